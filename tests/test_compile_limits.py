"""A compile that cannot load TVM's compiler says why in one line (issue 29, item 6): under
an address-space limit (`ulimit -v`) too small for it, that it ran out of memory, where
TVM itself falls back to its runtime and fails later on a missing function."""
from __future__ import annotations

import os
import resource
import subprocess
import sys

import pytest

from cvmc.errors import CvmcError
from cvmc.passes import target
from tests.test_cli_robustness import EXAMPLE, ROOT

LIMIT = 400_000 * 1024  # `ulimit -v 400000`: Python, NumPy and cvmc fit, TVM's compiler not


def test_compile_under_a_small_address_space_limit_says_out_of_memory(tmp_path):
    def limited():
        resource.setrlimit(resource.RLIMIT_AS, (LIMIT, LIMIT))

    env = {**os.environ, "CVMC_CACHE_DIR": "", "CVMC_JOBS": "1",
           "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.run([sys.executable, "-m", "cvmc.cli", "compile", str(EXAMPLE), "-o",
                           str(tmp_path / "m.cvmx")], env=env, cwd=ROOT, preexec_fn=limited,
                          capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert proc.stderr.startswith("error: out of memory") and proc.stderr.count("\n") == 1, \
        proc.stderr[-2000:]
    assert "ulimit -v" in proc.stderr and not (tmp_path / "m.cvmx").exists()


def test_tvm_without_its_compiler_is_a_clear_error(monkeypatch):
    """No address-space limit: TVM's runtime alone was loaded (a broken install)."""
    import tvm

    monkeypatch.setattr(resource, "getrlimit",
                        lambda which: (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
    monkeypatch.delitem(tvm.base._LOADED_LIBS, "tvm_compiler")
    with pytest.raises(CvmcError, match="reinstall apache-tvm"):
        target.compiler_tvm()

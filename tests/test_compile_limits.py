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


@pytest.mark.parametrize("failure", [MemoryError(),
                                     RuntimeError("InternalError: std::bad_alloc")])
def test_a_failed_allocation_anywhere_is_one_line(monkeypatch, capsys, failure):
    """Under other limits the allocation fails elsewhere: in Python (MemoryError) or in
    TVM's C++ (its InternalError of std::bad_alloc), each one line, exit 1."""
    from cvmc import cli

    def run(args):
        raise failure

    monkeypatch.setattr(cli, "cmd_check", run)
    assert cli.main(["check", str(EXAMPLE)]) == 1
    assert capsys.readouterr().err == f"error: {cli.OUT_OF_MEMORY}\n"


def test_other_runtime_errors_are_not_called_out_of_memory(monkeypatch):
    from cvmc import cli

    def run(args):
        raise RuntimeError("something else")

    monkeypatch.setattr(cli, "cmd_check", run)
    with pytest.raises(RuntimeError, match="something else"):
        cli.main(["check", str(EXAMPLE)])


_FAILING_REPORT = """
from cvmc import cli

def main():
    try:
        raise MemoryError
    except MemoryError:
        raise KeyError("reporting the error needed memory too")

cli.main = main
cli.entry()
"""


def test_memory_too_short_to_report_an_error_still_ends_in_one_line():
    # near the limit, printing the message fails as well: the chain ends in another error
    proc = subprocess.run([sys.executable, "-c", _FAILING_REPORT], capture_output=True,
                          text=True, timeout=120, cwd=ROOT, check=False)
    from cvmc.cli import OUT_OF_MEMORY

    assert (proc.returncode, proc.stderr) == (1, f"error: {OUT_OF_MEMORY}\n")

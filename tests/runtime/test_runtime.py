"""The runtime alone: API, aligned buffers, determinism across runs and thread counts, and
installation into a fresh virtual environment without TVM (which builds its native
runtime on first use)."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import cvmc_runtime
import numpy as np
import pytest
from cvmc_runtime.model import ALIGNMENT, aligned_empty

from cvmc.codegen import compile_model
from cvmc.frontend import load_graph
from cvmc.reference import reference_run
from tests.oputil import compile_passes

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "small_cnn" / "graph.nnef"
SHAPE = (1, 3, 16, 16)

# Runs an artifact N times on T threads and prints one hex digest of every output's bytes
# per run.
RUN_SCRIPT = """
import hashlib, sys
import numpy as np
import cvmc_runtime
cvmc_runtime.set_num_threads(int(sys.argv[5]))
model = cvmc_runtime.load(sys.argv[1])
x = np.load(sys.argv[2])
for _ in range(int(sys.argv[3])):
    out = model.run({"data": x})
    print(hashlib.sha256(b"".join(v.tobytes() for v in out.values())).hexdigest())
np.save(sys.argv[4], out["logits"])
"""


@pytest.fixture(scope="module")
def example(tmp_path_factory):
    """(artifact path, input path, reference logits) for the bundled example."""
    d = tmp_path_factory.mktemp("rt")
    graph = compile_passes(load_graph(EXAMPLE))
    compile_model(graph, d / "m.cvmx", "llvm")
    x = np.random.default_rng(3).integers(-127, 128, SHAPE, np.int8)
    np.save(d / "x.npy", x)
    (d / "run.py").write_text(RUN_SCRIPT)
    return d, reference_run(graph, {"data": x})["logits"]


def test_signature_and_run(example):
    d, want = example
    model = cvmc_runtime.load(d / "m.cvmx")
    assert [(s.name, s.shape, s.dtype, s.precision) for s in model.inputs] == \
        [("data", SHAPE, "int8", 8)]
    assert [s.name for s in model.outputs] == ["logits"]
    got = model.run({"data": np.load(d / "x.npy")})["logits"]
    assert np.array_equal(got, want)


def test_unaligned_and_non_contiguous_inputs_are_copied_to_aligned_buffers(example):
    d, want = example
    x = np.load(d / "x.npy")
    raw = np.zeros(x.size + 1, np.int8)[1:]  # data pointer 1 byte past an allocation
    raw[:] = x.ravel()
    unaligned = raw.reshape(SHAPE)
    assert unaligned.ctypes.data % ALIGNMENT != 0
    model = cvmc_runtime.load(d / "m.cvmx")
    assert np.array_equal(model.run({"data": unaligned})["logits"], want)
    transposed = np.ascontiguousarray(x.transpose(0, 1, 3, 2)).transpose(0, 1, 3, 2)
    assert np.array_equal(model.run({"data": transposed})["logits"], want)


@pytest.mark.parametrize("shape, dtype", [((3, 5), "int8"), ((0,), "int32"), ((7, 1, 3), "int32")])
def test_aligned_empty(shape, dtype):
    a = aligned_empty(shape, dtype)
    assert a.shape == shape and a.dtype == dtype and a.flags.c_contiguous
    assert a.ctypes.data % ALIGNMENT == 0


def _run_subprocess(python: str, d: Path, runs: int, threads: int, out: str,
                    env: dict | None = None) -> list[str]:
    proc = subprocess.run([python, str(d / "run.py"), str(d / "m.cvmx"), str(d / "x.npy"),
                           str(runs), str(d / out), str(threads)], check=False,
                          capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.split()


def test_same_bits_every_run_and_thread_count(example):
    d, want = example
    one = _run_subprocess(sys.executable, d, 20, 1, "t1.npy")
    two = _run_subprocess(sys.executable, d, 20, 2, "t2.npy")
    assert len(one) == len(two) == 20
    assert set(one) == set(two) and len(set(one)) == 1
    assert np.array_equal(np.load(d / "t2.npy"), want)


def test_runtime_alone_in_fresh_venv(example, tmp_path):
    """pip install ./runtime into a venv without system packages; run the artifact there."""
    d, want = example
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    python = str(venv / "bin" / "python")
    source = tmp_path / "runtime"  # a copy: pip builds in the source tree
    shutil.copytree(ROOT / "runtime", source,
                    ignore=shutil.ignore_patterns("*.egg-info", "build", "__pycache__"))
    proc = subprocess.run([python, "-m", "pip", "install", "-q", "--disable-pip-version-check",
                           str(source)], check=False, capture_output=True, text=True,
                          timeout=600)
    if proc.returncode != 0:
        if "Could not find a version" in proc.stderr or "NewConnectionError" in proc.stderr \
                or "No matching distribution" in proc.stderr:
            pytest.skip(f"no package index reachable: {proc.stderr.strip().splitlines()[-1]}")
        pytest.fail(proc.stderr)
    check = subprocess.run([python, "-c", "import tvm"], check=False, capture_output=True)
    assert check.returncode != 0, "apache-tvm must not be installed with the runtime"
    # a cache folder of its own: the installed package builds its native runtime
    cache = tmp_path / "cache"
    digests = _run_subprocess(python, d, 2, 2, "venv.npy",
                              {**os.environ, "XDG_CACHE_HOME": str(cache)})
    assert len(set(digests)) == 1
    assert len(list((cache / "cvmc" / "runtime").glob("libcvmc_native-*.so"))) == 1
    assert np.array_equal(np.load(d / "venv.npy"), want)


def test_artifact_bytes_depend_only_on_their_contents(tmp_path):
    """Two writes of the same plan, library and weights (at different times) are the same
    file: int8 weights deflated, float32 weights stored."""
    import time
    import zipfile

    from cvmc_runtime.artifact import write_artifact

    weights = {"w": np.arange(-64, 64, dtype=np.int8).reshape(8, 16),
               "f": np.linspace(-1, 1, 33, dtype=np.float32)}
    plan = {"weights": [{"name": "w", "shape": [8, 16], "dtype": "int8"},
                        {"name": "f", "shape": [33], "dtype": "float32"}]}
    write_artifact(tmp_path / "a.cvmx", plan, b"\x7fELF library", weights)
    time.sleep(2.1)  # past the zip format's 2-second timestamp resolution
    write_artifact(tmp_path / "b.cvmx", plan, b"\x7fELF library", weights)
    assert (tmp_path / "a.cvmx").read_bytes() == (tmp_path / "b.cvmx").read_bytes()
    with zipfile.ZipFile(tmp_path / "a.cvmx") as z:
        kinds = {i.filename: i.compress_type for i in z.infolist()}
    assert kinds["weights/0.npy"] == zipfile.ZIP_DEFLATED
    assert kinds["weights/1.npy"] == zipfile.ZIP_STORED

"""The process's one native runtime (cvmc_runtime.pool): built once on first use into the
user's cache, loaded once, shared by every loaded model; its thread count set through
its API; artifacts carry kernels only, and artifacts of the earlier ABI (whose kernel
libraries held a pool of their own) are refused."""
from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
import textwrap
import zipfile

import cvmc_runtime
import numpy as np
import pytest
from cvmc_runtime import ModelError

import cvmc
from cvmc.codegen import compile_model
from tests.oputil import one_op_graph


@pytest.fixture(scope="module")
def two_models(tmp_path_factory):
    """(folder, [(artifact, input, reference output)]) for two different convolutions
    whose kernels run parallel loops."""
    folder = tmp_path_factory.mktemp("pool")
    rng = np.random.default_rng(32)
    models = []
    for index, (channels, size) in enumerate([(32, 28), (16, 20)]):
        x = rng.integers(-127, 128, (1, channels, size, size)).astype(np.int8)
        w = rng.integers(-127, 128, (channels, channels, 3, 3)).astype(np.int8)
        g = one_op_graph("conv2d", [(x, 8), (w, 8)], {"padding": [1, 1]}, weights=(1,))
        path = folder / f"m{index}.cvmx"
        compile_model(g, path, "llvm")
        np.save(folder / f"x{index}.npy", x)
        np.save(folder / f"y{index}.npy", cvmc.reference_run(g, {"x0": x})["y0"])
        models.append(path)
    return folder, models


def _python(code: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """`code` in a fresh interpreter."""
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, timeout=240, check=False, env=env or dict(os.environ))


def test_two_models_share_one_pool(two_models):
    """Two models loaded, run at 3 threads: 2 workers start in all (a pool per model
    would start 4), and each gives the reference's bits."""
    folder, paths = two_models
    done = _python(f"""
        import os, numpy as np, cvmc_runtime
        folder = {str(folder)!r}
        models = [cvmc_runtime.load(p) for p in {[str(p) for p in paths]!r}]
        cvmc_runtime.set_num_threads(3)
        before = len(os.listdir("/proc/self/task"))
        for _ in range(3):
            for i, m in enumerate(models):
                got = m.run({{"x0": np.load(f"{{folder}}/x{{i}}.npy")}})["y0"]
                assert np.array_equal(got, np.load(f"{{folder}}/y{{i}}.npy")), i
        stats = cvmc_runtime.pool_stats()
        print(len(os.listdir("/proc/self/task")) - before, stats["workers"], stats["threads"],
              stats["launches"] >= 6)
        """)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["2", "2", "3", "True"]


def test_kernels_get_the_pool_even_when_tvm_registered_its_own_later(two_models):
    """Importing TVM (as the compiler does) registers TVM's thread pool with tvm-ffi after
    the native runtime was loaded: kernels loaded afterwards still run on cvmc's pool."""
    folder, paths = two_models
    done = _python(f"""
        import numpy as np, cvmc_runtime
        cvmc_runtime.set_num_threads(2)
        import tvm  # noqa: F401
        m = cvmc_runtime.load({str(paths[0])!r})
        got = m.run({{"x0": np.load({str(folder / "x0.npy")!r})}})["y0"]
        assert np.array_equal(got, np.load({str(folder / "y0.npy")!r}))
        print(cvmc_runtime.pool_stats()["launches"] > 0)
        """)
    assert done.returncode == 0 and done.stdout.split() == ["True"], done.stderr


def test_set_num_threads_overrides_the_environment_default():
    """TVM_NUM_THREADS is the default until set_num_threads; without it, every CPU."""
    code = """
        import cvmc_runtime
        print(cvmc_runtime.pool_stats()["threads"])
        cvmc_runtime.set_num_threads(1)
        print(cvmc_runtime.pool_stats()["threads"])
        """
    done = _python(code, {**os.environ, "TVM_NUM_THREADS": "3"})
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["3", "1"]
    env = {k: v for k, v in os.environ.items() if k != "TVM_NUM_THREADS"}
    done = _python(code, env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [str(len(os.sched_getaffinity(0))), "1"]


@pytest.mark.parametrize("threads", [0, -1, 2.0, "2", None, True])
def test_set_num_threads_refuses_what_is_not_a_positive_integer(threads):
    with pytest.raises(ModelError, match="threads must be a positive integer"):
        cvmc_runtime.set_num_threads(threads)


def test_built_once_per_user_then_loaded_without_gcc(two_models, tmp_path):
    folder, paths = two_models
    run = f"""
        import numpy as np, cvmc_runtime
        m = cvmc_runtime.load({str(paths[0])!r})
        got = m.run({{"x0": np.load({str(folder / "x0.npy")!r})}})["y0"]
        print(np.array_equal(got, np.load({str(folder / "y0.npy")!r})))
        """
    cache = tmp_path / "cache"
    env = {**os.environ, "XDG_CACHE_HOME": str(cache)}
    done = _python(run, env)
    assert done.returncode == 0 and done.stdout.split() == ["True"], done.stderr
    built = list((cache / "cvmc" / "runtime").iterdir())
    assert len(built) == 1 and built[0].name.startswith("libcvmc_native-")
    # built: a later process needs no gcc (none on its PATH)
    done = _python(run, {**env, "PATH": str(tmp_path / "empty")})
    assert done.returncode == 0 and done.stdout.split() == ["True"], done.stderr
    assert list((cache / "cvmc" / "runtime").iterdir()) == built


@pytest.mark.parametrize("where, message", [
    ("file", "cannot build the native runtime in .*; set XDG_CACHE_HOME to a writable folder"),
    ("no gcc", "cannot build the native runtime: gcc failed to run .*needs gcc"),
])
def test_a_native_runtime_that_cannot_be_built_is_one_model_error(two_models, tmp_path,
                                                                    where, message):
    _, paths = two_models
    (tmp_path / "a_file").write_text("")
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "a_file")} if where == "file" \
        else {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "c"), "PATH": str(tmp_path)}
    done = _python(f"""
        import cvmc_runtime
        try:
            cvmc_runtime.load({str(paths[0])!r})
        except cvmc_runtime.ModelError as e:
            print(e)
        """, env)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert len(lines) == 1 and re.search(message, lines[0]), done.stdout


def test_artifacts_carry_kernels_only(two_models, tmp_path):
    """The kernel library defines none of the pool's functions: it calls the process's."""
    _, paths = two_models
    with zipfile.ZipFile(paths[0]) as z:
        (tmp_path / "kernels.so").write_bytes(z.read("kernels.so"))
    defined = subprocess.run(["nm", "--defined-only", str(tmp_path / "kernels.so")],
                             capture_output=True, text=True, check=True).stdout
    assert "cvmc_parallel_launch" not in defined and "cvmc_alloc_workspace" not in defined
    assert "__TVMBackendParallelLaunch" in defined  # the pointer tvm-ffi fills


def test_an_artifact_of_the_earlier_abi_is_refused(two_models, tmp_path):
    """ABI 1: kernel libraries that held a pool of their own."""
    _, paths = two_models
    with zipfile.ZipFile(paths[0]) as z:
        members = {i.filename: z.read(i) for i in z.infolist()}
    assert json.loads(members["cvmx.json"])["abi"] == 2
    members["cvmx.json"] = json.dumps({"format": "cvmx", "version": 1, "abi": 1}).encode()
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        for name, data in members.items():
            z.writestr(name, data)
    (tmp_path / "old.cvmx").write_bytes(buf.getvalue())
    with pytest.raises(ModelError, match="built for native runtime ABI 1, this runtime has "
                                         "ABI 2; recompile the model"):
        cvmc_runtime.load(tmp_path / "old.cvmx")

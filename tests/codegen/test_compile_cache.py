"""CPU kernels built apart (in worker processes or in this one) and kept in the kernel
cache (cvmc.codegen.cache): the library is the same bytes cold, warm and for any number
of jobs, runs bit-exactly as the reference interpreter computes, and a damaged cache
entry is rebuilt."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile

import numpy as np
import pytest

import cvmc
from cvmc.cli import main
from cvmc.codegen import build, cache, compile_model
from cvmc.errors import CvmcError
from cvmc.lowering import lower
from cvmc.passes import pipeline
from cvmc.passes.target import Target
from tests.test_cli_robustness import EXAMPLE, ROOT

SHAPE = [1, 4, 6, 6]


def blocks_graph(n: int = 3):
    """`n` equal conv -> shift -> clip -> relu blocks (different weights), then a pool: the
    blocks lower to one shared kernel, the rest to kernels of their own."""
    rng = np.random.default_rng(7)
    b = cvmc.GraphBuilder("blocks")
    x = b.input("x", SHAPE, "int8", precision=8)
    for i in range(n):
        w = b.constant(rng.integers(-127, 128, (4, 4, 3, 3)).astype(np.int8), name=f"w{i}",
                       precision=8)
        c = b.conv2d(x, w, padding=[1, 1], stride=[1, 1], dilation=[1, 1], groups=1)
        x = b.relu(b.cvm_clip(b.cvm_right_shift(c, precision=16, shift_bit=6), precision=8))
    y = b.max_pool2d(x, pool_size=[2, 2], padding=[0, 0], strides=[2, 2], ceil_mode=False,
                     name="y")
    z = b.sum(b.flatten(y), axis=[1], keepdims=False, name="z")
    return b.build(outputs=[y, z])


FEEDS = {"x": np.random.default_rng(1).integers(-127, 128, SHAPE).astype(np.int8)}


def compiled(tmp_path, name: str, **kw) -> tuple[bytes, bytes]:
    """(kernels.so, plan.json) of `blocks_graph` compiled into `tmp_path/name.cvmx`; its
    outputs equal the reference interpreter's."""
    import cvmc_runtime

    path = tmp_path / f"{name}.cvmx"
    compile_model(blocks_graph(), path, "llvm", **kw)
    got = cvmc_runtime.load(path).run(FEEDS)
    want = cvmc.reference_run(blocks_graph(), FEEDS)
    for out in ("y", "z"):
        assert np.array_equal(got[out], want[out]), out
    with zipfile.ZipFile(path) as z:
        return z.read("kernels.so"), z.read("plan.json")


def kernel_entries(folder) -> list:
    """The kernel cache's entries in `folder`, sorted, but the backend shim's."""
    shim = cache.KernelCache(folder)._path(build._shim_key())
    return sorted(p for p in folder.rglob("*") if p.is_file() and p != shim)


def refuse_builds(monkeypatch) -> None:
    """Any kernel compiled from here on fails the test (the cache must serve them all)."""
    def refuse(func, target):
        raise AssertionError(f"built {func.attrs['global_symbol']} again")
    monkeypatch.setattr(build, "compile_kernel", refuse)


def test_cold_warm_and_jobs_give_the_same_library(tmp_path, monkeypatch):
    monkeypatch.setenv("CVMC_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(build, "KERNELS_PER_WORKER", 1)  # workers even for a few kernels
    one = compiled(tmp_path, "one", jobs=1, cache=False)
    assert not (tmp_path / "cache").exists()
    cold = compiled(tmp_path, "cold", jobs=2)
    entries = kernel_entries(tmp_path / "cache")
    plan = json.loads(one[1])
    symbols = {k["symbol"] for k in plan["kernels"]}
    # the three equal blocks share one kernel: one entry per distinct kernel
    assert len(plan["kernels"]) > len(symbols) == len(entries)
    refuse_builds(monkeypatch)
    warm = compiled(tmp_path, "warm", jobs=2)
    assert one == cold == warm


def test_damaged_entries_are_rebuilt(tmp_path, monkeypatch):
    monkeypatch.setenv("CVMC_CACHE_DIR", str(tmp_path / "cache"))
    first = compiled(tmp_path, "first", jobs=1)
    entries = kernel_entries(tmp_path / "cache")
    assert len(entries) >= 3
    entries[0].write_bytes(entries[0].read_bytes()[:-100])  # truncated
    data = bytearray(entries[1].read_bytes())
    data[-1] ^= 0xFF  # one bit pattern of the object changed
    entries[1].write_bytes(bytes(data))
    entries[2].write_bytes(b"")
    rebuilt = []
    real = build.compile_kernel
    monkeypatch.setattr(build, "compile_kernel",
                        lambda f, t: rebuilt.append(str(f.attrs["global_symbol"])) or real(f, t))
    assert compiled(tmp_path, "again", jobs=1) == first
    assert len(rebuilt) == 3
    refuse_builds(monkeypatch)  # and the rebuilt entries were written back whole
    assert compiled(tmp_path, "third", jobs=1) == first


def test_cache_entry_round_trip_and_damage(tmp_path):
    store = cache.KernelCache(tmp_path)
    kernel = cache.KernelObject(b"\x7fELF" + bytes(range(256)), "cpu-default")
    store.store("ab" * 32, kernel)
    assert store.load("ab" * 32) == kernel
    assert store.load("cd" * 32) is None
    path = next(p for p in tmp_path.rglob("*") if p.is_file())
    assert not [p for p in tmp_path.rglob(".tmp-*")]  # the temporary file was renamed
    for damaged in (b"", path.read_bytes()[:10], b"x" + path.read_bytes()[1:],
                    path.read_bytes()[:-1]):
        path.write_bytes(damaged)
        assert store.load("ab" * 32) is None


def test_cache_key_follows_kernel_and_target():
    base = cache.kernel_key("kernel A", {"kind": "llvm", "mcpu": "znver3"})
    assert base == cache.kernel_key("kernel A", {"mcpu": "znver3", "kind": "llvm"})
    assert base != cache.kernel_key("kernel B", {"kind": "llvm", "mcpu": "znver3"})
    assert base != cache.kernel_key("kernel A", {"kind": "llvm", "mcpu": "znver4"})


def test_cache_folder_by_environment(tmp_path, monkeypatch):
    monkeypatch.delenv("CVMC_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache.cache_folder() == tmp_path / "xdg" / "cvmc" / "kernels"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cache.cache_folder() == tmp_path / "home" / ".cache" / "cvmc" / "kernels"
    monkeypatch.setenv("CVMC_CACHE_DIR", str(tmp_path / "mine"))
    assert cache.cache_folder() == tmp_path / "mine"
    monkeypatch.setenv("CVMC_CACHE_DIR", "")
    assert cache.cache_folder() is None


def test_no_cache_flag_writes_no_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("CVMC_CACHE_DIR", str(tmp_path / "cache"))
    out = str(tmp_path / "a.cvmx")
    assert main(["compile", str(EXAMPLE), "-o", out, "--no-cache"]) == 0
    assert not (tmp_path / "cache").exists()
    assert main(["compile", str(EXAMPLE), "-o", out]) == 0
    assert (tmp_path / "cache").is_dir()


@pytest.mark.parametrize("value", ["0", "two", "-1"])
def test_bad_jobs_is_a_user_error(monkeypatch, value):
    monkeypatch.setenv("CVMC_JOBS", value)
    with pytest.raises(CvmcError, match="CVMC_JOBS"):
        build.compile_jobs()


def test_scalar_fallback_is_per_kernel(tmp_path, monkeypatch):
    """A kernel whose vectorised build LLVM rejects is rebuilt scalar, alone: the others
    keep their rule, and the outputs stay exact."""
    import tvm

    monkeypatch.setenv("CVMC_CACHE_DIR", "")
    real = tvm.compile

    def picky(mod, target):
        if any("flatten" in gv.name_hint for gv in mod.functions) and "vectorized" in mod.script():
            raise tvm.TVMError("vectorised flatten rejected (test)")
        return real(mod, target=target)

    monkeypatch.setattr(tvm, "compile", picky)
    compiled(tmp_path, "fallback", jobs=1)
    plan = json.loads(zipfile.ZipFile(tmp_path / "fallback.cvmx")
                                     .read("plan.json"))
    rules = {k["symbol"]: k["schedule"] for k in plan["kernels"]}
    assert {r for s, r in rules.items() if "flatten" in s} == {"cpu-scalar"}
    assert "cpu-scalar" not in {r for s, r in rules.items() if "flatten" not in s}


@pytest.mark.skipif(shutil.which("nm") is None, reason="needs nm (binutils)")
def test_kernel_objects_link_together(tmp_path):
    """Every kernel object defines TVM's backend function pointers (filled by the shim at
    load): they must be weak, or two objects could not be linked into one library."""
    target = Target.make("llvm")
    graph = pipeline.run_pipeline(blocks_graph(), target=target)
    mod, _, _ = lower.lower_graph(graph, target)
    for func in list(mod.functions.values())[:2]:
        obj = tmp_path / "k.o"
        obj.write_bytes(build.compile_kernel(func, target).obj)
        symbols = subprocess.run(["nm", str(obj)], check=True, capture_output=True,
                                 text=True).stdout.split("\n")
        backend = [line.split() for line in symbols if "__TVMBackend" in line
                   or "__tvm_ffi__library_ctx" in line or "__tvm_ffi_main" in line]
        assert backend and all(kind in "VWvw" for _, kind, _ in backend), backend


def test_workers_start_from_a_script_without_main_guard(tmp_path):
    """A plain script (no `if __name__ == "__main__"`) may compile with worker processes:
    they do not run the script again."""
    script = tmp_path / "plain.py"
    script.write_text(
        "import sys\n"
        "from cvmc.codegen import build, compile_model\n"
        "from tests.codegen.test_compile_cache import blocks_graph\n"
        "build.KERNELS_PER_WORKER = 1\n"
        "print('script ran')\n"
        f"compile_model(blocks_graph(), {str(tmp_path / 'a.cvmx')!r}, 'llvm', jobs=2,"
        " cache=False)\n")
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          cwd=ROOT, env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
                          check=False, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.count("script ran") == 1
    assert (tmp_path / "a.cvmx").is_file()


@pytest.fixture
def fresh_shim(monkeypatch):
    """This process keeps no compiled shim; every gcc run for the shim is counted."""
    monkeypatch.setattr(build, "_SHIM_OBJECT", {})
    runs = []
    real = build._Gcc

    def counted(source, folder, name, what):
        runs.append(name)
        return real(source, folder, name, what)

    monkeypatch.setattr(build, "_Gcc", counted)
    return runs


def test_shim_object_is_cached_and_rebuilt_when_damaged(tmp_path, monkeypatch, fresh_shim):
    monkeypatch.setenv("CVMC_CACHE_DIR", str(tmp_path / "cache"))
    first = compiled(tmp_path, "first", jobs=1)
    assert fresh_shim.count("shim") == 1
    shim = cache.KernelCache(tmp_path / "cache")._path(build._shim_key())
    stored = shim.read_bytes()
    monkeypatch.setattr(build, "_SHIM_OBJECT", {})  # a new process: the cache alone has it
    assert compiled(tmp_path, "second", jobs=1) == first
    assert fresh_shim.count("shim") == 1  # gcc did not compile it again
    shim.write_bytes(stored[:-50])  # truncated
    monkeypatch.setattr(build, "_SHIM_OBJECT", {})
    assert compiled(tmp_path, "third", jobs=1) == first
    assert fresh_shim.count("shim") == 2
    assert shim.read_bytes() == stored  # written back whole


def test_shim_object_without_cache_is_compiled_once_per_process(tmp_path, monkeypatch,
                                                                fresh_shim):
    monkeypatch.setenv("CVMC_CACHE_DIR", str(tmp_path / "cache"))
    one = compiled(tmp_path, "one", jobs=1, cache=False)
    assert compiled(tmp_path, "two", jobs=1, cache=False) == one
    assert fresh_shim.count("shim") == 1
    assert not (tmp_path / "cache").exists()


def test_shim_key_follows_source_and_compiler(tmp_path, monkeypatch):
    build._shim_key.cache_clear()
    try:
        base = build._shim_key()
        build._shim_key.cache_clear()
        monkeypatch.setattr(build, "SHIM_C", build.SHIM_C + "\n/* edited */\n")
        edited = build._shim_key()
        monkeypatch.undo()
        build._shim_key.cache_clear()
        fake = tmp_path / "gcc"  # another gcc: the same source, another version
        fake.write_text("#!/bin/sh\necho 'gcc (Other) 99.1.0'\n")
        fake.chmod(0o755)
        monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
        other_gcc = build._shim_key()
        assert len({base, edited, other_gcc}) == 3
    finally:
        build._shim_key.cache_clear()


def test_compiling_process_builds_the_small_kernels_beside_the_workers(tmp_path, monkeypatch):
    """With workers, the largest kernel goes to a worker and this process builds some of
    the others (it does not wait idle for the workers' fork server); the library is the
    same bytes as one built here alone."""
    import tvm

    monkeypatch.setenv("CVMC_CACHE_DIR", "")
    alone = compiled(tmp_path, "alone", jobs=1)
    monkeypatch.setattr(build, "KERNELS_PER_WORKER", 1)
    here = []
    real = build.compile_kernel
    monkeypatch.setattr(build, "compile_kernel",
                        lambda f, t: here.append(str(f.attrs["global_symbol"])) or real(f, t))
    assert compiled(tmp_path, "both", jobs=2) == alone
    target = Target.make("llvm")
    graph = pipeline.run_pipeline(blocks_graph(), target=target)
    mod, _, _ = lower.lower_graph(graph, target)
    sizes = {gv.name_hint: len(tvm.ir.save_json(f)) for gv, f in mod.functions.items()}
    assert 0 < len(here) < len(sizes)
    assert max(sizes, key=sizes.get) not in here


"""CPU kernels built apart (in worker processes or in this one) and kept in the kernel
cache (cvmc.codegen.cache): the library is the same bytes cold, warm and for any number
of jobs, runs bit-exactly as the reference interpreter computes, and a cache entry that
is not exactly what a compile asks for (damaged, another model's, another CPU's, the
other kind, a bad rule) is rebuilt, never used."""
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
from cvmc.codegen.targets import backend
from cvmc.errors import CvmcError
from cvmc.lowering import lower
from cvmc.passes.target import Target
from tests.oputil import compile_passes
from tests.test_cli_robustness import EXAMPLE, ROOT

SHAPE = [1, 4, 6, 6]


def blocks_graph(n: int = 3, shift: int = 6):
    """`n` equal conv -> shift -> clip -> relu blocks (different weights), then a pool: the
    blocks lower to one shared kernel, the rest to kernels of their own."""
    rng = np.random.default_rng(7)
    b = cvmc.GraphBuilder("blocks")
    x = b.input("x", SHAPE, "int8", precision=8)
    for i in range(n):
        w = b.constant(rng.integers(-127, 128, (4, 4, 3, 3)).astype(np.int8), name=f"w{i}",
                       precision=8)
        c = b.conv2d(x, w, padding=[1, 1], stride=[1, 1], dilation=[1, 1], groups=1)
        x = b.relu(b.cvm_clip(b.cvm_right_shift(c, precision=16, shift_bit=shift), precision=8))
    y = b.max_pool2d(x, pool_size=[2, 2], padding=[0, 0], strides=[2, 2], ceil_mode=False,
                     name="y")
    z = b.sum(b.flatten(y), axis=[1], keepdims=False, name="z")
    return b.build(outputs=[y, z])


FEEDS = {"x": np.random.default_rng(1).integers(-127, 128, SHAPE).astype(np.int8)}


def compiled(tmp_path, name: str, expect: tuple[bytes, bytes] | None = None,
             **kw) -> tuple[bytes, bytes]:
    """(kernels.so, plan.json) of `blocks_graph` compiled into `tmp_path/name.cvmx`; its
    outputs equal the reference interpreter's. With `expect`, the library and plan are
    first checked to be those bytes (before running: a kernel built for another CPU may
    not run here)."""
    import cvmc_runtime

    path = tmp_path / f"{name}.cvmx"
    compile_model(blocks_graph(), path, "llvm", **kw)
    with zipfile.ZipFile(path) as z:
        built = z.read("kernels.so"), z.read("plan.json")
    if expect is not None:
        assert built == expect
    got = cvmc_runtime.load(path).run(FEEDS)
    want = cvmc.reference_run(blocks_graph(), FEEDS)
    for out in ("y", "z"):
        assert np.array_equal(got[out], want[out]), out
    return built


def kernel_entries(folder) -> list:
    """The kernel cache's entries in `folder`, sorted."""
    return sorted(p for p in folder.rglob("*") if p.is_file())


def refuse_builds(monkeypatch) -> None:
    """Any kernel compiled from here on fails the test (the cache must serve them all)."""
    def refuse(func, target, table):
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


def built_here(monkeypatch) -> list:
    """The symbols of the kernels this process compiles from here on (the cache did not
    serve them, and no worker took them)."""
    built = []
    real = build.compile_kernel
    monkeypatch.setattr(build, "compile_kernel",
                        lambda f, t, table: built.append(str(f.attrs["global_symbol"]))
                        or real(f, t, table))
    return built


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
    rebuilt = built_here(monkeypatch)
    assert compiled(tmp_path, "again", jobs=1) == first
    assert len(rebuilt) == 3
    refuse_builds(monkeypatch)  # and the rebuilt entries were written back whole
    assert compiled(tmp_path, "third", jobs=1) == first


def entries_by_symbol(folder, symbols) -> dict:
    """{symbol: its entry's path} in the kernel cache `folder`, for each of `symbols` (a
    kernel's exported function), found by the name in the object file."""
    found = {}
    for path in folder.rglob("*"):
        for symbol in symbols:
            if path.is_file() and f"__tvm_ffi_{symbol}\0".encode() in path.read_bytes():
                found[symbol] = path
    return found


def symbols_of(built: tuple[bytes, bytes]) -> set[str]:
    """The kernel symbols of a compiled (library, plan)."""
    return {k["symbol"] for k in json.loads(built[1])["kernels"]}


def test_another_models_kernel_under_an_entry_name_is_rebuilt(tmp_path, monkeypatch):
    """The same kernel with a right shift by 7 in place of 6 (another model, the same
    symbol) copied over this model's entry: the compile rebuilds it, the outputs stay
    exact."""
    monkeypatch.setenv("CVMC_CACHE_DIR", str(tmp_path / "ours"))
    first = compiled(tmp_path, "first", jobs=1)
    monkeypatch.setenv("CVMC_CACHE_DIR", str(tmp_path / "theirs"))
    compile_model(blocks_graph(shift=7), tmp_path / "theirs.cvmx", "llvm", jobs=1)
    symbols = symbols_of(first)
    ours = entries_by_symbol(tmp_path / "ours", symbols)
    theirs = entries_by_symbol(tmp_path / "theirs", symbols)
    changed = [s for s in symbols if ours[s].read_bytes() != theirs[s].read_bytes()]
    assert len(changed) == 1  # the conv kernel: the pool and the sum are the same
    ours[changed[0]].write_bytes(theirs[changed[0]].read_bytes())
    monkeypatch.setenv("CVMC_CACHE_DIR", str(tmp_path / "ours"))
    rebuilt = built_here(monkeypatch)
    assert compiled(tmp_path, "again", jobs=1) == first
    assert rebuilt == changed
    refuse_builds(monkeypatch)  # and its entry was overwritten with the right one
    assert compiled(tmp_path, "third", jobs=1) == first


def test_entries_of_another_cpu_are_rebuilt(tmp_path, monkeypatch):
    """Every entry replaced by the same kernel built for another CPU (`--mcpu`, AVX-512 or
    not as this one is not): each is rebuilt for this one (the library is compared before
    it runs: the other CPU's code may not run here)."""
    other = "haswell" if Target.make("llvm").has(["avx512f"]) else "znver4"
    monkeypatch.setenv("CVMC_CACHE_DIR", str(tmp_path / "ours"))
    first = compiled(tmp_path, "first", jobs=1)
    monkeypatch.setenv("CVMC_CACHE_DIR", str(tmp_path / "theirs"))
    with pytest.warns(UserWarning):  # not this machine's CPU
        compile_model(blocks_graph(), tmp_path / "theirs.cvmx", "llvm", mcpu=other, jobs=1)
    symbols = symbols_of(first)
    ours = entries_by_symbol(tmp_path / "ours", symbols)
    theirs = entries_by_symbol(tmp_path / "theirs", symbols)
    for symbol in symbols:
        ours[symbol].write_bytes(theirs[symbol].read_bytes())
    monkeypatch.setenv("CVMC_CACHE_DIR", str(tmp_path / "ours"))
    rebuilt = built_here(monkeypatch)
    assert compiled(tmp_path, "again", first, jobs=1) == first
    assert sorted(rebuilt) == sorted(symbols)


def edit_header(path, **fields) -> None:
    """Set `fields` in the JSON header of the cache entry at `path`, the object unchanged
    (so its checksum still matches)."""
    data = path.read_bytes()
    magic = data[:data.index(b"\n") + 1]
    (size,) = cache._HEADER.unpack_from(data, len(magic))
    start = len(magic) + cache._HEADER.size
    header = json.loads(data[start:start + size])
    header.update(fields)
    text = json.dumps(header).encode()
    path.write_bytes(magic + cache._HEADER.pack(len(text)) + text + data[start + size:])


@pytest.mark.parametrize("rule", ["x" * 1000, 7, "cuda-conv-dp4a"])
def test_entries_with_a_rule_not_a_cpu_rule_are_rebuilt(tmp_path, monkeypatch, rule):
    """A kernel entry whose schedule rule is not one of the CPU rules (a long string, a
    number, a CUDA rule) is rebuilt: the plan names only real rules."""
    monkeypatch.setenv("CVMC_CACHE_DIR", str(tmp_path / "cache"))
    first = compiled(tmp_path, "first", jobs=1)
    for path in entries_by_symbol(tmp_path / "cache", symbols_of(first)).values():
        edit_header(path, rule=rule)
    rebuilt = built_here(monkeypatch)
    assert compiled(tmp_path, "again", first, jobs=1) == first
    assert sorted(rebuilt) == sorted(symbols_of(first))


def test_concurrent_compiles_share_one_cache(tmp_path, monkeypatch):
    """Two compiles into one empty cache at the same time: both artifacts are the same
    library and run exactly, and every entry they left is whole and serves a third."""
    import cvmc_runtime

    env = {**os.environ, "CVMC_CACHE_DIR": str(tmp_path / "cache"), "CVMC_JOBS": "1",
           "PYTHONPATH": os.pathsep.join(sys.path)}
    outs = [tmp_path / f"m{i}.cvmx" for i in range(2)]
    procs = [subprocess.Popen([sys.executable, "-m", "cvmc.cli", "compile", str(EXAMPLE),
                               "-o", str(out)], env=env, cwd=ROOT, stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True) for out in outs]
    for proc in procs:
        _, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err
    x = np.load(EXAMPLE / "data.npy")
    want = cvmc.reference_run(cvmc.load_graph(EXAMPLE), {"data": x})["logits"]
    libraries = []
    for out in outs:
        assert np.array_equal(cvmc_runtime.load(out).run({"data": x})["logits"], want)
        libraries.append(zipfile.ZipFile(out).read("kernels.so"))
    assert libraries[0] == libraries[1]
    assert not list((tmp_path / "cache").rglob(".tmp-*"))
    monkeypatch.setenv("CVMC_CACHE_DIR", str(tmp_path / "cache"))
    refuse_builds(monkeypatch)
    compile_model(cvmc.load_graph(EXAMPLE), tmp_path / "warm.cvmx", "llvm", jobs=1)
    assert zipfile.ZipFile(tmp_path / "warm.cvmx").read("kernels.so") == libraries[0]


def c_object(tmp_path, *functions: str, weak: str = "") -> bytes:
    """An object file gcc compiles that defines `__tvm_ffi_<name>` for each of `functions`
    (and, weakly, `weak`)."""
    lines = [f"int __tvm_ffi_{name}(void) {{ return 0; }}" for name in functions]
    if weak:
        lines.append(f"__attribute__((weak)) int {weak} = 1;")
    source = tmp_path / "f.c"
    source.write_text("\n".join([*lines, "static int helper(void) { return 1; }", ""]))
    subprocess.run(["gcc", "-c", "-fPIC", str(source), "-o", str(tmp_path / "f.o")],
                   check=True)
    return (tmp_path / "f.o").read_bytes()


def test_cache_entry_round_trip_and_damage(tmp_path):
    store = cache.KernelCache(tmp_path / "cache")
    kernel = cache.KernelObject(c_object(tmp_path, "k0", weak="__TVMBackendAllocWorkspace"),
                                "cpu-default")
    key = cache.entry_key("kernel", ["__tvm_ffi_k0"], "kernel A", {"kind": "llvm"})
    store.store(key, kernel)
    assert store.load(key, {"cpu-default"}) == kernel
    assert store.load(key, {"cpu-scalar"}) is None  # a rule the caller does not know
    assert store.load(cache.entry_key("kernel", ["__tvm_ffi_k0"], "kernel B", {"kind": "llvm"}),
                      {"cpu-default"}) is None
    path = next(p for p in (tmp_path / "cache").rglob("*") if p.is_file())
    assert not list((tmp_path / "cache").rglob(".tmp-*"))  # the temporary file was renamed
    for damaged in (b"", path.read_bytes()[:10], b"x" + path.read_bytes()[1:],
                    path.read_bytes()[:-1]):
        path.write_bytes(damaged)
        assert store.load(key, {"cpu-default"}) is None


def test_entry_under_another_keys_name_is_refused(tmp_path):
    """An entry copied to the file name of another key (of any field) is not that key's."""
    store = cache.KernelCache(tmp_path / "cache")
    kernel = cache.KernelObject(c_object(tmp_path, "k0"), "cpu-default")
    fields = ("kernel", ["__tvm_ffi_k0"], "kernel A", {"kind": "llvm", "mcpu": "znver3"})
    key = cache.entry_key(*fields)
    store.store(key, kernel)
    others = [("other", *fields[1:]), (fields[0], ["__tvm_ffi_k1"], *fields[2:]),
              (*fields[:2], "kernel B", fields[3]),
              (*fields[:3], {"kind": "llvm", "mcpu": "znver4"})]
    for other in (cache.entry_key(*f) for f in others):
        assert other != key
        store._path(other).parent.mkdir(exist_ok=True)
        store._path(other).write_bytes(store._path(key).read_bytes())
        assert store.load(other, {"cpu-default"}) is None
    assert store.load(key, {"cpu-default"}) == kernel


@pytest.mark.parametrize("functions", [(), ("k1",), ("k0", "k1")])
def test_entry_whose_object_defines_other_symbols_is_refused(tmp_path, functions):
    """An entry whose header is right but whose object defines other functions than its key
    names (none, another, one more) would not link, or link the wrong code: refused."""
    store = cache.KernelCache(tmp_path / "cache")
    key = cache.entry_key("kernel", ["__tvm_ffi_k0"], "kernel A", {"kind": "llvm"})
    store.store(key, cache.KernelObject(c_object(tmp_path, *functions), "cpu-default"))
    assert store.load(key, {"cpu-default"}) is None
    store.store(key, cache.KernelObject(b"not an object file", "cpu-default"))
    assert store.load(key, {"cpu-default"}) is None


def test_cache_key_follows_kernel_and_target():
    def key(source, built_for):
        return cache.entry_key("kernel", ["__tvm_ffi_k0"], source, built_for)

    base = key("kernel A", {"kind": "llvm", "mcpu": "znver3"})
    assert base == key("kernel A", {"mcpu": "znver3", "kind": "llvm"})
    assert base != key("kernel B", {"kind": "llvm", "mcpu": "znver3"})
    assert base != key("kernel A", {"kind": "llvm", "mcpu": "znver4"})


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
    """Every kernel object defines TVM's backend function pointers (filled with the native
    runtime's functions at load): they must be weak, or two objects could not be linked into one library."""
    target = Target.make("llvm")
    graph = compile_passes(blocks_graph(), target=target)
    mod, _, _ = lower.lower_graph(graph, target)
    for func in list(mod.functions.values())[:2]:
        obj = tmp_path / "k.o"
        obj.write_bytes(build.compile_kernel(func, target, backend(target).schedules).obj)
        symbols = subprocess.run(["nm", str(obj)], check=True, capture_output=True,
                                 text=True).stdout.split("\n")
        weak = [line.split() for line in symbols if "__TVMBackend" in line
                or "__tvm_ffi__library_ctx" in line or "__tvm_ffi_main" in line]
        assert weak and all(kind in "VWvw" for _, kind, _ in weak), weak


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


def test_compiling_process_builds_the_small_kernels_beside_the_workers(tmp_path, monkeypatch):
    """With workers, the largest kernel goes to a worker and this process builds some of
    the others (it does not wait idle for the workers' fork server); the library is the
    same bytes as one built here alone."""
    import tvm

    monkeypatch.setenv("CVMC_CACHE_DIR", "")
    alone = compiled(tmp_path, "alone", jobs=1)
    monkeypatch.setattr(build, "KERNELS_PER_WORKER", 1)
    here = built_here(monkeypatch)
    assert compiled(tmp_path, "both", jobs=2) == alone
    target = Target.make("llvm")
    graph = compile_passes(blocks_graph(), target=target)
    mod, _, _ = lower.lower_graph(graph, target)
    sizes = {gv.name_hint: len(tvm.ir.save_json(f)) for gv, f in mod.functions.items()}
    assert 0 < len(here) < len(sizes)
    assert max(sizes, key=sizes.get) not in here


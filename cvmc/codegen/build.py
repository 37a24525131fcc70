"""Build an IRModule of PrimFuncs into one shared library for the CPU: TVM's LLVM backend,
one object per kernel (in worker processes, through the kernel cache), linked with the
library signature. The library holds kernels only: their backend functions (thread pool,
workspaces) are the process's native runtime, which cvmc_runtime loads once and tvm-ffi
writes into each library it loads (cvmc_runtime.pool). The CUDA
build is the CUDA backend's own (cvmc/codegen/targets/cuda.py); `Built` and
`kernel_signatures` serve both.
"""
from __future__ import annotations

import functools
import multiprocessing
import multiprocessing.forkserver
import multiprocessing.resource_tracker
import os
import signal
import subprocess
import sys
import tempfile
import types
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, ThreadPoolExecutor, wait
from contextlib import ExitStack, closing, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Self

from cvmc.codegen.cache import KernelCache, KernelObject, entry_key
from cvmc.codegen.cpu_features import needed_features, warn_if_not_host
from cvmc.codegen.lifeline import PARENT_ENV, die_with_server
from cvmc.codegen.shim import signature_source
from cvmc.errors import CvmcError
from cvmc.lowering.rules import SCALAR_RULE, ScheduleRule, schedule_and_build, schedule_llvm
from cvmc.passes.target import Target, host_cpu

KERNELS_PER_WORKER = 6


@dataclass
class Built:
    """A built kernel library: its bytes, the target dict, the schedule rule each kernel
    got, `emit()`, which makes (scheduled TIR, source) when they are asked for, and (CPU)
    each kernel's object file by symbol, as linked into the library."""

    library: bytes
    target: dict
    source_suffix: str
    schedules: dict[str, str]
    emit: Callable[[], tuple[str, str]]
    objects: dict[str, bytes] = field(default_factory=dict)

    @functools.cached_property
    def _emitted(self) -> tuple[str, str]:
        return self.emit()

    @property
    def tir(self) -> str:
        """The scheduled TIR of every kernel (one module)."""
        return self._emitted[0]

    @property
    def source(self) -> str:
        """The generated source: LLVM IR (llvm) or the CUDA translation unit (cuda)."""
        return self._emitted[1]


class _Gcc:
    """gcc compiling C `source` into `folder/name.o` (with tvm-ffi's headers) in the
    background, from the moment it is made; `result()` waits for it. As a context, a gcc
    still running at its end (an error elsewhere) is stopped."""

    def __init__(self, source: str, folder: Path, name: str, what: str):
        (folder / f"{name}.c").write_text(source)
        self.obj, self.what = folder / f"{name}.o", what
        self.proc = subprocess.Popen(_gcc_command(folder / f"{name}.c", self.obj),
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                     text=True)

    def result(self) -> bytes:
        """The object file's bytes, once gcc is done; a CvmcError with gcc's message if it
        failed."""
        _, stderr = self.proc.communicate()
        if self.proc.returncode != 0:
            raise CvmcError(f"cannot compile {self.what} with gcc:\n{stderr[-4000:]}")
        return self.obj.read_bytes()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc) -> None:
        if self.proc.returncode is None:  # not waited for by result(): an error elsewhere
            self.proc.kill()
            self.proc.communicate()


def _gcc_command(source: Path, obj: Path) -> list[str]:
    """The gcc command line that compiles C `source` into `obj`."""
    import tvm_ffi

    return ["gcc", "-O2", "-fPIC", "-pthread", f"-I{tvm_ffi.libinfo.find_include_path()}",
            "-c", str(source), "-o", str(obj)]


def kernel_signatures(mod, plan: dict) -> list[dict]:
    """The `plan`'s kernels as a library signature (cvmc_runtime.library): each with its
    arguments' shapes and dtypes as its PrimFunc in `mod` declares them, and the
    precisions the compiler's overflow proof assumed."""
    precisions = {s["name"]: s.get("precision")
                  for key in ("inputs", "weights", "buffers", "outputs") for s in plan[key]}
    out = []
    for kernel in plan["kernels"]:
        buffers = mod[kernel["symbol"]].params  # TVM 0.27: each param carries its buffer
        assert len(buffers) == len(kernel["args"]), kernel["symbol"]
        out.append({"symbol": kernel["symbol"], "num_inputs": kernel["num_inputs"],
                    "args": [{"name": name, "shape": [int(d) for d in b.shape],
                              "dtype": str(b.dtype), "precision": precisions[name]}
                             for name, b in zip(kernel["args"], buffers)]})
    return out


def build_llvm(mod, target: Target, table: Sequence[ScheduleRule],
               on_kernel: Callable[[str], None] | None = None, plan: dict | None = None,
               jobs: int | None = None, cache: KernelCache | None = None) -> Built:
    """Schedule (by the rows of the backend's schedule table `table`,
    `cvmc.lowering.rules`) and compile `mod` for the CPU of `target`; returns the linked library, holding the signature of `plan`'s kernels
    when given (a library to load with cvmc_runtime.load needs it).

    Each kernel is compiled on its own into an object file, in `jobs` worker processes
    (`compile_jobs()`), or taken from `cache`; the objects are linked with the signature
    into one library. Per kernel, rather than per part of the module: the cache
    then serves every kernel that did not change, the workers balance themselves, and a
    kernel the vectoriser rejects falls back to the scalar schedule alone. The library
    is the same bytes however it was built (cold, warm, any `jobs`): the objects are
    linked in kernel order and each kernel's object depends on that kernel alone."""
    from cvmc_runtime import signature_json
    from tvm.support.cc import create_shared

    features = needed_features(target)
    if not target.mtriple:
        warn_if_not_host(target.mcpu, host_cpu(), features)
    built_for = {**target.describe(), "features": features}
    funcs = {gv.name_hint: func for gv, func in mod.functions.items()}
    keys = {s: entry_key("kernel", [f"__tvm_ffi_{s}"], f.script(), built_for)
            for s, f in funcs.items()} if cache else {}
    # a cached kernel carries the rule it got: one of the table's, or the scalar fallback
    known = {rule.name for rule in [*table, SCALAR_RULE]}
    kernels = {s: cache.load(keys[s], known) for s in funcs} if cache else {}
    kernels = {s: k for s, k in kernels.items() if k is not None}
    for symbol in kernels:
        if on_kernel:
            on_kernel(symbol)
    missing = {s: f for s, f in funcs.items() if s not in kernels}
    with tempfile.TemporaryDirectory(prefix="cvmc-") as tmp, ExitStack() as stack:
        def gcc(source: str, name: str, what: str) -> _Gcc:
            return stack.enter_context(_Gcc(source, Path(tmp), name, what))

        # gcc builds the signature while the kernels compile; not for another triple, whose
        # objects only a C library links (cvmc.codegen.clib)
        cross = bool(target.mtriple)
        signature = None if plan is None or cross else gcc(
            signature_source(signature_json(built_for, kernel_signatures(mod, plan))),
            "signature", "the library signature")
        # closed on any error here too, so its workers stop now, not at garbage collection
        building = stack.enter_context(closing(_compile_kernels(
            missing, target, table, jobs or compile_jobs(), on_kernel)))
        for symbol, kernel in building:
            kernels[symbol] = kernel
            if cache:
                cache.store(keys[symbol], kernel)
        rules = {s: kernels[s].rule for s in funcs}
        emit = functools.partial(_emit_llvm, mod, target, table, rules)
        if cross:
            return Built(b"", built_for, "ll", rules, emit,
                         {s: kernels[s].obj for s in funcs})
        objects = {f"k{i}": kernels[symbol].obj for i, symbol in enumerate(funcs)}
        if signature:
            objects["signature"] = signature.result()
        for name, obj in objects.items():
            (Path(tmp) / f"{name}.o").write_bytes(obj)
        lib = Path(tmp) / "kernels.so"
        create_shared(str(lib), [str(Path(tmp) / f"{n}.o") for n in objects],
                      options=["-pthread"])
        return Built(lib.read_bytes(), built_for, "ll", rules, emit,
                     {s: kernels[s].obj for s in funcs})


def compile_jobs() -> int:
    """How many processes build kernels (this one and its workers): `CVMC_JOBS`, else the
    CPUs this process may run on."""
    value = os.environ.get("CVMC_JOBS", "")
    if not value:
        return len(os.sched_getaffinity(0))
    if not value.isdigit() or int(value) < 1:
        raise CvmcError(f"CVMC_JOBS={value}: expected a whole number of processes, 1 or more")
    return int(value)


def start_workers(kernels: int, jobs: int | None = None) -> None:
    """Start the build workers' fork server now when a compile of at most `kernels`
    kernels may use workers (`_compile_kernels`): it imports TVM and the schedules (2-3 s
    of CPU) in the background while the passes and lowering run in this process."""
    if min(jobs or compile_jobs(), kernels // KERNELS_PER_WORKER) > 1:
        _start_server()


def _worker_context():
    """The workers' multiprocessing context: each worker forks from a fork server that has
    imported this module (TVM and the schedule table) once, for every compile of this
    process. Not forked from the compiling process itself (TVM's threads and state do not
    survive a fork), nor spawned (each worker would import TVM again: 2-3 s). The server
    imports `cvmc.codegen.lifeline` first: it dies with the thread that started it, and
    its workers with it (`_start_server`)."""
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["cvmc.codegen.lifeline", __name__])
    return context


def _start_server() -> None:
    """Start the workers' fork server (and multiprocessing's resource tracker), unless
    running, from this thread: the server dies when this thread ends (a later compile
    starts another). They start with Ctrl-C blocked, and so do the workers the server
    forks: the terminal sends Ctrl-C to the whole process group, and the compiling
    process alone handles it, dropping the kernels not started yet, so the user sees
    `cvmc: interrupted` rather than a traceback from a helper."""
    _worker_context()
    # the tracker first: its own start unblocks SIGINT (it ignores SIGINT by itself)
    multiprocessing.resource_tracker.ensure_running()
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    os.environ[PARENT_ENV] = str(os.getpid())
    try:
        multiprocessing.forkserver.ensure_running()
    finally:
        del os.environ[PARENT_ENV]
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)


def _compile_kernels(funcs: dict, target: Target, table: Sequence[ScheduleRule], jobs: int,
                     on_kernel: Callable[[str], None] | None):
    """(symbol, KernelObject) for each PrimFunc of `funcs`, as they finish, built by `jobs`
    processes: this one and `jobs - 1` workers (`_worker_context`), or this one alone for
    one job or a few kernels. The workers take the kernels as JSON (`tvm.ir.save_json`),
    the largest first, so no big kernel is left to finish alone at the end; this process
    takes the smallest, between handing the workers theirs, so it also builds while the
    workers' fork server is still starting."""
    import tvm

    # A worker costs its fork server's start when it is not running yet (2-3 s), a kernel
    # 0.1-1 s to build: workers pay for themselves from about KERNELS_PER_WORKER kernels.
    jobs = min(jobs, len(funcs) // KERNELS_PER_WORKER)
    if jobs <= 1:
        for symbol, func in funcs.items():
            yield symbol, compile_kernel(func, target, table)
            if on_kernel:
                on_kernel(symbol)
        return
    texts = dict(sorted(((symbol, tvm.ir.save_json(func)) for symbol, func in funcs.items()),
                        key=lambda pair: -len(pair[1])))
    order, pending = list(texts), {}
    _start_server()  # (if not yet) from this thread, not the short-lived one below
    pool = ProcessPoolExecutor(jobs - 1, mp_context=_worker_context(),
                               initializer=die_with_server)

    def submit(symbol: str):
        with _main_module_hidden():  # a submit may start a worker
            return pool.submit(compile_kernel_json, texts[symbol], target, table)

    # The first submit starts a worker, which waits for the fork server to have imported
    # TVM: a thread waits for it, while this process builds kernels.
    try:
        with ThreadPoolExecutor(1) as thread:
            first = order.pop(0)
            starting = thread.submit(submit, first)
            while order or pending or starting:
                if starting and starting.done():
                    pending[starting.result()] = first
                    starting = None
                # two kernels per worker handed out: one building, the next one queued
                while not starting and order and len(pending) < 2 * (jobs - 1):
                    symbol = order.pop(0)
                    pending[submit(symbol)] = symbol
                finished = [future for future in pending if future.done()]
                if not finished and order:  # no worker is done: build the smallest here
                    symbol = order.pop()
                    results = [(symbol, compile_kernel(funcs[symbol], target, table))]
                elif not finished:
                    wait([*pending, starting] if starting else pending,
                         return_when=FIRST_COMPLETED)
                    continue
                else:
                    results = [(pending.pop(future), future.result()) for future in finished]
                for symbol, kernel in results:
                    yield symbol, kernel
                    if on_kernel:
                        on_kernel(symbol)
    finally:
        # On an error or Ctrl-C (wherever it comes) the kernels not started yet are dropped,
        # not waited for, and the pool lets go of its queues: an interrupted compile exits
        # with no worker left and no semaphore for the resource tracker to report.
        pool.shutdown(wait=True, cancel_futures=True)


@contextmanager
def _main_module_hidden():
    """`__main__` is an empty module inside: a worker process runs its parent's main
    script again unless it has none, and a script that calls cvmc.compile without an
    `if __name__ == "__main__"` guard would then compile again in each worker (Python
    refuses it). The workers need only cvmc's modules."""
    main = sys.modules["__main__"]
    sys.modules["__main__"] = types.ModuleType("__main__")
    try:
        yield
    finally:
        sys.modules["__main__"] = main


def compile_kernel_json(func_json: str, target: Target,
                        table: Sequence[ScheduleRule]) -> KernelObject:
    """compile_kernel of a PrimFunc given as `tvm.ir.save_json` text (a worker's task)."""
    import tvm

    return compile_kernel(tvm.ir.load_json(func_json), target, table)


def compile_kernel(func, target: Target, table: Sequence[ScheduleRule]) -> KernelObject:
    """One PrimFunc scheduled by the rows of `table` (with their fallbacks) and compiled
    for the CPU of `target` into an object file."""
    import tvm

    symbol = str(func.attrs["global_symbol"])
    _, ex, rules = schedule_and_build(tvm.IRModule({symbol: func}), target, table,
                                      lambda m: tvm.compile(m, target=target.describe()))
    with tempfile.TemporaryDirectory(prefix="cvmc-") as tmp:
        obj = Path(tmp) / "kernel.o"
        ex.mod.write_to_file(str(obj))
        return KernelObject(obj.read_bytes(), rules[symbol])


def _emit_llvm(mod, target: Target, table: Sequence[ScheduleRule],
               rules: dict[str, str]) -> tuple[str, str]:
    """(scheduled TIR, LLVM IR) of `mod` as `build_llvm` built it, each kernel with the rule
    it got, made again only when asked for (`--emit`): the kernels were compiled apart,
    perhaps in other processes or an earlier run."""
    import tvm

    funcs = {}
    for gv, func in mod.functions.items():
        alone = tvm.IRModule({gv: func})
        funcs[gv] = schedule_llvm(alone, target, table,
                                  rules[gv.name_hint] == SCALAR_RULE.name)[0][gv]
    scheduled = tvm.IRModule(funcs)
    source = tvm.compile(scheduled, target=target.describe()).mod.inspect_source("ll")
    return scheduled.script(), source

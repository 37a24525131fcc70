"""The native runtime's thread pool and workspace arena (runtime/cvmc_runtime/native/
cvmc_pool.c, issue 20 items 3 and 5) driven from C through a small driver compiled with
it, then inside real kernels: every task id runs once whatever the thread count, a
stalled worker holds back only its own task, errors propagate, nested launches run
inline, workspaces come from a per-thread arena that stops allocating after the first
run, the pool survives unloading and fork, and compiled results are the reference's bits
at 1 to 4 threads."""
from __future__ import annotations

import ctypes
import itertools
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import cvmc_runtime
import numpy as np
import pytest
from cvmc_runtime import NATIVE_FOLDER

import cvmc
from cvmc.codegen import compile_model
from tests.oputil import one_op_graph

MAX_TASKS = 4096  # the driver's record arrays

DRIVER_C = r"""
#include "cvmc_pool.c"

static int drive_counts[4096], drive_by_caller[4096], drive_num_task, drive_fail_id;
static int drive_stall_ms, drive_stalled, drive_bad_workspace;
static pthread_t drive_caller;

/* A task as TVM writes one: it takes two workspaces (freed in reverse), fills them,
   checks nothing else wrote them, records who ran it, and fails if told to. */
static int drive_task(int id, TVMParallelGroupEnv* env, void* cdata) {
  (void)cdata;
  __atomic_store_n(&drive_num_task, env->num_task, __ATOMIC_RELAXED);
  __atomic_add_fetch(&drive_counts[id], 1, __ATOMIC_RELAXED);
  int caller = pthread_equal(pthread_self(), drive_caller);
  drive_by_caller[id] = caller;
  if (!caller && drive_stall_ms && !__atomic_exchange_n(&drive_stalled, 1, __ATOMIC_RELAXED))
    usleep(drive_stall_ms * 1000);
  unsigned char* a = (unsigned char*)cvmc_alloc_workspace(1, 0, 1000, 0, 32);
  unsigned char* b = (unsigned char*)cvmc_alloc_workspace(1, 0, 40, 0, 32);
  memset(a, id & 0xff, 1000);
  memset(b, (id + 1) & 0xff, 40);
  for (int i = 0; i < 1000; i++) if (a[i] != (id & 0xff)) drive_bad_workspace = 1;
  if (((uintptr_t)a | (uintptr_t)b) % 64) drive_bad_workspace = 1;
  if (cvmc_free_workspace(1, 0, b) || cvmc_free_workspace(1, 0, a)) drive_bad_workspace = 1;
  return id == drive_fail_id ? 7 : 0;
}

int drive_launch(int num_task, int fail_id, int stall_ms, int* counts, int* by_caller,
                 int* num_task_seen, int* bad_workspace) {
  memset(drive_counts, 0, sizeof(drive_counts));
  memset(drive_by_caller, 0, sizeof(drive_by_caller));
  drive_num_task = -1;
  drive_fail_id = fail_id;
  drive_stall_ms = stall_ms;
  drive_stalled = 0;
  drive_bad_workspace = 0;
  drive_caller = pthread_self();
  int r = cvmc_parallel_launch(drive_task, NULL, num_task);
  memcpy(counts, drive_counts, sizeof(drive_counts));
  memcpy(by_caller, drive_by_caller, sizeof(drive_by_caller));
  *num_task_seen = drive_num_task;
  *bad_workspace = drive_bad_workspace;
  return r;
}

static int drive_inner(int id, TVMParallelGroupEnv* env, void* cdata) {
  *(int*)cdata = env->num_task * 1000 + id + 1;
  return 0;
}

static int drive_outer(int id, TVMParallelGroupEnv* env, void* cdata) {
  (void)env;
  return cvmc_parallel_launch(drive_inner, (int*)cdata + id, 0);
}

int drive_nested(int num_task, int* out) {
  return cvmc_parallel_launch(drive_outer, out, num_task);
}

int drive_barrier(void) { return cvmc_parallel_barrier(0, NULL); }
void* drive_alloc(uint64_t n) { return cvmc_alloc_workspace(1, 0, n, 0, 8); }
int drive_free(void* p) { return cvmc_free_workspace(1, 0, p); }
int drive_workers(void) { return pool.started; }

uint64_t drive_mallocs(void) {
  uint64_t n = 0;
  for (cvmc_arena* a = cvmc_arenas; a; a = a->next) n += a->mallocs;
  return n;
}
"""


@pytest.fixture(scope="module")
def driver_path(tmp_path_factory) -> Path:
    """The pool and the driver above, compiled into one library (not registered with
    tvm-ffi: the process's own native runtime stays the kernels')."""
    folder = tmp_path_factory.mktemp("pool")
    (folder / "driver.c").write_text(DRIVER_C)
    subprocess.run(["gcc", "-O2", "-fPIC", "-shared", "-pthread", "-Wall", "-Werror",
                    f"-I{NATIVE_FOLDER}", str(folder / "driver.c"), "-o",
                    str(folder / "driver.so")], check=True, capture_output=True, timeout=120)
    return folder / "driver.so"


@pytest.fixture(scope="module")
def driver(driver_path):
    """The driver loaded in this process (kept loaded: ctypes never unloads it)."""
    lib = ctypes.CDLL(str(driver_path))
    lib.drive_alloc.restype = ctypes.c_void_p
    lib.drive_alloc.argtypes = [ctypes.c_uint64]
    lib.drive_free.argtypes = [ctypes.c_void_p]
    lib.drive_mallocs.restype = ctypes.c_uint64
    return lib


@pytest.fixture
def threads(driver):
    """Set the thread count of the driver's pool and of the process's native runtime."""
    def set_threads(n: int) -> None:
        driver.cvmc_set_num_threads(n)
        cvmc_runtime.set_num_threads(n)
    return set_threads


def _launch(driver, num_task=0, fail_id=-1, stall_ms=0):
    counts, by_caller = (ctypes.c_int * MAX_TASKS)(), (ctypes.c_int * MAX_TASKS)()
    seen, bad = ctypes.c_int(), ctypes.c_int()
    r = driver.drive_launch(num_task, fail_id, stall_ms, counts, by_caller,
                            ctypes.byref(seen), ctypes.byref(bad))
    return r, np.array(counts), np.array(by_caller), seen.value, bad.value


@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_every_task_runs_once_with_workspaces_of_its_own(driver, threads, n):
    threads(n)
    for num_task in (0, 5, 37):
        for _ in range(100):
            r, counts, _, seen, bad = _launch(driver, num_task)
            assert r == 0 and bad == 0
            assert seen >= 1 and (num_task == 0 or seen == num_task)
            assert np.array_equal(counts[:seen], np.ones(seen, int))
            assert not counts[seen:].any()


def test_a_stalled_worker_holds_back_only_its_own_task(driver, threads):
    """A worker stuck 300 ms in its first task: the caller claims every other task, where
    a static split would have left the worker's whole share waiting."""
    threads(2)
    r, counts, by_caller, seen, _ = _launch(driver, stall_ms=300)
    assert r == 0 and seen >= 4 and counts[:seen].sum() == seen
    assert by_caller[:seen].sum() >= seen - 1


@pytest.mark.parametrize("n", [1, 2, 3])
def test_a_failing_task_fails_the_launch(driver, threads, n):
    threads(n)
    r, counts, *_ = _launch(driver, num_task=9, fail_id=4)
    assert r == 7 and counts[:9].sum() == 9
    assert _launch(driver, num_task=9)[0] == 0


@pytest.mark.parametrize("n", [1, 2, 4])
def test_a_launch_inside_a_task_runs_inline(driver, threads, n):
    threads(n)
    out = (ctypes.c_int * 6)()
    assert driver.drive_nested(6, out) == 0
    assert list(out) == [1001] * 6  # inner launch: one task (num_task 1, id 0) per outer task


def test_barrier_is_refused(driver):
    assert driver.drive_barrier() != 0


def test_workspace_arena_is_lifo_aligned_and_stops_allocating(driver, threads):
    threads(1)
    sizes = [100, 5000, 70, 64, 1]

    def one_round(free_order):
        ptrs = [driver.drive_alloc(s) for s in sizes]
        assert all(p % 64 == 0 for p in ptrs)
        spans = sorted((p, p + s) for p, s in zip(ptrs, sizes))
        assert all(a[1] <= b[0] for a, b in itertools.pairwise(spans))  # no overlap
        for i in free_order:
            assert driver.drive_free(ptrs[i]) == 0
        return ptrs

    one_round([4, 3, 2, 1, 0])
    one_round([1, 3, 0, 4, 2])  # out of LIFO order: the frees wait, nothing leaks
    before = driver.drive_mallocs()
    first = one_round([4, 3, 2, 1, 0])
    assert one_round([0, 2, 4, 1, 3]) == first  # the arena is empty again after each round
    assert driver.drive_mallocs() == before


def _python(code: str, timeout: int = 240) -> subprocess.CompletedProcess:
    """`code` in a fresh interpreter (a crash or a hang is a failure, not a dead pytest)."""
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, timeout=timeout, check=False,
                          env={**os.environ, "TVM_NUM_THREADS": "3"})


def test_unloading_stops_the_workers(driver_path):
    """dlopen, launch (3 threads: 2 workers start), dlclose, many times: the destructor joins
    the workers before their code is unmapped."""
    done = _python(f"""
        import ctypes, os
        dl = ctypes.CDLL(None)
        dl.dlopen.restype, dl.dlopen.argtypes = ctypes.c_void_p, [ctypes.c_char_p, ctypes.c_int]
        dl.dlsym.restype, dl.dlsym.argtypes = ctypes.c_void_p, [ctypes.c_void_p, ctypes.c_char_p]
        dl.dlclose.argtypes = [ctypes.c_void_p]
        nested = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int, ctypes.POINTER(ctypes.c_int))
        start = len(os.listdir("/proc/self/task"))
        for _ in range(50):
            h = dl.dlopen({str(driver_path)!r}.encode(), 2)
            out = (ctypes.c_int * 8)()
            assert nested(dl.dlsym(h, b"drive_nested"))(8, out) == 0 and list(out) == [1001] * 8
            workers = ctypes.CFUNCTYPE(ctypes.c_int)(dl.dlsym(h, b"drive_workers"))()
            assert workers == 2, workers
            assert dl.dlclose(h) == 0
            assert len(os.listdir("/proc/self/task")) == start
        print("ok")
        """)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr


def test_a_forked_child_makes_its_own_pool(driver_path):
    done = _python(f"""
        import ctypes, os
        lib = ctypes.CDLL({str(driver_path)!r})
        def check():
            out = (ctypes.c_int * 8)()
            return lib.drive_nested(8, out) == 0 and list(out) == [1001] * 8
        assert check() and lib.drive_workers() == 2
        pid = os.fork()
        if pid == 0:
            os._exit(0 if check() and lib.drive_workers() == 2 else 1)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0 and check()
        print("ok")
        """, timeout=60)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr


# ---------------------------------------------------------------- real kernels

@pytest.fixture(scope="module")
def conv_model(tmp_path_factory):
    """(artifact, input, reference outputs) of a 3x3 conv whose kernel runs parallel loops
    and takes workspaces inside them."""
    rng = np.random.default_rng(20)
    x = rng.integers(-127, 128, (1, 32, 28, 28)).astype(np.int8)
    w = rng.integers(-127, 128, (32, 32, 3, 3)).astype(np.int8)
    g = one_op_graph("conv2d", [(x, 8), (w, 8)], {"padding": [1, 1]}, weights=(1,))
    path = tmp_path_factory.mktemp("conv") / "conv.cvmx"
    compile_model(g, path, "llvm")
    return path, {"x0": x}, cvmc.reference_run(g, {"x0": x})


def test_kernels_give_the_reference_bits_at_any_thread_count(conv_model, threads):
    path, feeds, ref = conv_model
    model = cvmc_runtime.load(path)
    for n in (1, 2, 3, 4, 1):
        threads(n)
        for _ in range(3):
            got = model.run(feeds)
            assert all(np.array_equal(got[k], ref[k]) for k in ref), n
    stats = cvmc_runtime.pool_stats()
    assert stats["launches"] > 0 and stats["tasks"] > stats["launches"]


def test_warm_runs_allocate_nothing(conv_model, threads):
    """At 1 thread a warm run allocates nothing. At 2, which thread first meets a kernel's
    workspace size is up to the scheduler (tasks are claimed dynamically), so an arena may
    still grow in a later run, but at most twice per kernel (a block of its own, then the
    arena regrown when empty): the count is bounded, never one per task."""
    path, feeds, _ = conv_model
    model = cvmc_runtime.load(path)
    kernels = len(model.plan["kernels"])
    for count in (1, 2):
        threads(count)
        model.run(feeds)
        model.run(feeds)
        before = cvmc_runtime.pool_stats()
        for _ in range(5):
            model.run(feeds)
        after = cvmc_runtime.pool_stats()
        assert after["workspaces"] > before["workspaces"]
        assert after["mallocs"] - before["mallocs"] <= (0 if count == 1 else 2 * kernels * count)


def test_models_loaded_run_and_dropped_in_a_loop(conv_model):
    path, feeds, ref = conv_model
    np.save(path.parent / "x.npy", feeds["x0"])
    np.save(path.parent / "y.npy", ref["y0"])
    done = _python(f"""
        import gc, numpy as np, cvmc_runtime
        x, want = np.load({str(path.parent / "x.npy")!r}), np.load({str(path.parent / "y.npy")!r})
        for _ in range(20):
            m = cvmc_runtime.load({str(path)!r})
            assert np.array_equal(m.run({{"x0": x}})["y0"], want)
            del m
            gc.collect()
        print("ok")
        """)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr

"""Tensors next to PROT_NONE guard pages, and a worker process that runs kernels on them.

A kernel that reads outside its buffer may read garbage and throw it away (a `Select`
evaluates both operands): no result changes, yet the read faults in a real process when the
page it touches is unmapped. Every region `guarded` returns is an mmap with a PROT_NONE
page on each side, and the tensor lies either right after the first one ("after_guard":
any read before it faults) or ending right before the last one ("before_guard": any read
past it faults; only the < 64-byte gap that 64-byte alignment leaves is readable garbage).
Linux only (mprotect through libc).

A fault kills the process that runs the kernel, so the tests run kernels in a worker
process (`GuardWorker`, `python -m tests.guard_pages`): a killed worker fails the one test
with the kernel it was calling, and the next test starts a fresh worker.
"""
from __future__ import annotations

import ctypes
import importlib
import json
import mmap
import os
import select
import signal
import subprocess
import sys
import traceback
from pathlib import Path

import numpy as np
from cvmc_runtime.model import ALIGNMENT

PAGE = mmap.PAGESIZE
_PROT_NONE = 0  # <sys/mman.h> (the mmap module has no name for it)
PLACEMENTS = ("after_guard", "before_guard")
_TIMEOUT_S = 300  # per request: a worker that hangs fails its test instead of the session
_PROGRESS = None  # the worker's progress file (what it is doing, for a fault report)


_LIBC = ctypes.CDLL(None, use_errno=True)
_LIBC.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]


def _mprotect_none(addr: int, size: int) -> None:
    if _LIBC.mprotect(addr, size, _PROT_NONE) != 0:
        raise OSError(ctypes.get_errno(), "mprotect failed")


def guarded(nbytes: int, placement: str, garbage: np.ndarray) -> np.ndarray:
    """`nbytes` uint8 at `placement` next to a guard page; every readable byte of the
    region (the tensor included) is first filled from `garbage` (cycled)."""
    data = -(-max(nbytes, 1) // PAGE) * PAGE
    region = mmap.mmap(-1, data + 2 * PAGE, prot=mmap.PROT_READ | mmap.PROT_WRITE)
    raw = np.frombuffer(region, np.uint8)  # keeps the mapping alive while a view exists
    body = raw[PAGE:PAGE + data]
    body[:] = np.resize(garbage, data)
    _mprotect_none(raw.ctypes.data, PAGE)
    _mprotect_none(raw.ctypes.data + PAGE + data, PAGE)
    start = 0 if placement == "after_guard" else data - (-(-nbytes // ALIGNMENT) * ALIGNMENT)
    return body[start:start + nbytes]


def guarded_empty(shape, dtype, placement: str, garbage: np.ndarray) -> np.ndarray:
    """An array of `shape` and `dtype` placed by `guarded`."""
    dtype = np.dtype(dtype)
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    return guarded(nbytes, placement, garbage).view(dtype).reshape(shape)


def progress(what: str) -> None:
    """Record what the worker does next (the report names it if the worker dies)."""
    if _PROGRESS is not None:
        _PROGRESS.seek(0)
        _PROGRESS.write(what.ljust(200)[:200])
        _PROGRESS.flush()


class GuardWorker:
    """A `python -m tests.guard_pages` process, restarted after it dies."""

    def __init__(self, progress_file: Path):
        self.progress_file = progress_file
        self.proc: subprocess.Popen | None = None

    def call(self, function: str, **kwargs) -> None:
        """Run `module:function(**kwargs)` in the worker; an exception there or a fault
        raises AssertionError naming what the worker was doing."""
        self.progress_file.write_text("")
        if self.proc is None:
            self.proc = subprocess.Popen([sys.executable, "-m", "tests.guard_pages",
                                          str(self.progress_file)],
                                         stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                         text=True, cwd=Path(__file__).parent.parent)
        assert self.proc.stdin and self.proc.stdout
        self.proc.stdin.write(json.dumps({"function": function, "kwargs": kwargs}) + "\n")
        self.proc.stdin.flush()
        ready, _, _ = select.select([self.proc.stdout], [], [], _TIMEOUT_S)
        reply = self.proc.stdout.readline() if ready else ""
        if reply:
            if json.loads(reply)["error"]:
                raise AssertionError(f"worker: {json.loads(reply)['error']}")
            return
        status = self.close(wait=bool(ready))
        doing = self.progress_file.read_text().strip() or "starting"
        raise AssertionError(f"the worker died ({status}) while {doing}")

    def close(self, wait: bool = False) -> str:
        """Stop the worker (the next call starts another), after it exits by itself with
        `wait`; how it ended, in words."""
        if self.proc is None:
            return "not running"
        if wait:
            self.proc.wait()
        hung = self.proc.poll() is None
        if hung:
            self.proc.kill()
        rc = self.proc.wait()
        self.proc = None
        if hung:
            return f"no reply in {_TIMEOUT_S} s"
        return f"signal {signal.Signals(-rc).name}" if rc < 0 else f"exit status {rc}"


def _serve(progress_path: str) -> None:
    global _PROGRESS
    _PROGRESS = open(progress_path, "r+")  # noqa: SIM115 (open for the worker's lifetime)
    replies = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # whatever a kernel or library prints cannot garble the replies
    for line in sys.stdin:
        request = json.loads(line)
        module, name = request["function"].split(":")
        try:
            getattr(importlib.import_module(module), name)(**request["kwargs"])
            error = None
        except Exception:  # noqa: BLE001 (reported to the test, which fails with it)
            error = traceback.format_exc()
        replies.write(json.dumps({"error": error}) + "\n")
        replies.flush()


if __name__ == "__main__":
    # through the importable module, whose `progress` the kernel runners call
    importlib.import_module("tests.guard_pages")._serve(sys.argv[1])

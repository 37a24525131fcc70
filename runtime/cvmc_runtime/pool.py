"""The process's one native runtime: the thread pool and workspace arenas that every loaded
CPU artifact's kernels call (`native/cvmc_pool.c`), with its registration with tvm-ffi
(`native/cvmc_tvm_ffi.c`), built into one shared library and loaded once per process.

Built on first use, not when the package is installed: gcc compiles the sources (~1 s)
into `$XDG_CACHE_HOME/cvmc/runtime` (else `~/.cache/cvmc/runtime`), in a file named by the
sha256 of the sources, the gcc flags and the machine, so every later process, and every checkout
or install with the same sources, loads it without gcc. A setuptools build step would
build it only on `pip install`: an editable install whose C sources change afterwards
would keep loading the stale library, and one shared environment serves several
checkouts of different sources; a library named by its sources' hash is always theirs.

`register_pool` registers the pool with tvm-ffi, which writes it into the backend pointers
of each kernels.so it loads afterwards: `load` calls it before each kernel library it
loads (TVM, when the compiler imports it, registers its own pool in tvm-ffi too).
"""
from __future__ import annotations

import ctypes
import functools
import hashlib
import json
import os
import platform
import subprocess
import tempfile
from pathlib import Path

from cvmc_runtime.artifact import NATIVE_FOLDER
from cvmc_runtime.signature import ModelError

SOURCES = ("cvmc_pool.h", "cvmc_pool.c", "cvmc_tvm_ffi.c")
# -Bsymbolic: the library calls its own functions, whatever else the process defines.
GCC_FLAGS = ("-O2", "-fPIC", "-shared", "-pthread", "-Wl,-Bsymbolic")


def library_folder() -> Path:
    """Where the built native runtime is kept."""
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "cvmc" / "runtime"


def library_name() -> str:
    """The built library's file name: a digest of its sources, the gcc flags and the
    machine (a home folder may serve several)."""
    digest = hashlib.sha256(json.dumps([GCC_FLAGS, platform.machine()]).encode())
    for name in SOURCES:
        data = (NATIVE_FOLDER / name).read_bytes()
        digest.update(f"{name}\0{len(data)}\0".encode() + data)
    return f"libcvmc_native-{digest.hexdigest()[:32]}.so"


def _build(path: Path) -> None:
    """gcc builds the native runtime into `path` (through a temporary file in its folder,
    renamed into place: processes building it at once each rename a whole library)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".build-", suffix=".so", dir=path.parent)
        os.close(fd)
    except OSError as e:
        raise ModelError(f"cannot build the native runtime in {path.parent} ({e}); set "
                         f"XDG_CACHE_HOME to a writable folder") from None
    try:
        sources = [str(NATIVE_FOLDER / n) for n in SOURCES if n.endswith(".c")]
        try:
            done = subprocess.run(["gcc", *GCC_FLAGS, *sources, "-o", tmp],
                                  capture_output=True, text=True, timeout=300, check=False)
        except (OSError, subprocess.TimeoutExpired) as e:
            raise ModelError(f"cannot build the native runtime: gcc failed to run ({e}); "
                             f"it is built once per user on first use and needs gcc") from None
        if done.returncode != 0:
            raise ModelError(f"cannot build the native runtime with gcc: "
                             f"{done.stderr.strip()[-2000:]}")
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


@functools.cache
def native() -> ctypes.CDLL:
    """The native runtime, built if no process built it before, loaded once."""
    import tvm_ffi  # noqa: F401 (loads libtvm_ffi.so globally: the library calls it)

    path = library_folder() / library_name()
    if not path.exists():
        _build(path)
    try:
        lib = ctypes.CDLL(str(path))
    except OSError as e:
        raise ModelError(f"cannot load the native runtime {path} ({e}); delete it to have "
                         f"it rebuilt") from None
    lib.cvmc_set_num_threads.argtypes = [ctypes.c_int]
    lib.cvmc_pool_stats.argtypes = [ctypes.c_char_p, ctypes.c_size_t]
    return lib


def register_pool() -> None:
    """Make the process's pool the one tvm-ffi gives the kernel libraries it loads next."""
    if native().cvmc_tvm_ffi_register() != 0:
        raise ModelError("tvm-ffi refused the native runtime's functions")


def load_kernels(path: str | os.PathLike):
    """A CPU kernel library cvmc built (a .so), loaded with the process's pool, as `load`
    loads an artifact's: for tools and tests that call kernels themselves."""
    import tvm_ffi

    register_pool()
    return tvm_ffi.load_module(os.fspath(path))


def set_num_threads(threads: int) -> None:
    """Threads every CPU kernel of this process uses from its next call on, all loaded
    models together (one pool). Until it is called: TVM_NUM_THREADS when set, else every
    CPU this process may run on."""
    if type(threads) is not int or threads < 1:
        raise ModelError(f"threads must be a positive integer, got {threads!r}")
    native().cvmc_set_num_threads(threads)


def pool_stats() -> dict:
    """The pool's counters: parallel `launches` (and those run `inline`), `tasks` run,
    `workspaces` taken and `mallocs` for them, `workers` started, the `threads` the next
    launch uses, the `cpus` it may run on."""
    text = ctypes.create_string_buffer(1024)
    native().cvmc_pool_stats(text, len(text))
    return json.loads(text.value)

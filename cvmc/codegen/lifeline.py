"""The build workers' fork server (`cvmc.codegen.build`) imports this module first, told
its parent by `PARENT_ENV`: the server then dies with the thread that started it in the
compiling process, and each worker, by `die_with_server` (its first step), with the
server. A compile killed with SIGKILL (which runs no cleanup) so leaves no server and no
worker behind, and multiprocessing's resource tracker, once no process is left to write
to it, exits too: none of them keeps the caller's stdout or stderr open.

The kernel does the killing (`PR_SET_PDEATHSIG`), so it holds while a worker is deep in
LLVM; a process whose parent is gone before it asked (its first milliseconds) sees that
its parent is no longer the one it had, and exits.
"""
from __future__ import annotations

import ctypes
import os
import signal

# Set by the compiling process, only while it starts the server: its pid.
PARENT_ENV = "CVMC_BUILD_SERVER_PARENT"
_PR_SET_PDEATHSIG = 1


def die_with_parent(parent: int) -> None:
    """The kernel sends this process SIGKILL when the thread that forked it ends; exit now
    if that process, `parent`, has ended already."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    if os.getppid() != parent:
        os._exit(1)


def die_with_server() -> None:
    """In a worker the server forked: die with the server. (A worker of a server this
    module did not start, one the program had started before cvmc, keeps the default.)"""
    if SERVER is not None:
        die_with_parent(SERVER)


# Imported by the server first: its pid, for its workers (they inherit it), and its tie
# to its parent. (Imported by the compiling process too, where PARENT_ENV is not set.)
SERVER = None
if PARENT_ENV in os.environ:
    SERVER = os.getpid()
    die_with_parent(int(os.environ.pop(PARENT_ENV)))

"""The processes of a compile (the build workers' fork server, its workers, multiprocessing's
resource tracker) never outlive it: a compile killed with SIGKILL leaves none, and the
caller reading its output gets EOF; Ctrl-C (SIGINT to the whole process group, as a
terminal sends it) exits 130 with one quiet line, at any moment of the build (issue 29,
item 7)."""
from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.test_cli_robustness import ROOT, conv_chain

LAYERS = 24


@pytest.fixture(scope="module")
def many_kernels(tmp_path_factory) -> Path:
    """LAYERS conv kernels, each its own (each shifts by another amount): enough for build
    workers at CVMC_JOBS=2."""
    return conv_chain(tmp_path_factory.mktemp("many") / "graph.nnef", LAYERS, lambda i: i + 1)


def session(sid: int) -> dict[int, tuple[int, bytes]]:
    """{pid: (parent pid, command line)} of the live (not zombie) processes of session
    `sid`: the compile started as its leader and every process it started."""
    found = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
            cmdline = (stat.parent / "cmdline").read_bytes()
        except OSError:  # gone meanwhile
            continue
        state, ppid, _, process_sid = text[text.rindex(")") + 2:].split()[:4]
        if int(process_sid) == sid and state != "Z":
            found[int(stat.parent.name)] = (int(ppid), cmdline)
    return found


def start_compile(model: Path, tmp_path: Path) -> subprocess.Popen:
    """`cvmc compile MODEL` with an empty kernel cache and two jobs, leading a session of
    its own (so that the test finds every process it starts, and signals them all as a
    terminal would)."""
    env = {**os.environ, "CVMC_JOBS": "2", "CVMC_CACHE_DIR": str(tmp_path / "cache"),
           "PYTHONPATH": os.pathsep.join(sys.path)}
    return subprocess.Popen([sys.executable, "-m", "cvmc.cli", "compile", str(model), "-o",
                             str(tmp_path / "m.cvmx")], env=env, cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True)


def catches_interrupt(pid: int) -> bool:
    """True if process `pid` has a handler for SIGINT (Python's, which raises
    KeyboardInterrupt: a Python process past its start and not ignoring Ctrl-C)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    caught = next(line.split()[1] for line in status.splitlines() if line.startswith("SigCgt:"))
    return bool(int(caught, 16) & (1 << (signal.SIGINT - 1)))


def wait_for(proc: subprocess.Popen, stage: str, timeout: float = 120) -> bool:
    """Wait until the compile's fork server is importing TVM (`stage` "server": it has
    started Python, whose handler makes Ctrl-C a KeyboardInterrupt until the server
    ignores it) or has forked a worker ("worker"); False if the compile ended first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        servers = [(pid, ppid) for pid, (ppid, cmd) in session(proc.pid).items()
                   if b"multiprocessing.forkserver" in cmd]
        if stage == "server" and any(ppid == proc.pid and catches_interrupt(pid)
                                     for pid, ppid in servers):
            return True
        if stage == "worker" and len(servers) >= 2:
            return True
        time.sleep(0.01)
    return False


def read_to_eof(fd: int, timeout: float) -> bool:
    """Read `fd` until EOF: True if it came within `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while (left := deadline - time.monotonic()) > 0:
        if select.select([fd], [], [], left)[0] and not os.read(fd, 65536):
            return True
    return False


def no_process_left(sid: int, timeout: float) -> dict:
    """{} once no process of session `sid` is alive (within `timeout` s), else those left."""
    deadline = time.monotonic() + timeout
    while (left := session(sid)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return left


def test_killed_compile_leaves_no_process_and_its_output_ends(tmp_path, many_kernels):
    proc = start_compile(many_kernels, tmp_path)
    try:
        if not wait_for(proc, "worker"):
            pytest.skip("the compile finished before a worker started")
        proc.kill()
        assert read_to_eof(proc.stdout.fileno(), 10)  # no helper holds the pipe open
        assert read_to_eof(proc.stderr.fileno(), 10)
        assert proc.wait(10) == -signal.SIGKILL
        assert no_process_left(proc.pid, 5) == {}
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # what the test started and a bug left
        except ProcessLookupError:
            pass
        proc.communicate()


@pytest.mark.parametrize("stage", ["server", "worker"])
def test_interrupted_build_exits_130_quietly(tmp_path, many_kernels, stage):
    """Ctrl-C while the fork server imports TVM (early in a build) or while a worker builds
    a kernel: exit 130, `cvmc: interrupted` alone (no traceback from any process, no
    semaphore left for the resource tracker to report), and no process left."""
    proc = start_compile(many_kernels, tmp_path)
    try:
        if not wait_for(proc, stage):
            pytest.skip(f"the compile finished before its {stage} started")
        os.killpg(proc.pid, signal.SIGINT)
        _, err = proc.communicate(timeout=120)
        if proc.returncode == 0:
            pytest.skip("the compile finished before the signal")
        assert proc.returncode == 130, err
        assert err.decode().strip() == "cvmc: interrupted"
        assert no_process_left(proc.pid, 5) == {}
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.communicate()

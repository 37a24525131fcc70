"""User mistakes at the command line: one `error:` line, exit 1, never a traceback; model
names never become paths outside the output folder; outputs are written atomically;
Ctrl-C / SIGTERM exit 130 and leave no temporary file (issue 9, items 4, 9, 10, 12)."""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import cvmc_runtime
import numpy as np
import pytest

from cvmc.cli import main

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "small_cnn"
DATA = EXAMPLE / "data.npy"


def one_error_line(capsys, *argv: str) -> str:
    """Run `cvmc ARGV`: exit code 1, exactly one line on stderr starting with 'error:'."""
    capsys.readouterr()
    assert main([str(a) for a in argv]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error:") and err.count("\n") == 1 and "Traceback" not in err, err
    return err


@pytest.fixture(scope="module")
def artifact(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("art") / "m.cvmx"
    assert main(["compile", str(EXAMPLE), "-o", str(path)]) == 0
    return path


# ---- item 10: paths the user names -------------------------------------------------------
def test_output_into_missing_folder_or_onto_folder(tmp_path, capsys):
    err = one_error_line(capsys, "compile", EXAMPLE, "-o", tmp_path / "nope" / "m.cvmx")
    assert "does not exist" in err
    assert "is a folder" in one_error_line(capsys, "compile", EXAMPLE, "-o", tmp_path)


def test_emit_destinations_are_checked_before_compiling(tmp_path, capsys):
    (tmp_path / "m.tir").mkdir()
    err = one_error_line(capsys, "compile", EXAMPLE, "-o", tmp_path / "m.cvmx", "--emit", "tir")
    assert "m.tir: is a folder" in err
    assert not (tmp_path / "m.cvmx").exists()  # nothing left behind
    err = one_error_line(capsys, "compile", EXAMPLE, "-o", tmp_path / "x.tir", "--emit", "tir")
    assert "also the artifact" in err  # item 12: would overwrite the artifact


def test_dump_ir_output_dir_and_export_onto_files(tmp_path, artifact, capsys):
    file = tmp_path / "f"
    file.write_text("x")
    assert "not a folder" in one_error_line(capsys, "compile", EXAMPLE, "-o", tmp_path / "m.cvmx",
                                            "--dump-ir", file)
    assert "not a folder" in one_error_line(capsys, "run", artifact, "--input", f"data={DATA}",
                                            "--output-dir", file)
    assert "not a folder" in one_error_line(capsys, "export", EXAMPLE, "-o", file)
    (tmp_path / "exp" / "params").mkdir(parents=True)
    assert "is a folder" in one_error_line(capsys, "export", EXAMPLE, "-o", tmp_path / "exp")


def test_bad_npy_inputs(tmp_path, artifact, capsys):
    empty = tmp_path / "empty.npy"
    empty.write_bytes(b"")
    huge = tmp_path / "huge.npy"
    with open(huge, "wb") as f:  # a header claiming 2^40 elements, and no data
        np.lib.format.write_array_header_1_0(
            f, {"descr": "|i1", "fortran_order": False, "shape": (1 << 20, 1 << 20)})
    assert "cannot read" in one_error_line(capsys, "run", artifact, "--input", f"data={empty}")
    t0 = time.perf_counter()
    assert "1099511627776 bytes" in one_error_line(capsys, "run", artifact, "--input",
                                                      f"data={huge}")
    assert time.perf_counter() - t0 < 5
    err = one_error_line(capsys, "run", artifact, "--input", f"data={DATA}", "--input",
                         f"data={DATA}")
    assert "given twice" in err  # item 12


# ---- item 4: output names never become paths ----------------------------------------------
@pytest.fixture(scope="module")
def cvm_json(tmp_path_factory) -> Path:
    """The example exported as a CVM-Runtime graph JSON (+ params)."""
    folder = tmp_path_factory.mktemp("cvm")
    assert main(["export", str(EXAMPLE), "-o", str(folder)]) == 0
    return folder


@pytest.mark.parametrize("name", ["/abs/path", "../../x", "a/b", "..", "nul\0byte", "back\\x"])
def test_output_names_must_be_plain_file_names(tmp_path, cvm_json, capsys, name):
    """A CVM-Runtime graph may name its output anything; the compiled artifact (its plan
    and its library agree on the name) runs, but the name never becomes a path."""
    shutil.copytree(cvm_json, tmp_path / "cvm")
    doc = json.loads((tmp_path / "cvm" / "symbol.json").read_text())
    doc["nodes"][-1]["name"] = name
    (tmp_path / "cvm" / "symbol.json").write_text(json.dumps(doc))
    compiled = tmp_path / "named.cvmx"
    assert main(["compile", str(tmp_path / "cvm" / "symbol.json"), "-o", str(compiled)]) == 0
    out = tmp_path / "deep" / "out"
    err = one_error_line(capsys, "run", compiled, "--input", f"data={DATA}", "--output-dir",
                         out)
    assert "plain file name" in err
    assert [p for p in tmp_path.rglob("*.npy")] == []  # nothing written anywhere


def test_reference_run_of_a_json_model_with_a_path_for_a_name(tmp_path, capsys):
    """The same rule on the reference path: a CVM-Runtime node named '../escape'."""
    assert main(["export", str(EXAMPLE), "-o", str(tmp_path / "cvm")]) == 0
    doc = json.loads((tmp_path / "cvm" / "symbol.json").read_text())
    doc["nodes"][-1]["name"] = "../escape"
    (tmp_path / "cvm" / "symbol.json").write_text(json.dumps(doc))
    err = one_error_line(capsys, "run", "--reference", tmp_path / "cvm" / "symbol.json",
                         "--input", f"data={DATA}", "--output-dir", tmp_path / "out")
    assert "plain file name" in err and not (tmp_path / "escape.npy").exists()


# ---- item 9: atomic writes, interrupts ------------------------------------------------------
def test_outputs_are_written_and_no_temporary_files_remain(tmp_path, artifact):
    assert main(["run", str(artifact), "--input", f"data={DATA}", "--output-dir",
                 str(tmp_path / "out")]) == 0
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["logits.npy"]


def _compile_process(model: Path, output: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "cvmc.cli", "compile", str(model), "-o",
                             str(output)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


def conv_chain(path: Path, layers: int, shift_bit) -> Path:
    """An NNEF graph of `layers` conv kernels, 1x1 on [1, 8, 8, 8], layer i shifting right
    by `shift_bit(i)` bits (kernels alike where the shifts are), written at `path`."""
    lines = ["version 1.0;", "graph deep( data ) -> ( out )", "{",
             "    data = external<integer>(shape = [1, 8, 8, 8], precision = 8);"]
    prev = "data"
    for i in range(layers):
        lines += [f"    w{i} = constant<integer>(shape = [8, 8, 1, 1], value = [{i % 5 - 2}]);",
                  f"    c{i} = conv2d({prev}, w{i});",
                  f"    s{i} = cvm_right_shift(c{i}, precision = 8, shift_bit = {shift_bit(i)});"]
        prev = f"s{i}"
    path.write_text("\n".join([*lines, f"    out = relu({prev});", "}", ""]))
    return path


@pytest.fixture(scope="module")
def slow_model(tmp_path_factory) -> Path:
    """12 conv kernels: a compile of several seconds, long enough to interrupt."""
    return conv_chain(tmp_path_factory.mktemp("slow") / "graph.nnef", 12, lambda i: 4)


def _wait_for_signal_handlers(proc: subprocess.Popen, timeout: float = 60) -> None:
    """Wait until `proc` catches SIGINT and SIGTERM (the CLI installs its handlers after
    its imports): the caught-signal mask in /proc/PID/status has both bits."""
    wanted = (1 << (signal.SIGINT - 1)) | (1 << (signal.SIGTERM - 1))
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            status = Path(f"/proc/{proc.pid}/status").read_text()
        except FileNotFoundError:  # it has exited meanwhile
            return
        caught = int(next(line.split()[1] for line in status.splitlines()
                          if line.startswith("SigCgt:")), 16)
        if caught & wanted == wanted:
            return
        time.sleep(0.02)


@pytest.mark.parametrize("sig, code", [(signal.SIGINT, 130), (signal.SIGTERM, 130),
                                       (signal.SIGKILL, -9)])
def test_interrupted_compile_keeps_the_old_artifact(tmp_path, artifact, slow_model, sig, code):
    target = tmp_path / "m.cvmx"
    shutil.copy(artifact, target)
    before = target.read_bytes()
    proc = _compile_process(slow_model, target)
    _wait_for_signal_handlers(proc)  # past the imports (even on a loaded machine)
    time.sleep(0.5)  # inside the passes or the build; the artifact is written last
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=120)
    if proc.returncode == 0:
        pytest.skip("the compile finished before the signal")
    assert proc.returncode == code, err
    if code == 130:
        assert err.strip() == "cvmc: interrupted" and "Traceback" not in err
    assert target.read_bytes() == before
    cvmc_runtime.load(target)
    leftovers = [p.name for p in tmp_path.iterdir() if p.name != "m.cvmx"]
    assert leftovers == [] or sig == signal.SIGKILL, leftovers


def test_concurrent_compiles_to_one_path_each_leave_a_complete_artifact(tmp_path):
    target = tmp_path / "m.cvmx"
    procs = [_compile_process(EXAMPLE, target) for _ in range(2)]
    for p in procs:
        p.communicate(timeout=300)
        assert p.returncode == 0
    model = cvmc_runtime.load(target)
    x = np.load(DATA)
    assert model.run({"data": x})["logits"].shape == (1, 10)
    assert [p.name for p in tmp_path.iterdir()] == ["m.cvmx"]


def test_atomic_write_leaves_nothing_when_the_writer_fails(tmp_path):
    from cvmc_runtime.fileio import atomic_write

    (tmp_path / "f").write_bytes(b"old")

    def fail(f):
        f.write(b"partial")
        raise RuntimeError("disk full")
    with pytest.raises(RuntimeError):
        atomic_write(tmp_path / "f", fail)
    assert (tmp_path / "f").read_bytes() == b"old" and os.listdir(tmp_path) == ["f"]

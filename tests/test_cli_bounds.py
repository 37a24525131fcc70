"""Bounds, boundaries and silent acceptance at the command line (issue 29, items 5, 6, 8
and 9): every `.npy` a user names is bounded in bytes and checked against its header
before anything is allocated, shapes are checked before any conversion, eval refuses
labels that are no class and names bad data by its index in the dataset, and a
quantization.json is never read through a link that leaves the model folder. Each CLI
case runs as a child process: exit code 1, one `error:` line, no traceback."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import cvmc_runtime
import numpy as np
import pytest
from cvmc_runtime import MAX_NPY_BYTES, ModelError

import cvmc
from cvmc.cli import main
from cvmc.errors import CvmcError
from tests.quantize.tiny import write_quantized

# A float conv for `cvmc quantize` (input [1, 1, 4, 4]).
FLOAT_CONV = """version 1.0;

graph g( x ) -> ( y )
{
    x = external<scalar>(shape = [1, 1, 4, 4]);
    w = constant<scalar>(shape = [2, 1, 1, 1], value = [0.5, -1.0]);
    y = conv(x, w);
}
"""
# The child's peak memory is measured by a parent that does nothing else.
_MEASURED = ("import resource, subprocess, sys\n"
             "p = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,"
             " text=True)\n"
             "sys.stderr.write(p.stderr)\n"
             "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)\n"
             "sys.exit(p.returncode)\n")


def cvmc_error(*argv) -> tuple[str, int]:
    """`cvmc ARGV` in a child process that must exit 1 with one `error:` line and no
    traceback: (that line, the child's peak resident memory in MiB)."""
    p = subprocess.run([sys.executable, "-c", _MEASURED, sys.executable, "-m", "cvmc.cli",
                        *map(str, argv)], capture_output=True, text=True, check=False,
                       timeout=300)
    assert p.returncode == 1, (p.returncode, p.stderr)
    assert p.stderr.startswith("error:") and p.stderr.count("\n") == 1, p.stderr
    assert "Traceback" not in p.stderr
    return p.stderr, int(p.stdout) // 1024


@pytest.fixture(scope="module")
def d(tmp_path_factory) -> Path:
    """q.cvmx (the tiny quantized dense layer, x [2, 4] with a scale, 3 classes), the float
    conv folder `fc`, and small valid data."""
    d = tmp_path_factory.mktemp("bounds")
    assert main(["compile", str(write_quantized(d / "q")), "-o", str(d / "q.cvmx")]) == 0
    (d / "fc").mkdir()
    (d / "fc" / "graph.nnef").write_text(FLOAT_CONV)
    np.save(d / "x.npy", np.ones((5, 4), np.float32))
    np.save(d / "labels.npy", np.zeros(5, np.int64))
    return d


def npy_header(path: Path, descr: str, shape: tuple, data_bytes: int) -> Path:
    """A .npy header declaring `shape` of `descr`, followed by `data_bytes` bytes (a hole:
    no disk and no memory, whatever the header claims)."""
    with open(path, "wb") as f:
        np.lib.format.write_array_header_1_0(
            f, {"descr": descr, "fortran_order": False, "shape": shape})
        f.truncate(f.tell() + data_bytes)
    return path


def entry_points(d: Path, file: Path) -> dict[str, list]:
    """Each command reading `file` as the array a user names."""
    return {"run --input": ["run", d / "q.cvmx", "--input", f"x={file}"],
            "bench --input": ["bench", d / "q.cvmx", "--input", f"x={file}", "--repeat", "1"],
            "eval --data": ["eval", d / "q.cvmx", "--data", file, "--compare", d / "q.cvmx"],
            "eval --labels": ["eval", d / "q.cvmx", "--data", d / "x.npy", "--labels", file],
            "quantize --calib": ["quantize", d / "fc", "-o", d / "out", "--calib", f"x={file}"]}


ENTRY_POINTS = ["run --input", "bench --input", "eval --data", "eval --labels",
                "quantize --calib"]


# ---- item 5: bytes, not elements; the header against the file; shapes before conversion ----
@pytest.mark.parametrize("entry", ENTRY_POINTS)
def test_a_header_claiming_gigabytes_on_a_tiny_file_allocates_nothing(d, entry):
    # 6 GiB of float64 (805M elements: under the old 2^30-element bound), no data
    six = npy_header(d / "six.npy", "<f8", (6 << 27,), 0)
    err, peak = cvmc_error(*entry_points(d, six)[entry])
    assert f"declares float64 [805306368], 6442450944 bytes: more than the {MAX_NPY_BYTES}" \
        in err and peak < 300
    # under the bound, but the file holds less than its header declares
    three = npy_header(d / "three.npy", "<i8", (3 << 27,), 1000)
    err, peak = cvmc_error(*entry_points(d, three)[entry])
    assert "holds 1000 bytes of data, but its header declares int64 [402653184], " \
        "3221225472 bytes" in err and peak < 300


def test_a_real_file_over_the_bound_is_not_read(d):
    big = npy_header(d / "big.npy", "<f8", (5 << 27,), 5 << 30)  # 5 GiB, all of it there
    err, peak = cvmc_error(*entry_points(d, big)["run --input"])
    assert "5368709120 bytes: more than the" in err and peak < 300


@pytest.mark.parametrize("entry, words", [
    ("run --input", "input 'x': expected shape [2, 4], got [2097152, 4, 4]"),
    ("bench --input", "input 'x': expected shape [2, 4], got [2097152, 4, 4]"),
    ("eval --data", "data of shape [2097152, 4, 4] does not hold samples of input 'x'"),
    ("quantize --calib", "expected samples of shape [N, 1, 1, 4, 4] with real values"),
])
def test_a_large_input_of_the_wrong_shape_is_refused_before_any_conversion(d, entry, words):
    """128 MiB of float32 in the wrong shape: read (once), never copied to float64 (that
    took 14 times the file's size before)."""
    wrong = npy_header(d / "wrong.npy", "<f4", (1 << 21, 4, 4), 128 << 20)
    err, peak = cvmc_error(*entry_points(d, wrong)[entry])
    assert words in err and peak < 256, (err, peak)


def test_a_fifo_is_refused_not_waited_on(d, tmp_path):
    os.mkfifo(tmp_path / "in.npy")  # nothing ever writes it: opening it would block
    err, _ = cvmc_error("run", d / "q.cvmx", "--input", f"x={tmp_path / 'in.npy'}")
    assert "cannot read" in err and "(not a regular file)" in err


def test_model_run_checks_a_float_input_shape_before_quantizing(d):
    # a stride-0 view: 2^36 floats in no memory; quantizing would need 512 GiB
    huge = np.broadcast_to(np.float32(1), (1 << 34, 4))
    with pytest.raises(ModelError, match=r"input 'x': expected shape \[2, 4\], got "):
        cvmc_runtime.load(d / "q.cvmx").run({"x": huge})


def test_weights_are_read_by_the_same_reader(d, tmp_path):
    import zipfile
    with zipfile.ZipFile(d / "q.cvmx") as z:
        members = {n: z.read(n) for n in z.namelist()}
    weight = next(n for n in members if n.startswith("weights/"))
    members[weight] = members[weight][:-4]  # the header unchanged, the data short
    with zipfile.ZipFile(tmp_path / "cut.cvmx", "w") as z:
        for name, blob in members.items():
            z.writestr(name, blob)
    with pytest.raises(ModelError, match=f"member '{weight}' holds .* bytes of data, but "
                                         f"its header declares"):
        cvmc_runtime.load(tmp_path / "cut.cvmx")


# ---- item 6: boundary faults -----------------------------------------------------------------
def test_eval_of_a_zero_d_array(d):
    np.save(d / "scalar.npy", np.float32(1))
    err, _ = cvmc_error("eval", d / "q.cvmx", "--data", d / "scalar.npy", "--labels",
                        d / "labels.npy")
    assert "--data: a 0-d array holds no samples" in err


@pytest.mark.parametrize("argument, words", [
    ({"quantization": 42}, "compile: quantization must be a quantization.json path or"),
    ({"quantization": b"q.json"}, "compile: quantization must be"),
    ({"jobs": 0}, "compile: jobs must be an integer >= 1, got 0"),
    ({"jobs": "2"}, "compile: jobs must be an integer >= 1"),
    ({"mcpu": 7}, "compile: mcpu must be a CPU name, got 7"),
    ({"arch": 80}, "compile: arch must be a CUDA arch"),
    ({"cache": "no"}, "compile: cache must be True or False"),
    ({"output": 3}, "compile: output must be a path, or None for the result alone, got 3"),
    ({"graph": "examples/small_cnn"}, "compile: graph must be a Graph"),
])
def test_compile_arguments_are_checked_before_any_work(d, argument, words):
    graph = cvmc.load_graph(d / "q")
    kwargs = {"graph": graph, "output": d / "api.cvmx", **argument}
    with pytest.raises(CvmcError, match=words):
        cvmc.compile(**kwargs)
    assert not (d / "api.cvmx").exists()


@pytest.mark.parametrize("call, words", [
    (lambda: cvmc.load_graph(42), "load_graph: path must be a path, got 42"),
    (lambda: cvmc.load_graph("m", quant=1), "load_graph: quant must be a path"),
    (lambda: cvmc.reference_run(None, {}), "reference_run: graph must be a Graph"),
    (lambda: cvmc.print_graph("g"), "print_graph: graph must be a Graph"),
    (lambda: cvmc.GraphBuilder("g").build(42), "build: outputs must be a Var or a list"),
])
def test_other_public_functions_check_their_arguments(call, words):
    with pytest.raises(CvmcError, match=words):
        call()


@pytest.mark.parametrize("call, words", [
    (lambda d: cvmc_runtime.check_inputs(cvmc_runtime.load(d / "q.cvmx").inputs,
                                         {"x": np.zeros((2, 4), np.int8)}, saturate="no"),
     "saturate must be True or False, got 'no'"),
    (lambda d: cvmc_runtime.read_npy(42, "--data"), "--data: expected a path or bytes"),
    (lambda d: cvmc_runtime.read_npy(d / "x.npy", "--data", "4G"), "an integer max_bytes"),
    (lambda d: cvmc_runtime.predict(d / "q.cvmx", [[1.0, 2.0, 3.0, 4.0]]),
     "data must be a NumPy array of samples, got list"),
])
def test_runtime_functions_check_their_arguments(d, call, words):
    with pytest.raises(ModelError, match=words):
        call(d)


def test_a_numpy_scale_is_a_number():
    assert cvmc_runtime.quantize("x", [0.5], np.float32(4.0), 8).tolist() == [2]
    assert cvmc_runtime.dequantize(np.array([2]), np.int64(4)).tolist() == [0.5]


def test_reference_run_checks_saturate(d):
    with pytest.raises(CvmcError, match="reference_run: saturate must be True or False"):
        cvmc.reference_run(cvmc.load_graph(d / "q"), {"x": np.zeros((2, 4), np.int8)},
                           saturate="yes")


def _strict(text: str) -> object:
    def refuse(constant):
        raise AssertionError(f"not JSON: {constant}")
    return json.loads(text, parse_constant=refuse)


def test_report_json_is_strict_json_on_all_zero_data(d, tmp_path):
    np.save(tmp_path / "zeros.npy", np.zeros((3, 1, 1, 4, 4), np.float32))
    assert main(["quantize", str(d / "fc"), "-o", str(tmp_path / "q"), "--calib",
                 f"x={tmp_path / 'zeros.npy'}", "--report-json",
                 str(tmp_path / "report.json")]) == 0
    report = _strict((tmp_path / "report.json").read_text())
    # the integer layer is exact (+inf dB): null, with max_abs_error 0; quantizing it
    # changes no output (+inf dB): null; an 8-bit output (the default --output-bits)
    assert report == {"samples": 3, "sensitivity_samples": 3, "layers": [
        {"layer": "y", "op": "conv", "precision": 8, "dtype": "int8", "sqnr_db": None,
         "max_abs_error": 0.0, "sensitivity_db": None, "sensitivity_rank": 1}]}
    _strict((tmp_path / "q" / "quantization.json").read_text())


# ---- item 8: no quantization.json through a link that leaves the folder ----------------------
def test_quantization_json_through_a_link_out_of_the_folder_is_refused(d, tmp_path):
    outside = tmp_path / "elsewhere.json"
    outside.write_text(json.dumps({"inputs": {"x": {"scale": 3.0, "precision": 8}}}))
    folder = write_quantized(tmp_path / "m", None)
    (folder / "quantization.json").symlink_to(outside)
    for model in (folder, folder / "graph.nnef"):
        err, _ = cvmc_error("compile", model, "-o", tmp_path / "m.cvmx")
        assert "quantization file" in err and "resolves outside the model folder" in err
    assert not (tmp_path / "m.cvmx").exists()
    # a link that stays inside the folder is read
    (folder / "scales.json").write_text(outside.read_text())
    (folder / "quantization.json").unlink()
    (folder / "quantization.json").symlink_to("scales.json")
    assert main(["compile", str(folder), "-o", str(tmp_path / "m.cvmx")]) == 0
    assert cvmc_runtime.load(tmp_path / "m.cvmx").inputs[0].scale == 3.0


# ---- item 9: labels that are no class; bad data named by its index in the dataset -----------
@pytest.mark.parametrize("label, index", [(99, 3), (-1, 0), (3, 4)])
def test_eval_labels_outside_the_classes_are_refused(d, label, index):
    labels = np.zeros(5, np.int64)
    labels[index] = label
    np.save(d / "bad_labels.npy", labels)
    err, _ = cvmc_error("eval", d / "q.cvmx", "--data", d / "x.npy", "--labels",
                        d / "bad_labels.npy")
    assert f"--labels: label {label} at index {index} is not a class of {d / 'q.cvmx'}, " \
        f"whose output 'y' has 3 classes (0..2)" in err


def test_bad_data_is_named_by_its_index_in_the_dataset(d):
    x = np.zeros((1000, 4), np.float32)
    x[900, 1] = np.nan
    np.save(d / "nan.npy", x)
    err, _ = cvmc_error("eval", d / "q.cvmx", "--data", d / "nan.npy", "--compare",
                        d / "q.cvmx", "--workers", "2")
    assert "data: NaN at index [900, 1] (sample 900) cannot be quantized" in err
    q = np.zeros((1000, 4), np.int32)
    q[901, 2] = 200
    with pytest.raises(ModelError, match=r"data: 200 at index \[901, 2\] \(sample 901\) is "
                                         r"outside the precision 8 of input 'x'"):
        cvmc_runtime.predict(d / "q.cvmx", q)

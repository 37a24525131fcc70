"""Float at the boundary of a quantized artifact (issue 19 item 4): `cvmc compile` records
quantization.json's scales in the plan, the runtime quantizes float inputs by the one rule
and dequantizes outputs on request; integer inputs work as before."""
from __future__ import annotations

import copy
import io
import json
import math
import re
import zipfile

import cvmc_runtime
import numpy as np
import pytest
from cvmc_runtime import ModelError
from cvmc_runtime.plan import validate_plan

import cvmc
from cvmc.cli import main
from cvmc.codegen.quantization import check_quantization
from cvmc.frontend import load_checked
from cvmc.frontend.container import quantization_file
from tests.quantize.tiny import (
    QUANTIZATION,
    X_SCALE,
    Y_SCALE,
    W,
    quantized_logits,
    rule,
    write_quantized,
)

# Halves (0.25 * 10 = 2.5 exactly) round away from zero; 0.35 is 0.3499999940... as a
# float32, so 3.4999... rounds down; -20 and 13 saturate at -127 and 127.
X = np.array([[0.25, -0.25, 0.35, -20.0], [13.0, 0.04, -0.05, 0.0]], np.float32)


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory):
    """The tiny quantized model compiled by `cvmc compile` (which finds its
    quantization.json), and the same graph compiled without scales."""
    d = tmp_path_factory.mktemp("boundary")
    assert main(["compile", str(write_quantized(d / "q")), "-o", str(d / "q.cvmx"),
                 "--emit", "plan"]) == 0
    assert main(["compile", str(write_quantized(d / "plain", None)), "-o",
                 str(d / "plain.cvmx")]) == 0
    return d


def test_float_inputs_are_quantized_by_the_rule(artifacts):
    model = cvmc_runtime.load(artifacts / "q.cvmx")
    q = rule(X, X_SCALE, 8)
    assert q.tolist() == [[3, -3, 3, -127], [127, 0, -1, 0]]  # by hand
    got = model.run({"x": X})["y"]
    assert got.dtype == np.int32 and np.array_equal(got, q @ W.T)
    # float64 and nested lists are reals too
    assert np.array_equal(model.run({"x": X.astype(np.float64).tolist()})["y"],
                          rule(X.astype(np.float64), X_SCALE, 8) @ W.T)


def test_dequantize_returns_reals(artifacts):
    model = cvmc_runtime.load(artifacts / "q.cvmx")
    got = model.run({"x": X}, dequantize=True)["y"]
    assert got.dtype == np.float32
    assert np.array_equal(got, (quantized_logits(X) / Y_SCALE).astype(np.float32))
    assert got[0, 0] == np.float32(-502 / 40)  # 3*1 - 3*2 + 3*3 - 127*4, by hand


def test_integer_inputs_are_unchanged(artifacts):
    scaled, plain = (cvmc_runtime.load(artifacts / f) for f in ("q.cvmx", "plain.cvmx"))
    x = np.array([[1, -2, 3, 127], [-127, 0, 5, 9]], np.int8)
    for model in (scaled, plain):
        assert np.array_equal(model.run({"x": x})["y"], x.astype(np.int64) @ W.T)
        with pytest.raises(ModelError, match=r"value 128 at index \[0, 0\] is outside"):
            model.run({"x": np.full((2, 4), 128, np.int32)})
        assert np.array_equal(model.run({"x": np.full((2, 4), 300)}, saturate=True)["y"],
                              np.full((2, 4), 127) @ W.T)


def test_the_scales_are_exposed(artifacts):
    model = cvmc_runtime.load(artifacts / "q.cvmx")
    assert [(s.name, s.scale) for s in model.inputs + model.outputs] == \
        [("x", X_SCALE), ("y", Y_SCALE)]
    plan = json.loads((artifacts / "q.plan.json").read_text())
    assert plan["inputs"][0]["scale"] == X_SCALE and plan["outputs"][0]["scale"] == Y_SCALE
    plain = cvmc_runtime.load(artifacts / "plain.cvmx")
    assert plain.inputs[0].scale is None and plain.outputs[0].scale is None


def test_without_scales_floats_and_dequantize_are_refused(artifacts):
    plain = cvmc_runtime.load(artifacts / "plain.cvmx")
    with pytest.raises(ModelError, match="expected an integer array, got dtype float32 "
                                         r"\(it has no scale"):
        plain.run({"x": X})
    with pytest.raises(ModelError, match="records no output scale"):
        plain.run({"x": np.zeros((2, 4), np.int8)}, dequantize=True)
    with pytest.raises(ModelError, match="dequantize must be True or False"):
        plain.run({"x": np.zeros((2, 4), np.int8)}, dequantize="yes")


def test_bad_float_inputs(artifacts):
    model = cvmc_runtime.load(artifacts / "q.cvmx")
    bad = X.copy()
    bad[1, 2] = np.nan
    with pytest.raises(ModelError, match=r"input 'x': NaN at index \(1, 2\)"):
        model.run({"x": bad})
    with pytest.raises(ModelError, match=r"input 'x': expected shape \[2, 4\], got \[4\]"):
        model.run({"x": X[0]})


def test_python_api_takes_the_scales(tmp_path):
    graph = load_checked(write_quantized(tmp_path / "m", None))
    cvmc.compile(graph, tmp_path / "m.cvmx", quantization=QUANTIZATION)
    model = cvmc_runtime.load(tmp_path / "m.cvmx")
    assert np.array_equal(model.run({"x": X}, dequantize=True)["y"],
                          (quantized_logits(X) / Y_SCALE).astype(np.float32))


def _doc(edit) -> dict:
    doc = copy.deepcopy(QUANTIZATION)
    edit(doc)
    return doc


@pytest.mark.parametrize("edit, message", [
    (lambda d: d["inputs"]["x"].update(scale=-1), "inputs.x.scale must be a finite number > 0"),
    (lambda d: d["outputs"]["y"].update(scale=0), "outputs.y.scale must be a finite number"),
    (lambda d: d["outputs"]["y"].update(scale=math.inf), "outputs.y.scale must be a finite"),
    (lambda d: d["outputs"]["y"].update(scale=math.nan), "outputs.y.scale must be a finite"),
    (lambda d: d["outputs"]["y"].update(scale=10 ** 400), "outputs.y.scale must be a finite"),
    (lambda d: d["inputs"]["x"].update(scale="10"), "inputs.x.scale must be a finite"),
    (lambda d: d["inputs"]["x"].update(scale=True), "inputs.x.scale must be a finite"),
    (lambda d: d["inputs"]["x"].update(precision=16),
     "inputs.x.precision must be the graph's precision of 'x', 8, got 16"),
    (lambda d: d["inputs"]["x"].pop("precision"), "inputs.x must be an object with precision"),
    (lambda d: d["outputs"]["y"].update(zero_point=0), "outputs.y must be an object with"),
    (lambda d: d["inputs"].update(z={"scale": 1, "precision": 8}),
     "inputs.z must name one of the graph's inputs"),
    (lambda d: d["outputs"].update(x={"scale": 1}), "outputs.x must name one of the graph's"),
    (lambda d: d.update(inputs=[]), "inputs must be an object"),
    (lambda d: d.update(params={}), "the top level must be an object with 'inputs'"),
])
def test_bad_quantization_files_are_refused(tmp_path, edit, message):
    graph = load_checked(write_quantized(tmp_path / "m", None))
    with pytest.raises(cvmc.CvmcError, match=re.escape(message)):
        check_quantization(_doc(edit), graph)


def test_cli_names_the_file_and_the_field(tmp_path, capsys):
    model = write_quantized(tmp_path / "m", _doc(lambda d: d["outputs"]["y"].update(scale=-2)))
    assert main(["compile", str(model), "-o", str(tmp_path / "m.cvmx")]) == 1
    err = capsys.readouterr().err.strip()
    assert err == f"error: {model / 'quantization.json'}: outputs.y.scale must be a finite " \
                  f"number > 0, got -2" and not (tmp_path / "m.cvmx").exists()
    (model / "quantization.json").write_text("{")
    assert main(["compile", str(model), "-o", str(tmp_path / "m.cvmx")]) == 1
    assert "quantization.json: not valid JSON" in capsys.readouterr().err


def _spec(name, dtype="int8", precision=8, **extra):
    return {"name": name, "shape": [4], "dtype": dtype, "precision": precision, **extra}


PLAN = {"device": "cpu", "target": {"kind": "llvm", "mcpu": "x86-64", "features": []},
        "inputs": [_spec("x", scale=10.0)], "weights": [_spec("w")], "buffers": [],
        "outputs": [_spec("y", "int32", 19, scale=40)],
        "kernels": [{"symbol": "k", "args": ["x", "w", "y"], "num_inputs": 2}]}


@pytest.mark.parametrize("where, spec, message", [
    ("inputs", _spec("x", scale=-1.0), "inputs[0] 'x': scale must be a finite number > 0"),
    ("inputs", _spec("x", scale=0), "scale must be a finite number > 0, got 0"),
    ("outputs", _spec("y", "int32", 19, scale=float("inf")), "outputs[0] 'y': scale must"),
    ("outputs", _spec("y", "int32", 19, scale=10 ** 400), "outputs[0] 'y': scale must"),
    ("outputs", _spec("y", "int32", 19, scale="40"), "scale must be a finite number"),
    ("outputs", _spec("y", "int32", 19, scale=None), "scale must be a finite number"),
    ("weights", _spec("w", scale=1.0), "weights[0] 'w': only an integer input or output"),
    ("outputs", _spec("y", "float32", None, scale=1.0), "only an integer input or output"),
])
def test_plan_validation_refuses_bad_scales(where, spec, message):
    validate_plan(PLAN)
    plan = copy.deepcopy(PLAN)
    plan[where] = [spec]
    with pytest.raises(ModelError, match=re.escape(message)) as e:
        validate_plan(plan)
    assert str(e.value).startswith("invalid plan: ")


def test_an_artifact_with_a_corrupt_scale_is_refused(artifacts, tmp_path):
    source = artifacts / "q.cvmx"
    with zipfile.ZipFile(source) as z:
        members = {i.filename: z.read(i) for i in z.infolist()}
    plan = json.loads(members["plan.json"])
    plan["inputs"][0]["scale"] = -10.0
    members["plan.json"] = json.dumps(plan).encode()
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        for name, data in members.items():
            z.writestr(name, data)
    (tmp_path / "bad.cvmx").write_bytes(buf.getvalue())
    with pytest.raises(ModelError, match="inputs\\[0\\] 'x': scale must be a finite number"):
        cvmc_runtime.load(tmp_path / "bad.cvmx")


def test_cli_run_float_inputs_and_dequantize(artifacts, tmp_path, capsys):
    np.save(tmp_path / "x.npy", X)
    out = tmp_path / "out"
    assert main(["run", str(artifacts / "q.cvmx"), "--input", f"x={tmp_path / 'x.npy'}",
                 "--dequantize", "--output-dir", str(out)]) == 0
    assert np.array_equal(np.load(out / "y.npy"),
                          (quantized_logits(X) / Y_SCALE).astype(np.float32))
    assert main(["run", str(artifacts / "q.cvmx"), "--input", f"x={tmp_path / 'x.npy'}",
                 "--output-dir", str(out)]) == 0
    assert np.array_equal(np.load(out / "y.npy"), quantized_logits(X))
    capsys.readouterr()
    assert main(["run", str(artifacts / "plain.cvmx"), "--input",
                 f"x={tmp_path / 'x.npy'}", "--dequantize"]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err and "no output scale" in err


def test_compile_finds_the_file_in_the_folder_or_beside_the_graph(tmp_path):
    folder = write_quantized(tmp_path / "m")
    want = folder / "quantization.json"
    assert quantization_file(folder) == want and quantization_file(folder / "graph.nnef") == want
    (tmp_path / "m.tar").write_bytes(b"")  # archives and CVM JSON hold no such file
    (tmp_path / "quantization.json").write_text("{}")
    assert quantization_file(tmp_path / "m.tar") is None
    assert quantization_file(write_quantized(tmp_path / "plain", None)) is None

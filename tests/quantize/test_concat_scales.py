"""A model output that concatenates differently scaled parts keeps one scale per part
(issue 30 item 4): a detector-like head, box regressions (range ~ +-100) beside sigmoid
scores (0..1), concatenated along axis 1. quantization.json records {"scale": [...],
"axis": 1, "sizes": [4, 3]} (moved along with reshapes and transposes after the concat);
compile checks it, the plan carries it, and Model.run, `cvmc run --dequantize` and the C
header use it."""
from __future__ import annotations

import json

import cvmc_runtime
import numpy as np
import pytest
from cvmc_runtime import TensorSpec, quantize

import cvmc
from cvmc import reference_run
from cvmc.cli import main
from cvmc.errors import CvmcError
from cvmc.quantize import Options, quantize_graph
from cvmc.quantize.rewrite import Rewriter
from cvmc.quantize.writer import write_model
from tests.cvm_runtime import assert_cvm_runtime_agrees, needs_cvm_runtime
from tests.quantize.test_rules import _model

BODY = """    box = linear(x, wb, bb);
    boxes = mul(box, 40.0);
    logits = linear(x, ws, bs);
    scores = sigmoid(logits);
    y = concat([boxes, scores], axis = 1);"""
RNG = np.random.default_rng(30)
WEIGHTS = {"wb": RNG.standard_normal((4, 8)) * 0.5, "bb": RNG.standard_normal((1, 4)),
           "ws": RNG.standard_normal((3, 8)) * 0.5, "bs": RNG.standard_normal((1, 3))}
SAMPLES = {"x": RNG.standard_normal((64, 1, 8)).astype(np.float32)}


class OneScale(Rewriter):
    """The quantize pass with every concat part at the output's one scale."""

    sliced_outputs = False


@pytest.fixture(scope="module")
def head(tmp_path_factory):
    """(the float graph, its quantized model, the same at one output scale)."""
    graph = _model(tmp_path_factory.mktemp("head"), BODY, {"x": (1, 8)}, WEIGHTS)
    return (graph, quantize_graph(graph, SAMPLES, Options()),
            quantize_graph(graph, SAMPLES, Options(), rewriter=OneScale))


def _floats(graph) -> np.ndarray:
    return np.concatenate([reference_run(graph, {"x": x})["y"] for x in SAMPLES["x"]])


def _ints(q) -> np.ndarray:
    return np.concatenate([reference_run(q.graph, {"x": quantize("x", x, *q.inputs["x"])
                                                   .astype(np.int8)})["y"]
                           for x in SAMPLES["x"]])


def _sqnr(want: np.ndarray, got: np.ndarray) -> float:
    return 10 * np.log10(np.sum(want ** 2) / np.sum((want - got) ** 2))


def test_each_part_keeps_its_calibrated_scale(head) -> None:
    """The entry is per slice; each scale is 127 / the part's absmax over the samples (the
    absmax method), computed here from the float model."""
    graph, q, one = head
    floats = _floats(graph).astype(np.float64)
    entry = q.manifest()["outputs"]["y"]
    assert entry["axis"] == 1 and entry["sizes"] == [4, 3]
    want = [127 / np.abs(floats[:, :4]).max(), 127 / np.abs(floats[:, 4:]).max()]
    np.testing.assert_allclose(entry["scale"], want, rtol=1e-6)
    assert one.manifest()["outputs"]["y"] == {"scale": pytest.approx(min(want), rel=1e-6)}
    assert q.graph.types[q.graph.outputs[0]].precision == 8


def test_the_score_part_gains_in_sqnr(head) -> None:
    """Dequantized per slice, the scores' SQNR rises by about 20 log10(score scale ratio)
    (here ~40 dB); the boxes' stays within 1 dB."""
    graph, q, one = head
    floats = _floats(graph).astype(np.float64)
    scale = np.repeat(q.manifest()["outputs"]["y"]["scale"], [4, 3])
    sliced = _ints(q) / scale
    single = _ints(one) / one.manifest()["outputs"]["y"]["scale"]
    box, score = slice(0, 4), slice(4, 7)
    gain = _sqnr(floats[:, score], sliced[:, score]) - _sqnr(floats[:, score], single[:, score])
    assert gain > 25, gain
    assert abs(_sqnr(floats[:, box], sliced[:, box]) -
               _sqnr(floats[:, box], single[:, box])) < 1


def test_compiled_model_dequantizes_per_slice(head, tmp_path) -> None:
    """quantization.json as `cvmc quantize` writes it compiles; llvm gives the reference's
    bits; Model.run(dequantize=True) and `cvmc run --dequantize` divide each slice by its
    own scale; the C header lists every scale."""
    _, q, _ = head
    folder = write_model(q, tmp_path / "q", tmp_path / "src", False)
    entry = json.loads((folder / "quantization.json").read_text())["outputs"]["y"]
    assert main(["compile", str(folder), "-o", str(tmp_path / "q.cvmx")]) == 0
    model = cvmc_runtime.load(tmp_path / "q.cvmx")
    x = SAMPLES["x"][0]
    ints = reference_run(q.graph, {"x": quantize("x", x, *q.inputs["x"]).astype(np.int8)})["y"]
    assert np.array_equal(model.run({"x": x})["y"], ints)
    want = (ints / np.repeat(entry["scale"], [4, 3]).reshape(1, 7)).astype(np.float32)
    assert np.array_equal(model.run({"x": x}, dequantize=True)["y"], want)
    np.save(tmp_path / "x.npy", x)
    assert main(["run", str(tmp_path / "q.cvmx"), "--input", f"x={tmp_path / 'x.npy'}",
                 "--output-dir", str(tmp_path / "out"), "--dequantize"]) == 0
    assert np.array_equal(np.load(tmp_path / "out" / "y.npy"), want)
    (spec,) = model.outputs
    assert TensorSpec.from_json(spec.to_json()).to_json() == {**spec.to_json(), **entry}
    assert main(["compile", str(folder), "--emit", "c-library", "-o",
                 str(tmp_path / "qnet")]) == 0
    header = (tmp_path / "qnet" / "qnet.h").read_text()
    assert f"scale {entry['scale']!r} per slice along axis 1, sizes [4, 3]" in header


@needs_cvm_runtime
def test_cvm_runtime_agrees(head) -> None:
    """The integer graph is an ordinary concatenate of requantized parts: reference, llvm
    and CVM-Runtime (CPU, FORMAL) agree bit for bit."""
    _, q, _ = head
    rng = np.random.default_rng(31)
    for _ in range(3):
        assert_cvm_runtime_agrees(q.graph, rng.integers(-127, 128, (1, 8)).astype(np.int8))


@pytest.mark.parametrize("edit, message", [
    ({"axis": 2}, r"outputs\.y\.axis must be an axis of the tensor's shape \[1, 7\]"),
    ({"axis": True}, r"outputs\.y\.axis must be an axis"),
    ({"sizes": [4, 4]}, r"outputs\.y\.sizes must sum to the extent of axis 1, 7"),
    ({"sizes": [7, 0]}, r"outputs\.y\.sizes must be a list of integers > 0"),
    ({"sizes": "4,3"}, r"outputs\.y\.sizes must be a list of integers > 0"),
    ({"scale": [1.0]}, r"outputs\.y\.scale must be a list of 2 finite numbers > 0"),
    ({"scale": [1.0, -2.0]}, r"outputs\.y\.scale must be a list of 2 finite numbers > 0"),
    ({"scale": [1.0, 1e309]}, r"outputs\.y\.scale must be a list of 2 finite numbers > 0"),
    ({"scale": 3.0}, r"outputs\.y\.scale must be a list, one per slice"),
])
def test_compile_refuses_a_bad_per_slice_entry(head, edit, message) -> None:
    _, q, _ = head
    entry = {"scale": [1.0, 2.0], "axis": 1, "sizes": [4, 3], **edit}
    doc = {"inputs": {"x": {"scale": 1.0, "precision": 8}}, "outputs": {"y": entry}}
    with pytest.raises(CvmcError, match=message):
        cvmc.compile(q.graph, None, quantization=doc)


@pytest.mark.parametrize("tail, axis, shape", [
    ("t = transpose(c, axes = [1, 0]);\n    y = reshape(t, shape = [7, 1, 1]);", 0, (7, 1, 1)),
    ("y = unsqueeze(c, axes = [0]);", 2, (1, 1, 7)),
])
def test_through_reshapes_and_transposes(head, tmp_path, tail, axis, shape) -> None:
    """A concat reshaped or transposed on its way to the output: the scale per slice moves
    with it (to the axis where the parts now lie), and the integers are the direct
    concat's, moved."""
    body = BODY.replace("y = concat", "c = concat") + "\n    " + tail
    q = quantize_graph(_model(tmp_path, body, {"x": (1, 8)}, WEIGHTS), SAMPLES, Options())
    _, direct, _ = head
    assert q.manifest()["outputs"]["y"] == {**direct.manifest()["outputs"]["y"], "axis": axis}
    assert np.array_equal(_ints(q).reshape(-1, *shape), _ints(direct).reshape(-1, *shape))


def test_a_reshape_that_mixes_the_slices_gives_one_scale(tmp_path) -> None:
    """Parts of 4 and 2 reshaped to [2, 3]: no one axis holds the slices, so the output is
    requantized to one scale, the one-scale rule's, within a unit of its integers."""
    weights = {**WEIGHTS, "ws": WEIGHTS["ws"][:2], "bs": WEIGHTS["bs"][:, :2]}
    body = BODY.replace("y = concat", "c = concat") + "\n    y = reshape(c, shape = [2, 3]);"
    graph = _model(tmp_path, body, {"x": (1, 8)}, weights)
    q = quantize_graph(graph, SAMPLES, Options())
    one = quantize_graph(graph, SAMPLES, Options(), rewriter=OneScale)
    assert q.manifest()["outputs"]["y"] == one.manifest()["outputs"]["y"]
    assert np.abs(_ints(q).astype(np.int64) - _ints(one)).max() <= 1


def _plan(**output) -> dict:
    """A one-kernel plan x -> y [1, 7], with `output`'s keys on y."""
    spec = {"name": "y", "shape": [1, 7], "dtype": "int32", "precision": 8, **output}
    return {"device": "cpu", "target": {"kind": "llvm", "mcpu": "x86-64", "features": []},
            "inputs": [{"name": "x", "shape": [1, 8], "dtype": "int8", "precision": 8}],
            "weights": [], "buffers": [], "outputs": [spec],
            "kernels": [{"symbol": "k", "args": ["x", "y"], "num_inputs": 1}]}


@pytest.mark.parametrize("output, message", [
    ({"scale": [1.0, 2.0], "axis": 1, "sizes": [4, 3]}, None),
    ({"scale": [1.0, 2.0], "axis": 1, "sizes": [4, 4]}, "sizes must sum to the extent"),
    ({"scale": [1.0, 2.0], "sizes": [4, 3]}, "axis must be an axis"),
    ({"scale": [1.0, 0.0], "axis": 1, "sizes": [4, 3]}, "scale must be a list of 2 finite"),
])
def test_the_runtime_checks_a_plan_scale_per_slice(output, message) -> None:
    from cvmc_runtime.plan import validate_plan

    if message is None:
        validate_plan(_plan(**output))
        spec = TensorSpec.from_json(_plan(**output)["outputs"][0])
        assert spec.scale.tolist() == [[1.0] * 4 + [2.0] * 3]
        return
    with pytest.raises(cvmc_runtime.ModelError, match=f"invalid plan: outputs\\[0\\] 'y': "
                                                      f"{message}"):
        validate_plan(_plan(**output))


def test_dequantize_divides_each_slice_by_its_scale() -> None:
    """Hand-computed: [8, -4 | 6] at scales [2 | 3] along axis 1 are [4, -2 | 2]; a scale
    array with a zero is refused."""
    scale = cvmc_runtime.sliced_scale([2.0, 3.0], 1, [2, 1], 2)
    q = np.array([[8, -4, 6]], np.int32)
    assert cvmc_runtime.dequantize(q, scale).tolist() == [[4.0, -2.0, 2.0]]
    assert cvmc_runtime.scale_entry(scale) == {"scale": [2.0, 3.0], "axis": 1, "sizes": [2, 1]}
    with pytest.raises(cvmc_runtime.ModelError, match="every scale must be a finite number"):
        cvmc_runtime.dequantize(q, np.array([[2.0, 0.0, 3.0]]))

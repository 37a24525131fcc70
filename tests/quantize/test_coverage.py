"""`cvmc quantize` on the layers real networks hold, each a small float ONNX model built
with onnx.helper: LSTM and GRU as the converter unrolls them (split, sigmoid and tanh
gates, products of activations), ConvTranspose, self-attention (matmuls of two
activations), LayerNorm, erf and GELU, softmax over any axis, nearest and bilinear
resizes, asymmetric padding.

Oracle: ONNX Runtime's float run of the same model; each case states its bound (output
SQNR in dB over the calibration samples, or a max error from the scales). The integer
model's llvm build computes the reference interpreter's bits on three samples.
"""
from __future__ import annotations

import json

import numpy as np
import pytest
from cvmc_runtime import dequantize, quantize

from cvmc import load_graph, reference_run
from cvmc.cli import main

pytest.importorskip("nnef_tools", reason="needs the convert extra: pip install 'cvmc[convert]'")
onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

from onnx import TensorProto, helper, numpy_helper

from tests.frontend.test_onnx_coverage import B, I, S, _rnn


def _onnx(nodes, inits: dict, x_shape, y_shape=None, opset: int = 13):
    """A float model of x -> y (y's shape from ONNX shape inference where None)."""
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x_shape))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, y_shape and list(y_shape))],
        [numpy_helper.from_array(v.astype(np.int64 if v.dtype.kind == "i" else np.float32), k)
         for k, v in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return onnx.shape_inference.infer_shapes(model)


def quantized_run(tmp, model, samples: np.ndarray):
    """(ONNX Runtime's float outputs, the integer model's dequantized, quantization.json)
    of `cvmc quantize` of a one-input, one-output ONNX model over `samples` ([N, *input
    shape], also the calibration set); the first three samples run on the llvm build too,
    bit-exact with the reference interpreter."""
    import cvmc_runtime

    import cvmc
    onnx.save(model, tmp / "m.onnx")
    np.save(tmp / "x.npy", samples)
    assert main(["quantize", str(tmp / "m.onnx"), "-o", str(tmp / "q"), "--calib",
                 f"x={tmp / 'x.npy'}"]) == 0
    graph = load_graph(tmp / "q")
    manifest = json.loads((tmp / "q" / "quantization.json").read_text())
    (out,) = graph.outputs
    session = ort.InferenceSession(str(tmp / "m.onnx"), providers=["CPUExecutionProvider"])
    ints = [quantize("x", x, manifest["inputs"]["x"]["scale"], 8).astype(np.int8)
            for x in samples]
    got = np.array([dequantize(reference_run(graph, {"x": xi})[out],
                               manifest["outputs"][out]["scale"]) for xi in ints])
    want = np.array([session.run(None, {"x": x})[0] for x in samples], np.float64)
    cvmc.compile(graph, str(tmp / "q.cvmx"), target="llvm")
    built = cvmc_runtime.load(str(tmp / "q.cvmx"))
    for xi in ints[:3]:
        assert np.array_equal(built.run({"x": xi})[out], reference_run(graph, {"x": xi})[out])
    return want, got.reshape(want.shape), manifest


def quantized_sqnr(tmp, model, samples: np.ndarray) -> float:
    """The output SQNR (dB) of `quantized_run`."""
    want, got, _ = quantized_run(tmp, model, samples)
    return 10 * np.log10(np.square(want).sum() / np.square(got - want).sum())


@pytest.mark.parametrize("op", ["LSTM", "GRU"])
def test_recurrent_layers_unrolled_by_the_converter(tmp_path, op):
    """A bidirectional LSTM / GRU whose Y feeds a relu: the converter's unrolling into
    split, matmuls, sigmoid and tanh gates, and products of two activations; 32.6 / 35.0 dB
    measured."""
    model = _rnn(op, "bidirectional", initial=False, outputs=("Y",))
    model.graph.node.append(helper.make_node("Relu", ["Y"], ["r"]))
    del model.graph.output[0]
    model.graph.output.append(helper.make_tensor_value_info("r", TensorProto.FLOAT, None))
    samples = np.random.default_rng(4).standard_normal((16, S, B, I)).astype(np.float32)
    assert quantized_sqnr(tmp_path, model, samples) >= 25


def _conv_transpose(seed: int, cin: int, cout: int, size: int, **attrs):
    """ConvTranspose with bias over x [1, cin, size, size] (output shape from ONNX shape
    inference)."""
    r = np.random.default_rng(seed)
    groups = attrs.get("group", 1)
    k = attrs.pop("k")
    inits = {"w": r.standard_normal((cin, cout // groups, k, k)) * 0.3,
             "b": r.standard_normal(cout) * 0.1}
    node = helper.make_node("ConvTranspose", ["x", "w", "b"], ["y"], kernel_shape=[k, k],
                            **attrs)
    return _onnx([node], inits, [1, cin, size, size])


@pytest.mark.parametrize("attrs", [
    {"k": 2, "strides": [2, 2]},  # a detector's 2x upsampling head
    {"k": 4, "strides": [2, 2], "pads": [1, 1, 1, 1]},
    {"k": 3, "strides": [2, 2], "pads": [1, 1, 1, 1], "output_padding": [1, 1]},
    {"k": 3, "strides": [3, 3], "pads": [0, 1, 2, 0], "group": 2},
    {"k": 3, "pads": [1, 1, 1, 1], "dilations": [2, 2]}])
def test_transposed_conv(tmp_path, attrs):
    """ConvTranspose (NNEF deconv) as a conv2d over the zero-upsampled input: 8-bit weights
    like a conv, so its error is a conv's: >= 30 dB on standard-normal inputs (36.0-36.9
    measured)."""
    model = _conv_transpose(5, 4, 6, 5, **attrs)
    samples = np.random.default_rng(6).standard_normal((8, 1, 4, 5, 5)).astype(np.float32)
    assert quantized_sqnr(tmp_path, model, samples) >= 30


def _attention(seed: int, seq: int = 6, dim: int = 8, heads: int = 2):
    """Self-attention over x [1, seq, dim]: q, k, v projections, heads split by reshape and
    transpose, softmax(q k^T / sqrt(d)) v over the last axis, heads merged, a projection."""
    r = np.random.default_rng(seed)
    d = dim // heads
    inits = {f"w{n}": r.standard_normal((dim, dim)) * 0.4 for n in "qkvo"}
    inits.update({"heads": np.array([1, seq, heads, d]), "merged": np.array([1, seq, dim]),
                  "scale": np.array(1 / np.sqrt(d))})
    nodes = []
    for n in "qkv":
        nodes += [helper.make_node("MatMul", ["x", f"w{n}"], [f"{n}0"]),
                  helper.make_node("Reshape", [f"{n}0", "heads"], [f"{n}1"]),
                  helper.make_node("Transpose", [f"{n}1"], [n], perm=[0, 2, 1, 3])]
    nodes += [helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]),
              helper.make_node("MatMul", ["q", "kt"], ["s0"]),
              helper.make_node("Mul", ["s0", "scale"], ["s"]),
              helper.make_node("Softmax", ["s"], ["p"], axis=-1),
              helper.make_node("MatMul", ["p", "v"], ["o0"]),
              helper.make_node("Transpose", ["o0"], ["o1"], perm=[0, 2, 1, 3]),
              helper.make_node("Reshape", ["o1", "merged"], ["o2"]),
              helper.make_node("MatMul", ["o2", "wo"], ["y"])]
    return _onnx(nodes, inits, [1, seq, dim])


def test_attention(tmp_path):
    """Products of two activations (q k^T, then with v) and softmax over the last axis of
    rank-4 scores, projections of a rank-3 activation: >= 25 dB (26.8 measured; the
    softmax's 7-bit output times v costs most)."""
    samples = np.random.default_rng(8).standard_normal((12, 1, 6, 8)).astype(np.float32)
    assert quantized_sqnr(tmp_path, _attention(9), samples) >= 25


def _layer_norm(seed: int, decomposed: bool, shape=(1, 6, 16)):
    """LayerNormalization over the last axis (opset 17), or the ReduceMean / Sub / Pow /
    ReduceMean / Add / Sqrt / Div / Mul / Add chain older exporters write."""
    r = np.random.default_rng(seed)
    inits = {"g": r.random(shape[-1]) + 0.5, "b": r.standard_normal(shape[-1]) * 0.1,
             "eps": np.array(1e-5), "two": np.array(2.0)}
    if decomposed:
        nodes = [helper.make_node("ReduceMean", ["x"], ["m"], axes=[-1]),
                 helper.make_node("Sub", ["x", "m"], ["d"]),
                 helper.make_node("Pow", ["d", "two"], ["sq"]),
                 helper.make_node("ReduceMean", ["sq"], ["v"], axes=[-1]),
                 helper.make_node("Add", ["v", "eps"], ["ve"]),
                 helper.make_node("Sqrt", ["ve"], ["sd"]),
                 helper.make_node("Div", ["d", "sd"], ["n"]),
                 helper.make_node("Mul", ["n", "g"], ["ng"]),
                 helper.make_node("Add", ["ng", "b"], ["y"])]
    else:
        nodes = [helper.make_node("LayerNormalization", ["x", "g", "b"], ["y"], axis=-1,
                                  epsilon=1e-5)]
    return _onnx(nodes, inits, shape, opset=13 if decomposed else 17)


@pytest.mark.parametrize("decomposed", [False, True])
def test_layer_norm(tmp_path, decomposed):
    """LayerNorm: the variance's sqrt(v + eps) is finite only for v >= -eps, so its table
    spans the integers >= 0 (a variance takes no others), and the division by it becomes a
    product with a table of 1 / sqrt(v + eps). Rows of different scales (0.5 to 3): >= 25
    dB (27.8 measured; the 8-bit deviations of the smallest rows cost most)."""
    rng = np.random.default_rng(5)
    samples = (rng.standard_normal((12, 1, 6, 16)) * rng.uniform(0.5, 3, (12, 1, 6, 1))
               + 0.5).astype(np.float32)
    assert quantized_sqnr(tmp_path, _layer_norm(3, decomposed), samples) >= 25


SQRT2 = np.array(np.sqrt(2.0))


@pytest.mark.parametrize("nodes, lipschitz", [
    ([helper.make_node("Erf", ["x"], ["y"])], 2 / np.sqrt(np.pi)),
    ([helper.make_node("Div", ["x", "sqrt2"], ["a"]), helper.make_node("Erf", ["a"], ["e"]),
      helper.make_node("Add", ["e", "one"], ["b"]), helper.make_node("Mul", ["x", "b"], ["c"]),
      helper.make_node("Mul", ["c", "half"], ["y"])], 1.13)])  # GELU, as exporters write it
def test_erf_and_gelu_are_one_table(tmp_path, nodes, lipschitz):
    """erf (NNEF-Tools' fragment: a polynomial within 1.5e-7 of it) and GELU
    x (1 + erf(x / sqrt 2)) / 2 are one table each: error <= L dx + 0.5 / s_y (+ the
    fragment's 1.5e-7 and float32 rounding)."""
    inits = {"sqrt2": SQRT2, "one": np.array(1.0), "half": np.array(0.5)}
    samples = (np.random.default_rng(2).standard_normal((8, 1, 4, 8)) * 2).astype(np.float32)
    want, got, manifest = quantized_run(tmp_path, _onnx(nodes, inits, [1, 4, 8]), samples)
    assert [n.op for n in load_graph(tmp_path / "q").nodes] == ["broadcast_add", "cvm_lut"]
    sx, sy = manifest["inputs"]["x"]["scale"], manifest["outputs"]["y"]["scale"]
    assert np.abs(got - want).max() <= lipschitz * 0.5 / sx + 0.5 / sy + 1e-6


@pytest.mark.parametrize("axis, shape", [(1, (1, 5, 3, 4)), (-1, (1, 3, 7)), (2, (2, 3, 4, 5))])
def test_softmax_over_any_axis(tmp_path, axis, shape):
    """Softmax over the channels, the last axis, a middle axis: within the rule's bound,
    dx / 2 + (n + 1) / 2^15 + 0.5 / 127 (test_rules.py)."""
    samples = (np.random.default_rng(3).standard_normal((6, *shape)) * 3).astype(np.float32)
    model = _onnx([helper.make_node("Softmax", ["x"], ["y"], axis=axis)], {}, shape, shape)
    want, got, manifest = quantized_run(tmp_path, model, samples)
    bound = 0.25 / manifest["inputs"]["x"]["scale"] + (shape[axis] + 1) / 2 ** 15 + 0.5 / 127
    assert np.abs(got - want).max() <= bound


@pytest.mark.parametrize("mode, transform, scales", [
    ("nearest", "asymmetric", [2, 2]), ("linear", "half_pixel", [2, 2]),
    ("linear", "align_corners", [2, 3]), ("linear", "asymmetric", [3, 2]),
    ("linear", "pytorch_half_pixel", [2, 2])])
def test_resize(tmp_path, mode, transform, scales):
    """Resize, nearest and bilinear: each output a convex combination of inputs each within
    dx, so error <= dx + 1 / s_y (the output's rounding and fixed point)."""
    shape = (1, 3, 4, 5)
    node = helper.make_node("Resize", ["x", "", "scales"], ["y"], mode=mode,
                            coordinate_transformation_mode=transform)
    model = _onnx([node], {"scales": np.array([1, 1, *scales], np.float32)}, shape)
    samples = np.random.default_rng(2).standard_normal((6, *shape)).astype(np.float32)
    want, got, manifest = quantized_run(tmp_path, model, samples)
    bound = 0.5 / manifest["inputs"]["x"]["scale"] + 1 / manifest["outputs"]["y"]["scale"]
    assert np.abs(got - want).max() <= bound + 1e-6


def test_asymmetric_padding(tmp_path):
    """TF's SAME padding (a stride-2 conv padded after only), a max pool and an average
    pool (count_include_pad 0) padded unevenly: >= 30 dB (40.9 measured; test_rules.py
    holds each rule's own bound)."""
    r = np.random.default_rng(1)
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[0, 0, 1, 1], strides=[2, 2]),
             helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("MaxPool", ["r"], ["m"], kernel_shape=[3, 3], pads=[0, 1, 1, 0]),
             helper.make_node("AveragePool", ["m"], ["y"], kernel_shape=[2, 2],
                              pads=[1, 0, 0, 1], strides=[2, 2], count_include_pad=0)]
    model = _onnx(nodes, {"w": r.standard_normal((4, 3, 3, 3)) * 0.4,
                          "b": r.standard_normal(4) * 0.1}, [1, 3, 8, 8])
    samples = r.standard_normal((6, 1, 3, 8, 8)).astype(np.float32)
    assert quantized_sqnr(tmp_path, model, samples) >= 30

"""The quantizer's accuracy rules on small float nets built here (numpy weights), each
measured as output SQNR against the float model on the reference interpreter, with the
rule and without it (`Options`), and each integer model bit-exact between the reference
interpreter and its llvm build (and CVM-Runtime where CVM_RUNTIME_DRIVER is set).

- Products of two activations at wide operands (`product_operands`): a squeeze-excite
  block (a conv's output times a sigmoid gate: 15 x 15 bits) and self-attention (q k^T,
  13 x 13 bits for K = 8, then softmax times v: 14 x 14 for K = 6).
- Clamps to [0, hi] on the whole grid (`shifted_clamps`): a conv, relu, a padded depthwise
  conv, relu6, a reshape and a dense; a deconv's relu before an asymmetric padding.
- Two layers of transformer exports: a bias after a matmul by an unsqueezed weight, a
  gather by a weight index.
"""
from __future__ import annotations

import numpy as np
import pytest

from cvmc.quantize import Options
from cvmc.quantize.layers import run_float
from cvmc.quantize.report import layer_report
from tests.cvm_runtime import assert_cvm_runtime_agrees, needs_cvm_runtime, run_llvm
from tests.quantize.test_rules import _compare, _model

RNG = np.random.default_rng(3)
C, D = 8, 8

SQUEEZE_EXCITE = """    c = conv(x, w1, b1, padding = [(1, 1), (1, 1)]);
    p = mean_reduce(c, axes = [2, 3]);
    h0 = conv(p, w2, b2);
    h = relu(h0);
    g0 = conv(h, w3, b3);
    g = sigmoid(g0);
    y = mul(c, g);"""
SQUEEZE_EXCITE_WEIGHTS = {
    "w1": RNG.standard_normal((C, 3, 3, 3)) * 0.3, "b1": RNG.standard_normal((1, C)) * 0.1,
    "w2": RNG.standard_normal((4, C, 1, 1)) * 0.5, "b2": RNG.standard_normal((1, 4)) * 0.1,
    # gates mostly well below 1, as trained squeeze-excite blocks have them
    "w3": RNG.standard_normal((C, 4, 1, 1)) * 0.5,
    "b3": RNG.standard_normal((1, C)) * 1.5 - 2.5}

# the feature map a relu's result (a clamp to [0, hi] keeps the product's operand bits)
SQUEEZE_EXCITE_RELU = SQUEEZE_EXCITE.replace(
    "    c = conv(x, w1, b1, padding = [(1, 1), (1, 1)]);",
    "    c0 = conv(x, w1, b1, padding = [(1, 1), (1, 1)]);\n    c = relu(c0);")

ATTENTION = """    q = matmul(x, wq);
    k = matmul(x, wk);
    v = matmul(x, wv);
    s = matmul(q, k, transposeB = true);
    t = mul(s, 0.35);
    p = softmax(t, axes = [2]);
    y = matmul(p, v);"""
ATTENTION_WEIGHTS = {f"w{n}": RNG.standard_normal((1, D, D)) * 0.4 for n in "qkv"}

CLAMPS = """    c = conv(x, w1, b1, padding = [(1, 1), (1, 1)]);
    h = relu(c);
    d = conv(h, w2, b2, padding = [(1, 1), (1, 1)], groups = 0);
    e = clamp(d, 0.0, 6.0);
    f = reshape(e, shape = [1, 288]);
    y = linear(f, w3, b3);"""
CLAMPS_WEIGHTS = {
    "w1": RNG.standard_normal((C, 3, 3, 3)) * 0.3, "b1": RNG.standard_normal((1, C)) * 0.1,
    "w2": RNG.standard_normal((C, 1, 3, 3)) * 0.5, "b2": RNG.standard_normal((1, C)) + 0.5,
    "w3": RNG.standard_normal((10, 288)) * 0.1, "b3": RNG.standard_normal((1, 10)) * 0.1}

# name: (body, input shape, weights)
NETS = {"squeeze_excite": (SQUEEZE_EXCITE, (1, 3, 8, 8), SQUEEZE_EXCITE_WEIGHTS),
        "squeeze_excite_relu": (SQUEEZE_EXCITE_RELU, (1, 3, 8, 8), SQUEEZE_EXCITE_WEIGHTS),
        "attention": (ATTENTION, (1, 6, D), ATTENTION_WEIGHTS),
        "clamps": (CLAMPS, (1, 3, 6, 6), CLAMPS_WEIGHTS)}


def _sqnr(want: np.ndarray, got: np.ndarray) -> float:
    return float(10 * np.log10(np.square(want).sum() / np.square(got - want).sum()))


def _net(tmp_path, name: str):
    body, shape, weights = NETS[name]
    graph = _model(tmp_path, body, {"x": shape}, weights)
    samples = {"x": np.random.default_rng(5).standard_normal((16, *shape)).astype(np.float32)}
    return graph, samples


@pytest.mark.parametrize("name, floor, gain", [
    # measured: 36.0 dB with 8-bit operands, 38.2 dB with 15-bit ones
    ("squeeze_excite", 37.5, 1.5),
    # measured: 36.1 dB with 8-bit operands, 38.8 dB with 15-bit ones
    ("squeeze_excite_relu", 38.0, 2.0),
    # measured: 32.2 dB with 8-bit operands, 34.8 dB with 13- and 14-bit ones
    ("attention", 34.0, 2.0)])
def test_products_of_two_activations_take_wide_operands(tmp_path, name, floor, gain):
    """The model output at 16 bits, so that the products' operands are what limits it:
    the wide rule meets its SQNR floor and beats 8-bit operands by `gain` dB."""
    graph, samples = _net(tmp_path, name)
    want, got, q = _compare(graph, samples, Options(output_bits=16))
    narrow_want, narrow_got, _ = _compare(graph, samples,
                                          Options(output_bits=16, product_bits=8))
    wide, narrow = _sqnr(want, got), _sqnr(narrow_want, narrow_got)
    assert wide >= floor and wide >= narrow + gain, (wide, narrow)
    x = q.inputs["x"]
    ints = np.clip(np.round(samples["x"][0] * x[0]), -127, 127).astype(np.int8)
    assert np.array_equal(run_llvm(q.graph, ints), _reference(q.graph, ints))


def _reference(graph, x: np.ndarray) -> np.ndarray:
    from cvmc import reference_run
    return reference_run(graph, {"x": x})[graph.outputs[0]]


@pytest.mark.parametrize("name, operands, bits", [
    ("squeeze_excite", ("c", "g"), 15),  # a mul: 15 + 15 bits, no sum after it
    ("squeeze_excite_relu", ("c0", "c", "g"), 15),  # the relu on the conv's 15 bits
    ("attention", ("q", "k", "v", "p"), 14)])  # K = 8: 13 + 13 + 4, K = 6: 14 + 14 + 3
def test_product_operands_fit_int32(tmp_path, name, operands, bits):
    """The integer graph's types (the precision proof): each operand of a product is
    wider than 8 bits and at most `bits`, every conv2d and dense input at most 8 bits, and
    no precision above 32."""
    graph, samples = _net(tmp_path, name)
    g = _compare(graph, samples)[2].graph
    for operand in operands:
        assert 8 < g.types[operand].precision <= bits, (operand, g.types[operand])
    assert all(t.precision <= 32 for t in g.types.values())
    for node in g.nodes:
        if node.op in ("conv2d", "dense"):
            assert g.types[node.inputs[0]].precision <= 8, node


def test_clamps_use_the_whole_grid(tmp_path):
    """relu and relu6 read only by convs and denses: [0, threshold] on [-127, 127], offset
    threshold / 2 (the float clamps' absmax over the samples, halved), no relu or clip op
    left (the requantization's saturation is the clamp); each clamp's own SQNR (the layer
    report) and the output's up by >= 1.5 dB (measured: h 37.1 -> 38.9, e 33.8 -> 36.4,
    y 32.4 -> 34.4 dB)."""
    graph, samples = _net(tmp_path, "clamps")
    want, got, q = _compare(graph, samples, Options(output_bits=16))
    narrow_want, narrow_got, narrow = _compare(graph, samples,
                                               Options(output_bits=16, shifted=False))
    assert _sqnr(want, got) >= 34.0 and _sqnr(want, got) >= _sqnr(narrow_want, narrow_got) + 1.5
    floats = [run_float(q.source, {"x": x}) for x in samples["x"]]
    for clamp in ("h", "e"):
        absmax = max(float(np.abs(env[clamp]).max()) for env in floats)
        assert q.offsets[clamp] == pytest.approx(absmax / 2, rel=1e-6)
    assert not {"relu", "clip"} & {n.op for n in q.graph.nodes}
    count = samples["x"].shape[0]
    rows = {r["layer"]: r["sqnr_db"] for r in layer_report(q, samples, count)}
    before = {r["layer"]: r["sqnr_db"] for r in layer_report(narrow, samples, count)}
    assert rows["h"] >= before["h"] + 1.5 and rows["e"] >= before["e"] + 1.5
    x = q.inputs["x"]
    ints = np.clip(np.round(samples["x"][0] * x[0]), -127, 127).astype(np.int8)
    assert np.array_equal(run_llvm(q.graph, ints), _reference(q.graph, ints))


@pytest.mark.parametrize("body", [
    "    c = conv(x, w, padding = [(1, 1), (1, 1)]);\n    y = relu(c);",  # a model output
    ("    c = conv(x, w, padding = [(1, 1), (1, 1)]);\n    h = relu(c);\n"
     "    y = add(h, x);"),  # read by an add
    "    h = relu(x);\n    y = conv(h, w);"])  # of an input, not of a conv
def test_other_clamps_stay_symmetric(tmp_path, body):
    graph = _model(tmp_path, body, {"x": (1, 3, 6, 6)}, {"w": CLAMPS_WEIGHTS["w1"][:3]})
    samples = {"x": RNG.standard_normal((4, 1, 3, 6, 6)).astype(np.float32)}
    assert _compare(graph, samples)[2].offsets == {}


@needs_cvm_runtime
@pytest.mark.parametrize("name", NETS)
def test_runs_on_cvm_runtime(tmp_path, name):
    graph, samples = _net(tmp_path, name)
    q = _compare(graph, samples)[2]
    x = np.random.default_rng(13).integers(-127, 128, NETS[name][1]).astype(np.int8)
    assert_cvm_runtime_agrees(q.graph, x)


def test_bias_after_a_matmul_by_an_unsqueezed_weight(tmp_path):
    """matmul(x, unsqueeze(W)) then a bias add (what the ONNX converter writes for a
    sequence-first transformer's projection, x [seq, 1, dim]) folds into one dense with
    the bias on the last axis: no add left, and within the dense bound of test_rules
    (dx sum|w| + (0.5 / s_w) K max|x| + K dx 0.5 / s_w + bias and output roundings)."""
    w, bias = RNG.standard_normal((8, 6)) * 0.4, RNG.standard_normal((1, 1, 6)) * 0.3
    graph = _model(tmp_path, "    u = unsqueeze(w, axes = [0]);\n    m = matmul(x, u);\n"
                             "    y = add(m, b);", {"x": (4, 1, 8)}, {"w": w, "b": bias})
    samples = {"x": RNG.standard_normal((8, 4, 1, 8)).astype(np.float32)}
    want, got, q = _compare(graph, samples)
    sx, sy, sw = q.inputs["x"][0], q.manifest()["outputs"]["y"]["scale"], 127 / np.abs(w).max()
    xmax = np.abs(samples["x"]).max()
    bound = (0.5 / sx * np.abs(w).sum(0).max() + 0.5 / sw * 8 * xmax + 8 * 0.25 / (sx * sw)
             + 0.5 / (sx * sw) + 1 / sy)
    assert np.abs(got - want).max() <= bound
    ops = [n.op for n in q.graph.nodes]
    assert ops.count("dense") == 1 and not {"elemwise_add", "broadcast_add"} & set(ops)


@pytest.mark.parametrize("index", [1, -1])
def test_gather_by_a_weight_index_is_take(tmp_path, index):
    """gather of one index along an axis (torch's split of packed q, k, v): CVM take, the
    input's integers moved: within the input's rounding dx = 0.5 / s_x of the float slice,
    llvm and CVM-Runtime bit-exact."""
    graph = _model(tmp_path, f"    y = gather(x, {index}, axis = 1);", {"x": (2, 3, 4)}, {})
    samples = {"x": RNG.standard_normal((6, 2, 3, 4)).astype(np.float32)}
    want, got, q = _compare(graph, samples)
    assert got.shape == (6, 2, 4)
    assert np.abs(got - want).max() <= 0.5 / q.inputs["x"][0] + 1e-6
    assert [n.op for n in q.graph.nodes] == ["take", "reshape"]
    ints = np.clip(np.round(samples["x"][0] * q.inputs["x"][0]), -127, 127).astype(np.int8)
    assert np.array_equal(run_llvm(q.graph, ints), _reference(q.graph, ints))


@needs_cvm_runtime
def test_gather_runs_on_cvm_runtime(tmp_path):
    graph = _model(tmp_path, "    y = gather(x, -1, axis = 1);", {"x": (2, 3, 4)}, {})
    q = _compare(graph, {"x": RNG.standard_normal((6, 2, 3, 4)).astype(np.float32)})[2]
    x = np.random.default_rng(13).integers(-127, 128, (2, 3, 4)).astype(np.int8)
    assert_cvm_runtime_agrees(q.graph, x)


def test_shifted_clamp_after_a_deconv_before_an_asymmetric_padding(tmp_path):
    """A deconv's relu read by a conv with asymmetric padding (its excess concatenated as
    the integer 0, the rest padded by conv2d: both corrected per position): the shifted
    grid's SQNR above the symmetric one (measured 34.1 -> 35.1 dB), llvm bit-exact."""
    r = np.random.default_rng(1)
    body = ("    c = deconv(x, w1, b1, stride = [2, 2], padding = [(1, 1), (1, 1)]);\n"
            "    h = relu(c);\n    y = conv(h, w2, padding = [(1, 0), (0, 1)]);")
    graph = _model(tmp_path, body, {"x": (1, 3, 5, 5)},
                   {"w1": r.standard_normal((3, 4, 4, 4)) * 0.3,
                    "b1": r.standard_normal((1, 4)) * 0.1,
                    "w2": r.standard_normal((5, 4, 2, 2)) * 0.4})
    samples = {"x": r.standard_normal((8, 1, 3, 5, 5)).astype(np.float32)}
    want, got, q = _compare(graph, samples)
    narrow_want, narrow_got, _ = _compare(graph, samples, Options(shifted=False))
    assert set(q.offsets) == {"h"}
    assert _sqnr(want, got) >= _sqnr(narrow_want, narrow_got) + 0.5
    ints = np.clip(np.round(samples["x"][0] * q.inputs["x"][0]), -127, 127).astype(np.int8)
    assert np.array_equal(run_llvm(q.graph, ints), _reference(q.graph, ints))

"""What `cvmc quantize` writes, exported and run on CVM-Runtime itself (CPU and FORMAL):
every rewrite rule as a one-layer model, and whole MNIST-style nets with residuals,
concats, lookup tables and softmax. Each must load and give the bits of the reference
interpreter and of the llvm build (tests/cvm_runtime.py) for an input over the whole
8-bit range (every table entry reachable)."""
from __future__ import annotations

import numpy as np
import pytest

from cvmc.frontend import load_checked, load_graph
from cvmc.quantize import Options, quantize_graph
from cvmc.quantize.rewrite import Rewriter
from tests.cvm_runtime import assert_cvm_runtime_agrees, needs_cvm_runtime
from tests.quantize.test_concat_scales import OneScale
from tests.quantize.test_rules import _model

pytestmark = needs_cvm_runtime
RNG = np.random.default_rng(11)


def _weights(*shapes: tuple[int, ...], scale: float = 0.5) -> list[np.ndarray]:
    return [RNG.standard_normal(s) * scale for s in shapes]


W33, B4 = _weights((4, 3, 3, 3), (1, 4))
W3, C3 = _weights((3, 3, 3, 3), (1, 3, 1, 1))
WL, BL, WM = _weights((5, 12), (1, 5), (12, 5))
BN = {n: RNG.random((1, 4)) + 0.5 for n in ("mean", "var", "off", "scl")}
X, V = (1, 3, 6, 6), (2, 12)  # the image and vector inputs

# name: (float layer(s) as NNEF, input shape, weights, options)
RULES = {
    "conv": ("y = conv(x, w, b, padding = [(1, 1), (1, 1)], stride = [2, 1]);", X,
             {"w": W33, "b": B4}, Options()),
    "conv_per_channel": ("y = conv(x, w, b, padding = [(1, 1), (1, 1)]);", X,
                         {"w": W33, "b": B4}, Options(per_channel=True)),
    "conv_batch_norm": (("c = conv(x, w);\n"
                        "y = batch_normalization(c, mean, var, off, scl, epsilon = 0.001);"),
                        X, {"w": W33, **BN}, Options()),
    "linear": ("y = linear(x, w, b);", V, {"w": WL, "b": BL}, Options()),
    "matmul": ("y = matmul(x, w);", V, {"w": WM}, Options()),
    "matmul_add": ("m = matmul(x, w);\ny = add(m, b);", V, {"w": WM, "b": BL}, Options()),
    "residual_add": ("c = conv(x, w, padding = [(1, 1), (1, 1)]);\ny = add(c, x);", X,
                     {"w": W3}, Options()),
    "sub_of_two": ("c = conv(x, w, padding = [(1, 1), (1, 1)]);\ny = sub(x, c);", X,
                   {"w": W3}, Options()),
    "add_weight": ("y = add(x, c);", X, {"c": C3}, Options()),
    "sub_weight": ("y = sub(x, c);", X, {"c": C3}, Options()),
    "mul_weight": ("y = mul(x, c);", X, {"c": C3}, Options()),
    "mul_of_two": (("c = conv(x, w, padding = [(1, 1), (1, 1)]);\ns = sigmoid(x);\n"
                   "y = mul(c, s);"), X, {"w": W3}, Options()),
    "concat": ("c = conv(x, w);\nd = mul(c, 8.0);\ny = concat([x, d], axis = 1);", X,
               {"w": W3}, Options()),
    "avg_pool_ignore": (("y = avg_pool(x, size = [1, 1, 3, 3], stride = [1, 1, 2, 2], "
                        "padding = [(0, 0), (0, 0), (1, 1), (1, 1)], border = 'ignore');"), X,
                        {}, Options()),
    "avg_pool_constant": (("y = avg_pool(x, size = [1, 1, 2, 2], stride = [1, 1, 2, 2], "
                          "border = 'constant');"), X, {}, Options()),
    "mean_reduce": ("y = mean_reduce(x, axes = [2, 3]);", X, {}, Options()),
    "sum_reduce": ("y = sum_reduce(x, axes = [1]);", X, {}, Options()),
    "max_pool": (("y = max_pool(x, size = [1, 1, 3, 3], stride = [1, 1, 2, 2], "
                 "padding = [(0, 0), (0, 0), (1, 1), (1, 1)], border = 'ignore');"), X, {},
                 Options()),
    "relu": ("y = relu(x);", X, {}, Options()),
    "clamp": ("y = clamp(x, -0.5, 1.25);", X, {}, Options()),
    "reshape": ("y = reshape(x, shape = [1, 12, 9]);", X, {}, Options()),
    "squeeze": ("y = squeeze(x, axes = [0]);", X, {}, Options()),
    "unsqueeze": ("y = unsqueeze(x, axes = [4]);", X, {}, Options()),
    "transpose": ("y = transpose(x, axes = [0, 2, 3, 1]);", X, {}, Options()),
    "slice": ("y = slice(x, axes = [1, 3], begin = [1, 0], end = [3, 2]);", X, {}, Options()),
    "slice_strided": (("y = slice(x, axes = [1, 2], begin = [-3, 0], end = [4, 5], "
                      "stride = [2, 2]);"), X, {}, Options()),
    "nearest_upsample": ("y = nearest_upsample(x, factor = [2, 2]);", X, {}, Options()),
    "sigmoid": ("y = sigmoid(x);", X, {}, Options()),
    "tanh": ("y = tanh(x);", X, {}, Options()),
    "exp": ("y = exp(x);", X, {}, Options()),
    "hardswish": (("a = add(x, 3.0);\nc = clamp(a, 0.0, 6.0);\nm = mul(x, c);\n"
                  "y = div(m, 6.0);"), X, {}, Options()),
    "softmax": ("y = softmax(x, axes = [1]);", V, {}, Options()),
    "conv_softmax": ("c = conv(x, w);\ny = softmax(c, axes = [1]);", X, {"w": W3},
                     Options()),
    "output_16_bits": ("y = conv(x, w, b);", X, {"w": W33, "b": B4}, Options(output_bits=16)),
}

# An MNIST-style net (1x1x12x12): conv / relu / max pool, a residual block, a concat of a
# sigmoid branch and a conv branch, tanh, a global average pool, linear, softmax.
MNIST = """c1 = conv(x, w1, b1, padding = [(1, 1), (1, 1)]);
r1 = relu(c1);
p1 = max_pool(r1, size = [1, 1, 2, 2], stride = [1, 1, 2, 2],
              padding = [(0, 0), (0, 0), (0, 0), (0, 0)], border = 'ignore');
c2 = conv(p1, w2, padding = [(1, 1), (1, 1)]);
r2 = relu(c2);
s = add(r2, p1);
g = sigmoid(s);
c3 = conv(s, w3);
cat = concat([g, c3], axis = 1);
t = tanh(cat);
m = mean_reduce(t, axes = [2, 3]);
f = reshape(m, shape = [1, 12]);
l = linear(f, wf, bf);
y = softmax(l, axes = [1]);"""
MNIST_WEIGHTS = dict(zip(("w1", "b1", "w2", "w3", "wf", "bf"), _weights(
    (6, 1, 3, 3), (1, 6), (6, 6, 3, 3), (6, 6, 1, 1), (10, 12), (1, 10))))


def _quantized(tmp_path, body: str, shape: tuple[int, ...], weights: dict,
               options: Options, rewriter=Rewriter):
    graph = _model(tmp_path, "\n".join(f"    {line}" for line in body.splitlines()),
                   {"x": shape}, weights)
    return quantize_graph(graph, _samples(shape), options, rewriter=rewriter).graph


def _samples(shape: tuple[int, ...]) -> dict[str, np.ndarray]:
    """Calibration samples, the same in every test whatever ran before."""
    return {"x": np.random.default_rng(12).standard_normal((8, *shape)).astype(np.float32)}


def _full_range(shape: tuple[int, ...], count: int = 1) -> list[np.ndarray]:
    """`count` inputs over the whole 8-bit range, the same in every test."""
    rng = np.random.default_rng(13)
    return [rng.integers(-127, 128, shape).astype(np.int8) for _ in range(count)]


@pytest.mark.parametrize("rule", RULES)
def test_rule_runs_on_cvm_runtime(tmp_path, rule: str) -> None:
    body, shape, weights, options = RULES[rule]
    assert_cvm_runtime_agrees(_quantized(tmp_path, body, shape, weights, options),
                              *_full_range(shape))


def test_mnist_net_runs_on_cvm_runtime(tmp_path) -> None:
    graph = _quantized(tmp_path, MNIST, (1, 1, 12, 12), MNIST_WEIGHTS, Options())
    assert {"cvm_lut", "concatenate", "elemwise_add", "broadcast_div"} <= \
        {n.op for n in graph.nodes}
    for x in _full_range((1, 1, 12, 12), 3):
        assert_cvm_runtime_agrees(graph, x)


@pytest.mark.parametrize("net", ["conv_bn_net", "branchy_net"])
def test_onnx_net_runs_on_cvm_runtime(tmp_path, net: str) -> None:
    """The ONNX nets of tests/quantize/onnx_nets.py, converted and quantized per channel as
    `cvmc quantize` does."""
    pytest.importorskip("nnef_tools", reason="needs the convert extra: pip install "
                                             "'cvmc[convert]'")
    onnx = pytest.importorskip("onnx")
    from cvmc.cli import main
    from tests.quantize import onnx_nets

    onnx.save(getattr(onnx_nets, net)(), tmp_path / "net.onnx")
    assert main(["convert", str(tmp_path / "net.onnx"), "-o", str(tmp_path / "float")]) == 0
    graph = load_checked(tmp_path / "float")
    shape = graph.types[graph.inputs[0]].shape
    q = quantize_graph(graph, _samples(shape), Options(per_channel=True)).graph
    for x in _full_range(shape, 3):
        assert_cvm_runtime_agrees(q, x)


def test_concat_of_a_much_finer_branch(tmp_path) -> None:
    """A concat input 1000 times finer than its output: its requantization to the output's
    scale shifts right by at most 30 (cvmc/quantize/fixedpoint.py: MAX_SHIFT), since
    CVM-Runtime's CPU backend computes a shift by 31 or more without rounding; so CPU,
    FORMAL, the reference and llvm agree. (Both parts at the output's one scale, as for a
    concat that is not a model output.)"""
    graph = _quantized(tmp_path, "c = conv(x, w);\nd = mul(c, 1000.0);\n"
                       "y = concat([x, d], axis = 1);", X, {"w": W3}, Options(), OneScale)
    assert max(n.attrs["shift_bit"] for n in graph.nodes if n.op == "cvm_right_shift") <= 30
    assert_cvm_runtime_agrees(graph, *_full_range(X))


@pytest.mark.parametrize("net", ["float_net-u8", "float_net-s8-per-channel", "branchy_net",
                                 "qlinear_conv", "qlinear_matmul"])
def test_imported_quantized_onnx_runs_on_cvm_runtime(tmp_path, net: str) -> None:
    """Models quantized elsewhere (ONNX Runtime's QDQ, QLinearConv / QLinearMatMul) as
    `cvmc quantize` imports them (tests/quantize/test_qdq.py)."""
    pytest.importorskip("onnxruntime")
    import onnx

    from cvmc.cli import main
    from tests.quantize import test_qdq
    from tests.quantize.onnx_nets import branchy_net

    if net.startswith("qlinear"):
        onnx.save(test_qdq.qlinear_conv_net(matmul=net == "qlinear_matmul"),
                  tmp_path / "q.onnx")
        assert main(["quantize", str(tmp_path / "q.onnx"), "-o", str(tmp_path / "q")]) == 0
    else:
        model = branchy_net() if net == "branchy_net" else test_qdq.float_net()
        test_qdq.ort_qdq(model, tmp_path, "QInt8" if "s8" in net else "QUInt8",
                         "per-channel" in net or net == "branchy_net")
    graph = load_graph(tmp_path / "q")
    for x in _full_range(graph.types[graph.inputs[0]].shape, 2):
        assert_cvm_runtime_agrees(graph, x)

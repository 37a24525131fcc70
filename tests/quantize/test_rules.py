"""Each rewrite rule against float, within a bound derived from the scales.

Each case is a one-layer float NNEF model. The integer model runs on the reference
interpreter (inputs quantized by cvmc_runtime.quantize), its output is dequantized and
compared with the float model's output on the reference interpreter. Notation: s_x, s_y the
input and output scales (quantization.json), dx = 0.5 / s_x the input rounding (the
thresholds are the samples' absmax, so nothing is clipped), 1 / s_y the output's rounding
(half a unit) plus the fixed-point error (at most half a unit, test_fixedpoint.py).
"""
from pathlib import Path

import numpy as np
import pytest
from cvmc_runtime import dequantize, quantize, sliced_scale

from cvmc import reference_run
from cvmc.errors import CvmcError
from cvmc.frontend import load_checked
from cvmc.frontend.cvm_json import cvm_document
from cvmc.frontend.tensorfile import write_tensor
from cvmc.quantize import Options, quantize_graph

RNG = np.random.default_rng(7)


def _model(tmp: Path, body: str, inputs: dict[str, tuple], weights: dict[str, np.ndarray],
           out="y"):
    """A float NNEF folder: inputs, weights (as variables) and the body's lines."""
    decl = [f"    {n} = external<scalar>(shape = {list(s)});" for n, s in inputs.items()]
    for n, w in weights.items():
        decl.append(f"    {n} = variable<scalar>(shape = {list(w.shape)}, label = '{n}');")
        write_tensor(tmp / f"{n}.dat", w.astype(np.float32))
    text = (f"version 1.0;\ngraph g( {', '.join(inputs)} ) -> ( {out} )\n{{\n"
            + "\n".join(decl) + "\n" + body + "\n}\n")
    (tmp / "graph.nnef").write_text(text)
    return load_checked(tmp)


def _compare(graph, samples, options: Options | None = None):
    """(float outputs, dequantized integer outputs, the Quantized model) per sample."""
    q = quantize_graph(graph, samples, options or Options())
    n = next(iter(samples.values())).shape[0]
    want, got = [], []
    for k in range(n):
        feeds = {i: samples[i][k] for i in graph.inputs}
        want.append(reference_run(graph, feeds)["y"].astype(np.float64))
        ints = {i: quantize(i, feeds[i], *q.inputs[i]).astype(np.int8) for i in graph.inputs}
        y, entry = reference_run(q.graph, ints)["y"], q.manifest()["outputs"]["y"]
        scale = entry["scale"] if "axis" not in entry else \
            sliced_scale(entry["scale"], entry["axis"], entry["sizes"], y.ndim)
        got.append(dequantize(y, scale).astype(np.float64))
    return np.array(want), np.array(got), q


def _sx(q, name="x"):
    return q.inputs[name][0]


def _sy(q):
    return q.manifest()["outputs"]["y"]["scale"]


@pytest.mark.parametrize("per_channel, padding", [
    (False, "[(1, 1), (1, 1)]"), (True, "[(1, 1), (1, 1)]"),
    (False, "[(0, 1), (2, 1)]"),  # asymmetric: the excess concatenated as zeros
    (True, "[]")])  # automatic (TF's SAME): stride 2 on 7 needs 2 rows, 1 + 1
def test_conv_with_bias(tmp_path, per_channel, padding):
    w = RNG.standard_normal((4, 3, 3, 3)) * np.array([1.0, 0.1, 3.0, 0.5])[:, None, None, None]
    b = RNG.standard_normal((1, 4)) * 0.2
    g = _model(tmp_path, f"    y = conv(x, w, b, padding = {padding}, stride = [2, 1]);",
               {"x": (1, 3, 7, 7)}, {"w": w, "b": b})
    xs = RNG.standard_normal((8, 1, 3, 7, 7)).astype(np.float32)
    want, got, q = _compare(g, {"x": xs}, Options(per_channel=per_channel))
    sx, sy, k = _sx(q), _sy(q), 27
    wmax = np.abs(w).reshape(4, -1).max(1) if per_channel else np.full(4, np.abs(w).max())
    sw = 127 / wmax
    xmax = np.abs(xs).max()
    # |conv(x, w) - conv(xq, wq)| <= dx sum|w_c| + (0.5/s_w) K |x|max + K dx 0.5/s_w, the
    # bias rounding 0.5/(s_x s_w), then the output's rounding and fixed point
    bound = (0.5 / sx * np.abs(w).reshape(4, -1).sum(1) + 0.5 / sw * k * xmax
             + k * 0.25 / (sx * sw) + 0.5 / (sx * sw)).max() + 1 / sy
    assert np.abs(got - want).max() <= bound


def test_per_channel_reduces_error_on_spread_channels(tmp_path):
    w = RNG.standard_normal((4, 3, 3, 3)) * np.array([8.0, 0.05, 0.05, 0.05])[:, None, None, None]
    g = _model(tmp_path, "    y = conv(x, w, padding = [(1, 1), (1, 1)]);",
               {"x": (1, 3, 5, 5)}, {"w": w})
    xs = RNG.standard_normal((6, 1, 3, 5, 5)).astype(np.float32)
    errors = []
    for per_channel in (False, True):
        want, got, _ = _compare(g, {"x": xs}, Options(per_channel=per_channel))
        errors.append(np.abs(got - want)[:, :, 1:].max())  # the small channels
    # per tensor, the small channels' weights all round to 0 (8 * 3 sigma / 127 > 0.05 * 3
    # sigma); per channel they keep 8 bits, and only the shared output scale's rounding is left
    assert errors[1] < errors[0]


def test_linear(tmp_path):
    w, b = RNG.standard_normal((5, 12)) * 0.3, RNG.standard_normal((1, 5))
    g = _model(tmp_path, "    y = linear(x, w, b);", {"x": (2, 12)}, {"w": w, "b": b})
    xs = RNG.standard_normal((8, 2, 12)).astype(np.float32)
    want, got, q = _compare(g, {"x": xs})
    sx, sy, sw = _sx(q), _sy(q), 127 / np.abs(w).max()
    bound = (0.5 / sx * np.abs(w).sum(1).max() + 0.5 / sw * 12 * np.abs(xs).max()
             + 12 * 0.25 / (sx * sw) + 0.5 / (sx * sw) + 1 / sy)
    assert np.abs(got - want).max() <= bound


def test_matmul_then_bias_add_becomes_one_dense(tmp_path):
    w, b = RNG.standard_normal((12, 5)) * 0.3, RNG.standard_normal((1, 5))
    g = _model(tmp_path, "    m = matmul(x, w);\n    y = add(m, b);", {"x": (2, 12)},
               {"w": w, "b": b})
    xs = RNG.standard_normal((8, 2, 12)).astype(np.float32)
    want, got, q = _compare(g, {"x": xs})
    assert next(n.op for n in q.graph.nodes) == "dense" and "m" not in q.graph.types
    sx, sy, sw = _sx(q), _sy(q), 127 / np.abs(w).max()
    bound = (0.5 / sx * np.abs(w).sum(0).max() + 0.5 / sw * 12 * np.abs(xs).max()
             + 12 * 0.25 / (sx * sw) + 0.5 / (sx * sw) + 1 / sy)
    assert np.abs(got - want).max() <= bound


def test_residual_add_of_differently_scaled_inputs(tmp_path):
    g = _model(tmp_path, "    y = add(x, z);", {"x": (1, 3, 4, 4), "z": (1, 3, 4, 4)}, {})
    xs = RNG.standard_normal((8, 1, 3, 4, 4)).astype(np.float32)
    zs = (RNG.standard_normal((8, 1, 3, 4, 4)) * 20).astype(np.float32)
    want, got, q = _compare(g, {"x": xs, "z": zs})
    sc = 32767 / max(np.abs(xs).max(), np.abs(zs).max())  # the 16-bit common scale
    # each operand: its input rounding, then requantized to s_c (at most one unit of s_c)
    bound = 0.5 / _sx(q, "x") + 0.5 / _sx(q, "z") + 2 / sc + 1 / _sy(q)
    assert np.abs(got - want).max() <= bound


def test_concat_of_differently_scaled_inputs(tmp_path):
    """A model output: each part at its own scale, s_y one per slice (the one-scale rule:
    tests/quantize/test_concat_scales.py)."""
    g = _model(tmp_path, "    y = concat([x, z], axis = 1);",
               {"x": (1, 2, 3, 3), "z": (1, 3, 3, 3)}, {})
    xs = RNG.standard_normal((8, 1, 2, 3, 3)).astype(np.float32) * 0.1
    zs = RNG.standard_normal((8, 1, 3, 3, 3)).astype(np.float32) * 5
    want, got, q = _compare(g, {"x": xs, "z": zs})
    err = np.abs(got - want)
    sy_x, sy_z = _sy(q)
    assert err[:, :, :2].max() <= 0.5 / _sx(q, "x") + 1 / sy_x
    assert err[:, :, 2:].max() <= 0.5 / _sx(q, "z") + 1 / sy_z


@pytest.mark.parametrize("call", [
    ("avg_pool(x, size = [1, 1, 3, 3], stride = [1, 1, 2, 2], padding = [(0, 0), (0, 0), "
    "(1, 1), (1, 1)], border = 'ignore')"),
    "avg_pool(x, size = [1, 1, 2, 2], stride = [1, 1, 2, 2], border = 'constant')",
    "mean_reduce(x, axes = [2, 3])",
    ("avg_pool(x, size = [1, 1, 3, 3], stride = [1, 1, 2, 2], padding = [(0, 0), (0, 0), "
     "(0, 1), (1, 2)], border = 'ignore')"),
    ("avg_pool(x, size = [1, 1, 2, 2], stride = [1, 1, 2, 2], padding = [(0, 0), (0, 0), "
     "(1, 0), (0, 1)], border = 'constant')")])
def test_average_pools(tmp_path, call):
    g = _model(tmp_path, f"    y = {call};", {"x": (1, 3, 6, 6)}, {})
    xs = RNG.standard_normal((8, 1, 3, 6, 6)).astype(np.float32)
    want, got, q = _compare(g, {"x": xs})
    # an average of inputs each within dx, then the output's rounding
    assert np.abs(got - want).max() <= 0.5 / _sx(q) + 1 / _sy(q)


@pytest.mark.parametrize("call", [
    "relu(x)", "clamp(x, -0.5, 1.25)",
    "max_pool(x, size = [1, 1, 2, 2], padding = [(0, 0), (0, 0), (0, 0), (0, 0)])",
    ("max_pool(x, size = [1, 1, 3, 3], stride = [1, 1, 2, 2], padding = [(0, 0), (0, 0), "
     "(0, 1), (1, 2)], border = 'ignore')"),
    "reshape(x, shape = [1, 12, 3])", "transpose(x, axes = [0, 2, 3, 1])",
    "nearest_upsample(x, factor = [2, 2])",
    "slice(x, axes = [1, 3], begin = [1, 0], end = [3, 2])",
    "slice(x, axes = [1, 2], begin = [-3, 0], end = [4, 3], stride = [2, 2])"])
def test_passed_through(tmp_path, call):
    g = _model(tmp_path, f"    y = {call};", {"x": (1, 4, 3, 3)}, {})
    xs = RNG.standard_normal((8, 1, 4, 3, 3)).astype(np.float32)
    want, got, q = _compare(g, {"x": xs})
    assert _sy(q) == _sx(q)  # the scale passes: no requantization
    cvm_document(q.graph)  # CVM-Runtime has every op it uses (else: a CvmcError)
    assert np.abs(got - want).max() <= 0.5 / _sx(q) + 1e-6  # 1-Lipschitz in each element


@pytest.mark.parametrize("call,lipschitz", [("sigmoid(x)", 0.25), ("tanh(x)", 1.0),
                                            ("exp(x)", None)])
def test_lookup_tables(tmp_path, call, lipschitz):
    g = _model(tmp_path, f"    y = {call};", {"x": (1, 2, 4, 4)}, {})
    xs = RNG.standard_normal((8, 1, 2, 4, 4)).astype(np.float32)
    want, got, q = _compare(g, {"x": xs})
    lip = lipschitz if lipschitz is not None else np.exp(np.abs(xs).max())
    assert np.abs(got - want).max() <= lip * 0.5 / _sx(q) + 0.5 / _sy(q) + 1e-6


def test_table_spans_where_the_function_is_finite(tmp_path):
    g = _model(tmp_path, "    y = sqrt(x);", {"x": (1, 2, 4, 4)}, {})
    xs = np.abs(RNG.standard_normal((8, 1, 2, 4, 4))).astype(np.float32)
    want, got, q = _compare(g, {"x": xs})
    assert [n.op for n in q.graph.nodes] == ["cvm_lut"]  # indexed by x itself: 0..127
    # |sqrt(x) - sqrt(xq)| <= sqrt(|x - xq|), then the table's rounding
    assert np.abs(got - want).max() <= np.sqrt(0.5 / _sx(q)) + 0.5 / _sy(q) + 1e-6
    # a negative input reads the table's first entry, sqrt(0)
    negative = np.full((1, 2, 4, 4), -100, np.int8)
    assert not reference_run(q.graph, {"x": negative})["y"].any()


def test_softmax(tmp_path):
    g = _model(tmp_path, "    y = softmax(x, axes = [1]);", {"x": (2, 10)}, {})
    xs = (RNG.standard_normal((8, 2, 10)) * 3).astype(np.float32)
    want, got, q = _compare(g, {"x": xs})
    # softmax moves by at most max|dx| / 2; e = round(exp(.) 2^14) over a sum >= 2^14;
    # the final rounding half a unit of 1/127
    bound = 0.5 * 0.5 / _sx(q) + 11 / 32768 + 0.5 / 127
    assert np.abs(got - want).max() <= bound


@pytest.mark.parametrize("body", [
    "    y = matmul(x, z);",
    "    t = transpose(z, axes = [0, 1, 3, 2]);\n    y = matmul(x, t, transposeB = true);",
    "    t = transpose(x, axes = [0, 1, 3, 2]);\n    y = matmul(t, z, transposeA = true);"])
def test_matmul_of_two_activations(tmp_path, body):
    g = _model(tmp_path, body, {"x": (2, 3, 4, 5), "z": (2, 3, 5, 6)}, {})
    xs = RNG.standard_normal((8, 2, 3, 4, 5)).astype(np.float32)
    zs = (RNG.standard_normal((8, 2, 3, 5, 6)) * 3).astype(np.float32)
    want, got, q = _compare(g, {"x": xs, "z": zs})
    assert {"broadcast_mul", "sum"} <= {n.op for n in q.graph.nodes}
    # |a b - aq bq| <= dx_a K max|b| + dx_b K max|a| + K dx_a dx_b, then the output's
    # rounding and fixed point
    dxa, dxb, k = 0.5 / _sx(q, "x"), 0.5 / _sx(q, "z"), 5
    bound = (dxa * k * np.abs(zs).max() + dxb * k * np.abs(xs).max() + k * dxa * dxb
             + 1 / _sy(q))
    assert np.abs(got - want).max() <= bound


def test_batch_norm_is_folded_into_the_conv(tmp_path):
    w = RNG.standard_normal((3, 2, 3, 3))
    stats = {n: RNG.random((1, 3)) + 0.5 for n in ("mean", "var", "off", "scl")}
    s, o = RNG.random((1, 3, 1, 1)) + 0.5, RNG.standard_normal((1, 3, 1, 1))
    g = _model(tmp_path, "    c = conv(x, w);\n"
               "    n = batch_normalization(c, mean, var, off, scl, epsilon = 0.001);\n"
               "    m = mul(n, s);\n    y = add(m, o);",
               {"x": (1, 2, 5, 5)}, {"w": w, "s": s, "o": o, **stats})
    xs = RNG.standard_normal((4, 1, 2, 5, 5)).astype(np.float32)
    want, got, q = _compare(g, {"x": xs})
    assert [n.op for n in q.graph.nodes][:2] == ["conv2d", "cvm_clip"]
    assert not {"c", "n", "m"} & set(q.graph.types)  # one conv, then its requantization
    assert np.abs(got - want).max() <= 0.05 * np.abs(want).max()


@pytest.mark.parametrize("body, message", [
    ("    y = pow(x, z);", r"layer 'y' \(pow\): no quantization rule"),
    ("    y = conv(x, w, padding = [(1, 1), (1, 1)], border = 'reflect');",
     r"layer 'y' \(conv\): border 'reflect'"),
    ("    y = rcp(x);", r"layer 'y' \(rcp\): the function is not finite")])
def test_uncovered_layers_are_refused_before_calibrating(tmp_path, monkeypatch, body, message):
    def calibrate(*args):
        raise AssertionError("calibrated before refusing the layer")
    monkeypatch.setattr("cvmc.quantize.calibrate", calibrate)
    g = _model(tmp_path, body, {"x": (1, 2, 4, 4), "z": (1, 2, 4, 4)},
               {"w": np.ones((3, 2, 3, 3))})
    with pytest.raises(CvmcError, match=message):
        quantize_graph(g, {"x": np.ones((2, 1, 2, 4, 4), np.float32),
                           "z": np.ones((2, 1, 2, 4, 4), np.float32)}, Options())


def test_softmax_after_conv_is_not_folded_as_affine(tmp_path):
    # softmax maps every constant tensor to one value: an affine test at constants alone
    # would fold it into the conv
    w = RNG.standard_normal((4, 2, 1, 1))
    g = _model(tmp_path, "    c = conv(x, w);\n    y = softmax(c, axes = [1]);",
               {"x": (1, 2, 3, 3)}, {"w": w})
    xs = RNG.standard_normal((4, 1, 2, 3, 3)).astype(np.float32)
    want, got, q = _compare(g, {"x": xs})
    assert "cvm_lut" in [n.op for n in q.graph.nodes]
    assert np.abs(got - want).max() <= 0.05


def test_hardswish_is_one_lookup_table(tmp_path):
    g = _model(tmp_path, "    a = add(x, 3.0);\n    c = clamp(a, 0.0, 6.0);\n"
               "    m = mul(x, c);\n    y = div(m, 6.0);", {"x": (1, 2, 4, 4)}, {})
    xs = (RNG.standard_normal((8, 1, 2, 4, 4)) * 3).astype(np.float32)
    want, got, q = _compare(g, {"x": xs})
    assert [n.op for n in q.graph.nodes] == ["broadcast_add", "cvm_lut"]
    # hardswish is 1.5-Lipschitz; the table rounds once, to half a unit of s_y
    assert np.abs(got - want).max() <= 1.5 * 0.5 / _sx(q) + 0.5 / _sy(q) + 1e-6


def test_mul_by_per_channel_weight(tmp_path):
    c = RNG.standard_normal((1, 3, 1, 1))
    g = _model(tmp_path, "    y = mul(x, c);", {"x": (1, 3, 4, 4)}, {"c": c})
    xs = RNG.standard_normal((8, 1, 3, 4, 4)).astype(np.float32)
    want, got, q = _compare(g, {"x": xs})
    sc = 127 / np.abs(c).max()
    # |x c - xq cq| <= dx |c| + |x| 0.5 / s_c + dx 0.5 / s_c, then the output's rounding
    bound = (0.5 / _sx(q) * np.abs(c).max() + np.abs(xs).max() * 0.5 / sc
             + 0.25 / (_sx(q) * sc) + 1 / _sy(q))
    assert np.abs(got - want).max() <= bound


def test_a_user_fragment_without_a_rule_is_split_into_its_primitives(tmp_path):
    w = RNG.standard_normal((3, 2, 3, 3))
    write_tensor(tmp_path / "w.dat", w.astype(np.float32))
    (tmp_path / "graph.nnef").write_text(
        "version 1.0;\nextension KHR_enable_fragment_definitions;\n"
        "fragment block( input: tensor<scalar>, filter: tensor<scalar> )"
        " -> ( output: tensor<scalar> )\n{\n    c = conv(input, filter);\n"
        "    output = relu(c);\n}\n"
        "graph g( x ) -> ( y )\n{\n    x = external<scalar>(shape = [1, 2, 5, 5]);\n"
        "    w = variable<scalar>(shape = [3, 2, 3, 3], label = 'w');\n"
        "    y = block(x, w);\n}\n")
    g = load_checked(tmp_path)
    xs = RNG.standard_normal((4, 1, 2, 5, 5)).astype(np.float32)
    want, got, q = _compare(g, {"x": xs})
    assert next(n.op for n in q.graph.nodes) == "conv2d" and q.graph.nodes[-1].op == "relu"
    assert np.abs(got - want).max() <= 0.05 * np.abs(want).max()

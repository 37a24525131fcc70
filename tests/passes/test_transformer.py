"""The fuse-transformer pass: PyTorch's decomposed layer normalization, as NNEF-Tools
writes it, becomes one layer_norm node and one kernel with its scale and shift; the
compiled result stays within layer_norm's bound of the reference (the chain), with the
same bits at 1 and 2 threads; chains that differ are left alone."""
from __future__ import annotations

import math
import tempfile
from pathlib import Path

import numpy as np
import pytest

import cvmc
from cvmc.frontend.nnef import parse_nnef
from cvmc.passes.target import Target
from tests.nnefutil import (
    mean_bound,
    moments_bound,
    random_inputs,
    run_at_1_and_2_threads,
    softmax_bound,
)
from tests.oputil import compile_passes

U = 2.0**-24
CHAIN = """
    m = mean_reduce(x, axes = [{axes}]);
    d = sub(x, m);
    p = pow(d, 2.0);
    v = mean_reduce(p, axes = [{axes}]);
    a = add(v, 1e-5);
    s = sqrt(a);
    n = div(d, s);
    q = mul(n, g);
    y = add(q, b);
"""


def _document(shape=(2, 5, 48), axes="2", extra_output: str = "") -> str:
    scale = [1 if i != len(shape) - 1 else shape[-1] for i in range(len(shape))]
    outputs = ", ".join(["y", *([extra_output] if extra_output else [])])
    return (f"version 1.0;\ngraph G( x, g, b ) -> ( {outputs} )\n{{\n"
            f"    x = external<scalar>(shape = {list(shape)});\n"
            f"    g = external<scalar>(shape = {scale});\n"
            f"    b = external<scalar>(shape = {scale});\n"
            f"{CHAIN.format(axes=axes)}}}\n")


def _fused(text: str):
    return compile_passes(parse_nnef(text, "ln.nnef"), target=Target.make("llvm", "znver3"))


def _layer_norm_bound(x: np.ndarray, axes: tuple[int, ...], eps: float, y: np.ndarray):
    """cvmc/ops/transformer.py's bound on |layer_norm - reference|: (dm + 2u|d|) / s +
    |y| (dv / (2 (v + eps)) + 4u), from the mean's and the variance's bounds."""
    x64 = x.astype(np.float64)
    mean = np.mean(x64, axis=axes, keepdims=True)
    d = x64 - mean
    v = np.mean(d * d, axis=axes, keepdims=True)
    s = np.sqrt(v + eps)
    dm, dv = mean_bound(x, axes), moments_bound(x, axes, mean)
    return (dm + 2 * U * np.abs(d)) / s + np.abs(y) * (dv / (2 * (v + eps)) + 4 * U)


def test_decomposed_layer_norm_becomes_one_kernel():
    g = _fused(_document())
    assert [n.op for n in g.nodes] == ["layer_norm", "mul", "add"]
    assert g.kernels == [[n.name for n in g.nodes]]
    assert g.nodes[0].attrs["axes"] == (2,)
    assert g.nodes[0].attrs["epsilon"] == pytest.approx(1e-5)


@pytest.mark.parametrize("shape,axes", [((2, 5, 48), "2"), ((3, 4, 6), "1, 2")])
def test_layer_norm_kernel_within_bound_at_any_thread_count(shape, axes):
    source = parse_nnef(_document(shape, axes), "ln.nnef")
    feeds = random_inputs(source)
    feeds["x"] = (feeds["x"] * 4 + 1.5).astype(np.float32)  # a mean far from 0 too
    want = cvmc.reference_run(source, feeds)["y"]
    assert np.array_equal(want, cvmc.reference_run(_fused(_document(shape, axes)), feeds)["y"])
    runs = run_at_1_and_2_threads(source, feeds)
    r = tuple(int(a) for a in axes.split(","))
    n = ((want - feeds["b"]) / feeds["g"]).astype(np.float64)
    # the scale and shift: |g| times the normalized bound, two roundings more
    bound = np.abs(feeds["g"]) * _layer_norm_bound(feeds["x"], r, 1e-5, n) \
        + 4 * U * (np.abs(want) + np.abs(feeds["b"]))
    assert np.all(np.abs(runs[0].astype(np.float64) - want) <= bound)



def _one_op_run(text: str, op: str, scale: float):
    """(feeds, reference output, compiled output) of document `text` on random x times
    `scale`, after checking the pass makes it the one op `op` of the same reference bits."""
    source = parse_nnef(text, "doc.nnef")
    g = _fused(text)
    assert [n.op for n in g.nodes] == [op]
    feeds = {"x": (random_inputs(source)["x"] * scale).astype(np.float32)}
    want = cvmc.reference_run(source, feeds)["y"]
    assert np.array_equal(want, cvmc.reference_run(g, feeds)["y"])
    return feeds, want, run_at_1_and_2_threads(source, feeds)[0]


def test_softmax_becomes_one_kernel_within_bound():
    text = ("version 1.0;\ngraph G( x ) -> ( y )\n{\n"
            "    x = external<scalar>(shape = [2, 4, 77]);\n"
            "    y = softmax(x, axes = [2]);\n}\n")
    _, want, got = _one_op_run(text, "fused_softmax", 8)
    assert np.all(np.abs(got.astype(np.float64) - want) <= softmax_bound(want, 77))


# GELU as NNEF-Tools converts PyTorch's nn.GELU() (ONNX Div, Erf, Add, Mul, Mul), with
# its erf fragment verbatim
GELU = """version 1.0;
extension KHR_enable_fragment_definitions;
extension KHR_enable_operator_expressions;
fragment erf( x: tensor<scalar> ) -> ( y: tensor<scalar> )
{
    t = 1.0 / (1.0 + 0.3275911 * abs(x));
    z = 1.0 - (((((1.061405429 * t + -1.453152027) * t) + 1.421413741) * t + -0.284496736)
        * t + 0.254829592) * t * exp(-x * x);
    y = sign(x) * z;
}
graph G( x ) -> ( y )
{
    x = external<scalar>(shape = [3, 40]);
    d = div(x, 1.4142135381698608);
    e = erf(d);
    a = add(e, 1.0);
    m = mul(x, a);
    y = mul(m, 0.5);
}
"""


def test_gelu_erf_becomes_one_op_within_bound():
    feeds, want, got = _one_op_run(GELU, "gelu_erf", 3)
    x = feeds["x"].astype(np.float64)
    assert np.all(np.abs(got.astype(np.float64) - want) <= 64 * U * np.abs(x))
    # and it is GELU: A&S 7.1.26 is within 1.5e-7 of erf
    exact = 0.5 * x * (1 + np.vectorize(math.erf)(x / math.sqrt(2)))
    assert np.all(np.abs(want - exact) <= 1e-6 * (1 + np.abs(x)))


def test_gelu_with_another_constant_is_left_alone():
    text = GELU.replace("y = mul(m, 0.5);", "y = mul(m, 0.25);")
    assert "gelu_erf" not in [n.op for n in _fused(text).nodes]


def test_moments_form_with_two_subtractions_becomes_layer_norm():
    text = _document().replace("    n = div(d, s);", "    c = sub(x, m);\n    n = div(c, s);")
    source, g = parse_nnef(text, "ln.nnef"), _fused(text)
    assert [n.op for n in g.nodes] == ["layer_norm", "mul", "add"]
    feeds = random_inputs(source)
    assert np.array_equal(cvmc.reference_run(source, feeds)["y"],
                          cvmc.reference_run(g, feeds)["y"])


def test_chain_with_an_outside_reader_is_left_alone():
    g = _fused(_document(extra_output="d"))
    assert "layer_norm" not in [n.op for n in g.nodes]


def test_other_epsilon_position_or_exponent_is_left_alone():
    text = _document().replace("p = pow(d, 2.0);", "p = pow(d, 3.0);")
    assert "layer_norm" not in [n.op for n in _fused(text).nodes]


# Self-attention as NNEF-Tools converts PyTorch's nn.MultiheadAttention (ONNX opset 14, a
# 2-layer nn.TransformerEncoder, seq-first): q, k, v [seq, batch, heads, d] transposed to
# heads-first, K to [.., d, seq]; both scaled by sqrt(1/sqrt(d)) (a [1] weight unsqueezed),
# the scores' softmax, then the matmul with V.
ATTENTION = """version 1.0;
graph G( q, k, v ) -> ( y, o )
{
    q = external<scalar>(shape = [16, 1, 2, 8]);
    k = external<scalar>(shape = [16, 1, 2, 8]);
    v = external<scalar>(shape = [16, 1, 2, 8]);
    c = constant<scalar>(shape = [1], value = [0.3535533845424652]);
    tv = transpose(v, axes = [1, 2, 0, 3]);
    tk = transpose(k, axes = [1, 2, 3, 0]);
    uk = unsqueeze(c, axes = [0, 1, 2]);
    sk = mul(tk, uk);
    tq = transpose(q, axes = [1, 2, 0, 3]);
    uq = unsqueeze(c, axes = [0, 1, 2]);
    sq = mul(tq, uq);
    s = matmul(sq, sk);
    y = softmax(s, axes = [3]);
    o = matmul(y, tv);
}
"""
# The other form: K read transposed by the matmul, the scale on the scores.
SCORES = """version 1.0;
graph G( q, k ) -> ( y )
{
    q = external<scalar>(shape = [2, 3, 12, 8]);
    k = external<scalar>(shape = [2, 3, 24, 8]);
    s = matmul(q, k, transposeB = true);
    t = mul(s, 0.125);
    y = softmax(t, axes = [3]);
}
"""


def _attention_bound(q, k, want, attrs) -> np.ndarray:
    """cvmc/ops/transformer.py's attention_scores bound: each score within D = gamma(d + 2)
    |c| sum_d |q'_d k'_d| moves y by a factor within exp(+-2 max D) (softmax is
    shift-invariant), then the softmax's own bound."""
    q = np.abs(q.astype(np.float64) * np.float32(attrs["q_scale"]))
    k = np.abs(k.astype(np.float64) * np.float32(attrs["k_scale"]))
    depth = q.shape[-1]
    dots = np.matmul(q, np.swapaxes(k, -1, -2) if attrs["transposeB"] else k)
    gamma = (depth + 2) * U / (1 - (depth + 2) * U)
    worst = 2 * gamma * abs(np.float32(attrs["scale"])) * dots.max(axis=-1, keepdims=True)
    return np.expm1(worst) * np.abs(want) + np.exp(worst) * softmax_bound(want, want.shape[-1])


# The exported chain with a causal mask (nn.TransformerEncoder(x, mask=...)): NNEF-Tools
# adds it to the scores before the softmax.
MASKED = ATTENTION.replace("( q, k, v )", "( q, k, v, m )").replace(
    "    c = constant", "    m = external<scalar>(shape = [1, 1, 16, 16]);\n    c = constant"
).replace("y = softmax(s, axes = [3]);", "a = add(s, m);\n    y = softmax(a, axes = [3]);")


@pytest.mark.parametrize("text,inputs", [(ATTENTION, ("tq", "tk")), (SCORES, ("q", "k")),
                                         (MASKED, ("tq", "tk", "m"))])
def test_attention_scores_become_one_kernel_within_bound(text, inputs):
    source, g = parse_nnef(text, "att.nnef"), _fused(text)
    (node,) = [n for n in g.nodes if n.op == "attention_scores"]
    assert not any(n.op in ("fused_softmax", "mul", "add") for n in g.nodes)
    assert node.outputs == ("y",) and node.inputs == inputs
    feeds = {n: (v * 3).astype(np.float32) for n, v in random_inputs(source).items()}
    if "m" in feeds:  # causal: 0 on and below the diagonal, -inf above (exact adds)
        feeds["m"] = np.triu(np.full((1, 1, 16, 16), -np.inf, np.float32), 1)
    want = cvmc.reference_run(source, feeds)
    assert all(np.array_equal(w, cvmc.reference_run(g, feeds)[n]) for n, w in want.items())
    with tempfile.TemporaryDirectory(prefix="cvmc-att-") as tmp:
        result = cvmc.compile(source, Path(tmp) / "m.cvmx", target="llvm", mcpu="znver3")
    assert [k["schedule"] for k in result.plan["kernels"] if "attention_scores" in k["ops"]] \
        == ["cpu-attention"]
    got = run_at_1_and_2_threads(source, feeds)[0]
    # q and k as the scores read them: the transposes of the exported chain, or the inputs
    q, k = (feeds[n] for n in ("q", "k"))
    if inputs[0] == "tq":
        q, k = np.transpose(q, (1, 2, 0, 3)), np.transpose(k, (1, 2, 3, 0))
    bound = _attention_bound(q, k, want["y"], node.attrs)
    assert np.all(np.abs(got.astype(np.float64) - want["y"]) <= bound)
    if "m" in feeds:
        masked = np.broadcast_to(feeds["m"] < 0, got.shape)
        assert np.all(got[masked] == 0) and np.all(got[~masked] > 0)


def test_attention_scores_read_elsewhere_are_left_alone():
    text = SCORES.replace("-> ( y )", "-> ( y, t )")
    ops = [n.op for n in _fused(text).nodes]
    assert "attention_scores" not in ops and "fused_softmax" in ops


def test_attention_with_broadcast_batch_or_softmax_over_queries_is_left_alone():
    broadcast = SCORES.replace("[2, 3, 24, 8]", "[1, 3, 24, 8]")
    assert "attention_scores" not in [n.op for n in _fused(broadcast).nodes]
    queries = SCORES.replace("axes = [3]", "axes = [2]")
    assert "attention_scores" not in [n.op for n in _fused(queries).nodes]

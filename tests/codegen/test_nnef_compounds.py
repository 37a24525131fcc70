"""The stdlib compound fragments built on NNEF's reduce, data-movement and element-wise
primitives compile through expansion: each tiny document is parsed, compiled for llvm, run
by the runtime and compared with the reference interpreter within the fragment's bound
(derived in `tests.nnefutil` and at each entry from the per-op bounds)."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import pytest

from cvmc.frontend.nnef import parse_nnef
from tests.nnefutil import (
    mean_bound,
    moments_bound,
    random_inputs,
    relative,
    run_both,
    run_digests,
    softmax_bound,
    ulp_bound,
)
from tests.oputil import assert_matches

rng = np.random.default_rng(3)


def _off_grid(count: int) -> np.ndarray:
    """Grid positions k + f with the fraction f in [0.1, 0.4] or [0.6, 0.9]: a rounding's
    argument a few ULP off stays on the same side of every half."""
    f = rng.uniform(0.1, 0.4, count) + 0.5 * (rng.random(count) < 0.5)
    return np.arange(count) + f


# Quantization inputs whose round() arguments keep off the halves (see each case).
_LINEAR = np.float32([-3.0, 5.0, *(-1.0 + _off_grid(15) * 3.0 / 15)])  # min -1, max 2, r 15
_MIN_MAX = np.float32([-9.0, 5.0, *(-1.0 + _off_grid(254) * 3.0 / 255)])  # r 255
_LOG = np.float32(np.exp2(_off_grid(11) - 7.5) * np.where(rng.random(11) < 0.5, -1, 1))


@dataclass
class Compound:
    """A document body over input `x` of `shape` (and others it declares) with outputs
    `outputs`, and its bound: `ulp`, or `atol(feeds, want) -> {output: absolute bound}`."""

    name: str
    body: str
    shape: tuple[int, ...] = (2, 5, 3)
    inputs: tuple[str, ...] = ("x",)
    outputs: tuple[str, ...] = ("y",)
    ulp: int = 0
    atol: Callable | None = None
    feeds: dict = field(default_factory=dict)


def _document(c: Compound) -> str:
    return (f"version 1.0;\ngraph G( {', '.join(c.inputs)} ) -> ( {', '.join(c.outputs)} )"
            f"\n{{\n"
            f"    x = external<scalar>(shape = {list(c.shape)});\n    {c.body}\n}}\n")


COMPOUNDS = [
    Compound("mean_reduce", "y = mean_reduce(x, axes = [1, 2]);",
             atol=lambda f, w: {"y": mean_bound(f["x"], (1, 2))}),
    Compound("moments", "m, y = moments(x, axes = [1]);", outputs=("m", "y"),
             atol=lambda f, w: {"m": mean_bound(f["x"], (1,)),
                                "y": moments_bound(f["x"], (1,), w["m"])}),
    Compound("softmax", "y = softmax(x, axes = [1]);", atol=lambda f, w: {
        "y": softmax_bound(w["y"], 5)}),
    # sum of K magnitudes, + bias (>= 0: no cancellation), / : K + 2 roundings on top
    Compound("l1_normalization", "y = l1_normalization(x, axes = [1], bias = 0.5, "
             "epsilon = 1e-3);", shape=(2, 5), atol=lambda f, w: {"y": relative(w["y"], 9)}),
    # x^2 and sqrt are pow (8 u each), then the sum of K squares and the division
    Compound("l2_normalization", "y = l2_normalization(x, axes = [1], epsilon = 1e-3);",
             shape=(2, 5), atol=lambda f, w: {"y": relative(w["y"], 5 + 24)}),
    # correctly rounded adds on the same operands, copies, compares and selects: exact
    Compound("add_n", "a = external<scalar>(shape = [2, 5, 3]); y = add_n([x, a, x]);",
             inputs=("x", "a")),
    Compound("copy_n", "[p, q] = copy_n(x, times = 2); c = gt(p, 0.0); d = mul(q, 2.0); "
             "y = select(c, p, d);"),
    Compound("clamp", "y = clamp(x, -1.0, 0.5);"),
    Compound("min", "a = external<scalar>(shape = [2, 5, 1]); y = min(x, a);",
             inputs=("x", "a")),
    Compound("max", "y = max(x, 0.25);"),
    Compound("prelu", "a = external<scalar>(shape = [2, 5]); y = prelu(x, a);",
             inputs=("x", "a")),
    Compound("leaky_relu", "y = leaky_relu(x, alpha = 0.1);"),
    # 1 / (1 + e): e within 8 u; 1 + e and the division re-round: 12 u relative < 16 ULP
    Compound("sigmoid", "y = sigmoid(x);", ulp=16),
    Compound("silu", "y = silu(x);", ulp=16),
    Compound("gelu", "y = gelu(x);", ulp=16),
    # log(e + 1): 1 + e off by 8 u e + 2 u (1 + e) -> 10 u absolute; log's own 4 ULP
    Compound("softplus", "y = softplus(x);", atol=lambda f, w: {"y": ulp_bound(w["y"], 12)}),
    # alpha (e - 1): e off by 8 u (e <= 1 where selected), e - 1 re-rounds; * alpha
    Compound("elu", "y = elu(x, alpha = 0.5);", atol=lambda f, w: {"y": ulp_bound(w["y"], 12)}),
    Compound("selu", "y = selu(x);", atol=lambda f, w: {"y": ulp_bound(w["y"], 24)}),
    # exact ops up to round(), whose arguments keep off the halves; the last (q + p) / r *
    # (max - min) + min may contract into one FMA: off by u |product| <= 3 u, which is
    # many ULP where the sum cancels to about 0 (2.98e-8 against 0)
    Compound("linear_quantize", "y = linear_quantize(x, -1.0, 2.0, bits = 4);",
             shape=(17,), feeds={"x": _LINEAR}, atol=lambda f, w: {"y": ulp_bound(w["y"], 4)}),
    Compound("min_max_linear_quantize", "y = min_max_linear_quantize(x, -1.0, 2.0, "
             "bits = 8, signed = true, symmetric = false);", shape=(256,),
             feeds={"x": _MIN_MAX}, atol=lambda f, w: {"y": ulp_bound(w["y"], 4)}),
    # round(x / 0.25) + 3, clamp, (q - 3) * 0.25: exact
    Compound("zero_point_linear_quantize", "y = zero_point_linear_quantize(x, 3, 0.25, "
             "bits = 8, signed = false, symmetric = false);"),
    # log2 |x| (4 ULP) keeps off the halves, so q is exact; sign(x) * 2^q: pow's 4 ULP
    Compound("logarithmic_quantize", "y = logarithmic_quantize(x, 4.0, bits = 3);",
             shape=(11,), ulp=4, feeds={"x": _LOG}),
]


@pytest.mark.parametrize("c", COMPOUNDS, ids=lambda c: c.name)
def test_compound_compiles_and_matches_reference(c):
    g = parse_nnef(_document(c), f"{c.name}.nnef")
    feeds = {**random_inputs(g), **c.feeds}
    want, got = run_both(g, feeds)
    bounds = c.atol(feeds, want) if c.atol else {}
    for name in g.outputs:
        assert_matches(c.name, name, want[name], got[name], c.ulp, bounds.get(name))


def test_quantization_inputs_reach_every_level():
    """The hand-picked inputs exercise the clamps and many levels (not one constant)."""
    (c,) = [c for c in COMPOUNDS if c.name == "min_max_linear_quantize"]
    y = run_both(parse_nnef(_document(c), "q.nnef"), {"x": _MIN_MAX})[0]["y"]
    assert y.min() == -1.0 and y.max() == 2.0 and len(np.unique(y)) > 150


REDUCTIONS = """version 1.0;
graph R( x, b ) -> ( s, c, m, k )
{
    x = external<scalar>(shape = [64, 300]);
    b = external<scalar>(shape = [300, 96]);
    s = sum_reduce(x, axes = [1]);
    c = matmul(x, b);
    m = softmax(x, axes = [0]);
    k = argmax_reduce(x, axes = [0, 1]);
}
"""


def test_reductions_give_the_same_bits_every_run_and_thread_count(tmp_path):
    import cvmc

    g = parse_nnef(REDUCTIONS, "r.nnef")
    np.savez(tmp_path / "feeds.npz", **random_inputs(g))
    cvmc.compile(g, tmp_path / "r.cvmx", target="llvm")
    one, two = (run_digests(tmp_path / "r.cvmx", tmp_path / "feeds.npz", n) for n in (1, 2))
    assert len(one) == 1 and one == two

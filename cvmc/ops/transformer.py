"""Transformer ops that the `fuse-transformer` pass (`cvmc.passes.transformer`) makes of the
chains exporters write, so that each runs as one kernel instead of many. Their reference
rules are the chains they replace, step by step (each step rounded to float32, as the
reference interpreter rounds each op of the chain).

layer_norm(x, axes, epsilon): the decomposed layer normalization of PyTorch's exports
(ONNX opset < 17) as NNEF-Tools writes it,

    mean = mean_reduce(x, axes);  d = x - mean;  var = mean_reduce(d^2, axes)
    y = d / sqrt(var + epsilon)

(`pow(., 2.0)` or `sqr` for d^2, `pow(., 0.5)` or `sqrt` for the root). The scale and shift
that follow stay element-wise ops: the fusion pass puts them under this kernel.

fused_softmax(x, axes): NNEF's softmax fragment once expanded (max_reduce, sub, exp,
sum_reduce, div; the stdlib name `softmax` stays the fragment's), one kernel instead of four.
Bound: the max and x - max are exact, exp is NNEF's exp (4 ULP: on the CPU
the polynomial of cvmc/ops/fastmath.py, measured 1 ULP; elsewhere the C library's expf), the
sum of K positive terms in a fixed order, one division: |y - y_ref| <= gamma(K + 2 + 8) |y|
(docs/float.md's softmax bound).

attention_scores(q, k, mask?, q_scale, k_scale, scale, transposeB): the scores of
attention and their softmax over the key axis, softmax((q * q_scale) @ (k * k_scale) * scale
+ mask) (k^T where transposeB; a scale of 1 is an absent multiply: x * 1 is exact; the
additive mask has the scores' rank, extents of 1 broadcast, -inf masks out), one kernel
instead of the mul, mul, matmul, mul, add and softmax that exporters write (NNEF-Tools on
PyTorch's attention scales q and k both, by d^-1/4). Bound: each score t = the sum of D
products q'_d k'_d in a fixed order, times c = scale, plus the mask, is within Delta =
gamma(D + 2) |c| sum_d |q'_d k'_d| + 2u |t + mask| of the chain's (which rounds the exact
dot product once; a mask of 0 or -inf adds no rounding); softmax is shift-invariant, so the
scores' errors move y by a factor within exp(+-2 max_row Delta); then the softmax's own
bound: |y - y_ref| <= (exp(2 Delta) - 1) |y| + exp(2 Delta) gamma(N + 10) |y|.

Accuracy of layer_norm (u = 2^-24, K = the reduced elements, gamma(n) = n u / (1 - n u)):
the kernel sums in float32 in a fixed order. The mean is off by dm <= gamma(K + 2)
mean(|x|), the variance as `moments`' (docs/float.md), dv; then |y - y_ref| <= (dm +
2u|d|) / s + |y| (dv / (2(v + eps)) + 4u), s = sqrt(v + eps). The same bits at any thread
count: a row is one thread's.
"""
from __future__ import annotations

import math

import numpy as np

from cvmc.errors import OpRuleError
from cvmc.ops.fastmath import te_exp
from cvmc.ops.nnef_math import FORMULAS
from cvmc.ops.nnef_std import reduce_shape
from cvmc.ops.registry import Attr, Attrs, Fusion, op

_F32 = np.float32

layer_norm = op("layer_norm", family="transformer", seeds=("cvmc",), inputs=("input",),
                outputs=("output",), types="scalar -> scalar",
                attrs=(Attr("axes", "ints"), Attr("epsilon", "scalar")),
                # where every |x - mean| >= mean(|x|) / 2 (the bound below; K <= 8)
                ulp=64,
                # the scale and shift after it run under its kernel
                fusion=Fusion.OUT_ELEMWISE)


@layer_norm.shape
def _layer_norm_shape(ins, a):
    reduce_shape("layer_norm", [tuple(ins[0].shape)], a)  # checks the axes
    return tuple(ins[0].shape)


@layer_norm.reference
def _layer_norm_reference(xs, a):
    x, axes = xs[0], tuple(a.axes)
    count = math.prod(x.shape[k] for k in axes)
    mean = (np.sum(x, axis=axes, keepdims=True) / count).astype(_F32)
    d = (x - mean).astype(_F32).astype(np.float64)
    var = (np.sum((d * d).astype(_F32), axis=axes, keepdims=True, dtype=np.float64)
           / count).astype(_F32)
    s = np.power((var + np.float64(_F32(a.epsilon))).astype(_F32).astype(np.float64), 0.5) \
        .astype(_F32)
    return d / s


@layer_norm.arith
def _layer_norm_arith(ins, outs, a):
    """Per element: sum, subtract, square, sum, divide (GOPS)."""
    return 5 * outs[0].size


@layer_norm.lower
def _layer_norm_lower(xs, a):
    from cvmc.ops.reduce import te_reduce
    from cvmc.ops.te import shape_of, te, tirx

    x, axes = xs[0], tuple(a.axes)
    shape = shape_of(x)
    count = tirx.const(float(math.prod(shape[k] for k in axes)), "float32")

    total = te_reduce(x, axes, True, te.sum, "layer_norm_sum")
    mean = te.compute(total.shape, lambda *i: total(*i) / count, name="layer_norm_mean")
    d = te.compute(x.shape, lambda *i: x(*i) - _at_row(mean, axes, i),
                   name="layer_norm_centered")
    squares = te.compute(x.shape, lambda *i: d(*i) * d(*i), name="layer_norm_square")
    var = te_reduce(squares, axes, True, te.sum, "layer_norm_var")
    eps = tirx.const(float(_F32(a.epsilon)), "float32")
    root = te.compute(var.shape, lambda *i: tirx.sqrt(var(*i) / count + eps),
                      name="layer_norm_root")
    return te.compute(x.shape, lambda *i: d(*i) / _at_row(root, axes, i), name="layer_norm")


fused_softmax = op("fused_softmax", family="transformer", seeds=("cvmc",), inputs=("x",),
                   outputs=("y",), types="scalar -> scalar", attrs=(Attr("axes", "ints"),),
                   # gamma(K + 10) |y| in ULP (one ULP >= u |y| / 2) for K <= 8 (the OpCase)
                   ulp=40)


@fused_softmax.shape
def _softmax_shape(ins, a):
    reduce_shape("fused_softmax", [tuple(ins[0].shape)], a)  # checks the axes
    return tuple(ins[0].shape)


@fused_softmax.reference
def _softmax_reference(xs, a):
    x, axes = xs[0], tuple(a.axes)
    d = (x - np.max(x, axis=axes, keepdims=True)).astype(_F32).astype(np.float64)
    e = np.exp(d).astype(_F32)
    total = np.sum(e, axis=axes, keepdims=True, dtype=np.float64).astype(_F32)
    return e.astype(np.float64) / total


@fused_softmax.arith
def _softmax_arith(ins, outs, a):
    """Per element: max, subtract, exp, sum, divide (GOPS)."""
    return 5 * outs[0].size


@fused_softmax.lower
def _softmax_lower(xs, a):
    from cvmc.ops.reduce import te_reduce
    from cvmc.ops.te import te

    x, axes = xs[0], tuple(a.axes)
    peak = te_reduce(x, axes, True, te.max, "softmax_max")
    e = te.compute(x.shape, lambda *i: te_exp(x(*i) - _at_row(peak, axes, i)),
                   name="softmax_exp")
    total = te_reduce(e, axes, True, te.sum, "softmax_sum")
    return te.compute(x.shape, lambda *i: e(*i) / _at_row(total, axes, i), name="fused_softmax")


attention_scores = op(
    "attention_scores", family="transformer", seeds=("cvmc",), inputs=("q", "k", "mask?"),
    outputs=("y",), types="scalar, scalar, scalar -> scalar",
    attrs=(Attr("q_scale", "scalar", 1.0), Attr("k_scale", "scalar", 1.0),
           Attr("scale", "scalar", 1.0), Attr("transposeB", "bool", False)),
    # (2 Delta + gamma(N + 10)) |y| in ULP for the OpCase's D = N = 8, sum |q' k'| <= 6.05
    ulp=160)


@attention_scores.shape
def _scores_shape(ins, a):
    q, k = (tuple(t.shape) for t in ins[:2])
    kd, n = (k[-1], k[-2]) if a.transposeB else (k[-2], k[-1])
    if len(q) < 2 or len(q) != len(k) or q[:-2] != k[:-2] or q[-1] != kd:
        raise OpRuleError(f"attention_scores: q {list(q)} and k {list(k)} (transposeB "
                          f"{a.transposeB}) are not [..., M, D] and [..., D, N], equal "
                          f"batch")
    scores = (*q[:-1], n)
    mask = tuple(ins[2].shape) if len(ins) == 3 else scores
    if len(mask) != len(scores) or any(m not in (1, s) for m, s in zip(mask, scores)):
        raise OpRuleError(f"attention_scores: the mask {list(mask)} is not the scores' "
                          f"shape {list(scores)} with some extents 1")
    return scores


@attention_scores.reference
def _scores_reference(xs, a):
    # the chain, op by op as the interpreter runs it: each in float64, rounded to float32
    def rounded(v):
        return v.astype(_F32).astype(np.float64)

    q = rounded(xs[0] * np.float64(_F32(a.q_scale)))
    k = rounded(xs[1] * np.float64(_F32(a.k_scale)))
    s = rounded(np.matmul(q, np.swapaxes(k, -1, -2) if a.transposeB else k))
    s = rounded(s * np.float64(_F32(a.scale)))
    if len(xs) == 3:
        s = rounded(s + xs[2])
    return _softmax_reference([s], Attrs(axes=(s.ndim - 1,)))


@attention_scores.arith
def _scores_arith(ins, outs, a):
    """Per score: D multiply-adds, then the softmax's five (GOPS)."""
    return outs[0].size * (2 * ins[0].shape[-1] + 5)


@attention_scores.lower
def _scores_lower(xs, a):
    from cvmc.ops.te import shape_of, te, tirx

    q, k = xs[:2]
    depth, last = shape_of(q)[-1], len(shape_of(q)) - 1
    d = te.reduce_axis((0, depth), name="d")
    qs, ks, scale = (tirx.const(float(_F32(v)), "float32")
                     for v in (a.q_scale, a.k_scale, a.scale))

    def key(b, n, j):
        return k(*b, n, j) if a.transposeB else k(*b, j, n)

    out_shape = (*shape_of(q)[:-1], shape_of(k)[-2 if a.transposeB else -1])
    dot = te.compute(out_shape, lambda *i: te.sum(
        (q(*i[:-1], d) * qs) * (key(i[:-2], i[-1], d) * ks), axis=d), name="attention_dot")
    def scaled(*i):
        if len(xs) < 3:
            return dot(*i) * scale
        # the mask broadcasts: an extent of 1 repeats
        mask = xs[2]
        return dot(*i) * scale + mask(*[0 if e == 1 else v for e, v in zip(shape_of(mask), i)])
    scores = te.compute(out_shape, scaled, name="attention_scores_scaled")
    return _softmax_lower([scores], Attrs(axes=(last,)))


def _at_row(t, axes, i):
    """`t` (reduced over `axes`, keepdims) at the row of element index `i`."""
    return t(*[0 if k in axes else v for k, v in enumerate(i)])



# ---- gelu_erf -----------------------------------------------------------------------------
# A template: "x", ("const", value) or (op, *operands); the ops are NNEF element-wise ones.
def _c(v: float) -> tuple:
    return ("const", float(_F32(v)))


_Z = ("div", "x", _c(1.4142135381698608))
_T = ("div", _c(1.0), ("add", _c(1.0), ("mul", _c(0.3275910914), ("nnef.abs", _Z))))
_POLY = _c(1.0614054203)
for _coef in (-1.4531520605, 1.4214137793, -0.2844967246, 0.2548295856):
    _POLY = ("add", ("mul", _POLY, _T), _c(_coef))
_ERF = ("mul", ("sign", _Z), ("sub", _c(1.0), ("mul", ("mul", _POLY, _T),
                                               ("exp", ("mul", ("neg", _Z), _Z)))))
GELU_ERF = ("mul", ("mul", "x", ("add", _ERF, _c(1.0))), _c(0.5))


def evaluate_template(template, x, const, apply):
    """`template` on `x`: constants by `const(value)`, each op by `apply(op, operands)`;
    a subexpression that occurs several times is computed once."""
    memo: dict[int, object] = {}

    def walk(t):
        if t == "x":
            return x
        if t[0] == "const":
            return const(t[1])
        if id(t) not in memo:
            memo[id(t)] = apply(t[0], [walk(a) for a in t[1:]])
        return memo[id(t)]
    return walk(template)


gelu_erf = op("gelu_erf", family="transformer", seeds=("cvmc",), inputs=("x",),
              outputs=("y",), types="scalar -> scalar", fusion=Fusion.ELEMWISE)
gelu_erf.shape(lambda ins, a: tuple(ins[0].shape))


@gelu_erf.reference
def _gelu_reference(xs, a):
    # each op's formula in float64, rounded to float32, as the interpreter runs the chain
    return evaluate_template(GELU_ERF, xs[0], np.float64,
                             lambda o, v: np.float64(FORMULAS[o][0](*v)).astype(_F32)
                             .astype(np.float64))


@gelu_erf.arith
def _gelu_arith(ins, outs, a):
    """The chain's 21 element-wise ops per element (GOPS)."""
    return 21 * outs[0].size


@gelu_erf.lower
def _gelu_lower(xs, a):
    from cvmc.ops.te import te, tirx

    x = xs[0]
    return te.compute(x.shape, lambda *i: evaluate_template(
        GELU_ERF, x(*i), lambda v: tirx.const(v, "float32"),
        lambda o, v: FORMULAS[o][1](*v)), name="gelu_erf")

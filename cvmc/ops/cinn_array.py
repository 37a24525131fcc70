"""Paddle CINN's primitives that are not element-wise, as `cinn.<name>` ops: dot, reduce,
the batch-norm statistics (bn_mean_variance, bn_grad_bias_scale), data movement
(broadcast_to, concat, reshape, reverse, slice, transpose) and const_scalar. Element
types, shapes, accuracy and the edge decisions of every CINN op: `cvmc.ops.cinn`'s
docstring (spec: ../shared/spec/cinn-builder-primitives.txt).
"""
from __future__ import annotations

import itertools
import math

import numpy as np

from cvmc.ops.cinn import holding, power_precision, register, te_fmaxmin
from cvmc.ops.common import arith_per_input, mac_ops, no_arith, prec_max, require
from cvmc.ops.nnef_std import check_axes, fmt
from cvmc.ops.reduce import reduced_shape, te_reduce
from cvmc.ops.registry import Attr, Fusion
from cvmc.ops.transform import gather_rules, reshape_like, types_of
from cvmc.ops.transform_gather import te_concat

_INJECTIVE, _REDUCTION = Fusion.INJECTIVE, Fusion.REDUCTION


# ---- dot, reduce, batch-norm statistics -----------------------------------------------------
def _dot_k(ins) -> int:
    """K, the length of the summed axis, after checking both operands."""
    x, y = ins[0].shape, ins[1].shape
    require(len(x) in (1, 2) and len(y) in (1, 2),
            f"cinn.dot: operands must have rank 1 or 2, got x {fmt(x)} and y {fmt(y)}")
    require(x[-1] == y[0], f"cinn.dot: x {fmt(x)} and y {fmt(y)} do not agree: x's last "
                           f"extent {x[-1]} must equal y's first {y[0]} (x^T y)")
    return x[-1]


dot = register("dot", ("x", "y"), "numeric, numeric -> numeric", _REDUCTION,
               precision_rule="bits of K * (2^(p_x-1) - 1) * (2^(p_y-1) - 1)", multiply_add=True)
# GOPS: 2 per multiply-add, K of them per output element
dot.arith(lambda ins, outs, a: mac_ops(outs[0].size, ins[0].shape[-1]))


@dot.shape
def _dot_shape(ins, a):
    _dot_k(ins)
    return ins[0].shape[:-1] + ins[1].shape[1:] or (1,)


@dot.precision
def _dot_precision(ins, a):
    return holding(_dot_k(ins) * prec_max(ins[0].precision) * prec_max(ins[1].precision))


dot.reference(lambda xs, a: np.reshape(np.dot(xs[0], xs[1]), _dot_shape(types_of(xs), a)))


@dot.lower
def _dot_lower(xs, a):
    from cvmc.ops.te import te
    x, y = xs
    k = te.reduce_axis((0, int(x.shape[-1])), name="k")
    rows = len(x.shape) - 1  # output axes taken from x (0 or 1), then from y

    def element(*i):
        xi, yi = i[:rows], i[rows:][:len(y.shape) - 1]
        return te.sum(x(*xi, k) * y(k, *yi), axis=k)
    return te.compute(_dot_shape(types_of(xs), a), element, name="dot")


REDUCE_KINDS = ("sum", "prod", "max", "min")
reduce_op = register("reduce", ("input",), "numeric -> numeric", _REDUCTION, attrs=(
    Attr("kind", "str", choices=REDUCE_KINDS), Attr("dim", "ints", ()),
    Attr("keep_dim", "bool", False)),
    precision_rule="sum: bits of K * (2^(p_x-1) - 1); prod: bits of (2^(p_x-1) - 1)^K; "
                   "max, min: p_x (K: elements per result)")


def _reduce_axes(ndim: int, a) -> tuple[int, ...]:
    """The reduced axes: `dim`, or every axis when it is empty."""
    check_axes("cinn.reduce", "'dim'", a.dim, ndim)
    return tuple(sorted(a.dim)) or tuple(range(ndim))


@reduce_op.shape
def _reduce_shape(ins, a):
    r = _reduce_axes(ins[0].ndim, a)
    return reduced_shape(ins[0].shape, r, a.keep_dim) if r else ins[0].shape


@reduce_op.precision
def _reduce_precision(ins, a):
    m = prec_max(ins[0].precision)
    k = math.prod(ins[0].shape[i] for i in _reduce_axes(ins[0].ndim, a))
    return {"sum": holding(k * m), "prod": power_precision(m, k)}.get(a.kind, ins[0].precision)


def _np_extreme(x, r: tuple[int, ...], is_max: bool):
    """IEEE 754-2019 maximum / minimum over axes r: NaN if any, and a zero result is +0 for
    max when any +0 is there (for min: -0 when any -0 is), whatever the order."""
    out = (np.max if is_max else np.min)(x, axis=r)
    if x.dtype.kind != "f":
        return out
    wanted_sign = np.any((x == 0) & (np.signbit(x) != is_max), axis=r)
    zero = np.where(wanted_sign == is_max, 0.0, -0.0)
    return np.where(out == 0, zero, out)


@reduce_op.reference
def _reduce_reference(xs, a):
    x = xs[0]
    r = _reduce_axes(x.ndim, a)
    if not r:
        return x.copy()
    fn = {"sum": lambda v: np.sum(v, axis=r), "prod": lambda v: np.prod(v, axis=r),
          "max": lambda v: _np_extreme(v, r, True), "min": lambda v: _np_extreme(v, r, False)}
    return np.reshape(fn[a.kind](x), reduced_shape(x.shape, r, a.keep_dim))


def _te_reducer(kind: str, dtype: str):
    """The TE reducer of a reduce kind on elements of `dtype`."""
    from cvmc.ops.te import te, tirx
    if kind == "sum":
        return te.sum
    if kind == "prod":
        return te.comm_reducer(lambda u, v: u * v, lambda t: tirx.const(1, t), name="prod")
    if not dtype.startswith("float"):
        return te.max if kind == "max" else te.min
    is_max = kind == "max"
    return te.comm_reducer(lambda u, v: te_fmaxmin(tirx, u, v, is_max),
                           lambda t: tirx.const(-math.inf if is_max else math.inf, t),
                           name=f"ieee_{kind}")


@reduce_op.lower
def _reduce_lower(xs, a):
    from cvmc.ops.te import elementwise
    x = xs[0]
    r = _reduce_axes(len(x.shape), a)
    if not r:
        return elementwise(x, lambda v: v, "reduce")
    return te_reduce(x, r, a.keep_dim, _te_reducer(a.kind, str(x.dtype)), f"reduce_{a.kind}")


def _channel_reduced(name: str, x: tuple[int, ...]) -> tuple[int, ...]:
    """The axes a batch-norm statistic sums over: every axis but the channel axis 1."""
    require(len(x) >= 2, f"{name}: input must have rank >= 2 (N, C, ...), got {fmt(x)}")
    return tuple(i for i in range(len(x)) if i != 1)


bn_mean_variance = register("bn_mean_variance", ("input",), "scalar -> scalar", _REDUCTION,
                            outputs=("sum", "square_sum"))
bn_mean_variance.arith(arith_per_input(3))  # GOPS: sum x and sum x^2 per input element


@bn_mean_variance.shape
def _bn_mean_variance_shape(ins, a):
    _channel_reduced("cinn.bn_mean_variance", ins[0].shape)
    return [(ins[0].shape[1],)] * 2


@bn_mean_variance.reference
def _bn_mean_variance_reference(xs, a):
    x = xs[0]
    r = _channel_reduced("cinn.bn_mean_variance", x.shape)
    return np.sum(x, axis=r), np.sum(x * x, axis=r)  # x * x is exact in float64


@bn_mean_variance.lower
def _bn_mean_variance_lower(xs, a):
    from cvmc.ops.te import elementwise, te
    x = xs[0]
    r = _channel_reduced("cinn.bn_mean_variance", tuple(int(d) for d in x.shape))
    square = elementwise(x, lambda v: v * v, "square")
    return (te_reduce(x, r, False, te.sum, "bn_sum"),
            te_reduce(square, r, False, te.sum, "bn_square_sum"))


bn_grad_bias_scale = register("bn_grad_bias_scale", ("input", "grad", "save_mean"),
                              "scalar, scalar, scalar -> scalar", _REDUCTION,
                              outputs=("bias_grad", "scale_grad"))
# GOPS: sum g and sum g (x - mean) per input element
bn_grad_bias_scale.arith(arith_per_input(4))


@bn_grad_bias_scale.shape
def _bn_grad_shape(ins, a):
    x, grad, mean = (t.shape for t in ins)
    _channel_reduced("cinn.bn_grad_bias_scale", x)
    require(grad == x, f"cinn.bn_grad_bias_scale: grad has shape {fmt(grad)}, expected the "
                       f"shape of input {fmt(x)}")
    require(mean == (x[1],), f"cinn.bn_grad_bias_scale: save_mean has shape {fmt(mean)}, "
                             f"expected [{x[1]}] (one mean per channel of input {fmt(x)})")
    return [(x[1],)] * 2


@bn_grad_bias_scale.reference
def _bn_grad_reference(xs, a):
    x, grad, mean = xs
    r = _channel_reduced("cinn.bn_grad_bias_scale", x.shape)
    centered = x - mean.reshape((1, -1) + (1,) * (x.ndim - 2))
    return np.sum(grad, axis=r), np.sum(grad * centered, axis=r)


@bn_grad_bias_scale.lower
def _bn_grad_lower(xs, a):
    from cvmc.ops.te import te
    x, grad, mean = xs
    r = _channel_reduced("cinn.bn_grad_bias_scale", tuple(int(d) for d in x.shape))
    term = te.compute(x.shape, lambda *i: grad(*i) * (x(*i) - mean(i[1])), name="bn_term")
    return (te_reduce(grad, r, False, te.sum, "bn_bias_grad"),
            te_reduce(term, r, False, te.sum, "bn_scale_grad"))


# ---- data movement: broadcast_to, concat, reshape, reverse, slice, transpose -------------
broadcast_to = register("broadcast_to", ("var",), "? -> ?", _INJECTIVE, attrs=(
    Attr("out_shape", "ints", lo=1), Attr("broadcast_axes", "ints", lo=0)))


@broadcast_to.shape
def _broadcast_to_shape(ins, a):
    x, out, axes = ins[0].shape, a.out_shape, a.broadcast_axes
    name = "cinn.broadcast_to"
    require(len(axes) == len(x), f"{name}: 'broadcast_axes' {fmt(axes)} must have one entry per "
                                 f"input axis ({len(x)} for input {fmt(x)})")
    require(all(v < len(out) for v in axes),
            f"{name}: 'broadcast_axes' {fmt(axes)} must be in range [0,{len(out)}) (the rank "
            f"of 'out_shape' {fmt(out)})")
    require(all(u < v for u, v in itertools.pairwise(axes)),
            f"{name}: 'broadcast_axes' {fmt(axes)} must be strictly increasing")
    for i, (e, ax) in enumerate(zip(x, axes)):
        require(e in (1, out[ax]), f"{name}: input axis {i} (extent {e}) maps to output axis "
                                   f"{ax} (extent {out[ax]}); the extents must be equal or "
                                   f"the input's 1")
    return tuple(out)


gather_rules(broadcast_to, lambda ins, out, a: lambda d: tuple(
    0 if e == 1 else d[ax] for e, ax in zip(ins[0].shape, a.broadcast_axes)))

concat = register("concat", ("*input_vars",), "?[] -> ?", _INJECTIVE,
                  attrs=(Attr("axis", "int", 0, lo=0),))


@concat.shape
def _concat_shape(ins, a):
    first = ins[0].shape
    require(a.axis < len(first), f"cinn.concat: 'axis' must be in range [0,{len(first)}), "
                                 f"found {a.axis}")
    for k, t in enumerate(ins[1:], 1):
        require(len(t.shape) == len(first) and all(
            e == f for i, (e, f) in enumerate(zip(t.shape, first)) if i != a.axis),
            f"cinn.concat: input {k} has shape {fmt(t.shape)}, expected the shape of input 0 "
            f"{fmt(first)} on every axis but {a.axis}")
    return first[:a.axis] + (sum(t.shape[a.axis] for t in ins),) + first[a.axis + 1:]


concat.reference(lambda xs, a: np.concatenate(xs, axis=a.axis))
concat.lower(lambda xs, a: te_concat(xs, a.axis, _concat_shape(types_of(xs), a), "concat"))

reshape = register("reshape", ("input",), "? -> ?", _INJECTIVE, attrs=(Attr("shape", "ints"),))


@reshape.shape
def _reshape_shape(ins, a):
    x, shape = ins[0].shape, list(a.shape)
    require(all(s >= 1 or s == -1 for s in shape),
            f"cinn.reshape: 'shape' {fmt(shape)} may hold positive extents and one -1 only")
    require(shape.count(-1) <= 1, f"cinn.reshape: 'shape' {fmt(shape)} has more than one -1")
    volume, known = math.prod(x), math.prod(s for s in shape if s != -1)
    if -1 in shape:
        require(volume % known == 0, f"cinn.reshape: the input's {volume} elements ({fmt(x)}) "
                                     f"do not divide into 'shape' {fmt(shape)}")
        shape[shape.index(-1)] = volume // known
    require(math.prod(shape) == volume, f"cinn.reshape: 'shape' {fmt(a.shape)} holds "
                                        f"{math.prod(shape)} elements, the input {fmt(x)} "
                                        f"{volume}")
    return tuple(shape)


reshape_like(reshape)

reverse = register("reverse", ("input",), "? -> ?", _INJECTIVE, attrs=(Attr("axis", "ints"),))


@reverse.shape
def _reverse_shape(ins, a):
    check_axes("cinn.reverse", "'axis'", a.axis, ins[0].ndim)
    return ins[0].shape


gather_rules(reverse, lambda ins, out, a: lambda d: tuple(
    n - 1 - i if k in a.axis else i for k, (n, i) in enumerate(zip(out, d))))

slice_op = register("slice", ("input",), "? -> ?", _INJECTIVE, attrs=(
    Attr("axes", "ints"), Attr("starts", "ints"), Attr("ends", "ints")))


@slice_op.shape
def _slice_shape(ins, a):
    x = ins[0].shape
    for what in ("starts", "ends"):
        require(len(a[what]) == len(a.axes), f"cinn.slice: '{what}' {fmt(a[what])} must have "
                                             f"one entry per axis in 'axes' {fmt(a.axes)}")
    check_axes("cinn.slice", "'axes'", a.axes, len(x))
    out = list(x)
    for axis, start, end in zip(a.axes, a.starts, a.ends):
        require(0 <= start < end <= x[axis],
                f"cinn.slice: along axis {axis} (extent {x[axis]}) start {start} and end "
                f"{end} must satisfy 0 <= start < end <= {x[axis]}")
        out[axis] = end - start
    return tuple(out)


gather_rules(slice_op, lambda ins, out, a: lambda d: tuple(
    i + dict(zip(a.axes, a.starts)).get(k, 0) for k, i in enumerate(d)))

transpose = register("transpose", ("input",), "? -> ?", _INJECTIVE, attrs=(Attr("axis", "ints"),))


@transpose.shape
def _transpose_shape(ins, a):
    x, n = ins[0].shape, len(a.axis)
    require(n <= len(x), f"cinn.transpose: 'axis' {fmt(a.axis)} is longer than the input's "
                         f"rank {len(x)}")
    require(sorted(a.axis) == list(range(n)),
            f"cinn.transpose: 'axis' {fmt(a.axis)} must be a permutation of [0..{n - 1}] "
            f"(it permutes the leading {n} axes)")
    return tuple(x[i] for i in a.axis) + x[n:]


def _transpose_map(ins, out, a):
    def index(d):
        src = list(d)  # axes past len(axis) stay in place
        for k, ax in enumerate(a.axis):
            src[ax] = d[k]
        return tuple(src)
    return index


gather_rules(transpose, _transpose_map)


# ---- const_scalar -------------------------------------------------------------------------
const_scalar = register("const_scalar", (), "-> ?", Fusion.OPAQUE,
                        attrs=(Attr("value", "literal"),),
                        precision_rule="bits of |value| (integer values)")
const_scalar.arith(no_arith)  # GOPS: it computes nothing


@const_scalar.kind
def _const_scalar_kind(kinds, a):
    v = a.value
    return "logical" if isinstance(v, bool) else "integer" if isinstance(v, int) else "scalar"


@const_scalar.shape
def _const_scalar_shape(ins, a):
    v = a.value
    if isinstance(v, int) and not isinstance(v, bool):
        require(abs(v) <= prec_max(32), f"cinn.const_scalar: integer value {v} does not fit "
                                         f"int32 (precision 32): |v| <= {prec_max(32)}")
    elif isinstance(v, float):
        require(math.isfinite(v) and abs(v) <= float(np.finfo(np.float32).max),
                f"cinn.const_scalar: value {v} is not a finite float32 "
                f"(|v| <= {float(np.finfo(np.float32).max):.8g})")
    return ()


const_scalar.precision(lambda ins, a: holding(abs(a.value)))
const_scalar.reference(lambda xs, a: np.asarray(a.value))


@const_scalar.lower
def _const_scalar_lower(xs, a):
    from cvmc.ops.registry import KINDS
    from cvmc.ops.te import te, tirx
    value = tirx.const(a.value, KINDS[_const_scalar_kind([], a)])
    return te.compute((), lambda: value, name="const_scalar")


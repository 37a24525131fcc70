"""CVM elemwise operators: abs, cvm_precision, elemwise_add/sub, negative, clip, cvm_clip,
cvm_right_shift, cvm_left_shift.

Spec: ../shared/spec/cvm-operators-formal.txt, "Elemwise Operators"; precision rules and
the CVM-Runtime quirks avoided here from ../shared/design/cvm-semantics.md.
"""
from __future__ import annotations

import operator

import numpy as np

from cvmc.ops.common import (
    CORNERS_INTERVAL,
    corners_interval,
    data_interval,
    monotone_interval,
    numprec,
    prec_max,
    require,
)
from cvmc.ops.registry import Attr, Fusion, op

INT32_MAX = 2**31 - 1
_PRECISION = Attr("precision", "int", lo=1, hi=32)
_SHIFT_BIT = Attr("shift_bit", "int", lo=1, hi=32)


# ---- rules shared by several entries ---------------------------------------------------
def _input_shape(ins, a):
    return ins[0].shape


def _input_precision(ins, a):
    return ins[0].precision


def _attr_precision(ins, a):
    return a.precision


def _np_clip(x: np.ndarray, lo: int, hi: int) -> np.ndarray:
    """The spec's clip: a_max for x >= a_max, a_min for x <= a_min, else x."""
    return np.where(x >= hi, hi, np.where(x <= lo, lo, x))


def _te_clip(v, lo: int, hi: int):
    """TE expression clamping `v` to [lo, hi]."""
    from cvmc.ops.te import const, tirx
    return tirx.max(tirx.min(v, const(hi)), const(lo))


def _te_binary(xs, fn, name: str):
    """`te.compute` applying `fn(a, b)` to same-shaped inputs."""
    from cvmc.ops.te import te
    a, b = xs
    return te.compute(a.shape, lambda *i: fn(a(*i), b(*i)), name=name)


def _same_shapes(name: str):
    """Shape rule for the two-input elemwise ops: both inputs must have the same shape."""
    def rule(ins, a):
        lhs, rhs = ins[0].shape, ins[1].shape
        require(lhs == rhs, f"{name}: rhs has shape {rhs}, expected the lhs shape {lhs} "
                            f"(elemwise ops do not broadcast; use broadcast_*)")
        return lhs
    return rule


def _add_precision(ins, a):
    return max(ins[0].precision, ins[1].precision) + 1


# ---- abs, negative: one input, same precision ------------------------------------------
def _sign_op(name: str, reference, te_fn, interval, interval_rule: str):
    """Declare an elementwise op whose output keeps its input's precision (|-x| = |x|)."""
    d = op(name, family="elemwise", inputs=("data",), fusion=Fusion.ELEMWISE,
           precision_rule="p_x", interval_rule=interval_rule)
    d.shape(_input_shape)
    d.precision(_input_precision)
    d.interval(interval)
    d.reference(lambda xs, a: reference(xs[0]))

    @d.lower
    def _lower(xs, a):
        from cvmc.ops.te import elementwise
        return elementwise(xs[0], te_fn, name)
    return d


def _te_abs(v):
    from cvmc.ops.te import tirx
    return tirx.abs(v)


def _abs_interval(ivs, a):
    lo, hi = ivs[0]
    return (0 if lo <= 0 <= hi else min(abs(lo), abs(hi))), max(abs(lo), abs(hi))


abs_op = _sign_op("abs", lambda x: np.where(x >= 0, x, -x), _te_abs, _abs_interval,
                  "[0 (or min(|lo|, |hi|) where 0 is outside), max(|lo|, |hi|)]")
negative = _sign_op("negative", lambda x: -x, lambda v: -v,
                    lambda ivs, a: (-ivs[0][1], -ivs[0][0]), "[-hi, -lo]")


# ---- cvm_precision ---------------------------------------------------------------------
cvm_precision = op("cvm_precision", family="elemwise", inputs=("data",),
                   fusion=Fusion.ELEMWISE, precision_rule="6 (a bit length <= 31)")
cvm_precision.shape(_input_shape)


@cvm_precision.precision
def _cvm_precision_precision(ins, a):
    return 6


@cvm_precision.reference
def _cvm_precision_reference(xs, a):
    # ceil(log2(|x| + 1)) is the bit length of |x|: count the shifts that leave it nonzero
    ax = np.abs(xs[0])
    bits = np.zeros_like(ax)
    for k in range(32):
        bits += (ax >> k) > 0
    return np.maximum(bits, 1)  # 0 takes 1 bit


@cvm_precision.lower
def _cvm_precision_lower(xs, a):
    from cvmc.ops.te import const, elementwise, tirx

    def bit_length(v):
        # clz(0) is undefined, and max(|x|, 1) has the bit length the spec gives 0 (one)
        return const(32) - tirx.clz(tirx.max(tirx.abs(v), const(1)))
    return elementwise(xs[0], bit_length, "cvm_precision")


# ---- elemwise_add, elemwise_sub --------------------------------------------------------
def _additive_op(name: str, fn):
    """Declare a same-shape two-input op `fn(lhs, rhs)` (NumPy and TE alike) whose result
    needs one bit more than its wider input."""
    d = op(name, family="elemwise", inputs=("lhs", "rhs"), fusion=Fusion.ELEMWISE,
           precision_rule="max(p_a, p_b) + 1", interval_rule=CORNERS_INTERVAL)
    d.shape(_same_shapes(name))
    d.precision(_add_precision)
    d.interval(corners_interval(fn))
    d.reference(lambda xs, a: fn(xs[0], xs[1]))
    d.lower(lambda xs, a: _te_binary(xs, fn, name))
    return d


elemwise_add = _additive_op("elemwise_add", operator.add)
elemwise_sub = _additive_op("elemwise_sub", operator.sub)


# ---- clip ------------------------------------------------------------------------------
clip = op("clip", family="elemwise", inputs=("data",), fusion=Fusion.ELEMWISE,
          attrs=(Attr("a_min", "int", lo=-INT32_MAX, hi=INT32_MAX),
                 Attr("a_max", "int", lo=-INT32_MAX, hi=INT32_MAX)),
          precision_rule="numprec(max(|a_min|, |a_max|)); a_min < a_max",
          interval_rule="[lo, hi] clipped to [a_min, a_max]")


def _check_clip_bounds(a) -> None:
    require(a.a_min < a.a_max, f"clip: attribute 'a_min' must be less than 'a_max' "
                               f"({a.a_max}), got {a.a_min}")


@clip.shape
def _clip_shape(ins, a):
    _check_clip_bounds(a)
    return ins[0].shape


@clip.precision
def _clip_precision(ins, a):
    _check_clip_bounds(a)
    return numprec(max(abs(a.a_min), abs(a.a_max)))


@clip.interval
@monotone_interval
def _clip_interval(x, a):
    return min(max(x, a.a_min), a.a_max)


@clip.reference
def _clip_reference(xs, a):
    return _np_clip(xs[0], a.a_min, a.a_max)


@clip.lower
def _clip_lower(xs, a):
    from cvmc.ops.te import elementwise
    return elementwise(xs[0], lambda v: _te_clip(v, a.a_min, a.a_max), "clip")


# ---- cvm_clip --------------------------------------------------------------------------
cvm_clip = op("cvm_clip", family="elemwise", inputs=("data",), fusion=Fusion.ELEMWISE,
              attrs=(_PRECISION,), precision_rule="precision (attribute, 1..32)",
              interval_rule="[lo, hi] clipped to the precision's")
cvm_clip.shape(_input_shape)
cvm_clip.precision(_attr_precision)
cvm_clip.interval(data_interval)  # clamped into the precision's: infer_intervals


@cvm_clip.reference
def _cvm_clip_reference(xs, a):
    alpha = prec_max(a.precision)
    return _np_clip(xs[0], -alpha, alpha)


@cvm_clip.lower
def _cvm_clip_lower(xs, a):
    from cvmc.ops.te import elementwise
    alpha = prec_max(a.precision)
    return elementwise(xs[0], lambda v: _te_clip(v, -alpha, alpha), "cvm_clip")


# ---- cvm_right_shift -------------------------------------------------------------------
cvm_right_shift = op("cvm_right_shift", family="elemwise", inputs=("data",),
                     fusion=Fusion.ELEMWISE, attrs=(_PRECISION, _SHIFT_BIT),
                     precision_rule="precision (attribute, 1..32)",
                     interval_rule="the shift of lo and hi (it is monotone)")
cvm_right_shift.shape(_input_shape)
cvm_right_shift.precision(_attr_precision)


@cvm_right_shift.interval
@monotone_interval
def _cvm_right_shift_interval(x, a):
    return (x // 2 ** (a.shift_bit - 1) + 1) // 2  # the clip: infer_intervals


@cvm_right_shift.reference
def _cvm_right_shift_reference(xs, a):
    # int64: the spec's floor(X / 2^(s-1)) + 1 can reach 2^31 (CVM-Runtime quirk #1)
    t = (xs[0] // 2 ** (a.shift_bit - 1) + 1) // 2
    alpha = prec_max(a.precision)
    return _np_clip(t, -alpha, alpha)


@cvm_right_shift.lower
def _cvm_right_shift_lower(xs, a):
    from cvmc.ops.te import elementwise
    alpha = prec_max(a.precision)

    def shift(v):
        # shift amounts are s-1 <= 31 and 1: never the full int32 width, even for s = 32
        w = v >> (a.shift_bit - 1)
        # floor((w + 1) / 2) without w + 1, which overflows for w = 2^31 - 1 (quirk #1)
        return _te_clip((w >> 1) + (w & 1), -alpha, alpha)
    return elementwise(xs[0], shift, "cvm_right_shift")


# ---- cvm_left_shift --------------------------------------------------------------------
cvm_left_shift = op("cvm_left_shift", family="elemwise", inputs=("data",),
                    fusion=Fusion.ELEMWISE, attrs=(_PRECISION, _SHIFT_BIT),
                    precision_rule="precision (attribute, 1..32); p_x + shift_bit <= 32",
                    interval_rule="the shift of lo and hi (it is monotone)")
cvm_left_shift.shape(_input_shape)
cvm_left_shift.interval(monotone_interval(lambda x, a: x * 2 ** a.shift_bit))


@cvm_left_shift.precision
def _cvm_left_shift_precision(ins, a):
    p_x = ins[0].precision
    # X * 2^shift_bit must fit int32 before the clip
    require(p_x + a.shift_bit <= 32,
            f"cvm_left_shift: data precision + attribute 'shift_bit' must be <= 32, got "
            f"{p_x} + {a.shift_bit} = {p_x + a.shift_bit}")
    return a.precision


@cvm_left_shift.reference
def _cvm_left_shift_reference(xs, a):
    alpha = prec_max(a.precision)
    return _np_clip(xs[0] * 2 ** a.shift_bit, -alpha, alpha)


@cvm_left_shift.lower
def _cvm_left_shift_lower(xs, a):
    from cvmc.ops.te import elementwise
    alpha = prec_max(a.precision)
    # the precision rule keeps |x| * 2^shift_bit < 2^31, so the shift cannot overflow
    return elementwise(xs[0], lambda v: _te_clip(v << a.shift_bit, -alpha, alpha),
                       "cvm_left_shift")

"""NNEF's index-based window primitives (spec 4.3.3): argmax_pool, sample, desample, and
cvmc's max_window (the stdlib's max_pool, sample at argmax_pool's index, as one window
reduction; the `simplify` pass writes it where the index has no other use): their entries
(declarations, reference and lower rules). They share the window geometry, taps and
border handling of `nnef_nn` (whose docstring states the decisions: 'ignore' borders,
argmax_pool's order of floats and ties, sample's clamped and desample's ignored indices);
their shape rules are in `nnef_std_nn`. argmax_pool, sample and max_window select values:
exact, NaN included.
"""
from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from cvmc.ops.common import no_arith, require
from cvmc.ops.nnef_nn import (
    OUTPUT_SHAPE,
    WINDOW_SIZE,
    gather_taps,
    np_taps,
    row_major,
    te_all,
    te_clamp,
    te_f32,
    te_positions,
    te_read,
    te_reduce_axes,
    te_select,
    window_geometry,
    zero_outside,
)
from cvmc.ops.nnef_std import BORDERS, declare
from cvmc.ops.nnef_std_nn import Dim, box_shape, desample_shape, sample_shape, window_attrs
from cvmc.ops.registry import lookup

INDEX_BITS = 29  # argmax_pool windows have at most 2^29 taps (the low bits of its key)

# ---- the entries' declarations (their shape rules: nnef_std_nn) -------------------------
declare("argmax_pool", box_shape, ("input",), "scalar -> integer",
        (WINDOW_SIZE, *window_attrs(BORDERS)), ("index",),
        precision_rule="bitlen(window volume - 1) + 1: an index into the window")
# sample accepts 'ignore' although 4.3.3 omits it: the stdlib max_pool forwards its border
# (alexnet uses 'ignore') to sample through max_pool_with_index.
declare("sample", sample_shape, ("input", "index"), "scalar, integer -> scalar",
        (WINDOW_SIZE, *window_attrs(BORDERS)))
# cvmc's own: the stdlib's max_pool (sample at argmax_pool's index) as one window reduction;
# the compile pipeline's `simplify` pass writes it where the index has no other use.
declare("nnef.max_window", box_shape, ("input",), "scalar -> scalar",
        (WINDOW_SIZE, *window_attrs(BORDERS)))
declare("desample", desample_shape, ("input", "index"), "scalar, integer -> scalar",
        (WINDOW_SIZE, *window_attrs(("constant",)), OUTPUT_SHAPE))


# ---- NumPy reference --------------------------------------------------------------------
def _argmax_pool_reference(xs, a):
    x = xs[0]
    out, dims = window_geometry("argmax_pool", a, [x.shape], a.size, box_shape, False, 0)
    best = best_value = best_class = None
    for t, _, srcs, inside, _ in np_taps(dims, a.border, False, x.ndim, 0):
        values = np.broadcast_to(zero_outside(gather_taps(x, srcs, 0), inside, a.border), out)
        # value classes: 0 ignored border, 1 a number, 2 NaN (np.argmax: NaN is the largest)
        cls = np.where(np.isnan(values), 2, 1)
        if a.border == "ignore":
            cls = np.where(inside, cls, 0)
        if best is None:
            best, best_value, best_class = np.zeros(out, np.int64), values, cls
            continue
        better = (cls > best_class) | ((cls == best_class) & (cls == 1) & (values > best_value))
        best = np.where(better, t, best)  # strict: ties keep the first tap
        best_value = np.where(better, values, best_value)
        best_class = np.where(better, cls, best_class)
    return best


def _outside_value(border: str) -> float:
    """What sample reads at a border position of 'constant' (0) or 'ignore' (-inf)."""
    return -np.inf if border == "ignore" else 0.0


def _sample_reference(xs, a):
    x, index = xs
    out, dims = window_geometry("sample", a, [x.shape, index.shape], a.size, box_shape, False, 0)
    flat = np.clip(index, 0, math.prod(a.size) - 1)
    result = np.zeros(out)
    for t, _, srcs, inside, _ in np_taps(dims, a.border, False, x.ndim, 0):
        values = gather_taps(x, srcs, 0)
        if a.border in ("constant", "ignore"):
            values = np.where(inside, values, _outside_value(a.border))
        result = np.where(flat == t, values, result)
    return result


def _max_window_reference(xs, a):
    """The stdlib's max_pool literally: sample at argmax_pool's index."""
    return _sample_reference([xs[0], _argmax_pool_reference(xs, a)], a)


def _desample_reference(xs, a):
    x, index = xs
    out, dims = window_geometry("desample", a, [x.shape, index.shape], a.size, desample_shape,
                                True, 0)
    result = np.zeros(out)
    for t, _, srcs, inside, hit in np_taps(dims, "constant", True, x.ndim, 0):
        take = hit & inside & (gather_taps(index, srcs, 0) == t)
        result += np.where(take, gather_taps(x, srcs, 0), 0.0)
    return result


# ---- TE lowering ------------------------------------------------------------------------
def ordered_key(value, zero_is_negative_zero: bool = False):
    """An int64 in [0, 2^32) that orders float32 values (not NaN) as numbers, -0 below 0
    (the integer view of a float, its magnitude bits flipped when negative); with
    `zero_is_negative_zero` -0 maps to 0's key (argmax: they tie). Reductions over such keys
    are plain integer max reductions, which every target reduces across threads, in any
    order, to the same result."""
    from cvmc.ops.te import tirx

    bits = tirx.reinterpret("int32", value)
    key = tirx.Select(bits >= 0, bits, bits ^ 0x7FFFFFFF).astype("int64") + 2**31
    if not zero_is_negative_zero:
        return key
    # -0 takes 0's key, tested on the magnitude bits: TVM 0.27's simplifier rewrites
    # Select(bits == INT32_MIN, 0, bits) to bits (the tie was lost: +0 won)
    return tirx.Select((bits & 0x7FFFFFFF) == 0, tirx.const(2**31, "int64"), key)


def unordered_value(key):
    """The float32 whose `ordered_key` key is `key`."""
    from cvmc.ops.te import tirx

    k = (key - 2**31).astype("int32")
    return tirx.reinterpret("float32", tirx.Select(k >= 0, k, k ^ 0x7FFFFFFF))


def _flat_tap(taps: Sequence, sizes: Sequence[int]):
    """Row-major flat index of the taps (reduce vars or ints) in a window of `sizes`."""
    return sum(t * stride for t, stride in zip(taps, row_major(sizes)))


def _argmax_pool_lower(xs, a):
    from cvmc.ops.te import shape_of, te, tirx

    (x,) = xs
    out, dims = window_geometry("argmax_pool", a, [shape_of(x)], a.size, box_shape, False, 0)
    taps, axes = te_reduce_axes(dims, "rk")
    if not axes:  # a window of one tap
        return te.compute(out, lambda *i: tirx.const(0, "int32"), name="argmax_pool")
    low = 2**INDEX_BITS

    def key(*i):
        """The max of class * 2^61 + ordered value * 2^29 + (2^29 - 1 - tap): the larger
        class (0 an ignored border position, 1 a number, 2 NaN), then the larger number,
        then the first tap."""
        loads, _, inside = te_positions(dims, i, taps, a.border, False)
        value = te_read(x, loads, inside, a.border)
        number = tirx.const(2**61, "int64") + ordered_key(value, True) * low
        k = tirx.Select(tirx.isnan(value), tirx.const(2**62, "int64"), number)
        if a.border == "ignore":
            k = te_select(te_all(inside), k, tirx.const(0, "int64"))
        return te.max(k + (low - 1 - _flat_tap(taps, a.size)).astype("int64"), axis=axes)

    best = te.compute(out, key, name="argmax_pool_key")
    return te.compute(out, lambda *i: (low - 1 - (best(*i) & (low - 1))).astype("int32"),
                      name="argmax_pool")


def _sample_lower(xs, a):
    from cvmc.ops.te import shape_of, te, tirx

    x, index = xs
    out, dims = window_geometry("sample", a, [shape_of(x), shape_of(index)], a.size, box_shape,
                                False, 0)
    strides = row_major(a.size)

    def body(*i):
        flat = te_clamp(index(*i), 0, math.prod(a.size) - 1)
        taps = [tirx.floormod(tirx.floordiv(flat, s), d.f) for s, d in zip(strides, dims)]
        loads, _, inside = te_positions(dims, i, taps, a.border, False)
        return te_select(te_all(inside), x(*loads), te_f32(_outside_value(a.border))) \
            if a.border in ("constant", "ignore") else x(*loads)

    return te.compute(out, body, name="sample")


def _extended_stage(x, dims: Sequence[Dim], fill: float):
    """The extended input over the positions a window reads (position + p along each axis),
    `fill` outside the input, as a materialised stage (its load under a branch): the
    reduction then reads it without a bounds test and vectorises. None when every read is
    inside the input."""
    from cvmc.ops.te import MATERIALIZE, te, tirx

    reach = [dim.reach(False) for dim in dims]
    if all(lo >= 0 and hi < dim.X for (lo, hi), dim in zip(reach, dims)):
        return None

    def element(*e):
        inside = [t for pos, (lo, hi), dim in zip(e, reach, dims)
                  for need, t in ((lo < 0, pos + lo >= 0), (hi >= dim.X, pos + lo < dim.X))
                  if need]
        return tirx.if_then_else(tirx.all(*inside), x(*[pos + lo for pos, (lo, _) in
                                                       zip(e, reach)]), te_f32(fill))

    return te.compute([hi - lo + 1 for lo, hi in reach], element, name="max_window_pad",
                      attrs={MATERIALIZE: 1})


def _max_window_lower(xs, a):
    """A max over the window taps in row-major order: a tap replaces the running value
    when it is larger or a NaN (the first NaN stays), so ties keep the first tap and a
    NaN wins, as argmax_pool's index picks; 'ignore' reads -inf outside, which never wins
    (a window with no input element gives -inf, as sample reads there)."""
    from cvmc.ops.te import shape_of, te, tirx

    (x,) = xs
    out, dims = window_geometry("max_window", a, [shape_of(x)], a.size, box_shape, False, 0)
    taps, axes = te_reduce_axes(dims, "rk")
    outside = _outside_value(a.border)
    padded = _extended_stage(x, dims, outside) if a.border in ("constant", "ignore") else None

    def tap(i):
        if padded is not None:  # position i * s + j * d - p, stored at + p
            return padded(*[k * dim.s + j * dim.d for k, j, dim in zip(i, taps, dims)])
        loads, _, inside = te_positions(dims, i, taps, a.border, False)
        return te_select(te_all(inside), x(*loads), te_f32(outside))

    if not axes:  # a window of one tap
        return te.compute(out, lambda *i: tap(i), name="max_window")
    first_max = te.comm_reducer(
        lambda acc, v: tirx.Select(tirx.Or(v > acc, tirx.And(
            tirx.isnan(v), tirx.Not(tirx.isnan(acc)))), v, acc),
        lambda t: tirx.const(-math.inf, t))
    return te.compute(out, lambda *i: first_max(tap(i), axis=axes), name="max_window")


def _desample_lower(xs, a):
    from cvmc.ops.te import shape_of, te

    x, index = xs
    out, dims = window_geometry("desample", a, [shape_of(x), shape_of(index)], a.size,
                                desample_shape, True, 0)
    taps, axes = te_reduce_axes(dims, "rk")

    def body(*i):
        loads, hit, inside = te_positions(dims, i, taps, "constant", True)
        take = te_all([*hit, *inside, index(*loads) == _flat_tap(taps, a.size)])
        value = te_select(take, x(*loads), te_f32(0.0))
        return te.sum(value, axis=axes) if axes else value

    return te.compute(out, body, name="desample")


# ---- registration -----------------------------------------------------------------------
def _index_precision(ins, a) -> int:
    """argmax_pool's index lies in [0, window volume): the bits of volume - 1, plus sign."""
    volume = math.prod(a.size)
    require(volume <= 2**INDEX_BITS, f"argmax_pool: a window of {volume} taps is more than "
                                     f"cvmc supports (2^{INDEX_BITS})")
    return (volume - 1).bit_length() + 1


# Operations per output element: the reference interpreter bounds a node's work by them.
for _name in ("argmax_pool", "sample", "desample", "nnef.max_window"):
    lookup(_name).cost(lambda ins, outs, a: math.prod(a.size))  # window taps
# GOPS: argmax_pool and max_window one comparison per tap; sample and desample only select
# values
for _name in ("argmax_pool", "nnef.max_window"):
    lookup(_name).arith(lambda ins, outs, a: outs[0].size * math.prod(a.size))
for _name in ("sample", "desample"):
    lookup(_name).arith(no_arith)
lookup("argmax_pool").reference(_argmax_pool_reference)
lookup("argmax_pool").lower(_argmax_pool_lower)
lookup("argmax_pool").precision(_index_precision)
lookup("sample").reference(_sample_reference)
lookup("sample").lower(_sample_lower)
lookup("nnef.max_window").reference(_max_window_reference)
lookup("nnef.max_window").lower(_max_window_lower)
lookup("desample").reference(_desample_reference)
lookup("desample").lower(_desample_lower)

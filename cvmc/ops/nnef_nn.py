"""NNEF's sliding-window primitives (spec 4.3): conv, deconv, box, debox here, with the
window geometry, taps and borders they share with the index-based ones (argmax_pool,
sample, desample, cvmc's max_window: `nnef_pool`); their entries (declarations, reference
and lower rules). Their shape rules and argument checks are in `nnef_std_nn`; the
up-sampling and RoI primitives are in `nnef_resample`. The stdlib compounds built on them
(max_pool, avg_pool, rms_pool, separable_conv, nearest/area down-sampling, the local
normalizations) expand into them.

Every reference is the spec formula in NumPy (float64): a window tap j of output position i
reads the extended input at i * s + j * d - p (basic ops) or (i + p - j * d) / s where that
divides (reverse ops), extended by the border mode of 4.3 ("Border Modes"). The kernels
compute the same formula in float32 with one fixed summation order (taps in row-major
order, one thread per output element), so their bits do not depend on the thread count.

Decisions where the spec is silent (also in the README):
- 'ignore' (box, debox, argmax_pool, sample): border positions take no part. A normalized
  box divides by the number of taps inside the input (0 taps: the result is 0); argmax_pool
  picks among the taps inside (none inside: index 0); sample reads -inf at a border
  position (so max_pool over a window with no input element gives -inf, the identity of
  max, as the Khronos PyTorch interpreter does).
- argmax_pool orders values as np.argmax does: NaN is the largest, ties (0 and -0 too)
  take the first tap; a window has at most 2^29 taps. It reduces integer keys that order
  the floats this way (`ordered_key`, which max_roi_pool uses too), so any reduction order,
  across GPU threads too, gives the same result.
- sample clamps an index outside [0, window volume) into it; desample ignores such an index
  (it matches no tap).
- 'reflect' / 'reflect-even' are defined for one reflection at each edge: a padding that
  would need more is an error at check time (`nnef_std_nn.check_reflection`).

Accuracy (u = 2^-24; docs/float.md "Float accuracy: sliding-window, up-sampling and RoI ops"):
a result that sums K rounded terms is within gamma(K + 2) * S of the reference, S the sum
of the terms' magnitudes and gamma(n) = n u / (1 - n u), K per op: conv / deconv
C/G * prod(filter) + 1; box / debox / desample prod(size) (+1 normalized). argmax_pool and
sample are exact (they select values).
"""
from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterator, Sequence

import numpy as np

from cvmc.ops.common import mac_ops
from cvmc.ops.conv_nd import padded_input
from cvmc.ops.nnef_math import np_broadcast, te_broadcast
from cvmc.ops.nnef_std import BORDERS, declare
from cvmc.ops.nnef_std_nn import (
    Dim,
    box_shape,
    conv_shape,
    debox_shape,
    deconv_shape,
    window_attrs,
    window_dims,
)
from cvmc.ops.registry import Attr, Attrs, Fusion, lookup

# ---- the entries' declarations (their shape rules: nnef_std_nn) -------------------------
CONV_BORDERS = BORDERS[1:]  # every mode but 'ignore' (spec 4.3.1)

OUTPUT_SHAPE = Attr("output_shape", "ints", (), lo=1)  # deconv, debox, desample
_GROUPS = Attr("groups", "int", 1, lo=0)
# conv anchors a kernel with its element-wise epilogue (bias, relu, clamp) on the CPU; on
# CUDA dlight wants it alone (`epilogue_on` llvm only, as every op's by default).
declare("conv", conv_shape, ("input", "filter", "bias?"), "scalar, scalar, scalar -> scalar",
        (*window_attrs(CONV_BORDERS), _GROUPS), fusion=Fusion.OUT_ELEMWISE, multiply_add=True)
declare("deconv", deconv_shape, ("input", "filter", "bias?"), "scalar, scalar, scalar -> scalar",
        (*window_attrs(CONV_BORDERS), OUTPUT_SHAPE, _GROUPS), multiply_add=True)

WINDOW_SIZE = Attr("size", "ints", lo=1)  # the window ops (nnef_pool's too)
_NORMALIZE = Attr("normalize", "bool", False)
declare("box", box_shape, ("input",), "scalar -> scalar",
        (WINDOW_SIZE, *window_attrs(BORDERS), _NORMALIZE))
declare("debox", debox_shape, ("input",), "scalar -> scalar",
        (WINDOW_SIZE, *window_attrs(BORDERS), OUTPUT_SHAPE, _NORMALIZE))


# ---- shared geometry ------------------------------------------------------------------
def window_geometry(name: str, a: Attrs, shapes: list[tuple[int, ...]], size: Sequence[int],
                    rule: Callable, reverse: bool, first: int) -> tuple[tuple[int, ...], list[Dim]]:
    """(output shape, window dims of axes first..) of a sliding-window op."""
    out = tuple(rule(name, shapes, a))
    up, down = (out, shapes[0]) if reverse else (shapes[0], out)
    return out, window_dims(a, up[first:], down[first:], size)


def conv_geometry(name: str, a: Attrs, x, w, reverse: bool):
    """(output shape, spatial dims, groups) of conv / deconv."""
    rule = deconv_shape if reverse else conv_shape
    out, dims = window_geometry(name, a, [x, w], w[2:], rule, reverse, 2)
    groups = (out[1] if reverse else x[1]) // w[1]  # filter channels * groups = up-scaled C
    return out, dims, groups


def row_major(sizes: Sequence[int]) -> list[int]:
    """Row-major strides of a window of `sizes` (flat tap index = sum j_k * stride_k)."""
    return [math.prod(sizes[k + 1:]) for k in range(len(sizes))]


# ---- NumPy reference --------------------------------------------------------------------
def extended_index(pos: np.ndarray, z: int, border: str) -> tuple[np.ndarray, np.ndarray]:
    """(index into the input, inside) for positions of the extended input along an axis of
    extent z (spec 4.3 "Border Modes"); 'constant' / 'ignore' positions outside read index
    0, whose value the caller replaces."""
    inside = (pos >= 0) & (pos < z)
    if border == "replicate":
        src = np.where(pos < 0, 0, np.where(pos >= z, z - 1, pos))
    elif border == "reflect":
        src = np.where(pos < 0, -pos, np.where(pos >= z, z - 1 - (pos - z + 1), pos))
    elif border == "reflect-even":
        src = np.where(pos < 0, -pos - 1, np.where(pos >= z, z - 1 - (pos - z), pos))
    else:
        src = np.where(inside, pos, 0)
    return src, inside


def along_axis(v: np.ndarray, axis: int, ndim: int) -> np.ndarray:
    """A 1-D array shaped to broadcast along `axis` of a rank-`ndim` array."""
    shape = [1] * ndim
    shape[axis] = -1
    return v.reshape(shape)


def np_taps(dims: Sequence[Dim], border: str, reverse: bool, ndim: int, first: int
            ) -> Iterator[tuple[int, tuple[int, ...], list[np.ndarray], np.ndarray, np.ndarray]]:
    """Per window tap j, in row-major order: (flat tap index, j, input index per window
    axis, where the read position is inside the input, where the tap takes part: reverse
    ops skip (i + p - j * d) not divisible by s). Window axes are first, first + 1, ..."""
    for t, js in enumerate(itertools.product(*(range(d.f) for d in dims))):
        srcs, inside, hit = [], np.ones((1,) * ndim, bool), np.ones((1,) * ndim, bool)
        for k, (dim, j) in enumerate(zip(dims, js)):
            if reverse:
                v = np.arange(dim.X) + dim.p - j * dim.d
                divisible = v % dim.s == 0
                pos, z = np.where(divisible, v // dim.s, 0), dim.x
                hit = hit & along_axis(divisible, first + k, ndim)
            else:
                pos, z = np.arange(dim.x) * dim.s + j * dim.d - dim.p, dim.X
            src, ok = extended_index(pos, z, border)
            srcs.append(src)
            inside = inside & along_axis(ok, first + k, ndim)
        yield t, js, srcs, inside, hit


def gather_taps(x: np.ndarray, srcs: Sequence[np.ndarray], first: int) -> np.ndarray:
    """x indexed by srcs[k] along axis first + k."""
    for k, src in enumerate(srcs):
        x = np.take(x, src, axis=first + k)
    return x


def zero_outside(values: np.ndarray, inside: np.ndarray, border: str) -> np.ndarray:
    """'constant' and 'ignore' read 0 outside the input (4.3: c = 0)."""
    return np.where(inside, values, 0.0) if border in ("constant", "ignore") else values


def conv_reference(name: str, reverse: bool) -> Callable:
    """The reference rule of NNEF conv (`reverse` False) or deconv (True), in float64."""
    def rule(xs, a):
        x, w = xs[0], xs[1]
        out, dims, groups = conv_geometry(name, a, x.shape, w.shape, reverse)
        batch, cin, cout = x.shape[0], x.shape[1], out[1]
        acc = np.zeros((batch, groups, cout // groups) + out[2:])
        for _, js, srcs, inside, hit in np_taps(dims, a.border, reverse, x.ndim, 2):
            values = zero_outside(gather_taps(x, srcs, 2), inside, a.border)
            values = values.reshape((batch, groups, cin // groups) + values.shape[2:])
            taps = w[(slice(None), slice(None), *js)]
            if reverse:  # filter [c, C/G]: input channel k2 feeds output channel k1
                term = np.einsum("bgk...,gko->bgo...", values,
                                 taps.reshape(groups, cin // groups, cout // groups))
            else:  # filter [c, C/G]: output channel k2 reads input channel k1
                term = np.einsum("bgk...,gok->bgo...", values,
                                 taps.reshape(groups, cout // groups, cin // groups))
            acc += np.where(hit[:, :, None], term, 0.0)  # hit: [1, 1, spatial...]
        result = acc.reshape(out)
        return result if len(xs) == 2 else np.add(*np_broadcast([result, xs[2]]))
    return rule


def _box_reference(name: str, reverse: bool) -> Callable:
    def rule(xs, a):
        x = xs[0]
        out, dims = window_geometry(name, a, [x.shape], a.size,
                                    debox_shape if reverse else box_shape, reverse, 0)
        total, count = np.zeros(out), np.zeros(out)
        for _, _, srcs, inside, hit in np_taps(dims, a.border, reverse, x.ndim, 0):
            values = zero_outside(gather_taps(x, srcs, 0), inside, a.border)
            total += np.where(hit, values, 0.0)
            count += hit & inside
        if not a.normalize:
            return total
        if a.border == "ignore":  # the average of the taps inside the input
            return total / np.maximum(count, 1)
        return total / math.prod(a.size)
    return rule


# ---- TE lowering ------------------------------------------------------------------------
def te_f32(v: float):
    """The float32 constant `v` (TIR)."""
    from cvmc.ops.te import tirx
    return tirx.const(v, "float32")


def te_all(conds: list):
    """The conjunction of `conds` (None when empty)."""
    from cvmc.ops.te import tirx
    return tirx.all(*conds) if conds else None


def te_select(cond, value, other):
    """`value` where `cond` holds, else `other` (TIR); `value` when `cond` is None."""
    from cvmc.ops.te import tirx
    return value if cond is None else tirx.Select(cond, value, other)


def te_clamp(e, lo: int, hi: int):
    """e clamped into [lo, hi] (a NaN may come out either way: test isnan on e first)."""
    from cvmc.ops.te import tirx
    return tirx.max(tirx.min(e, hi), lo)  # the bounds take e's dtype


def te_index(pos, z: int, border: str, within: bool):
    """(index to load, inside or None) for a position of the extended input along an axis
    of extent z; `within`: the position is known to be inside. Every load index is clamped
    into [0, z), so no kernel reads outside its input whatever the data."""
    from cvmc.ops.te import clamped_index, tirx

    if within:
        return pos, None
    last = z - 1
    if border == "reflect":
        pos = tirx.Select(pos < 0, -pos, tirx.Select(pos > last, 2 * last - pos, pos))
    elif border == "reflect-even":
        pos = tirx.Select(pos < 0, -pos - 1, tirx.Select(pos > last, 2 * last + 1 - pos, pos))
    elif border != "replicate":
        return clamped_index(pos, z)
    return te_clamp(pos, 0, last), None


def te_positions(dims: Sequence[Dim], idx: Sequence, taps: Sequence, border: str,
                 reverse: bool):
    """(load index per window axis, conditions for the tap to take part, conditions for
    the read to be inside) for output indices `idx` and taps (reduce vars or ints)."""
    from cvmc.ops.te import tirx

    loads, hit, inside = [], [], []
    for dim, i, j in zip(dims, idx, taps):
        if reverse:
            v = i + dim.p - j * dim.d
            if dim.s > 1:
                hit.append(tirx.floormod(v, dim.s) == 0)
                v = tirx.floordiv(v, dim.s)
            z = dim.x
        else:
            v, z = i * dim.s + j * dim.d - dim.p, dim.X
        lo, hi = dim.reach(reverse)
        if reverse:  # v // s is loaded for every tap, divisible or not (`hit` drops those)
            lo = (dim.p - dim.d * (dim.f - 1)) // dim.s
        load, ok = te_index(v, z, border, 0 <= lo and hi < z)
        loads.append(load)
        if ok is not None:
            inside.append(ok)
    return loads, hit, inside


def te_reduce_axes(dims: Sequence[Dim], prefix: str):
    """One reduce axis per window dim of size > 1 (0 for the others), and the axes."""
    from cvmc.ops.te import te

    taps = [te.reduce_axis((0, d.f), f"{prefix}{k}") if d.f > 1 else 0
            for k, d in enumerate(dims)]
    return taps, [t for t in taps if not isinstance(t, int)]


def te_read(x, loads, inside, border: str):
    """The extended input at `loads`: 0 at a 'constant' / 'ignore' border position."""
    return te_select(te_all(inside), x(*loads), te_f32(0.0)) if border in ("constant", "ignore") \
        else x(*loads)


def _conv_lower(name: str, reverse: bool) -> Callable:
    def rule(xs, a):
        from cvmc.ops.te import DEPTHWISE, shape_of, te

        x, w = xs[0], xs[1]
        out, dims, groups = conv_geometry(name, a, shape_of(x), shape_of(w), reverse)
        cin_g, cout_g = shape_of(x)[1] // groups, out[1] // groups
        rc = te.reduce_axis((0, cin_g), "rc")
        taps, axes = te_reduce_axes(dims, "rk")

        # Zero borders: a materialised padded copy of the input (conv_nd's), read without
        # a test, so the reduction's loads stay affine and vectorise.
        padded = padded_input(x, [d.X for d in dims], [d.f for d in dims],
                              [d.x for d in dims], [d.s for d in dims], [d.d for d in dims],
                              [d.p for d in dims], name) \
            if not reverse and a.border in ("constant", "ignore") else None

        def body(b, o, *i):
            g = o // cout_g
            if padded is not None:
                value = padded(b, g * cin_g + rc, *[ik * d.s + j * d.d
                                                    for ik, j, d in zip(i, taps, dims)])
                return te.sum(value * w(o, rc, *taps), axis=[rc, *axes])
            loads, hit, inside = te_positions(dims, i, taps, a.border, reverse)
            value = te_read(x, [b, g * cin_g + rc, *loads], inside, a.border)
            weight = w(g * cin_g + rc, o - g * cout_g, *taps) if reverse else w(o, rc, *taps)
            return te.sum(te_select(te_all(hit), value * weight, te_f32(0.0)), axis=[rc, *axes])

        # A 2-D depth-wise conv on the padded copy: the CPU's depth-wise rule takes it
        # (cvmc/lowering/depthwise.py, as for conv2d).
        depthwise = padded is not None and len(dims) == 2 and cin_g == cout_g == 1
        acc = te.compute(out, body, name=name, attrs={DEPTHWISE: 1} if depthwise else {})
        return acc if len(xs) == 2 else te_broadcast([acc, xs[2]], lambda s, c: s + c,
                                                     f"{name}_bias")
    return rule


def _box_lower(name: str, reverse: bool) -> Callable:
    def rule(xs, a):
        from cvmc.ops.te import shape_of, te, tirx

        (x,) = xs
        out, dims = window_geometry(name, a, [shape_of(x)], a.size,
                                    debox_shape if reverse else box_shape, reverse, 0)
        taps, axes = te_reduce_axes(dims, "rk")

        def reduce(term, dtype: str):
            def body(*i):
                loads, hit, inside = te_positions(dims, i, taps, a.border, reverse)
                value = term(loads, hit, inside)
                return te.sum(value, axis=axes) if axes else value
            return te.compute(out, body, name=f"{name}_{dtype}")

        total = reduce(lambda loads, hit, inside: te_select(
            te_all(hit), te_read(x, loads, inside, a.border), te_f32(0.0)), "sum")
        if not a.normalize:
            return total
        if a.border != "ignore":
            volume = te_f32(float(math.prod(a.size)))
            return te.compute(out, lambda *i: total(*i) / volume, name=f"{name}_norm")
        count = reduce(lambda loads, hit, inside: te_select(
            te_all(hit + inside), tirx.const(1, "int32"), tirx.const(0, "int32")), "count")
        return te.compute(out, lambda *i: total(*i) / tirx.max(count(*i), 1).astype("float32"),
                          name=f"{name}_norm")
    return rule


# ---- registration -----------------------------------------------------------------------
# Operations per output element: the reference interpreter bounds a node's work by them.
for _name in ("box", "debox"):
    lookup(_name).cost(lambda ins, outs, a: math.prod(a.size))  # window taps
# GOPS: 2 per multiply-add, output elements x C/G x taps (a deconv: its input elements);
# box one addition per tap, debox each input element into each output of its window.
lookup("conv").arith(lambda ins, outs, a: mac_ops(outs[0].size, math.prod(ins[1].shape[1:])))
lookup("deconv").arith(lambda ins, outs, a: mac_ops(ins[0].size, math.prod(ins[1].shape[1:])))
lookup("box").arith(lambda ins, outs, a: outs[0].size * math.prod(a.size))
lookup("debox").arith(lambda ins, outs, a: ins[0].size * math.prod(a.size))
for _reverse, _name in ((False, "conv"), (True, "deconv")):
    lookup(_name).cost(lambda ins, outs, a: math.prod(ins[1].shape[1:]))  # C/G x taps
    lookup(_name).reference(conv_reference(_name, _reverse))
    lookup(_name).lower(_conv_lower(_name, _reverse))
for _reverse, _name in ((False, "box"), (True, "debox")):
    lookup(_name).reference(_box_reference(_name, _reverse))
    lookup(_name).lower(_box_lower(_name, _reverse))

"""NNEF's up-sampling and RoI primitives (spec 4.3 and 4.6): multilinear_upsample,
avg_roi_pool, max_roi_pool, roi_resample: their entries (declarations, reference and lower
rules). Their shape rules are in `nnef_std_nn`; they share the extended input (border
modes) of the sliding-window ops (`nnef_nn`) and their float-ordering keys (`nnef_pool`).
The references are the spec formulas in NumPy (float64); the kernels compute them in
float32 with one fixed summation order, one thread per output element.

Decisions where the spec is silent:
- multilinear_upsample 'aligned' with an input extent of 1 samples index 0 (g = inf).
- RoI pooling (4.6.1): the rounded RoI [y0, y1) x [x0, x1) (round(v) = floor(v + 0.5)) is
  split into cells of extent ceil(r / p) starting at y0 + i * floor(r / p) (the spec's
  "c_H + i * s_H" cannot be meant literally: it ignores the RoI). Positions outside the
  input read 0 and count, as avg_pool / max_pool with their default 'constant' border; a
  cell of extent <= 0 gives 0.
- roi_resample (4.6.2) samples RoI extent r at output index i, as multilinear_upsample does
  for an input of extent r: start + i * r / h ('asymmetric'), start + (i + 0.5) * r / h - 0.5
  ('symmetric'), start + i * (r - 1) / (h - 1) ('aligned'; h = 1: start), then
  interpolates linearly with the 'replicate' border (upsample's default). So
  roi_resample(x, RoI = the whole input, h = X * f) is multilinear_upsample(x, f).
- the RoI ops clamp a batch index into [0, batch); max_roi_pool's max is NaN if a value
  is NaN, and 0 wins over -0 (`nnef_pool.ordered_key`).

Accuracy (u = 2^-24; docs/float.md "Float accuracy: sliding-window, up-sampling and RoI ops"):
within gamma(K + 2) * S of the reference, K per op: multilinear_upsample 2^M + 2M - 1 (M
spatial dims; the weights are exact ratios of integers, each rounded once); avg_roi_pool
the cell volume + 2; roi_resample 2^M + 3M (positions in float64 as the reference, weights
rounded once). max_roi_pool is exact (it selects values).
"""
from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence

import numpy as np

from cvmc.ops.common import arith_per_output, mac_ops
from cvmc.ops.nnef_nn import (
    CONV_BORDERS,
    along_axis,
    extended_index,
    te_all,
    te_clamp,
    te_f32,
    te_index,
    te_read,
    te_select,
    zero_outside,
)
from cvmc.ops.nnef_pool import ordered_key, unordered_value
from cvmc.ops.nnef_std import declare
from cvmc.ops.nnef_std_nn import roi_shape, upsample_shape
from cvmc.ops.registry import Attr, lookup

COORD_LIMIT = 2**24  # RoI coordinates are clamped here: cell arithmetic stays in int32

# ---- the entries' declarations (their shape rules: nnef_std_nn) -------------------------
declare("multilinear_upsample", upsample_shape, ("input",), "scalar -> scalar",
        (Attr("factor", "ints", lo=1),
         Attr("method", "str", "symmetric", choices=("asymmetric", "symmetric", "aligned")),
         Attr("border", "str", "replicate", choices=CONV_BORDERS)))

_ROI_INPUTS = ("input", "rois", "batch_index")
_ROI_TYPES = "scalar, scalar, integer -> scalar"
_OUTPUT_SIZE = Attr("output_size", "ints", lo=1)
declare("avg_roi_pool", roi_shape, _ROI_INPUTS, _ROI_TYPES, (_OUTPUT_SIZE,))
declare("max_roi_pool", roi_shape, _ROI_INPUTS, _ROI_TYPES, (_OUTPUT_SIZE,))
declare("roi_resample", roi_shape, _ROI_INPUTS, _ROI_TYPES,
        (_OUTPUT_SIZE,
         Attr("method", "str", "symmetric", choices=("asymmetric", "symmetric", "aligned"))))


# ---- NumPy reference --------------------------------------------------------------------
def _linear_weights(method: str, n: int, f: int) -> tuple[np.ndarray, np.ndarray]:
    """(j, u) per output index of multilinear_upsample along an axis of extent n, factor f
    (spec 4.3.4): output[i] = (1 - u) input[j] + u input[j + 1]."""
    i = np.arange(n * f, dtype=np.float64)
    if method == "asymmetric":
        pos = i / f
    elif method == "symmetric":
        pos = (i - (f - 1) / 2) / f
    elif n > 1:  # aligned: i / g(x), g(x) = (x f - 1) / (x - 1)
        pos = i / ((n * f - 1) / (n - 1))
    else:  # g(1) is infinite
        pos = np.zeros_like(i)
    j = np.floor(pos)
    return j.astype(np.int64), pos - j


def _interpolate(x: np.ndarray, axes_weights: list[tuple[np.ndarray, np.ndarray]],
                 border: str) -> np.ndarray:
    """Sum over the 2^M corners of the product of linear weights times the extended input
    (axes 2.. of x, one (j, u) per spatial axis)."""
    result = 0.0
    for corner in itertools.product((0, 1), repeat=len(axes_weights)):
        values, weight = x, 1.0
        for k, ((j, u), c) in enumerate(zip(axes_weights, corner)):
            src, inside = extended_index(j + c, x.shape[2 + k], border)
            values = zero_outside(np.take(values, src, axis=2 + k),
                                   along_axis(inside, 2 + k, x.ndim), border)
            weight = weight * along_axis(u if c else 1 - u, 2 + k, x.ndim)
        result = result + weight * values
    return result


def _upsample_reference(xs, a):
    x = xs[0]
    weights = [_linear_weights(a.method, n, f) for n, f in zip(x.shape[2:], a.factor)]
    return _interpolate(x, weights, a.border)


def np_round_coordinate(v: np.ndarray) -> np.ndarray:
    """A RoI coordinate rounded to the nearest integer (round(v) = floor(v + 0.5), as NNEF's
    round), clamped to +-COORD_LIMIT; NaN gives 0."""
    r = np.floor(np.clip(v, -COORD_LIMIT, COORD_LIMIT) + 0.5)
    return np.where(np.isnan(r), 0, r).astype(np.int64)


def _roi_cells(roi: np.ndarray, output_size: Sequence[int]):
    """Per spatial axis: (cell starts per output index, cell extent) of a rounded RoI."""
    m = len(output_size)
    r = np_round_coordinate(roi)
    cells = []
    for k, p in enumerate(output_size):
        extent = int(r[m + k] - r[k])
        cells.append((int(r[k]) + np.arange(p) * (extent // p), -(-extent // p)))
    return cells


def cell_max(values: np.ndarray) -> float:
    """The maximum of max_roi_pool's cell: NaN if any value is NaN, and 0 above -0."""
    if np.isnan(values).any():
        return np.nan
    m = values.max()
    return m if m != 0 else 0.0 if (~np.signbit(values[values == 0])).any() else -0.0


def _roi_pool_reference(kind: str) -> Callable:
    def rule(xs, a):
        x, rois, batch_index = xs
        out = roi_shape(f"{kind}_roi_pool", [x.shape, rois.shape, batch_index.shape], a)
        result = np.zeros(out)
        for n in range(rois.shape[0]):
            b = int(np.clip(batch_index.reshape(-1)[n], 0, x.shape[0] - 1))
            cells = _roi_cells(rois[n], a.output_size)
            for cell in itertools.product(*(range(p) for p in a.output_size)):
                bounds = [(int(starts[i]), int(starts[i]) + extent)
                          for (starts, extent), i in zip(cells, cell)]
                result[(n, slice(None), *cell)] = _pool_cell(x[b], bounds, kind)
        return result
    return rule


def _pool_cell(x: np.ndarray, bounds: list[tuple[int, int]], kind: str) -> np.ndarray:
    """Average or max over the cell [lo, hi) per spatial axis of x [C, spatial...], where
    positions outside x read 0; an empty cell gives 0."""
    volume = math.prod(hi - lo for lo, hi in bounds)
    if any(hi <= lo for lo, hi in bounds):
        return np.zeros(x.shape[0])
    region = x[(slice(None), *(slice(max(lo, 0), max(min(hi, e), 0))
                               for (lo, hi), e in zip(bounds, x.shape[1:])))]
    region = region.reshape(x.shape[0], -1)
    if kind == "avg":
        return region.sum(axis=1) / volume
    if region.shape[1] < volume:  # the cell reaches outside: a 0 takes part
        region = np.concatenate([region, np.zeros((x.shape[0], 1))], axis=1)
    return np.array([cell_max(row) for row in region])


def roi_positions(method: str, start: float, end: float, h: int) -> np.ndarray:
    """Sample positions of roi_resample along one axis (see the module docstring)."""
    i, r = np.arange(h, dtype=np.float64), end - start
    if method == "asymmetric":
        return start + i * r / h
    if method == "symmetric":
        return start + (i + 0.5) * r / h - 0.5
    return start + i * (r - 1) / (h - 1) if h > 1 else np.full(h, start)


def _roi_resample_reference(xs, a):
    x, rois, batch_index = xs
    out = roi_shape("roi_resample", [x.shape, rois.shape, batch_index.shape], a)
    m = len(a.output_size)
    result = np.zeros(out)
    for n in range(rois.shape[0]):
        b = int(np.clip(batch_index.reshape(-1)[n], 0, x.shape[0] - 1))
        weights = []
        for k, h in enumerate(a.output_size):
            pos = roi_positions(a.method, rois[n, k], rois[n, m + k], h)
            # beyond [-1, extent] the replicate border gives the edge value anyway; a NaN
            # position keeps a NaN weight (and reads index 0)
            pos = np.clip(pos, -1, x.shape[2 + k])
            j = np.where(np.isnan(pos), 0, np.floor(pos))
            weights.append((j.astype(np.int64), pos - j))
        result[n] = _interpolate(x[b:b + 1], weights, "replicate")[0]
    return result


# ---- TE lowering ------------------------------------------------------------------------
def _te_linear(method: str, i, n: int, f: int):
    """(j, numerator, denominator) of multilinear_upsample along an axis: the exact
    rational u = numerator / denominator of the spec's frac(...), integers only."""
    from cvmc.ops.te import tirx

    if method == "asymmetric":  # i / f
        return tirx.floordiv(i, f), tirx.floormod(i, f), f
    if method == "symmetric":  # (i - (f - 1) / 2) / f = (2 i - f + 1) / (2 f)
        t = 2 * i - f + 1
        return tirx.floordiv(t, 2 * f), tirx.floormod(t, 2 * f), 2 * f
    if n == 1:  # aligned, g(1) infinite
        return tirx.const(0, "int32"), tirx.const(0, "int32"), 1
    t = i.astype("int64") * (n - 1)  # aligned: i / g = i (n - 1) / (n f - 1); up to 2^48
    den = n * f - 1
    return (tirx.floordiv(t, den).astype("int32"), tirx.floormod(t, den).astype("int32"), den)


def _te_interpolate(x, lead: Sequence, corners: Sequence, border: str):
    """Sum over the 2^M corners of weight products times the extended input; `corners`
    holds per spatial axis (j, weight of j, weight of j + 1, extent)."""
    total = None
    for corner in itertools.product((0, 1), repeat=len(corners)):
        loads, inside, weight = [], [], None
        for (j, w0, w1, extent), c in zip(corners, corner):
            load, ok = te_index(j + c, extent, border, False)
            loads.append(load)
            inside += [ok] if ok is not None else []
            weight = (w1 if c else w0) if weight is None else weight * (w1 if c else w0)
        term = weight * te_read(x, [*lead, *loads], inside, border)
        total = term if total is None else total + term
    return total


def _upsample_lower(xs, a):
    from cvmc.ops.te import shape_of, te

    (x,) = xs
    shape = shape_of(x)
    out = upsample_shape("multilinear_upsample", [shape], a)

    def body(b, c, *i):
        corners = []
        for ik, n, f in zip(i, shape[2:], a.factor):
            j, num, den = _te_linear(a.method, ik, n, f)
            d = te_f32(float(den))
            # both weights correctly rounded: (den - num) / den, not 1 - u
            corners.append((j, (den - num).astype("float32") / d, num.astype("float32") / d, n))
        return _te_interpolate(x, [b, c], corners, a.border)

    return te.compute(out, body, name="multilinear_upsample")


def te_round_coordinate(v):
    """`np_round_coordinate` in TE: floor(v + 0.5) in float64, clamped; NaN gives 0."""
    from cvmc.ops.te import tirx

    wide = te_clamp(v.astype("float64"), -COORD_LIMIT, COORD_LIMIT)
    r = tirx.floor(wide + tirx.const(0.5, "float64"))
    return tirx.Select(tirx.isnan(v), tirx.const(0, "int32"), r.astype("int32"))


def _batch(batch_index, n, batches: int):
    """The clamped batch index of RoI n ([N] or [N, 1] tensor)."""
    from cvmc.ops.te import shape_of

    read = batch_index(n) if len(shape_of(batch_index)) == 1 else batch_index(n, 0)
    return te_clamp(read, 0, batches - 1)


def _roi_pool_lower(kind: str) -> Callable:
    def rule(xs, a):
        from cvmc.ops.te import shape_of, te, tirx

        x, rois, batch_index = xs
        shape = shape_of(x)
        m = len(a.output_size)
        out = roi_shape(f"{kind}_roi_pool", [shape, shape_of(rois), shape_of(batch_index)], a)
        axes = [te.reduce_axis((0, e), f"rh{k}") for k, e in enumerate(shape[2:])]

        def cells(n, cell):
            """Per axis (start, extent) of the cell: start y0 + i * floor(r / p), extent
            ceil(r / p) (int32: coordinates are clamped to 2^24)."""
            result = []
            for k, (i, p) in enumerate(zip(cell, a.output_size)):
                lo = te_round_coordinate(rois(n, k))
                extent = te_round_coordinate(rois(n, m + k)) - lo
                result.append((lo + i * tirx.floordiv(extent, p), -tirx.floordiv(-extent, p)))
            return result

        def body(n, c, *cell):
            bounds = cells(n, cell)
            in_cell = te_all([tirx.all(r >= lo, r < lo + e) for r, (lo, e) in zip(axes, bounds)])
            value = x(_batch(batch_index, n, shape[0]), c, *axes)
            if kind == "avg":
                return te.sum(te_select(in_cell, value, te_f32(0.0)), axis=axes)
            # key 0: no input position in the cell, 2^33: NaN, else 1 + the ordered value
            key = tirx.Select(tirx.isnan(value), tirx.const(2**33, "int64"),
                              ordered_key(value) + 1)
            return te.max(te_select(in_cell, key, tirx.const(0, "int64")), axis=axes)

        reduced = te.compute(out, body, name=f"{kind}_roi_pool_cells")

        def finish(n, c, *cell):
            bounds = cells(n, cell)
            empty = tirx.any(*[e <= 0 for _, e in bounds])
            total = reduced(n, c, *cell)
            if kind == "avg":
                volume = None
                for _, e in bounds:
                    e = e.astype("float32")
                    volume = e if volume is None else volume * e
                return tirx.Select(empty, te_f32(0.0), total / volume)
            value = tirx.Select(total == 0, te_f32(-np.inf), tirx.Select(
                total == 2**33, te_f32(np.nan), unordered_value(total - 1)))
            outside = tirx.any(*[tirx.Or(lo < 0, lo + e > extent)
                                 for (lo, e), extent in zip(bounds, shape[2:])])
            # a zero takes part: the max is 0 unless value is NaN or above 0 (0 beats -0)
            with_zero = tirx.Select(tirx.Or(tirx.isnan(value), value > te_f32(0.0)), value,
                                    te_f32(0.0))
            return tirx.Select(empty, te_f32(0.0), tirx.Select(outside, with_zero, value))

        return te.compute(out, finish, name=f"{kind}_roi_pool")
    return rule


def _roi_resample_lower(xs, a):
    from cvmc.ops.te import shape_of, te, tirx

    x, rois, batch_index = xs
    shape = shape_of(x)
    m = len(a.output_size)
    out = roi_shape("roi_resample", [shape, shape_of(rois), shape_of(batch_index)], a)

    def position(start, end, i, h: int):
        f64 = "float64"
        i, r = i.astype(f64), end - start
        if a.method == "asymmetric":
            return start + i * r / tirx.const(h, f64)
        if a.method == "symmetric":
            return start + (i + tirx.const(0.5, f64)) * r / tirx.const(h, f64) - \
                tirx.const(0.5, f64)
        if h == 1:
            return start
        return start + i * (r - tirx.const(1.0, f64)) / tirx.const(h - 1, f64)

    def body(n, c, *i):
        corners = []
        for k, (ik, h) in enumerate(zip(i, a.output_size)):
            start = rois(n, k).astype("float64")
            end = rois(n, m + k).astype("float64")
            extent = shape[2 + k]
            pos = position(start, end, ik, h)
            nan = tirx.isnan(pos)
            clamped = te_clamp(pos, -1, extent)
            floor = tirx.Select(nan, tirx.const(0.0, "float64"), tirx.floor(clamped))
            u = tirx.Select(nan, pos, clamped - floor)
            corners.append((floor.astype("int32"), (tirx.const(1.0, "float64") - u)
                            .astype("float32"), u.astype("float32"), extent))
        return _te_interpolate(x, [_batch(batch_index, n, shape[0]), c], corners, "replicate")

    return te.compute(out, body, name="roi_resample")


# ---- registration -----------------------------------------------------------------------
# GOPS: multilinear a multiply-add per corner; RoI cells as large as the rois' values make
# them: one per output element
lookup("multilinear_upsample").arith(
    lambda ins, outs, a: mac_ops(outs[0].size, 2 ** len(a.factor)))
for _name in ("avg_roi_pool", "max_roi_pool", "roi_resample"):
    lookup(_name).arith(arith_per_output)
lookup("multilinear_upsample").reference(_upsample_reference)
lookup("multilinear_upsample").lower(_upsample_lower)
for _kind in ("avg", "max"):
    lookup(f"{_kind}_roi_pool").reference(_roi_pool_reference(_kind))
    lookup(f"{_kind}_roi_pool").lower(_roi_pool_lower(_kind))
lookup("roi_resample").reference(_roi_resample_reference)
lookup("roi_resample").lower(_roi_resample_lower)

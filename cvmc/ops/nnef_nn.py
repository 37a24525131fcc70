"""NNEF's sliding-window, up-sampling and RoI primitives (spec 4.3 and 4.6): conv, deconv,
box, debox, argmax_pool, sample, desample, multilinear_upsample, avg_roi_pool, max_roi_pool,
roi_resample: their entries (declarations, reference and lower rules). Their shape rules
and argument checks are in `nnef_std_nn`; the stdlib compounds built on them (max_pool, avg_pool,
rms_pool, separable_conv, nearest/area down/up-sampling, the local normalizations) expand
into them.

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
  take the first tap; a window has at most 2^29 taps. max_roi_pool's max is NaN if a value
  is NaN, and 0 wins over -0. Both reduce integer keys that order the floats this way
  (`_ordered`), so any reduction order, across GPU threads too, gives the same result.
- sample clamps an index outside [0, window volume) into it; desample ignores such an index
  (it matches no tap); the RoI ops clamp a batch index into [0, batch).
- 'reflect' / 'reflect-even' are defined for one reflection at each edge: a padding that
  would need more is an error at check time (`nnef_std_nn.check_reflection`).
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

Accuracy (u = 2^-24; docs/float.md "Float accuracy: sliding-window, up-sampling and RoI ops"):
a result that sums K rounded terms is within gamma(K + 2) * S of the reference, S the sum
of the terms' magnitudes and gamma(n) = n u / (1 - n u), K per op: conv / deconv
C/G * prod(filter) + 1; box / debox / desample prod(size) (+1 normalized);
multilinear_upsample 2^M + 2M - 1 (M spatial dims; the weights are exact ratios of
integers, each rounded once); avg_roi_pool the cell volume + 2; roi_resample 2^M + 3M
(positions in float64 as the reference, weights rounded once). argmax_pool, sample and
max_roi_pool are exact (they select values).
"""
from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterator, Sequence

import numpy as np

from cvmc.ops.common import arith_per_output, mac_ops, no_arith, require
from cvmc.ops.conv_nd import padded_input
from cvmc.ops.nnef_math import np_broadcast, te_broadcast
from cvmc.ops.nnef_std import BORDERS, declare
from cvmc.ops.nnef_std_nn import (
    Dim,
    box_shape,
    conv_shape,
    debox_shape,
    deconv_shape,
    desample_shape,
    roi_shape,
    sample_shape,
    upsample_shape,
    window_attrs,
    window_dims,
)
from cvmc.ops.registry import Attr, Attrs, Fusion, lookup

COORD_LIMIT = 2**24  # RoI coordinates are clamped here: cell arithmetic stays in int32
INDEX_BITS = 29  # argmax_pool windows have at most 2^29 taps (the low bits of its key)

# ---- the entries' declarations (their shape rules: nnef_std_nn) -------------------------
CONV_BORDERS = BORDERS[1:]  # every mode but 'ignore' (spec 4.3.1)

_OUTPUT_SHAPE = Attr("output_shape", "ints", (), lo=1)
_GROUPS = Attr("groups", "int", 1, lo=0)
# conv anchors a kernel with its element-wise epilogue (bias, relu, clamp) on the CPU; on
# CUDA dlight wants it alone (`Target.epilogue_anchors`).
declare("conv", conv_shape, ("input", "filter", "bias?"), "scalar, scalar, scalar -> scalar",
        (*window_attrs(CONV_BORDERS), _GROUPS), fusion=Fusion.OUT_ELEMWISE, multiply_add=True)
declare("deconv", deconv_shape, ("input", "filter", "bias?"), "scalar, scalar, scalar -> scalar",
        (*window_attrs(CONV_BORDERS), _OUTPUT_SHAPE, _GROUPS), multiply_add=True)

_SIZE = Attr("size", "ints", lo=1)
_NORMALIZE = Attr("normalize", "bool", False)
declare("box", box_shape, ("input",), "scalar -> scalar",
        (_SIZE, *window_attrs(BORDERS), _NORMALIZE))
declare("debox", debox_shape, ("input",), "scalar -> scalar",
        (_SIZE, *window_attrs(BORDERS), _OUTPUT_SHAPE, _NORMALIZE))
declare("argmax_pool", box_shape, ("input",), "scalar -> integer",
        (_SIZE, *window_attrs(BORDERS)), ("index",),
        precision_rule="bitlen(window volume - 1) + 1: an index into the window")
# sample accepts 'ignore' although 4.3.3 omits it: the stdlib max_pool forwards its border
# (alexnet uses 'ignore') to sample through max_pool_with_index.
declare("sample", sample_shape, ("input", "index"), "scalar, integer -> scalar",
        (_SIZE, *window_attrs(BORDERS)))
# cvmc's own: the stdlib's max_pool (sample at argmax_pool's index) as one window reduction;
# the compile pipeline's `simplify` pass writes it where the index has no other use.
declare("nnef.max_window", box_shape, ("input",), "scalar -> scalar",
        (_SIZE, *window_attrs(BORDERS)))
declare("desample", desample_shape, ("input", "index"), "scalar, integer -> scalar",
        (_SIZE, *window_attrs(("constant",)), _OUTPUT_SHAPE))

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


# ---- shared geometry ------------------------------------------------------------------
def _geometry(name: str, a: Attrs, shapes: list[tuple[int, ...]], size: Sequence[int],
              rule: Callable, reverse: bool, first: int) -> tuple[tuple[int, ...], list[Dim]]:
    """(output shape, window dims of axes first..) of a sliding-window op."""
    out = tuple(rule(name, shapes, a))
    up, down = (out, shapes[0]) if reverse else (shapes[0], out)
    return out, window_dims(a, up[first:], down[first:], size)


def conv_geometry(name: str, a: Attrs, x, w, reverse: bool):
    """(output shape, spatial dims, groups) of conv / deconv."""
    rule = deconv_shape if reverse else conv_shape
    out, dims = _geometry(name, a, [x, w], w[2:], rule, reverse, 2)
    groups = (out[1] if reverse else x[1]) // w[1]  # filter channels * groups = up-scaled C
    return out, dims, groups


def _row_major(sizes: Sequence[int]) -> list[int]:
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


def _along(v: np.ndarray, axis: int, ndim: int) -> np.ndarray:
    """A 1-D array shaped to broadcast along `axis` of a rank-`ndim` array."""
    shape = [1] * ndim
    shape[axis] = -1
    return v.reshape(shape)


def _np_taps(dims: Sequence[Dim], border: str, reverse: bool, ndim: int, first: int
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
                hit = hit & _along(divisible, first + k, ndim)
            else:
                pos, z = np.arange(dim.x) * dim.s + j * dim.d - dim.p, dim.X
            src, ok = extended_index(pos, z, border)
            srcs.append(src)
            inside = inside & _along(ok, first + k, ndim)
        yield t, js, srcs, inside, hit


def _gather(x: np.ndarray, srcs: Sequence[np.ndarray], first: int) -> np.ndarray:
    """x indexed by srcs[k] along axis first + k."""
    for k, src in enumerate(srcs):
        x = np.take(x, src, axis=first + k)
    return x


def _zero_outside(values: np.ndarray, inside: np.ndarray, border: str) -> np.ndarray:
    """'constant' and 'ignore' read 0 outside the input (4.3: c = 0)."""
    return np.where(inside, values, 0.0) if border in ("constant", "ignore") else values


def conv_reference(name: str, reverse: bool) -> Callable:
    """The reference rule of NNEF conv (`reverse` False) or deconv (True), in float64."""
    def rule(xs, a):
        x, w = xs[0], xs[1]
        out, dims, groups = conv_geometry(name, a, x.shape, w.shape, reverse)
        batch, cin, cout = x.shape[0], x.shape[1], out[1]
        acc = np.zeros((batch, groups, cout // groups) + out[2:])
        for _, js, srcs, inside, hit in _np_taps(dims, a.border, reverse, x.ndim, 2):
            values = _zero_outside(_gather(x, srcs, 2), inside, a.border)
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
        out, dims = _geometry(name, a, [x.shape], a.size, debox_shape if reverse else box_shape,
                              reverse, 0)
        total, count = np.zeros(out), np.zeros(out)
        for _, _, srcs, inside, hit in _np_taps(dims, a.border, reverse, x.ndim, 0):
            values = _zero_outside(_gather(x, srcs, 0), inside, a.border)
            total += np.where(hit, values, 0.0)
            count += hit & inside
        if not a.normalize:
            return total
        if a.border == "ignore":  # the average of the taps inside the input
            return total / np.maximum(count, 1)
        return total / math.prod(a.size)
    return rule


def _argmax_pool_reference(xs, a):
    x = xs[0]
    out, dims = _geometry("argmax_pool", a, [x.shape], a.size, box_shape, False, 0)
    best = best_value = best_class = None
    for t, _, srcs, inside, _ in _np_taps(dims, a.border, False, x.ndim, 0):
        values = np.broadcast_to(_zero_outside(_gather(x, srcs, 0), inside, a.border), out)
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
    out, dims = _geometry("sample", a, [x.shape, index.shape], a.size, box_shape, False, 0)
    flat = np.clip(index, 0, math.prod(a.size) - 1)
    result = np.zeros(out)
    for t, _, srcs, inside, _ in _np_taps(dims, a.border, False, x.ndim, 0):
        values = _gather(x, srcs, 0)
        if a.border in ("constant", "ignore"):
            values = np.where(inside, values, _outside_value(a.border))
        result = np.where(flat == t, values, result)
    return result


def _max_window_reference(xs, a):
    """The stdlib's max_pool literally: sample at argmax_pool's index."""
    return _sample_reference([xs[0], _argmax_pool_reference(xs, a)], a)


def _desample_reference(xs, a):
    x, index = xs
    out, dims = _geometry("desample", a, [x.shape, index.shape], a.size, desample_shape, True, 0)
    result = np.zeros(out)
    for t, _, srcs, inside, hit in _np_taps(dims, "constant", True, x.ndim, 0):
        take = hit & inside & (_gather(index, srcs, 0) == t)
        result += np.where(take, _gather(x, srcs, 0), 0.0)
    return result


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
            values = _zero_outside(np.take(values, src, axis=2 + k),
                                   _along(inside, 2 + k, x.ndim), border)
            weight = weight * _along(u if c else 1 - u, 2 + k, x.ndim)
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
def _f32(v: float):
    from cvmc.ops.te import tirx
    return tirx.const(v, "float32")


def _all(conds: list):
    """The conjunction of `conds` (None when empty)."""
    from cvmc.ops.te import tirx
    return tirx.all(*conds) if conds else None


def _select(cond, value, other):
    from cvmc.ops.te import tirx
    return value if cond is None else tirx.Select(cond, value, other)


def _clamp(e, lo: int, hi: int):
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
    return _clamp(pos, 0, last), None


def _te_positions(dims: Sequence[Dim], idx: Sequence, taps: Sequence, border: str,
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


def _reduce_axes(dims: Sequence[Dim], prefix: str):
    """One reduce axis per window dim of size > 1 (0 for the others), and the axes."""
    from cvmc.ops.te import te

    taps = [te.reduce_axis((0, d.f), f"{prefix}{k}") if d.f > 1 else 0
            for k, d in enumerate(dims)]
    return taps, [t for t in taps if not isinstance(t, int)]


def _read(x, loads, inside, border: str):
    """The extended input at `loads`: 0 at a 'constant' / 'ignore' border position."""
    return _select(_all(inside), x(*loads), _f32(0.0)) if border in ("constant", "ignore") \
        else x(*loads)


def _conv_lower(name: str, reverse: bool) -> Callable:
    def rule(xs, a):
        from cvmc.ops.te import DEPTHWISE, shape_of, te

        x, w = xs[0], xs[1]
        out, dims, groups = conv_geometry(name, a, shape_of(x), shape_of(w), reverse)
        cin_g, cout_g = shape_of(x)[1] // groups, out[1] // groups
        rc = te.reduce_axis((0, cin_g), "rc")
        taps, axes = _reduce_axes(dims, "rk")

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
            loads, hit, inside = _te_positions(dims, i, taps, a.border, reverse)
            value = _read(x, [b, g * cin_g + rc, *loads], inside, a.border)
            weight = w(g * cin_g + rc, o - g * cout_g, *taps) if reverse else w(o, rc, *taps)
            return te.sum(_select(_all(hit), value * weight, _f32(0.0)), axis=[rc, *axes])

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
        out, dims = _geometry(name, a, [shape_of(x)], a.size,
                              debox_shape if reverse else box_shape, reverse, 0)
        taps, axes = _reduce_axes(dims, "rk")

        def reduce(term, dtype: str):
            def body(*i):
                loads, hit, inside = _te_positions(dims, i, taps, a.border, reverse)
                value = term(loads, hit, inside)
                return te.sum(value, axis=axes) if axes else value
            return te.compute(out, body, name=f"{name}_{dtype}")

        total = reduce(lambda loads, hit, inside: _select(
            _all(hit), _read(x, loads, inside, a.border), _f32(0.0)), "sum")
        if not a.normalize:
            return total
        if a.border != "ignore":
            volume = _f32(float(math.prod(a.size)))
            return te.compute(out, lambda *i: total(*i) / volume, name=f"{name}_norm")
        count = reduce(lambda loads, hit, inside: _select(
            _all(hit + inside), tirx.const(1, "int32"), tirx.const(0, "int32")), "count")
        return te.compute(out, lambda *i: total(*i) / tirx.max(count(*i), 1).astype("float32"),
                          name=f"{name}_norm")
    return rule


def _ordered(value, zero_is_negative_zero: bool = False):
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


def _unordered(key):
    """The float32 whose `_ordered` key is `key`."""
    from cvmc.ops.te import tirx

    k = (key - 2**31).astype("int32")
    return tirx.reinterpret("float32", tirx.Select(k >= 0, k, k ^ 0x7FFFFFFF))


def _flat_tap(taps: Sequence, sizes: Sequence[int]):
    """Row-major flat index of the taps (reduce vars or ints) in a window of `sizes`."""
    return sum(t * stride for t, stride in zip(taps, _row_major(sizes)))


def _argmax_pool_lower(xs, a):
    from cvmc.ops.te import shape_of, te, tirx

    (x,) = xs
    out, dims = _geometry("argmax_pool", a, [shape_of(x)], a.size, box_shape, False, 0)
    taps, axes = _reduce_axes(dims, "rk")
    if not axes:  # a window of one tap
        return te.compute(out, lambda *i: tirx.const(0, "int32"), name="argmax_pool")
    low = 2**INDEX_BITS

    def key(*i):
        """The max of class * 2^61 + ordered value * 2^29 + (2^29 - 1 - tap): the larger
        class (0 an ignored border position, 1 a number, 2 NaN), then the larger number,
        then the first tap."""
        loads, _, inside = _te_positions(dims, i, taps, a.border, False)
        value = _read(x, loads, inside, a.border)
        number = tirx.const(2**61, "int64") + _ordered(value, True) * low
        k = tirx.Select(tirx.isnan(value), tirx.const(2**62, "int64"), number)
        if a.border == "ignore":
            k = _select(_all(inside), k, tirx.const(0, "int64"))
        return te.max(k + (low - 1 - _flat_tap(taps, a.size)).astype("int64"), axis=axes)

    best = te.compute(out, key, name="argmax_pool_key")
    return te.compute(out, lambda *i: (low - 1 - (best(*i) & (low - 1))).astype("int32"),
                      name="argmax_pool")


def _sample_lower(xs, a):
    from cvmc.ops.te import shape_of, te, tirx

    x, index = xs
    out, dims = _geometry("sample", a, [shape_of(x), shape_of(index)], a.size, box_shape,
                          False, 0)
    strides = _row_major(a.size)

    def body(*i):
        flat = _clamp(index(*i), 0, math.prod(a.size) - 1)
        taps = [tirx.floormod(tirx.floordiv(flat, s), d.f) for s, d in zip(strides, dims)]
        loads, _, inside = _te_positions(dims, i, taps, a.border, False)
        return _select(_all(inside), x(*loads), _f32(_outside_value(a.border))) \
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
                                                       zip(e, reach)]), _f32(fill))

    return te.compute([hi - lo + 1 for lo, hi in reach], element, name="max_window_pad",
                      attrs={MATERIALIZE: 1})


def _max_window_lower(xs, a):
    """A max over the window taps in row-major order: a tap replaces the running value
    when it is larger or a NaN (the first NaN stays), so ties keep the first tap and a
    NaN wins, as argmax_pool's index picks; 'ignore' reads -inf outside, which never wins
    (a window with no input element gives -inf, as sample reads there)."""
    from cvmc.ops.te import shape_of, te, tirx

    (x,) = xs
    out, dims = _geometry("max_window", a, [shape_of(x)], a.size, box_shape, False, 0)
    taps, axes = _reduce_axes(dims, "rk")
    outside = _outside_value(a.border)
    padded = _extended_stage(x, dims, outside) if a.border in ("constant", "ignore") else None

    def tap(i):
        if padded is not None:  # position i * s + j * d - p, stored at + p
            return padded(*[k * dim.s + j * dim.d for k, j, dim in zip(i, taps, dims)])
        loads, _, inside = _te_positions(dims, i, taps, a.border, False)
        return _select(_all(inside), x(*loads), _f32(outside))

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
    out, dims = _geometry("desample", a, [shape_of(x), shape_of(index)], a.size,
                          desample_shape, True, 0)
    taps, axes = _reduce_axes(dims, "rk")

    def body(*i):
        loads, hit, inside = _te_positions(dims, i, taps, "constant", True)
        take = _all([*hit, *inside, index(*loads) == _flat_tap(taps, a.size)])
        value = _select(take, x(*loads), _f32(0.0))
        return te.sum(value, axis=axes) if axes else value

    return te.compute(out, body, name="desample")


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
        term = weight * _read(x, [*lead, *loads], inside, border)
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
            d = _f32(float(den))
            # both weights correctly rounded: (den - num) / den, not 1 - u
            corners.append((j, (den - num).astype("float32") / d, num.astype("float32") / d, n))
        return _te_interpolate(x, [b, c], corners, a.border)

    return te.compute(out, body, name="multilinear_upsample")


def te_round_coordinate(v):
    """`np_round_coordinate` in TE: floor(v + 0.5) in float64, clamped; NaN gives 0."""
    from cvmc.ops.te import tirx

    wide = _clamp(v.astype("float64"), -COORD_LIMIT, COORD_LIMIT)
    r = tirx.floor(wide + tirx.const(0.5, "float64"))
    return tirx.Select(tirx.isnan(v), tirx.const(0, "int32"), r.astype("int32"))


def _batch(batch_index, n, batches: int):
    """The clamped batch index of RoI n ([N] or [N, 1] tensor)."""
    from cvmc.ops.te import shape_of

    read = batch_index(n) if len(shape_of(batch_index)) == 1 else batch_index(n, 0)
    return _clamp(read, 0, batches - 1)


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
            in_cell = _all([tirx.all(r >= lo, r < lo + e) for r, (lo, e) in zip(axes, bounds)])
            value = x(_batch(batch_index, n, shape[0]), c, *axes)
            if kind == "avg":
                return te.sum(_select(in_cell, value, _f32(0.0)), axis=axes)
            # key 0: no input position in the cell, 2^33: NaN, else 1 + the ordered value
            key = tirx.Select(tirx.isnan(value), tirx.const(2**33, "int64"),
                              _ordered(value) + 1)
            return te.max(_select(in_cell, key, tirx.const(0, "int64")), axis=axes)

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
                return tirx.Select(empty, _f32(0.0), total / volume)
            value = tirx.Select(total == 0, _f32(-np.inf), tirx.Select(
                total == 2**33, _f32(np.nan), _unordered(total - 1)))
            outside = tirx.any(*[tirx.Or(lo < 0, lo + e > extent)
                                 for (lo, e), extent in zip(bounds, shape[2:])])
            # a zero takes part: the max is 0 unless value is NaN or above 0 (0 beats -0)
            with_zero = tirx.Select(tirx.Or(tirx.isnan(value), value > _f32(0.0)), value,
                                    _f32(0.0))
            return tirx.Select(empty, _f32(0.0), tirx.Select(outside, with_zero, value))

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
            clamped = _clamp(pos, -1, extent)
            floor = tirx.Select(nan, tirx.const(0.0, "float64"), tirx.floor(clamped))
            u = tirx.Select(nan, pos, clamped - floor)
            corners.append((floor.astype("int32"), (tirx.const(1.0, "float64") - u)
                            .astype("float32"), u.astype("float32"), extent))
        return _te_interpolate(x, [_batch(batch_index, n, shape[0]), c], corners, "replicate")

    return te.compute(out, body, name="roi_resample")


# ---- registration -----------------------------------------------------------------------
def _index_precision(ins, a) -> int:
    """argmax_pool's index lies in [0, window volume): the bits of volume - 1, plus sign."""
    volume = math.prod(a.size)
    require(volume <= 2**INDEX_BITS, f"argmax_pool: a window of {volume} taps is more than "
                                     f"cvmc supports (2^{INDEX_BITS})")
    return (volume - 1).bit_length() + 1


# Operations per output element: the reference interpreter bounds a node's work by them.
for _name in ("box", "debox", "argmax_pool", "sample", "desample", "nnef.max_window"):
    lookup(_name).cost(lambda ins, outs, a: math.prod(a.size))  # window taps
# GOPS: 2 per multiply-add, output elements x C/G x taps (a deconv: its input elements);
# windows one comparison or addition per tap (debox: each input element into each output of
# its window); multilinear a multiply-add per corner; RoI cells as large as the rois'
# values make them: one per output element; sample and desample only select values.
lookup("conv").arith(lambda ins, outs, a: mac_ops(outs[0].size, math.prod(ins[1].shape[1:])))
lookup("deconv").arith(lambda ins, outs, a: mac_ops(ins[0].size, math.prod(ins[1].shape[1:])))
for _name in ("box", "argmax_pool", "nnef.max_window"):
    lookup(_name).arith(lambda ins, outs, a: outs[0].size * math.prod(a.size))
lookup("debox").arith(lambda ins, outs, a: ins[0].size * math.prod(a.size))
lookup("multilinear_upsample").arith(
    lambda ins, outs, a: mac_ops(outs[0].size, 2 ** len(a.factor)))
for _name in ("avg_roi_pool", "max_roi_pool", "roi_resample"):
    lookup(_name).arith(arith_per_output)
for _name in ("sample", "desample"):
    lookup(_name).arith(no_arith)
for _reverse, _name in ((False, "conv"), (True, "deconv")):
    lookup(_name).cost(lambda ins, outs, a: math.prod(ins[1].shape[1:]))  # C/G x taps
    lookup(_name).reference(conv_reference(_name, _reverse))
    lookup(_name).lower(_conv_lower(_name, _reverse))
for _reverse, _name in ((False, "box"), (True, "debox")):
    lookup(_name).reference(_box_reference(_name, _reverse))
    lookup(_name).lower(_box_lower(_name, _reverse))
lookup("argmax_pool").reference(_argmax_pool_reference)
lookup("argmax_pool").lower(_argmax_pool_lower)
lookup("argmax_pool").precision(_index_precision)
lookup("sample").reference(_sample_reference)
lookup("sample").lower(_sample_lower)
lookup("nnef.max_window").reference(_max_window_reference)
lookup("nnef.max_window").lower(_max_window_lower)
lookup("desample").reference(_desample_reference)
lookup("desample").lower(_desample_lower)
lookup("multilinear_upsample").reference(_upsample_reference)
lookup("multilinear_upsample").lower(_upsample_lower)
for _kind in ("avg", "max"):
    lookup(f"{_kind}_roi_pool").reference(_roi_pool_reference(_kind))
    lookup(f"{_kind}_roi_pool").lower(_roi_pool_lower(_kind))
lookup("roi_resample").reference(_roi_resample_reference)
lookup("roi_resample").lower(_roi_resample_lower)

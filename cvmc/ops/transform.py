"""CVM transform operators: repeat, tile, flatten, transpose, slice, slice_like,
expand_dims, reshape, squeeze (take, cvm_lut, concatenate, where: `transform_gather`).

Spec: ../shared/spec/cvm-operators-formal.txt, "Transform Operators" (and the v2 file);
readings where the spec is silent or contradicts itself: ../shared/design/cvm-semantics.md
and the notes at each entry. Attribute names and defaults follow CVM-Runtime's parameter
structs where the spec gives none (concatenate axis 1, repeat axis 0, num_newaxis 1).

Most of these ops are gathers `Y[d] = X[f(d)]` with a static index map `f`; one map per op
serves both the NumPy reference (on sparse index grids) and the TE lowering (on loop vars),
because `//`, `%`, `+` and `*` mean the same on both for the non-negative indices used here.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from cvmc.ir.graph import TensorType
from cvmc.ops.common import DATA_INTERVAL, data_interval, normalize_axis, require
from cvmc.ops.registry import MAX_ATTR, Attr, Fusion, OpDef, op

MAX_RANK = 6  # CVM-Runtime's limits on every tensor (cvm-semantics.md)
MAX_DIM = 2**24
MAX_VOLUME = 2**30

IndexMap = Callable[[Sequence], tuple]


# ---- helpers shared by several entries -------------------------------------------------
def limited_shape(name: str, shape: Sequence[int]) -> tuple[int, ...]:
    """`shape` as a tuple, checked against CVM-Runtime's tensor limits."""
    shape = tuple(int(d) for d in shape)
    require(1 <= len(shape) <= MAX_RANK,
            f"{name}: output would have rank {len(shape)} {shape}, expected 1..{MAX_RANK}")
    require(all(1 <= d <= MAX_DIM for d in shape),
            f"{name}: output shape {shape} has a dimension outside 1..{MAX_DIM}")
    volume = int(np.prod(shape, dtype=np.int64))
    require(volume <= MAX_VOLUME,
            f"{name}: output shape {shape} has {volume} elements, more than {MAX_VOLUME}")
    return shape


def input_precision(ins, a):
    """The precision rule of an op that only moves values: its first input's (p_x)."""
    return ins[0].precision


def types_of(xs) -> list[TensorType]:
    """Input types (shapes only) of TE tensors or arrays, to rerun a shape rule."""
    return [TensorType(tuple(int(d) for d in x.shape)) for x in xs]


def _np_gather(x: np.ndarray, out_shape: tuple[int, ...], index_map: IndexMap) -> np.ndarray:
    """Y[d] = X[index_map(d)] for every output index d, vectorised over sparse index grids."""
    grids = np.indices(out_shape, sparse=True)
    return np.broadcast_to(x[tuple(index_map(grids))], out_shape).copy()


def te_gather(x, out_shape: tuple[int, ...], index_map: IndexMap, name: str):
    """TE stage Y[d] = X[index_map(d)]."""
    from cvmc.ops.te import te
    return te.compute(out_shape, lambda *d: x(*index_map(d)), name=name)


def gather_rules(d: OpDef, make_map: Callable[[list[TensorType], tuple, object], IndexMap]):
    """Attach reference and lower rules computing Y[d] = data[make_map(ins, out, a)(d)]."""
    def reference(xs, a):
        ins = types_of(xs)
        out = d.rules["shape"](ins, a)
        return _np_gather(xs[0], out, make_map(ins, out, a))

    def lower(xs, a):
        ins = types_of(xs)
        out = d.rules["shape"](ins, a)
        return te_gather(xs[0], out, make_map(ins, out, a), d.name)

    d.reference(reference)
    d.lower(lower)


def ravel(index: Sequence, shape: Sequence[int]):
    """Row-major flat position of `index` in `shape` (the spec's flatten_index)."""
    flat = index[0]
    for i, n in zip(index[1:], shape[1:]):
        flat = flat * n + i
    return flat


def unravel(flat, shape: Sequence[int]) -> tuple:
    """The index in `shape` whose row-major flat position is `flat` (< volume of shape)."""
    index = []
    for n in reversed(shape[1:]):
        index.append(flat % n)
        flat = flat // n
    return (flat, *reversed(index))


def te_clamp_int(v, lo: int, hi: int):
    """TE expression clamping `v` to [lo, hi]."""
    from cvmc.ops.te import const, tirx
    return tirx.max(tirx.min(v, const(hi)), const(lo))


# ---- reshape-like ops: flatten, reshape, expand_dims, squeeze ------------------------------
# All four keep the row-major element order (the spec defines each through flatten_index
# or by inserting / dropping unit axes), so one reference and one lowering serve them.
def reshape_like(d: OpDef) -> None:
    """Attach the reference and lower rules of an op whose output is a row-major reshape."""
    def reference(xs, a):
        return xs[0].reshape(d.rules["shape"](types_of(xs), a))

    def lower(xs, a):
        in_shape = types_of(xs)[0].shape
        out = d.rules["shape"](types_of(xs), a)
        return te_gather(xs[0], out, lambda i: unravel(ravel(i, out), in_shape), d.name)

    d.reference(reference)
    d.lower(lower)


flatten = op("flatten", family="transform", inputs=("data",), fusion=Fusion.INJECTIVE,
             precision_rule="p_x", interval_rule=DATA_INTERVAL)
flatten.interval(data_interval)
flatten.precision(input_precision)


@flatten.shape
def _flatten_shape(ins, a):
    # The spec only orders the elements; CVM-Runtime's shape is 2-D (cvm-semantics.md).
    shape = ins[0].shape
    return limited_shape("flatten", (shape[0], int(np.prod(shape[1:], dtype=np.int64))))


reshape_like(flatten)

reshape = op("reshape", family="transform", inputs=("data",), fusion=Fusion.INJECTIVE,
             precision_rule="p_x", interval_rule=DATA_INTERVAL,
             attrs=(Attr("target_shape", "ints", aliases=("shape",), cvm_name="shape"),))
reshape.interval(data_interval)
reshape.precision(input_precision)


@reshape.shape
def _reshape_shape(ins, a):
    # The spec demands an explicit shape of equal volume; CVM-Runtime's special values
    # (0 copy, -1 infer, -2/-3/-4) are not part of it, so they are rejected here.
    target, shape = a.target_shape, ins[0].shape
    require(len(target) >= 1, "reshape: attribute 'target_shape' must not be empty")
    bad = next((m for m in target if m < 1), None)
    require(bad is None, f"reshape: attribute 'target_shape' entries must be >= 1, got {bad} "
                         f"in {list(target)} (the CVM spec has no inferred (-1) or copied "
                         f"(0) dimensions: give the full shape)")
    volume, target_volume = ins[0].size, int(np.prod(target, dtype=np.int64))
    require(target_volume == volume,
            f"reshape: attribute 'target_shape' {list(target)} has {target_volume} elements, "
            f"expected {volume} (the volume of data shape {shape})")
    return limited_shape("reshape", target)


reshape_like(reshape)

expand_dims = op("expand_dims", family="transform", inputs=("data",),
                 fusion=Fusion.INJECTIVE, precision_rule="p_x", interval_rule=DATA_INTERVAL,
                 attrs=(Attr("axis", "int"),
                        Attr("num_newaxis", "int", 1, lo=0, hi=MAX_ATTR - 1)))
expand_dims.interval(data_interval)
expand_dims.precision(input_precision)


@expand_dims.shape
def _expand_dims_shape(ins, a):
    # The formula adds N to a negative axis, the note N + 1; take N + 1 as CVM-Runtime
    # does, so that axis -1 appends at the end (cvm-semantics.md).
    shape, n = ins[0].shape, ins[0].ndim
    require(-n - 1 <= a.axis <= n, f"expand_dims: attribute 'axis' {a.axis} is out of range "
                                   f"for a rank-{n} tensor (expected {-n - 1}..{n})")
    axis = a.axis + n + 1 if a.axis < 0 else a.axis
    return limited_shape("expand_dims", (*shape[:axis], *(1,) * a.num_newaxis, *shape[axis:]))


reshape_like(expand_dims)

squeeze = op("squeeze", family="transform", inputs=("data",), fusion=Fusion.INJECTIVE,
             precision_rule="p_x", interval_rule=DATA_INTERVAL,
             attrs=(Attr("axes", "ints", (), scalar_ok=True, aliases=("axis",),
                         cvm_name="axis"),))
squeeze.interval(data_interval)
squeeze.precision(input_precision)


@squeeze.shape
def _squeeze_shape(ins, a):
    shape, n = ins[0].shape, ins[0].ndim
    if a.axes:
        axes = {normalize_axis("squeeze", "attribute 'axes' entry", ax, n) for ax in a.axes}
        for ax in sorted(axes):
            require(shape[ax] == 1, f"squeeze: axis {ax} has length {shape[ax]}, expected 1 "
                                    f"(data shape {shape})")
    else:
        axes = {ax for ax in range(n) if shape[ax] == 1}
    kept = tuple(m for ax, m in enumerate(shape) if ax not in axes)
    # Squeezing every axis leaves shape (1,) as in CVM-Runtime: tensors have rank >= 1.
    return limited_shape("squeeze", kept or (1,))


reshape_like(squeeze)


# ---- repeat ----------------------------------------------------------------------------
repeat = op("repeat", family="transform", inputs=("data",), fusion=Fusion.INJECTIVE,
            precision_rule="p_x", interval_rule=DATA_INTERVAL,
            attrs=(Attr("axis", "int", 0), Attr("repeats", "int", lo=1, hi=MAX_ATTR)))
repeat.interval(data_interval)
repeat.precision(input_precision)


def _repeat_axis(ins, a) -> int:
    # The spec says axis in [0, N); a negative axis counting from the end is accepted too.
    return normalize_axis("repeat", "attribute 'axis'", a.axis, ins[0].ndim)


@repeat.shape
def _repeat_shape(ins, a):
    shape, axis = list(ins[0].shape), _repeat_axis(ins, a)
    shape[axis] *= a.repeats
    return limited_shape("repeat", shape)


def _repeat_map(ins, out, a) -> IndexMap:
    axis, r = _repeat_axis(ins, a), a.repeats
    return lambda d: (*d[:axis], d[axis] // r, *d[axis + 1:])


gather_rules(repeat, _repeat_map)


# ---- tile ------------------------------------------------------------------------------
tile = op("tile", family="transform", inputs=("data",), fusion=Fusion.INJECTIVE,
          precision_rule="p_x", interval_rule=DATA_INTERVAL,
          attrs=(Attr("reps", "ints", lo=1, hi=MAX_ATTR - 1),))
tile.interval(data_interval)
tile.precision(input_precision)


@tile.shape
def _tile_shape(ins, a):
    shape, reps = ins[0].shape, a.reps
    require(len(reps) >= 1, "tile: attribute 'reps' must not be empty")
    k = max(len(shape), len(reps))
    sx = (1,) * (k - len(shape)) + shape
    sr = (1,) * (k - len(reps)) + reps
    return limited_shape("tile", [n * m for n, m in zip(sx, sr)])


def _tile_map(ins, out, a) -> IndexMap:
    shape = ins[0].shape
    offset = len(out) - len(shape)
    return lambda d: tuple(d[offset + j] % n for j, n in enumerate(shape))


gather_rules(tile, _tile_map)


# ---- transpose -------------------------------------------------------------------------
transpose = op("transpose", family="transform", inputs=("data",), fusion=Fusion.INJECTIVE,
               precision_rule="p_x", interval_rule=DATA_INTERVAL, attrs=(Attr("axes", "ints", ()),))
transpose.interval(data_interval)
transpose.precision(input_precision)


def _transpose_axes(ins, a) -> tuple[int, ...]:
    """real_axes: the permutation, negatives resolved; empty axes reverse the dimensions."""
    n = ins[0].ndim
    if not a.axes:
        return tuple(reversed(range(n)))
    require(len(a.axes) == n, f"transpose: attribute 'axes' {list(a.axes)} has {len(a.axes)} "
                              f"entries, expected 0 or {n} (the data rank)")
    real = tuple(normalize_axis("transpose", "attribute 'axes' entry", ax, n) for ax in a.axes)
    require(sorted(real) == list(range(n)), f"transpose: attribute 'axes' {list(a.axes)} is "
                                            f"not a permutation of 0..{n - 1}")
    return real


@transpose.shape
def _transpose_shape(ins, a):
    return tuple(ins[0].shape[ax] for ax in _transpose_axes(ins, a))


def _transpose_map(ins, out, a) -> IndexMap:
    # Y[d] = X[s] with s[real_axes[j]] = d[j]: read s through the inverse permutation.
    inverse = np.argsort(_transpose_axes(ins, a)).tolist()
    return lambda d: tuple(d[j] for j in inverse)


gather_rules(transpose, _transpose_map)


# ---- slice (strided_slice) -------------------------------------------------------------
slice_op = op("slice", family="transform", inputs=("data",), aliases=("strided_slice",),
              cvm_name="strided_slice", fusion=Fusion.INJECTIVE, precision_rule="p_x",
              interval_rule=DATA_INTERVAL,
              attrs=(Attr("begin", "ints"), Attr("end", "ints"),
                     Attr("strides", "ints", (), aliases=("stride",), cvm_name="stride")))
slice_op.interval(data_interval)
slice_op.precision(input_precision)


def _slice_axis(ax: int, n: int, a) -> tuple[int, int, int]:
    """(begin, stride, length) of one axis after NumPy-style resolution and clamping.

    The spec clips begin and end to e_range - 1, which would drop the last element even for
    the default end; CVM-Runtime (and NumPy) clamp to [0, n] for a positive stride and to
    [-1, n - 1] for a negative one, which this follows (cvm-semantics.md). For a negative
    stride a missing begin / end means the last element / before the first, as in NumPy
    `x[::-1]`; the spec's defaults (0, n) would make every such slice empty.
    """
    stride = a.strides[ax] if ax < len(a.strides) else 1
    require(stride != 0, f"slice: attribute 'strides' entry {ax} must be non-zero, got 0")
    lo, hi = (0, n) if stride > 0 else (-1, n - 1)
    bounds = []
    for values, default in ((a.begin, 0 if stride > 0 else n - 1),
                            (a.end, n if stride > 0 else -1)):
        v = values[ax] if ax < len(values) else None
        v = default if v is None else v + n if v < 0 else v
        bounds.append(min(max(v, lo), hi))
    begin, end = bounds
    length = -((begin - end) // stride)  # ceil((end - begin) / stride)
    require(length >= 1, f"slice: axis {ax} (length {n}) is empty: begin {begin}, end {end}, "
                         f"stride {stride} after clamping; empty results are not allowed")
    return begin, stride, length


def _slice_axes(ins, a) -> list[tuple[int, int, int]]:
    shape = ins[0].shape
    for name in ("begin", "end", "strides"):
        require(len(a[name]) <= len(shape), f"slice: attribute '{name}' {list(a[name])} has "
                                            f"{len(a[name])} entries, more than the data rank "
                                            f"{len(shape)}")
    return [_slice_axis(ax, n, a) for ax, n in enumerate(shape)]


@slice_op.shape
def _slice_shape(ins, a):
    return tuple(length for _, _, length in _slice_axes(ins, a))


def _slice_map(ins, out, a) -> IndexMap:
    axes = _slice_axes(ins, a)
    return lambda d: tuple(b + s * i for (b, s, _), i in zip(axes, d))


gather_rules(slice_op, _slice_map)


# ---- slice_like ------------------------------------------------------------------------
slice_like = op("slice_like", family="transform", inputs=("data", "shape_like"),
                fusion=Fusion.INJECTIVE, precision_rule="p_x (the data input)",
                interval_rule=DATA_INTERVAL,
                attrs=(Attr("axes", "ints", (), scalar_ok=True, aliases=("axis",),
                            cvm_name="axis"),))
slice_like.interval(data_interval)
slice_like.precision(input_precision)


@slice_like.shape
def _slice_like_shape(ins, a):
    x, like = ins
    if a.axes:
        axes = {normalize_axis("slice_like", "attribute 'axes' entry", ax, x.ndim)
                for ax in a.axes}
    else:
        require(like.ndim == x.ndim, f"slice_like: shape_like has rank {like.ndim}, expected "
                                     f"{x.ndim} (the data rank) when 'axes' is empty")
        axes = set(range(x.ndim))
    shape = list(x.shape)
    for ax in sorted(axes):
        require(ax < like.ndim, f"slice_like: axis {ax} is out of range for shape_like of "
                                f"rank {like.ndim}")
        require(like.shape[ax] <= x.shape[ax],
                f"slice_like: shape_like has length {like.shape[ax]} on axis {ax}, expected "
                f"at most {x.shape[ax]} (the data length)")
        shape[ax] = like.shape[ax]
    return tuple(shape)


gather_rules(slice_like, lambda ins, out, a: lambda d: tuple(d))  # Y[d] = X[d]

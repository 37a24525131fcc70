"""NNEF's reduce (spec 4.4), tensor shape (4.5), matmul and variable-update primitives:
their entries (declarations, reference and lower rules). Shape rules and argument checks
are in `nnef_std`; reshape, squeeze and unsqueeze take their rules from the CVM ops'
(`transform.reshape_like`).

The generic ones (`reshape`, `transpose`, `concat`, `split`, `stack`, `unstack`, `slice`,
`squeeze`, `unsqueeze`, `tile`, `gather`, `update`) only move values: they compute on
scalar, logical and CVM integer tensors alike, bit-exactly.

Decisions where the spec is silent (also in the README):
- argmax_reduce / argmin_reduce over several axes give the row-major flat index within
  the reduced axes; ties take the lowest index; NaN counts as the largest value for
  argmax and the smallest for argmin, so the first NaN wins (as np.argmax / np.argmin).
- max_reduce / min_reduce propagate NaN (as np.max / np.min).
- gather: a negative index counts from the end (as NumPy and ONNX); an index outside
  [-extent, extent) reads the nearest edge (a kernel cannot raise; it never reads outside
  the input).
- update(variable, value) computes the new value of the variable: its result is `value`.
  (cvmc's artifacts are stateless: the variable itself is not written back.)

Accuracy (u = 2^-24): sum_reduce and matmul sum K terms in float32 in a fixed order (one
thread per output element): |compiled - reference| <= gamma(K + 2) * sum(|terms|), gamma(n)
= n u / (1 - n u), K the reduction length (+1 for normalize's division); every other op
here is bit-exact.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np

from cvmc.ops.common import arith_per_input, mac_ops, no_arith
from cvmc.ops.nnef_std import (
    BORDERS,
    concat_shape,
    declare,
    gather_shape,
    ints_attr,
    matmul_shape,
    pad_shape,
    reduce_shape,
    reshape_shape,
    slice_shape,
    slice_starts,
    split_shape,
    squeeze_shape,
    stack_shape,
    tile_shape,
    transpose_shape,
    unsqueeze_shape,
    unstack_shape,
    update_shape,
)
from cvmc.ops.reduce import te_reduce
from cvmc.ops.registry import Attr, Fusion, lookup
from cvmc.ops.transform import ravel, reshape_like, te_gather, types_of
from cvmc.ops.transform_gather import te_concat

# ---- the entries' declarations (their shape rules: nnef_std) ----------------------------
declare("update", update_shape, ("variable", "value"), "?, ? -> ?", outputs=("result",))

_AXES = Attr("axes", "ints")
declare("sum_reduce", reduce_shape, ("input",), "scalar -> scalar",
        (_AXES, Attr("normalize", "bool", False)))
for _name, _types in (("max_reduce", "scalar -> scalar"), ("min_reduce", "scalar -> scalar"),
                      ("any_reduce", "logical -> logical"), ("all_reduce", "logical -> logical")):
    declare(_name, reduce_shape, ("input",), _types, (_AXES,))
for _name in ("argmax_reduce", "argmin_reduce"):
    declare(_name, reduce_shape, ("input",), "scalar -> integer", (_AXES,),
            precision_rule="max(bitlen(count - 1) + 1, 9): an index into the reduced axes, "
                           "stored as int32")

declare("matmul", matmul_shape, ("A", "B"), "scalar, scalar -> scalar",
        (Attr("transposeA", "bool", False), Attr("transposeB", "bool", False)), ("C",),
        # its kernel takes the element-wise epilogue (bias, activation) under its tile
        fusion=Fusion.OUT_ELEMWISE, multiply_add=True)

declare("nnef.reshape", reshape_shape, ("input",), "? -> ?",
        (ints_attr("shape"), Attr("axis_start", "int", 0, lo=0),
         Attr("axis_count", "int", -1, lo=-1)))

declare("unsqueeze", unsqueeze_shape, ("input",), "? -> ?", (_AXES,))
# The CVM squeeze / transpose read empty axes as "all unit dims" / "reverse" and reject a
# partial permutation; NNEF reads [] as no change and permutes only the leading axes.
declare("nnef.squeeze", squeeze_shape, ("input",), "? -> ?", (_AXES,))
declare("nnef.transpose", transpose_shape, ("input",), "? -> ?", (_AXES,))

_AXIS = Attr("axis", "int")
declare("concat", concat_shape, ("*values",), "?[] -> ?", (_AXIS,), ("value",))
declare("split", split_shape, ("value",), "? -> ?", (_AXIS, ints_attr("ratios", lo=1)),
        ("*values",))
declare("stack", stack_shape, ("*values",), "?[] -> ?", (_AXIS,), ("value",))
declare("unstack", unstack_shape, ("value",), "? -> ?", (_AXIS,), ("*values",))

declare("nnef.slice", slice_shape, ("input",), "? -> ?",
        (ints_attr("axes"), ints_attr("begin"), ints_attr("end"), ints_attr("stride", ())))

declare("pad", pad_shape, ("input",), "scalar -> scalar",
        (Attr("padding", "int_pairs"), Attr("border", "str", "constant", choices=BORDERS),
         Attr("value", "scalar", 0.0)))
declare("nnef.tile", tile_shape, ("input",), "? -> ?", (ints_attr("repeats", lo=1),))
declare("gather", gather_shape, ("input", "indices"), "?, integer -> ?", (Attr("axis", "int", 0),))

# GOPS: a reduction one operation per input element, matmul 2 per multiply-add (output
# elements x K); the others select, gather, copy or reshape values.
for _name in ("sum_reduce", "max_reduce", "min_reduce", "argmax_reduce", "argmin_reduce",
              "all_reduce", "any_reduce"):
    lookup(_name).arith(arith_per_input(1))
lookup("matmul").arith(lambda ins, outs, a: mac_ops(
    outs[0].size, ins[0].shape[-2 if a.transposeA else -1]))
for _name in ("concat", "split", "stack", "unstack", "gather", "pad", "update", "unsqueeze",
              "nnef.reshape", "nnef.slice", "nnef.squeeze", "nnef.tile", "nnef.transpose"):
    lookup(_name).arith(no_arith)


# ---- reductions ----------------------------------------------------------------------
def _reduce_axes(shape: Sequence[int], axes: Sequence[int]):
    """(reduce itervars, a function giving the input index for an output index): argmax
    needs the itervars themselves (for the flat index), which `te_reduce` keeps inside."""
    from cvmc.ops.te import te
    rs = {k: te.reduce_axis((0, shape[k]), name=f"r{k}") for k in sorted(axes)}
    return list(rs.values()), lambda o: [rs[k] if k in rs else o[k] for k in range(len(shape))]


def _reduce_te(kind: str):
    def lower(xs, a):
        from cvmc.ops.te import shape_of, te, tirx
        x, r = xs[0], tuple(sorted(a.axes))
        if kind == "sum":
            y = te_reduce(x, r, True, te.sum, "sum_reduce_")
            if not a.normalize:
                return y
            volume = tirx.const(float(math.prod(shape_of(x)[k] for k in r)), "float32")
            return te.compute(y.shape, lambda *o: y(*o) / volume, name="mean_reduce_")
        if kind in ("any", "all"):
            reducer = te.comm_reducer(
                (lambda p, q: tirx.Or(p, q)) if kind == "any" else (lambda p, q: tirx.And(p, q)),
                lambda t: tirx.const(kind == "all", "bool"))
            return te_reduce(x, r, True, reducer, f"{kind}_reduce_")
        # IEEE 754-2019 maximum / minimum, propagating NaN: a NaN element wins, and once
        # the accumulator is NaN no comparison is true, so it stays (the identity is -inf /
        # +inf); of equal zeros +0 is the larger. A total order: any combining order (a
        # GPU's reduction tree too) gives the same bits.
        def negative(f):
            return tirx.reinterpret("int32", f) < 0

        def better(v, acc):
            larger = v > acc if kind == "max" else v < acc
            zeros = negative(acc) if kind == "max" else negative(v)
            return tirx.Or(larger, tirx.And(v == acc, tirx.And(
                zeros, tirx.Not(negative(v) if kind == "max" else negative(acc)))))

        reducer = te.comm_reducer(
            lambda acc, v: tirx.Select(tirx.Or(tirx.isnan(v), better(v, acc)), v, acc),
            lambda t: tirx.const(-math.inf if kind == "max" else math.inf, t))
        return te_reduce(x, r, True, reducer, f"{kind}_reduce_")
    return lower


def _arg_te(kind: str):
    def lower(xs, a):
        from cvmc.ops.te import shape_of, te, tirx
        x = xs[0]
        shape = shape_of(x)
        best = _reduce_te(kind)(xs, a)  # NaN-propagating max / min: the value to find
        rs, at = _reduce_axes(shape, a.axes)
        extents = [shape[k] for k in sorted(a.axes)]

        def first_index(*o):
            # the lowest flat index holding the best value (a NaN matches a NaN): ties and
            # NaN resolve as np.argmax / np.argmin do, in any reduction order
            v, b = x(*at(o)), best(*o)
            match = tirx.Or(v == b, tirx.And(tirx.isnan(v), tirx.isnan(b)))
            return te.min(tirx.Select(match, ravel(rs, extents), tirx.const(2**31 - 1)),
                          axis=rs)
        return te.compute(best.shape, first_index, name=f"arg{kind}_reduce_")
    return lower


def _arg_reference(fn: Callable):
    def ref(xs, a):
        x, axes = xs[0], list(a.axes)
        rest = [k for k in range(x.ndim) if k not in axes]
        moved = np.transpose(x, rest + axes)
        flat = moved.reshape(moved.shape[:len(rest)] + (-1,))
        idx = fn(flat, axis=-1)
        return np.expand_dims(idx, tuple(axes)) if axes else idx
    return ref


def _arg_precision(ins, a):
    """Indices 0..count-1 need bitlen(count - 1) + 1 bits; at least 9, so the index is
    stored as int32: a CUDA kernel's index reduction then writes the output itself (an
    int8 cast after it would leave the reduction's result in a global workspace, which
    CUDA kernels cannot allocate)."""
    count = math.prod(ins[0].shape[k] for k in a.axes)
    return max(max(count - 1, 1).bit_length() + 1, 9)


for _kind in ("sum", "max", "min", "any", "all"):
    _d = lookup(f"{_kind}_reduce")
    _d.lower(_reduce_te(_kind))
for _kind, _fn in {"any": np.any, "all": np.all}.items():
    lookup(f"{_kind}_reduce").reference(
        lambda xs, a, fn=_fn: fn(xs[0], axis=tuple(a.axes), keepdims=True))


def _extreme_reference(larger: bool):
    """max / min_reduce: NaN if any element is NaN (np.max), and a zero result is +0 for
    max if some element is +0, -0 for min if some element is -0 (IEEE 754-2019 maximum /
    minimum: -0 < +0; NumPy leaves the sign of equal zeros open)."""
    def reference(xs, a):
        x, axes = xs[0], tuple(a.axes)
        best = (np.max if larger else np.min)(x, axis=axes, keepdims=True)
        signed = np.any((x == 0) & (np.signbit(x) != larger), axis=axes, keepdims=True)
        return np.where(best == 0, np.where(signed == larger, 0.0, -0.0), best)
    return reference


lookup("max_reduce").reference(_extreme_reference(True))
lookup("min_reduce").reference(_extreme_reference(False))
lookup("sum_reduce").reference(
    lambda xs, a: np.sum(xs[0], axis=tuple(a.axes), keepdims=True)
    / (math.prod(xs[0].shape[k] for k in a.axes) if a.normalize else 1))
for _kind, _fn in (("max", np.argmax), ("min", np.argmin)):
    _d = lookup(f"arg{_kind}_reduce")
    _d.reference(_arg_reference(_fn))
    _d.lower(_arg_te(_kind))
    _d.precision(_arg_precision)


# ---- matmul --------------------------------------------------------------------------
@lookup("matmul").reference
def _matmul_reference(xs, a):
    A, B = xs
    A = np.swapaxes(A, -1, -2) if a.transposeA else A
    B = np.swapaxes(B, -1, -2) if a.transposeB else B
    return np.matmul(A, B)


@lookup("matmul").lower
def _matmul_lower(xs, a):
    from cvmc.ops.te import shape_of, te
    A, B = xs
    sa, sb = shape_of(A), shape_of(B)
    k_extent = sa[-2] if a.transposeA else sa[-1]
    m, n = (sa[-1] if a.transposeA else sa[-2]), (sb[-2] if a.transposeB else sb[-1])
    batch = [max(p, q) for p, q in zip(sa[:-2], sb[:-2])]
    k = te.reduce_axis((0, k_extent), name="k")

    def at(t, shape, bidx, row, col):
        b = [0 if e == 1 else i for e, i in zip(shape[:-2], bidx)]
        return t(*b, row, col)

    def element(*o):
        *b, i, j = o
        lhs = at(A, sa, b, k, i) if a.transposeA else at(A, sa, b, i, k)
        rhs = at(B, sb, b, j, k) if a.transposeB else at(B, sb, b, k, j)
        return te.sum(lhs * rhs, axis=k)
    return te.compute((*batch, m, n), element, name="matmul_")


# ---- shape operations ----------------------------------------------------------------
def _attach(name: str, ref: Callable, lower: Callable) -> None:
    """The reference and lower rules of `name`."""
    d = lookup(name)
    d.reference(ref)
    d.lower(lower)


def _out_shapes(name: str, xs, a) -> list[tuple[int, ...]]:
    """Output shapes of op `name` on inputs `xs` (arrays or TE tensors): its shape rule."""
    return lookup(name).infer_shapes(types_of(xs), a)


for _name in ("nnef.reshape", "nnef.squeeze", "unsqueeze"):
    reshape_like(lookup(_name))


def _transpose_perm(a, rank: int) -> list[int]:
    """Output dim k reads input dim perm[k] (NNEF permutes the leading len(axes) dims)."""
    return [*a.axes, *range(len(a.axes), rank)]


def _transpose_lower(xs, a):
    from cvmc.ops.te import shape_of
    x = xs[0]
    shape = shape_of(x)
    perm = _transpose_perm(a, len(shape))
    out = [shape[p] for p in perm]
    inverse = [perm.index(k) for k in range(len(shape))]
    return te_gather(x, tuple(out), lambda o: [o[inverse[k]] for k in range(len(shape))],
                     "transpose_")


_attach("nnef.transpose",
        lambda xs, a: np.transpose(xs[0], _transpose_perm(a, xs[0].ndim)), _transpose_lower)


def _concat_lower(xs, a):
    out = _out_shapes("concat", xs, a)[0]
    return te_concat(xs, a.axis, out, "concat_")


def _stack_lower(xs, a):
    from cvmc.ops.te import shape_of, te, tirx
    shape = shape_of(xs[0])
    out = [*shape[:a.axis], len(xs), *shape[a.axis:]]

    def element(*o):
        index = [*o[:a.axis], *o[a.axis + 1:]]
        value = xs[-1](*index)
        for p in reversed(range(len(xs) - 1)):
            value = tirx.if_then_else(o[a.axis] == p, xs[p](*index), value)
        return value
    return te.compute(tuple(out), element, name="stack_")


def _split_lower(xs, a):
    x = xs[0]
    outs = _out_shapes("split", xs, a)
    result, start = [], 0
    for k, out in enumerate(outs):
        def source(o, start=start):
            index = list(o)
            index[a.axis] = o[a.axis] + start
            return index
        result.append(te_gather(x, out, source, f"split{k}_"))
        start += out[a.axis]
    return result


def _unstack_lower(xs, a):
    x = xs[0]
    return [te_gather(x, s, lambda o, k=k: [*o[:a.axis], k, *o[a.axis:]], f"unstack{k}_")
            for k, s in enumerate(_out_shapes("unstack", xs, a))]


def _split_reference(xs, a):
    x = xs[0]
    unit = x.shape[a.axis] // sum(a.ratios)
    cuts = np.cumsum([r * unit for r in a.ratios])[:-1]
    return [p.copy() for p in np.split(x, cuts, axis=a.axis)]


_attach("concat", lambda xs, a: np.concatenate(xs, axis=a.axis), _concat_lower)
_attach("stack", lambda xs, a: np.stack(xs, axis=a.axis), _stack_lower)
_attach("split", _split_reference, _split_lower)
_attach("unstack", lambda xs, a: [np.take(xs[0], k, axis=a.axis)
                                  for k in range(xs[0].shape[a.axis])], _unstack_lower)


def _slice_reference(xs, a):
    x = xs[0]
    index = [slice(None)] * x.ndim
    stride = a.stride or (1,) * len(a.axes)
    starts = slice_starts(x.shape, a)
    out = _out_shapes("nnef.slice", xs, a)[0]
    for axis, s in zip(a.axes, stride):
        first = starts[axis]
        index[axis] = first + s * np.arange(out[axis])
    return x[np.ix_(*[np.arange(e) if isinstance(i, slice) else i
                      for e, i in zip(x.shape, index)])]


def _slice_lower(xs, a):
    from cvmc.ops.te import shape_of
    x = xs[0]
    shape = shape_of(x)
    out = _out_shapes("nnef.slice", xs, a)[0]
    starts = slice_starts(shape, a)
    stride = dict(zip(a.axes, a.stride or (1,) * len(a.axes)))
    return te_gather(x, out, lambda o: [starts[k] + stride.get(k, 1) * o[k]
                                        for k in range(len(shape))], "slice_")


_attach("nnef.slice", _slice_reference, _slice_lower)
_attach("nnef.tile", lambda xs, a: np.tile(xs[0], a.repeats),
        lambda xs, a: _tile_lower(xs[0], a))


def _tile_lower(x, a):
    from cvmc.ops.te import shape_of
    shape = shape_of(x)
    out = tuple(e * r for e, r in zip(shape, a.repeats))
    return te_gather(x, out, lambda o: [i % e for i, e in zip(o, shape)], "tile_")


# ---- pad -----------------------------------------------------------------------------
def _border_index(i, z: int, border: str):
    """The input index an extended index `i` reads (spec 4.3 "Border Modes"; the shape
    rule allows one reflection at most). Works on NumPy arrays and TIR expressions."""
    def where(cond, p, q):
        if isinstance(i, np.ndarray):
            return np.where(cond, p, q)
        from cvmc.ops.te import tirx
        return tirx.Select(cond, p, q)

    if border == "replicate":
        return where(i < 0, 0 * i, where(i >= z, 0 * i + z - 1, i))
    if border == "reflect":
        return where(i < 0, -i, where(i >= z, 2 * (z - 1) - i, i))
    if border == "reflect-even":
        return where(i < 0, -i - 1, where(i >= z, 2 * z - 1 - i, i))
    return i  # constant: read only inside (the caller tests)


def _pad_reference(xs, a):
    x = xs[0]
    out_shape = [p + e + q for e, (p, q) in zip(x.shape, a.padding)]
    grids = np.meshgrid(*[np.arange(e) for e in out_shape], indexing="ij")
    src = [g - p for g, (p, _) in zip(grids, a.padding)]
    if a.border == "constant":
        inside = np.ones(out_shape, bool)
        for s, e in zip(src, x.shape):
            inside &= (s >= 0) & (s < e)
        safe = [np.clip(s, 0, e - 1) for s, e in zip(src, x.shape)]
        return np.where(inside, x[tuple(safe)], a.value)
    return x[tuple(_border_index(s, e, a.border) for s, e in zip(src, x.shape))]


def _pad_lower(xs, a):
    from cvmc.ops.te import shape_of, te, tirx
    x = xs[0]
    shape = shape_of(x)
    out = [p + e + q for e, (p, q) in zip(shape, a.padding)]

    def element(*o):
        src = [i - p for i, (p, _) in zip(o, a.padding)]
        if a.border != "constant":
            return x(*[_border_index(s, e, a.border) for s, e in zip(src, shape)])
        inside = tirx.all(*[tirx.And(s >= 0, s < e) for s, e in zip(src, shape)])
        return tirx.if_then_else(inside, x(*src), tirx.const(float(a.value), "float32"))
    return te.compute(tuple(out), element, name="pad_")


_attach("pad", _pad_reference, _pad_lower)


# ---- gather, update ------------------------------------------------------------------
def _gather_reference(xs, a):
    x, idx = xs
    extent = x.shape[a.axis]
    safe = np.clip(np.where(idx < 0, idx + extent, idx), 0, extent - 1)
    return np.take(x, safe, axis=a.axis)


def _gather_lower(xs, a):
    from cvmc.ops.te import shape_of, te, tirx
    x, idx = xs
    shape, ishape = shape_of(x), shape_of(idx)
    extent = shape[a.axis]
    out = [*shape[:a.axis], *ishape, *shape[a.axis + 1:]]

    def element(*o):
        pre, mid, post = o[:a.axis], o[a.axis:a.axis + len(ishape)], o[a.axis + len(ishape):]
        i = idx(*mid)
        i = tirx.Select(i < 0, i + extent, i)
        i = tirx.max(tirx.min(i, extent - 1), 0)
        return x(*pre, i, *post)
    return te.compute(tuple(out), element, name="gather_")


_attach("gather", _gather_reference, _gather_lower)
_attach("update", lambda xs, a: xs[1].copy(), lambda xs, a: te_gather(
    xs[1], tuple(int(d) for d in xs[1].shape), lambda o: o, "update_"))

"""CVM transform operators that gather by index or from several tensors: take, cvm_lut,
concatenate, where.

Spec: ../shared/spec/cvm-operators-formal.txt, "Transform Operators" (and the v2 file);
readings where the spec is silent or contradicts itself: ../shared/design/cvm-semantics.md
and the notes at each entry. Attribute names and defaults follow CVM-Runtime's parameter
structs where the spec gives none (concatenate axis 1). The shared index maps and limits
are `transform`'s.
"""
from __future__ import annotations

import math

import numpy as np

from cvmc.ir.graph import TensorType
from cvmc.ops.common import DATA_INTERVAL, data_interval, hull, normalize_axis, require
from cvmc.ops.registry import Attr, Fusion, op
from cvmc.ops.transform import input_precision, limited_shape, te_clamp_int, types_of, unravel

# ---- take, cvm_lut ---------------------------------------------------------------------
take = op("take", family="transform", inputs=("data", "indices"), fusion=Fusion.INJECTIVE,
          precision_rule="p_data (indices are clipped into range)", interval_rule=DATA_INTERVAL,
          attrs=(Attr("axis", "int?", None),))
take.interval(data_interval)
take.precision(input_precision)


def _take_shape_of(name: str, data: TensorType, indices: TensorType, axis: int | None):
    if axis is None:
        return limited_shape(name, indices.shape)
    ax = normalize_axis(name, "attribute 'axis'", axis, data.ndim)
    return limited_shape(name, (*data.shape[:ax], *indices.shape, *data.shape[ax + 1:]))


def _take_reference(x: np.ndarray, indices: np.ndarray, axis: int | None) -> np.ndarray:
    """The spec's take: out-of-range indices are clipped to the first / last element."""
    if axis is None:
        flat = x.reshape(-1)
        return flat[np.clip(indices, 0, flat.size - 1)]
    ax = axis + x.ndim if axis < 0 else axis
    return x[(slice(None),) * ax + (np.clip(indices, 0, x.shape[ax] - 1),)]


def _take_lower(x, indices, axis: int | None, name: str):
    """TE take with clipped indices (axis None: into the flattened data)."""
    from cvmc.ops.te import te
    shape = types_of([x])[0].shape
    m = len(indices.shape)
    if axis is None:
        def element(*d):
            return x(*unravel(te_clamp_int(indices(*d), 0, int(np.prod(shape)) - 1), shape))
        out = tuple(indices.shape)
    else:
        ax = axis + len(shape) if axis < 0 else axis

        def element(*d):
            i = te_clamp_int(indices(*d[ax:ax + m]), 0, shape[ax] - 1)
            return x(*d[:ax], i, *d[ax + m:])
        out = (*shape[:ax], *indices.shape, *shape[ax + 1:])
    return te.compute(out, element, name=name)


@take.shape
def _take_shape(ins, a):
    return _take_shape_of("take", ins[0], ins[1], a.axis)


@take.reference
def _take_ref(xs, a):
    return _take_reference(xs[0], xs[1], a.axis)


@take.lower
def _take_low(xs, a):
    return _take_lower(xs[0], xs[1], a.axis, "take")


# Input order (indices, table) as in CVM-Runtime and the v2 spec ("Input indices, X"); the
# first spec file lists X first but only defines cvm_lut as take(X, indices, axis=None).
cvm_lut = op("cvm_lut", family="transform", inputs=("indices", "table"),
             fusion=Fusion.INJECTIVE, precision_rule="p_table (indices are clipped)",
             interval_rule="the table's interval (its weight's min and max)",
             # CVM-Runtime's, not in the spec: its parser requires it (the table's size)
             attrs=(Attr("in_dim", "int?", None, lo=1,
                         cvm_derive=lambda shapes: math.prod(shapes[1])),))


@cvm_lut.shape
def _cvm_lut_shape(ins, a):
    size = int(np.prod(ins[1].shape))
    require(a.in_dim in (None, size), f"cvm_lut: attribute 'in_dim' {a.in_dim} must be the "
                                      f"table's size {size} (CVM-Runtime checks it)")
    return _take_shape_of("cvm_lut", ins[1], ins[0], None)


cvm_lut.interval(lambda ivs, a: ivs[1])


@cvm_lut.precision
def _cvm_lut_precision(ins, a):
    return ins[1].precision


@cvm_lut.reference
def _cvm_lut_reference(xs, a):
    return _take_reference(xs[1], xs[0], None)


@cvm_lut.lower
def _cvm_lut_lower(xs, a):
    return _take_lower(xs[1], xs[0], None, "cvm_lut")


# ---- concatenate -----------------------------------------------------------------------
concatenate = op("concatenate", family="transform", inputs=("*data",),
                 fusion=Fusion.INJECTIVE, precision_rule="max over the inputs",
                 interval_rule="the hull of the inputs'", attrs=(Attr("axis", "int", 1),))
concatenate.interval(lambda ivs, a: hull(*ivs))


def _concat_axis(ins, a) -> int:
    return normalize_axis("concatenate", "attribute 'axis'", a.axis, ins[0].ndim)


@concatenate.shape
def _concatenate_shape(ins, a):
    first, axis = ins[0], _concat_axis(ins, a)
    for i, t in enumerate(ins[1:], 1):
        same = t.ndim == first.ndim and all(
            m == n for j, (m, n) in enumerate(zip(t.shape, first.shape)) if j != axis)
        require(same, f"concatenate: input {i} has shape {t.shape}, expected the shape of "
                      f"input 0 {first.shape} on every axis but {axis}")
    shape = list(first.shape)
    shape[axis] = sum(t.shape[axis] for t in ins)
    return limited_shape("concatenate", shape)


@concatenate.precision
def _concatenate_precision(ins, a):
    return max(t.precision for t in ins)


@concatenate.reference
def _concatenate_reference(xs, a):
    return np.concatenate(xs, axis=_concat_axis(types_of(xs), a))


@concatenate.lower
def _concatenate_lower(xs, a):
    ins = types_of(xs)
    return te_concat(xs, _concat_axis(ins, a), _concatenate_shape(ins, a), "concatenate")


def te_concat(xs, axis: int, out: tuple[int, ...], name: str):
    """TE stage joining `xs` along `axis` into shape `out`."""
    from cvmc.ops.te import te, tirx
    starts = np.cumsum([0] + [int(x.shape[axis]) for x in xs]).tolist()

    def element(*d):
        def read(k):
            return xs[k](*d[:axis], d[axis] - starts[k], *d[axis + 1:])
        value = read(len(xs) - 1)
        # if_then_else evaluates only the taken branch: the other inputs' reads would be
        # out of bounds.
        for k in reversed(range(len(xs) - 1)):
            value = tirx.if_then_else(d[axis] < starts[k + 1], read(k), value)
        return value
    return te.compute(out, element, name=name)


# ---- where -----------------------------------------------------------------------------
where = op("where", family="transform", inputs=("condition", "x", "y"),
           fusion=Fusion.BROADCAST,
           precision_rule="max(p_x, p_y) (CVM-Runtime gives p_condition, which is unsound)",
           interval_rule="the hull of x's and y's")
where.interval(lambda ivs, a: hull(ivs[1], ivs[2]))


@where.shape
def _where_shape(ins, a):
    cond, x, y = ins
    require(y.shape == x.shape, f"where: y has shape {y.shape}, expected the shape of x "
                                f"{x.shape}")
    require(cond.shape == x.shape or cond.shape == x.shape[:1],
            f"where: condition has shape {cond.shape}, expected the shape of x {x.shape} or "
            f"({x.shape[0]},) (one flag per row)")
    return x.shape


@where.precision
def _where_precision(ins, a):
    # The result is one of x, y: max(p_x, p_y) bounds it; the condition's precision does not.
    return max(ins[1].precision, ins[2].precision)


@where.reference
def _where_reference(xs, a):
    cond, x, y = xs
    # A 1-D condition selects whole rows by cond[d0] (the spec; CVM-Runtime quirk #4 copies
    # a byte count instead and leaves garbage).
    flags = cond.reshape(cond.shape + (1,) * (x.ndim - cond.ndim))
    return np.where(flags != 0, x, y)


@where.lower
def _where_lower(xs, a):
    from cvmc.ops.te import const, te, tirx
    cond, x, y = xs
    rows = len(cond.shape) != len(x.shape)

    def element(*d):
        flag = cond(d[0]) if rows else cond(*d)
        return tirx.Select(flag != const(0), x(*d), y(*d))
    return te.compute(x.shape, element, name="where")

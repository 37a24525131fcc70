"""CVM reduce operators: sum, max.

Spec: ../shared/spec/cvm-operators-formal.txt, "Reduce Operators". The reduced axes R are
`axes` (T), or U - T with `exclude`; no axes reduces everything. Reducing every axis gives
shape (1,) (all ones of rank N with keepdims); R empty (exclude with every axis) is Y = X.
Precision rules from ../shared/design/cvm-semantics.md.
"""
from __future__ import annotations

from collections.abc import Callable

import numpy as np

from cvmc.ops.common import DATA_INTERVAL, bitlen, data_interval, normalize_axis, require
from cvmc.ops.registry import Attr, Fusion, OpDef, op

_ATTRS = (Attr("axes", "ints", default=(), scalar_ok=True, aliases=("axis",), cvm_name="axis"),
          Attr("keepdims", "bool", default=False),
          Attr("exclude", "bool", default=False))


def reduced_axes(name: str, ndim: int, a) -> tuple[int, ...]:
    """R, the sorted axes to reduce, after checking `axes` (range, no duplicates)."""
    t = [normalize_axis(name, "axis", ax, ndim) for ax in a.axes]
    for ax in t:
        require(t.count(ax) == 1, f"{name}: attribute 'axes' {list(a.axes)} names axis {ax} "
                                  f"more than once (expected distinct axes of a rank-{ndim} tensor)")
    if a.exclude:
        return tuple(i for i in range(ndim) if i not in t)
    return tuple(sorted(t)) or tuple(range(ndim))


def reduced_shape(shape: tuple[int, ...], r: tuple[int, ...], keepdims: bool) -> tuple[int, ...]:
    """Output shape when reducing axes `r` of `shape` (rank >= 1: everything gives (1,))."""
    if keepdims:
        return tuple(1 if i in r else n for i, n in enumerate(shape))
    return tuple(n for i, n in enumerate(shape) if i not in r) or (1,)


def te_reduce(x, r: tuple[int, ...], keepdims: bool, reducer, name: str):
    """TE reduction of `x` over axes `r` (not empty) with `reducer` (`te.sum`, `te.max`, a
    `te.comm_reducer`); the output shape is `reduced_shape`."""
    from cvmc.ops.te import shape_of, te
    shape = shape_of(x)
    raxes = {ax: te.reduce_axis((0, shape[ax]), name=f"k{ax}") for ax in r}
    kept = [i for i in range(len(shape)) if i not in r]

    def fcompute(*idx):
        # keepdims: the kept axes keep their positions; otherwise they come first, in order
        outer = [idx[i] for i in kept] if keepdims else idx[:len(kept)]
        coords = {**dict(zip(kept, outer)), **raxes}
        return reducer(x(*[coords[i] for i in range(len(shape))]), axis=list(raxes.values()))
    return te.compute(reduced_shape(shape, r, keepdims), fcompute, name=name)


def _te_reduce(x, a, name: str, reducer_name: str):
    """TE reduction of `x` over R with `te.sum` / `te.max`."""
    from cvmc.ops.te import shape_of, te
    r = reduced_axes(name, len(shape_of(x)), a)
    if not r:
        return te.compute(x.shape, lambda *i: x(*i), name=name)
    return te_reduce(x, r, a.keepdims, getattr(te, reducer_name), name)


def _reduction_size(name: str, t, a) -> int:
    """input_size / output_size: how many inputs each output combines."""
    r = reduced_axes(name, t.ndim, a)
    return int(np.prod([t.shape[i] for i in r], dtype=np.int64))


def _declare(name: str, precision_rule: str, np_reduce: Callable, reducer_name: str,
             interval_rule: str = "") -> OpDef:
    """Register one reduce op: `np_reduce` (NumPy) / `te.<reducer_name>` combine Z."""
    d = op(name, family="reduce", inputs=("data",), attrs=_ATTRS, fusion=Fusion.REDUCTION,
           precision_rule=precision_rule, interval_rule=interval_rule)

    @d.shape
    def _shape(ins, a):
        shape = ins[0].shape
        r = reduced_axes(name, len(shape), a)
        return reduced_shape(shape, r, a.keepdims) if r else shape

    @d.reference
    def _reference(xs, a):
        x = xs[0]
        r = reduced_axes(name, x.ndim, a)
        if not r:
            return x.copy()  # exclude with every axis: Y = X
        return np_reduce(x, axis=r).reshape(reduced_shape(x.shape, r, a.keepdims))

    d.lower(lambda xs, a: _te_reduce(xs[0], a, name, reducer_name))
    return d


reduce_sum = _declare("sum", "p_x + bitlen(input_size / output_size)", np.sum, "sum")
reduce_sum.precision(lambda ins, a: ins[0].precision + bitlen(_reduction_size("sum", ins[0], a)))
# CVM-Runtime's gas: each output adds input_size / output_size values
reduce_sum.cost(lambda ins, outs, a: _reduction_size("sum", ins[0], a))

# the true maximum, also for an all-negative input (CVM-Runtime starts from 0: quirk #3)
reduce_max = _declare("max", "p_x", np.max, "max", DATA_INTERVAL)
reduce_max.interval(data_interval)
reduce_max.precision(lambda ins, a: ins[0].precision)

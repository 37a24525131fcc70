"""The ops' TE vocabulary: the one place `lower` rules reach TVM from (imported lazily
inside the rules, so checking a graph never loads TVM), and the annotations by which a
compute tells the schedules what it is.

TVM 0.27 moved things around (`tvm.tirx`, `tvm.s_tir`); keeping op modules on this facade
means an API move is fixed here once. Integer helpers follow the CVM semantics notes:
Python `//` and `%` on TIR expressions floor, `truncdiv` truncates, `>>` is arithmetic.
The lowering layer imports this module (for the annotations); it never imports lowering.
"""
from __future__ import annotations

import tvm
from tvm import te, tirx, topi
from tvm.script.ir_builder import IRBuilder
from tvm.script.ir_builder import tirx as tir_builder

# ---- the compute <-> schedule contract: block and function annotations ---------------
# A stage a lower rule wants the CPU schedule to keep as a buffer rather than inline (conv
# padding: the conv's inner loop then reads without a test).
MATERIALIZE = "cvmc.materialize"
# [axis, start, stop]: the block's value along iterator `axis` is padding outside [start,
# stop). The schedule's `split_interior` partitions that loop so the interior part runs
# without the padding test (TVM's simplifier drops it there), and vectorises.
INTERIOR = "cvmc.interior"
# On a depthwise conv's reduction block (conv2d's lower rule). The op knows what it
# computed; the schedule reads that rather than guessing it from the TIR's shapes (an
# ordinary conv, a grouped one with several channels per group and a depthwise one with a
# channel multiplier all share the block's form).
DEPTHWISE = "cvmc.depthwise"
# On each kernel's PrimFunc: the op of the first node of its fused group, by which the
# schedule table picks a rule.
ANCHOR_ATTR = "cvmc.anchor"

__all__ = ["ANCHOR_ATTR", "DEPTHWISE", "INTERIOR", "MATERIALIZE", "IRBuilder", "as_int32",
           "as_int64", "cast", "clamped_index", "const", "convert", "elementwise", "shape_of",
           "te", "tir_builder", "tirx", "topi", "tvm"]


def const(value: int, dtype: str = "int32") -> tirx.PrimExpr:
    """An integer constant of the given dtype."""
    return tirx.const(int(value), dtype)


def as_int64(e: tirx.PrimExpr) -> tirx.PrimExpr:
    """Widen an expression to int64 (for intermediates that may exceed int32)."""
    return e.astype("int64")


def as_int32(e: tirx.PrimExpr) -> tirx.PrimExpr:
    """Narrow an expression to int32 (the value must already fit)."""
    return e.astype("int32")


def clamped_index(pos: tirx.PrimExpr, extent: int) -> tuple[tirx.PrimExpr, tirx.PrimExpr]:
    """(`pos` clamped into [0, extent), whether `pos` is inside): load at the index, keep
    the value under `Select(inside, value, ...)`, and no read leaves the buffer."""
    index = tirx.max(tirx.min(pos, extent - 1), 0)
    # `inside` tests the clamped index, not `0 <= pos < extent`: TVM simplifies a Select's
    # operands under its condition, and that condition would turn the clamped index back
    # into `pos`, whose load a Select performs even when it is outside (issue 22, item 0)
    return index, index == pos


def shape_of(t: te.Tensor) -> tuple[int, ...]:
    """The static shape of a TE tensor as Python ints."""
    return tuple(int(d) for d in t.shape)


def elementwise(x: te.Tensor, fn, name: str) -> te.Tensor:
    """`te.compute` applying `fn` to every element of `x`."""
    return te.compute(x.shape, lambda *i: fn(x(*i)), name=name)


def cast(x: te.Tensor, dtype: str, name: str) -> te.Tensor:
    """`x` converted elementwise to `dtype` (TE lambdas cannot take default arguments)."""
    return te.compute(x.shape, lambda *i: x(*i).astype(dtype), name=name)


def convert(x: te.Tensor, dtype: str, name: str) -> te.Tensor:
    """`x` converted elementwise to `dtype` by the rule of `cvmc.ops.common.convert_np`."""
    from cvmc.ops.common import INT32_SAT

    source = str(x.dtype)

    def element(*i):
        v = x(*i)
        if dtype == "bool":  # NaN is true (TIR's `!=` on floats is an ordered compare)
            nonzero = v != tirx.const(0, source)
            return tirx.Or(tirx.isnan(v), nonzero) if source.startswith("float") else nonzero
        if source.startswith("float") and dtype.startswith("int"):
            # clamp in float64, where 2^31 - 1 is exact (in float32 it rounds to 2^31)
            wide, bound = v.astype("float64"), tirx.const(float(INT32_SAT), "float64")
            clipped = tirx.max(tirx.min(wide, bound), -bound)
            return tirx.Select(tirx.isnan(v), tirx.const(0, dtype), clipped.astype(dtype))
        return v.astype(dtype)

    return te.compute(x.shape, element, name=name)

"""The one place op `lower` rules reach TVM from (imported lazily inside the rules).

TVM 0.27 moved things around (`tvm.tirx`, `tvm.s_tir`); keeping op modules on this facade
means an API move is fixed here once. Integer helpers follow the CVM semantics notes:
Python `//` and `%` on TIR expressions floor, `truncdiv` truncates, `>>` is arithmetic.
"""
from __future__ import annotations

import tvm
from tvm import te, tirx, topi
from tvm.script.ir_builder import IRBuilder
from tvm.script.ir_builder import tirx as tir_builder

__all__ = ["IRBuilder", "as_int32", "as_int64", "cast", "clamped_index", "const", "convert",
           "elementwise", "shape_of", "te", "tir_builder", "tirx", "topi", "tvm"]


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

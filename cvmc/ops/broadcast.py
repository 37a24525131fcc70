"""CVM broadcast operators: broadcast_add, broadcast_sub, broadcast_mul, broadcast_div,
broadcast_max, and broadcast_greater (from CVM-Runtime, not the spec).

Spec: ../shared/spec/cvm-operators-formal.txt, "Broadcast Operators": shapes align on the
right (a_j = d_{Q-M+j}), each pair of dimensions equal or one of them 1. Precision rules
from ../shared/design/cvm-semantics.md.
"""
from __future__ import annotations

import operator
from collections.abc import Callable

import numpy as np

from cvmc.ops.common import CORNERS_INTERVAL, corners_interval, require
from cvmc.ops.registry import Fusion, OpDef, op


def broadcast_shape(name: str, lhs: tuple[int, ...], rhs: tuple[int, ...]) -> tuple[int, ...]:
    """The output shape of a broadcast op, or an OpRuleError naming the clashing dimension."""
    return broadcast_shapes(name, ("lhs", "rhs"), (lhs, rhs))


def broadcast_shapes(name: str, names, shapes) -> tuple[int, ...]:
    """NumPy broadcasting of any number of shapes (`names` for the message): aligned on the
    right, missing leading dimensions count as 1, per dimension equal extents or 1."""
    q = max(len(s) for s in shapes)
    aligned = [(1,) * (q - len(s)) + tuple(s) for s in shapes]
    out = []
    for i, dims in enumerate(zip(*aligned)):
        big = {d for d in dims if d != 1}
        require(len(big) <= 1,
                f"{name}: {' and '.join(f'{n} shape {tuple(s)}' for n, s in zip(names, shapes))}"
                f" do not broadcast: aligned on the right, dimension {i} is "
                f"{' vs '.join(str(d) for d in dims)} (expected equal or 1)")
        out.append(big.pop() if big else 1)
    return tuple(out)


def np_operands(xs) -> list[np.ndarray]:
    """Every input expanded to the output shape: leading axes of extent 1 are prepended
    (em_i = 1 for i < Q - M) and an axis of extent 1 is always read at index 0."""
    out = broadcast_shapes("broadcast", [f"input {k}" for k in range(len(xs))],
                           [x.shape for x in xs])

    def expand(x: np.ndarray) -> np.ndarray:
        aligned = x.reshape((1,) * (len(out) - x.ndim) + x.shape)
        return np.broadcast_to(aligned, out)
    return [expand(x) for x in xs]


def te_broadcast(xs, fn: Callable, name: str):
    """`te.compute` of `fn(X0[...], X1[...], ...)` over the broadcast output shape."""
    from cvmc.ops.te import shape_of, te
    out = broadcast_shapes(name, [f"input {k}" for k in range(len(xs))],
                           [shape_of(x) for x in xs])

    def read(t, idx):
        dims = shape_of(t)
        off = len(idx) - len(dims)
        return t(*[0 if m == 1 else idx[off + j] for j, m in enumerate(dims)])
    return te.compute(out, lambda *idx: fn(*[read(x, idx) for x in xs]), name=name)


def _declare(name: str, precision_rule: str, precision: Callable, ref: Callable,
             expr: Callable, seeds: tuple[str, ...] = ("cvm",),
             corners: Callable | None = None) -> OpDef:
    """Register one broadcast op: `ref` (NumPy) and `expr` (TE) compute A OP B elementwise;
    `corners(a, b)` on ints, where given, its interval rule (`corners_interval`)."""
    d = op(name, family="broadcast", inputs=("lhs", "rhs"), fusion=Fusion.BROADCAST,
           precision_rule=precision_rule, seeds=seeds,
           interval_rule=CORNERS_INTERVAL if corners else "")
    if corners:
        d.interval(corners_interval(corners))
    d.shape(lambda ins, a: broadcast_shape(name, ins[0].shape, ins[1].shape))
    d.precision(lambda ins, a: precision(ins[0].precision, ins[1].precision))
    d.reference(lambda xs, a: ref(*np_operands(xs)))
    d.lower(lambda xs, a: te_broadcast(xs, expr, name))
    return d


def np_div(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Quotient truncated toward zero; x / 0 = 0."""
    nonzero = np.where(b == 0, 1, b)
    q = np.abs(a) // np.abs(nonzero) * np.sign(a) * np.sign(nonzero)
    return np.where(b == 0, 0, q)


def te_div(u, v):
    """u / v truncated toward zero; x / 0 = 0."""
    from cvmc.ops.te import const, tirx
    # divide by 1 where v = 0: a zero divisor would trap (x86 idiv) even in a dead branch
    q = tirx.truncdiv(u, tirx.Select(v == 0, const(1), v))
    return tirx.Select(v == 0, const(0), q)


def _te_max(u, v):
    from cvmc.ops.te import tirx
    return tirx.max(u, v)


def _add_precision(pa: int, pb: int) -> int:
    return max(pa, pb) + 1


broadcast_add = _declare("broadcast_add", "max(p_a, p_b) + 1", _add_precision,
                         np.add, lambda u, v: u + v, corners=operator.add)
broadcast_sub = _declare("broadcast_sub", "max(p_a, p_b) + 1", _add_precision,
                         np.subtract, lambda u, v: u - v, corners=operator.sub)
broadcast_mul = _declare("broadcast_mul", "p_a + p_b", lambda pa, pb: pa + pb,
                         np.multiply, lambda u, v: u * v, corners=operator.mul)
broadcast_div = _declare("broadcast_div", "p_a (truncating; x / 0 = 0)", lambda pa, pb: pa,
                         np_div, te_div)
broadcast_max = _declare("broadcast_max", "max(p_a, p_b)", max, np.maximum, _te_max,
                         corners=max)


def _te_greater(u, v):
    return (u > v).astype("int32")


# CVM-Runtime has it (CPU, CUDA and FORMAL kernels: Y = A > B as 0 or 1, with the broadcast
# above) though the spec does not. Its precision rule is the first input's; 1 does not fit
# precision 1 (|v| <= 0), so cvmc takes max(p_a, 2): sound, and equal to CVM-Runtime's for
# every p_a >= 2.
broadcast_greater = _declare("broadcast_greater", "max(p_a, 2) (values 0 or 1; CVM-Runtime "
                             "op, not in the spec: its rule is p_a)", lambda pa, pb: max(pa, 2),
                             lambda a, b: (a > b).astype(np.int64), _te_greater,
                             seeds=("cvm-runtime",))

"""Reference and lower rules of NNEF's element-wise primitives (spec 4.2): unary, binary
(arithmetic, comparison, logical), select, copy and cast, on float32 (scalar), bool
(logical) and, for the generic ones, integer tensors.

Broadcasting is NNEF's: shapes align on the LEFT and missing trailing dims count as 1
(`nnef_std.broadcast`), unlike CVM's NumPy-style `broadcast_*`.

Accuracy (stated in the README, checked by tests/ops/test_nnef_math.py): the reference
computes each formula in float64 and rounds once to float32. The compiled kernels compute
in float32, which for +, -, *, /, rcp, neg, abs, sign, floor, ceil, round, comparisons,
logic, select, copy and cast is bit-exact (IEEE rounds a float32 operation correctly; the
float64 result rounded to float32 is the same value, as 53 >= 2 * 24 + 2). The
transcendental functions call the C math library's float function (libm on the CPU,
CUDA's on the GPU): within TRANSCENDENTAL_ULP units in the last place. A kernel that fuses
a multiply into an add may use one FMA (LLVM contracts them): the result is then the more
accurate one, within 1 ULP of the two roundings of the reference.
"""
from __future__ import annotations

import functools
from collections.abc import Callable

import numpy as np

from cvmc.ops.nnef_std import ARITHMETIC, COMPARISON, UNARY
from cvmc.ops.registry import lookup

TRANSCENDENTAL_ULP = 4

# NumPy (float64) formula and the C math function a kernel calls, per transcendental op.
TRANSCENDENTAL: dict[str, tuple[Callable, str]] = {
    "exp": (np.exp, "expf"), "log": (np.log, "logf"), "sin": (np.sin, "sinf"),
    "cos": (np.cos, "cosf"), "tan": (np.tan, "tanf"), "sinh": (np.sinh, "sinhf"),
    "cosh": (np.cosh, "coshf"), "tanh": (np.tanh, "tanhf"), "asin": (np.arcsin, "asinf"),
    "acos": (np.arccos, "acosf"), "atan": (np.arctan, "atanf"), "asinh": (np.arcsinh, "asinhf"),
    "acosh": (np.arccosh, "acoshf"), "atanh": (np.arctanh, "atanhf"),
}


# NumPy formulas of the unary ops computed exactly in float32 (the reference interpreter
# needs no TVM; their TE expressions are in `exact_unary_te`).
EXACT_UNARY: dict[str, Callable] = {
    "neg": np.negative, "rcp": lambda x: 1.0 / x, "nnef.abs": np.abs, "sign": np.sign,
    "floor": np.floor, "ceil": np.ceil,
    # round(x) = floor(x + 0.5) (spec 4.2.1)
    "round": lambda x: np.floor(x + 0.5),
}


@functools.cache
def exact_unary_te() -> dict[str, Callable]:
    """TE expressions of EXACT_UNARY's ops (built when lowering: they need TVM)."""
    from cvmc.ops.te import tirx

    def f32(v: float):
        return tirx.const(v, "float32")

    return {
        "neg": lambda x: -x,
        "rcp": lambda x: f32(1.0) / x,
        "nnef.abs": lambda x: tirx.abs(x),
        # sign(+-0) = +0 and sign(NaN) = NaN, as np.sign gives (isnan, not x == x: TVM's
        # simplifier folds x == x to true)
        "sign": lambda x: tirx.Select(x > f32(0), f32(1), tirx.Select(
            x < f32(0), f32(-1), tirx.Select(tirx.isnan(x), x, f32(0)))),
        "floor": tirx.floor,
        "ceil": tirx.ceil,
        # x + 0.5 in float64, where it is exact: in float32, 0.49999997 + 0.5 would round
        # up to 1.
        "round": lambda x: tirx.floor(x.astype("float64") + tirx.const(0.5, "float64"))
        .astype("float32"),
    }


_BINARY: dict[str, tuple[Callable, Callable]] = {
    "add": (np.add, lambda x, y: x + y), "sub": (np.subtract, lambda x, y: x - y),
    "mul": (np.multiply, lambda x, y: x * y), "div": (np.divide, lambda x, y: x / y),
    "lt": (np.less, lambda x, y: x < y), "gt": (np.greater, lambda x, y: x > y),
    "le": (np.less_equal, lambda x, y: x <= y), "ge": (np.greater_equal, lambda x, y: x >= y),
    "eq": (np.equal, lambda x, y: x == y), "ne": (np.not_equal, lambda x, y: te_ne(x, y)),
    "and": (np.logical_and, lambda x, y: x & y), "or": (np.logical_or, lambda x, y: x | y),
}


def np_broadcast(xs: list[np.ndarray]) -> list[np.ndarray]:
    """NNEF broadcasting in NumPy: pad every shape with trailing 1s to the largest rank."""
    rank = max(x.ndim for x in xs)
    return [x.reshape(x.shape + (1,) * (rank - x.ndim)) for x in xs]


def te_broadcast(xs, fn: Callable, name: str):
    """`te.compute` of `fn(*elements)` with NNEF broadcasting (left-aligned shapes)."""
    from cvmc.ops.te import shape_of, te

    shapes = [shape_of(x) for x in xs]
    rank = max(len(s) for s in shapes)
    out = [max((s[i] for s in shapes if i < len(s)), default=1) for i in range(rank)]

    def read(x, shape, idx):
        return x(*[0 if e == 1 else i for e, i in zip(shape, idx)])

    # `name_`: op names such as `and`, `or`, `not` are C++ keywords in CUDA source
    return te.compute(out, lambda *idx: fn(*[read(x, s, idx) for x, s in zip(xs, shapes)]),
                      name=f"{name}_")


def _attach(name: str, ref: Callable, expr: Callable) -> None:
    """The reference and lower rules of one element-wise op: `ref` over NumPy arrays,
    `expr` over TE elements."""
    d = lookup(name)
    label = name.removeprefix("nnef.")
    d.reference(lambda xs, a: ref(*np_broadcast(xs)))
    d.lower(lambda xs, a: te_broadcast(xs, expr, label))


def extern(fname: str) -> Callable:
    """A TE expression calling the C math library's float function `fname`."""
    def call(*args):
        from cvmc.ops.te import tirx
        return tirx.call_pure_extern("float32", fname, *args)
    return call


def te_ne(x, y):
    """TE x != y, true when either is NaN (TIR's `!=` on floats is an ordered compare)."""
    from cvmc.ops.te import tirx
    return tirx.Or(tirx.Or(tirx.isnan(x), tirx.isnan(y)), x != y)


def te_select(c, t, f):
    """TE select (c ? t : f)."""
    from cvmc.ops.te import tirx
    return tirx.Select(c, t, f)


def exact_te(name: str) -> Callable:
    """The TE expression of exact unary op `name`, built when first used (it needs TVM,
    which checking a graph or running the reference never loads)."""
    return lambda *xs: exact_unary_te()[name](*xs)


for _name in UNARY:
    if _name in TRANSCENDENTAL:
        _attach(_name, TRANSCENDENTAL[_name][0], extern(TRANSCENDENTAL[_name][1]))
    else:
        _attach(_name, EXACT_UNARY[_name], exact_te(_name))
for _name, (_ref, _expr) in _BINARY.items():
    _attach(_name, _ref, _expr)
_attach("pow", np.power, extern("powf"))
_attach("not", np.logical_not, lambda x: ~x)
_attach("copy", lambda x: x.copy(), lambda x: x)
_attach("select", np.where, te_select)
# cast<T>: the value itself; the interpreter and the lowering convert every result to its
# tensor's dtype by one rule (`cvmc.ops.common.convert_np` / `ops.te.convert`).
_attach("cast", lambda x: x.copy(), lambda x: x)
assert set(ARITHMETIC) <= {*_BINARY, "pow"} and set(COMPARISON) <= set(_BINARY)

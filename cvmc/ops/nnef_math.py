"""NNEF's element-wise primitives (spec 4.2): unary, binary (arithmetic, comparison,
logical), select, copy and cast, on float32 (scalar), bool (logical) and, for the generic
ones, integer tensors. Each is one `elementwise(...)` entry: its declaration (the types of
its stdlib declaration), NumPy formula, TE expression and accuracy.

Broadcasting is NNEF's: shapes align on the LEFT and missing trailing dims count as 1
(`nnef_std.broadcast`), unlike CVM's NumPy-style `broadcast_*`.

Accuracy (docs/float.md, checked per op by tests/codegen/op_cases.py from the entry's
`ulp`): the reference computes each formula in float64 and rounds once to float32. The
compiled kernels compute in float32, which for +, -, *, /, rcp, neg, abs, sign, floor,
ceil, round, comparisons, logic, select, copy and cast is bit-exact (IEEE rounds a float32
operation correctly; the float64 result rounded to float32 is the same value, as
53 >= 2 * 24 + 2): `ulp` 0. The transcendental functions call the C math library's float
function (libm on the CPU, CUDA's on the GPU), but exp on the CPU a polynomial
(`fastmath.py`): within TRANSCENDENTAL_ULP units in the last place. A kernel that fuses a
multiply into an add may use one FMA (LLVM contracts them):
the result is then the more accurate one, within 1 ULP of the two roundings of the
reference.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from cvmc.ops.common import no_arith
from cvmc.ops.fastmath import te_exp
from cvmc.ops.nnef_std import broadcast, declare
from cvmc.ops.registry import Fusion, OpDef

TRANSCENDENTAL_ULP = 4

# The (NumPy formula, TE expression) of every entry below, by op name: CINN's ops of the
# same math (cvmc.ops.cinn) reuse them.
FORMULAS: dict[str, tuple[Callable, Callable]] = {}


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


def te_fn(fn: Callable) -> Callable:
    """A TE expression built by `fn(tirx, *operands)` (tirx imported when lowering: checking
    a graph or running the reference never loads TVM)."""
    def expr(*xs):
        from cvmc.ops.te import tirx
        return fn(tirx, *xs)
    return expr


def extern(fname: str) -> Callable:
    """A TE expression calling the C math library's float function `fname`."""
    return te_fn(lambda t, *xs: t.call_pure_extern("float32", fname, *xs))


def te_ne(x, y):
    """TE x != y, true when either is NaN (TIR's `!=` on floats is an ordered compare)."""
    from cvmc.ops.te import tirx
    return tirx.Or(tirx.Or(tirx.isnan(x), tirx.isnan(y)), x != y)


def te_select(c, t, f):
    """TE select (c ? t : f)."""
    from cvmc.ops.te import tirx
    return tirx.Select(c, t, f)


def _f32(t, v: float):
    return t.const(v, "float32")


def elementwise(name: str, types: str, ref: Callable, expr: Callable, ulp: int = 0,
                inputs: Sequence[str] | None = None, outputs: Sequence[str] | None = None
                ) -> OpDef:
    """Register the element-wise NNEF primitive `name`: `types` as its stdlib declaration
    has them, `ref` its NumPy formula (float64 for scalar operands), `expr` its TE
    expression over elements, `ulp` its float accuracy; operands broadcast as NNEF's.
    Inputs and outputs default to the stdlib's x -> y and x, y -> z."""
    unary = types.count(",") == 0
    inputs = inputs or (("x",) if unary else ("x", "y"))
    outputs = outputs or (("y",) if unary else ("z",))
    label = name.removeprefix("nnef.")  # messages use the name the document spells
    d = declare(name, lambda op_name, shapes, a: broadcast(op_name, inputs, shapes), inputs,
                types, outputs=outputs, fusion=Fusion.ELEMWISE if unary else Fusion.BROADCAST,
                ulp=ulp)
    d.reference(lambda xs, a: ref(*np_broadcast(xs)))
    d.lower(lambda xs, a: te_broadcast(xs, expr, label))
    FORMULAS[name] = (ref, expr)
    return d


def transcendental(name: str, ref: Callable, types: str = "scalar -> scalar") -> OpDef:
    """An element-wise primitive computed by the C math library's float function of its
    name (`expf`, ...): within TRANSCENDENTAL_ULP."""
    return elementwise(name, types, ref, extern(f"{name}f"), TRANSCENDENTAL_ULP)


# ---- unary: the C math library's functions, then the exact ones -------------------------
# exp: on the CPU a polynomial that vectorises (cvmc/ops/fastmath.py, measured 1 ULP), elsewhere
# the C library's expf
elementwise("exp", "scalar -> scalar", np.exp, te_exp, TRANSCENDENTAL_ULP)
for _name, _ref in (("log", np.log), ("sin", np.sin), ("cos", np.cos),
                    ("tan", np.tan), ("sinh", np.sinh), ("cosh", np.cosh), ("tanh", np.tanh),
                    ("asin", np.arcsin), ("acos", np.arccos), ("atan", np.arctan),
                    ("asinh", np.arcsinh), ("acosh", np.arccosh), ("atanh", np.arctanh)):
    transcendental(_name, _ref)
_UNARY = "scalar -> scalar"
elementwise("neg", _UNARY, np.negative, lambda x: -x)
elementwise("rcp", _UNARY, lambda x: 1.0 / x, te_fn(lambda t, x: _f32(t, 1.0) / x))
elementwise("sign", _UNARY, np.sign, te_fn(
    # sign(+-0) = +0 and sign(NaN) = NaN, as np.sign gives (isnan, not x == x: TVM's
    # simplifier folds x == x to true)
    lambda t, x: t.Select(x > _f32(t, 0), _f32(t, 1), t.Select(
        x < _f32(t, 0), _f32(t, -1), t.Select(t.isnan(x), x, _f32(t, 0))))))
elementwise("floor", _UNARY, np.floor, te_fn(lambda t, x: t.floor(x)))
elementwise("ceil", _UNARY, np.ceil, te_fn(lambda t, x: t.ceil(x)))
# round(x) = floor(x + 0.5) (spec 4.2.1); x + 0.5 in float64, where it is exact: in
# float32, 0.49999997 + 0.5 would round up to 1.
elementwise("round", _UNARY, lambda x: np.floor(x + 0.5), te_fn(
    lambda t, x: t.floor(x.astype("float64") + t.const(0.5, "float64")).astype("float32")))
# abs on integer tensors is the CVM op (same signature and shape); on scalars, nnef.abs.
elementwise("nnef.abs", _UNARY, np.abs, te_fn(lambda t, x: t.abs(x)))
elementwise("copy", "? -> ?", lambda x: x.copy(), lambda x: x).arith(no_arith)  # GOPS: 0
elementwise("not", "logical -> logical", np.logical_not, lambda x: ~x)

# ---- binary -----------------------------------------------------------------------------
_ARITHMETIC = "scalar, scalar -> scalar"
elementwise("add", _ARITHMETIC, np.add, lambda x, y: x + y)
elementwise("sub", _ARITHMETIC, np.subtract, lambda x, y: x - y)
elementwise("mul", _ARITHMETIC, np.multiply, lambda x, y: x * y)
elementwise("div", _ARITHMETIC, np.divide, lambda x, y: x / y)
transcendental("pow", np.power, _ARITHMETIC)
_COMPARISON = "scalar, scalar -> logical"
elementwise("lt", _COMPARISON, np.less, lambda x, y: x < y)
elementwise("gt", _COMPARISON, np.greater, lambda x, y: x > y)
elementwise("le", _COMPARISON, np.less_equal, lambda x, y: x <= y)
elementwise("ge", _COMPARISON, np.greater_equal, lambda x, y: x >= y)
elementwise("eq", _COMPARISON, np.equal, lambda x, y: x == y)
elementwise("ne", _COMPARISON, np.not_equal, te_ne)
_LOGIC = "logical, logical -> logical"
elementwise("and", _LOGIC, np.logical_and, lambda x, y: x & y)
elementwise("or", _LOGIC, np.logical_or, lambda x, y: x | y)

# cast<?>(input: tensor<>): any input; the result kind is the generic argument, which the
# frontend records as the output's dtype. The rules give the value itself; the interpreter
# and the lowering convert every result to its tensor's dtype by one rule
# (`cvmc.ops.common.convert_np` / `ops.te.convert`).
elementwise("cast", "any -> ?", lambda x: x.copy(), lambda x: x, inputs=("input",),
            outputs=("output",))
elementwise("select", "logical, ?, ? -> ?", np.where, te_select,
            inputs=("condition", "true_value", "false_value"), outputs=("output",))

# ---- cvmc's own: the stdlib's min, max and clamp as single element-wise ops ---------------
# The stdlib writes max(x, y) = select(x > y, x, y), min with <, and clamp(x, a, b) =
# max(min(x, b), a); the compile pipeline's `simplify` pass rewrites those selects into
# these (one node each, so the chain fuses into its producer). Their formulas are the
# selects themselves, bit for bit: a NaN x gives y (max, min) and b then a (clamp); of
# equal zeros y is taken.


def _np_clamp(x, a, b):
    low = np.where(x < b, x, b)
    return np.where(low > a, low, a)


def _te_clamp(t, x, a, b):
    low = t.Select(x < b, x, b)
    return t.Select(low > a, low, a)


elementwise("nnef.select_max", _ARITHMETIC, lambda x, y: np.where(x > y, x, y),
            lambda x, y: te_select(x > y, x, y))
elementwise("nnef.select_min", _ARITHMETIC, lambda x, y: np.where(x < y, x, y),
            lambda x, y: te_select(x < y, x, y))
elementwise("nnef.select_clamp", "scalar, scalar, scalar -> scalar", _np_clamp,
            te_fn(_te_clamp), inputs=("x", "a", "b"), outputs=("y",))

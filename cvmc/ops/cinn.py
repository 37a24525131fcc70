"""Paddle CINN's builder primitives as `cinn.<name>` ops (spec:
../shared/spec/cinn-builder-primitives.txt); `cvmc.GraphBuilder` has one method per op.
Here the element-wise, compare and select ops; dot, reduce, the batch-norm statistics,
data movement and const_scalar in `cinn_array`, cinn.conv in `cinn_conv`. This docstring
states what all of them share.

Element types. Each op's `types` says what it takes: `scalar` (float32), `integer` (a CVM
integer: int32 or int8 storage, with a precision), `logical` (bool), `numeric` (scalar or
integer, the same for all such inputs) and `?` (anything, the same for all). Integer
results get a precision rule that keeps the int32 proof sound (cvmc/ops/infer.py);
a result that could need more than 32 bits is rejected where the op is called, naming the
op and its rule. Float results follow nnef_math's accuracy statement: bit-exact where
IEEE rounds one float32 operation correctly, the C math library's float function (within
TRANSCENDENTAL_ULP) for transcendental ones, and for sums (reduce, dot, bn_*) within
gamma(K + 2) * S of the reference (README, "Float accuracy"; S the sum of the terms'
magnitudes, K the roundings of one term; one thread sums each result in a fixed order,
the reference in float64).

Shapes. Binary ops, compare and select broadcast as NumPy does (aligned on the right,
extents equal or 1: so `add(x, const_scalar(0.5))` works; CINN's builder leaves implicit
broadcasting out and has broadcast_to for it). Axes are in [0, rank) as the spec writes
(no negative axes). No tensor is empty (every extent is >= 1), so no reduction ever runs
over zero elements.

Edge decisions (the spec is silent; docs/builder.md has the
same table, tests/ops/test_cinn.py a hand-computed case for each):
- integer div truncates (C), floor_div floors, mod is C's remainder (sign of x), floor_mod
  takes the sign of y; by zero all four give 0 (CVM's broadcast_div: x / 0 = 0; NumPy's
  integer rule). Float div/mod/floor_div/floor_mod by zero are IEEE (inf or NaN).
- float floor_div and floor_mod are NumPy's (Python's) float32 divmod, so x = y *
  floor_div + floor_mod up to rounding; mod is C's fmodf (exact).
- shift counts: a negative count shifts by 0; right_shift is arithmetic, floor(x / 2^y),
  also for y >= 31 (0 or -1); left_shift's precision rule p_x + 2^(p_y-1) - 1 keeps every
  count below 32 and the result exact (x * 2^y).
- integer pow: x^y exactly for y >= 0 (0^0 = 1); for y < 0 it is trunc(1 / x^|y|): 1 or
  -1 for x = +-1, else 0 (0^-k = 0, as x / 0 = 0).
- round: halves away from zero, copysign(floor(|x| + 0.5), x) (the spec's formula, whose
  `+` after sgn(x) is a typo for a product; -0.3 rounds to -0); trunc rounds toward zero.
- max/min (binary and reduce) on floats are IEEE 754-2019 maximum/minimum: NaN if any
  operand is NaN, and -0 < +0; every combining order gives the same bits.
- reduce: `dim = []` reduces every axis (CINN's and CVM's reading); reducing every axis
  without keep_dim gives shape [1].
- reshape: at most one -1 (inferred); 0 and other negatives are errors.
- slice: 0 <= start < end <= extent per sliced axis, as the spec says (no clamping).
- broadcast_to: broadcast_axes maps input axis i to output axis broadcast_axes[i]; the map
  is strictly increasing and each input extent is 1 or the output's.
- transpose: `axis` permutes the leading len(axis) axes (a full permutation when it has
  the input's rank); [] is the identity. reverse: `axis` lists distinct axes; [] is the
  identity.
- dot: NumPy's dot for ranks 1 and 2 ([M, K] x [K, N] -> [M, N], [M, K] x [K] -> [M],
  [K] x [K, N] -> [N]), and [K] x [K] -> [1] (CINN has no rank-0 results).
- bn_mean_variance(x) = (sum x, sum x^2) and bn_grad_bias_scale(x, grad, save_mean) =
  (sum grad, sum grad * (x - save_mean)) over every axis but the channel axis 1 (CINN
  fixes NCHW: axes 0, 2, 3), float32 only as in CINN; results have shape [C].
- compare kinds are eq, ne, ge, gt, le, lt (the spec's kEq ... kLt); on NaN every kind is
  false except ne.
- const_scalar: a Python int is an integer (its precision the smallest that holds it), a
  float a float32, a bool a logical; shape [] (rank 0).
"""
from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np

from cvmc.ops.broadcast import broadcast_shapes, np_div, np_operands, te_broadcast, te_div
from cvmc.ops.common import bitlen, no_arith, prec_max
from cvmc.ops.nnef_math import (
    FORMULAS,
    TRANSCENDENTAL_ULP,
    extern,
    te_fn,
    te_ne,
    te_select,
)
from cvmc.ops.registry import Attr, Fusion, OpDef, lookup, op

_ELEMWISE, _BROADCAST = Fusion.ELEMWISE, Fusion.BROADCAST


def register(name: str, inputs: Sequence[str], types: str, fusion: Fusion,
             attrs: Sequence[Attr] = (), outputs: Sequence[str] = ("out",),
             precision_rule: str = "", aliases: Sequence[str] = (), ulp: int = 0,
             multiply_add: bool = False) -> OpDef:
    """Register `cinn.<name>` (the spec's primitive, snake_case)."""
    return op(f"cinn.{name}", family="cinn", seeds=("cinn",), inputs=inputs, types=types,
              attrs=attrs, outputs=outputs, fusion=fusion, precision_rule=precision_rule,
              aliases=tuple(f"cinn.{a}" for a in aliases), ulp=ulp, multiply_add=multiply_add)


def holding(r: int) -> int:
    """The smallest precision p holding every integer in [-r, r]: r <= 2^(p-1) - 1."""
    return bitlen(r) + 1


def power_precision(m: int, n: int) -> int:
    """Precision of x^y for |x| <= m, 0 <= y <= n (y = 0 gives 1). Exact while the power is
    small enough to compute; beyond, log2 gives the (already too large) bit count."""
    if m <= 1 or n == 0:
        return 2
    if n * m.bit_length() <= 4096:
        return holding(m ** n)
    return int(n * math.log2(m)) + 2


def _p(ins, k: int) -> int:
    """The precision of integer input k."""
    return ins[k].precision


def _is_float(x) -> bool:
    """True for a float array (reference) or float TE tensor / expression (lower)."""
    return str(x.dtype).startswith("float")


def _f32(v: float):
    from cvmc.ops.te import tirx
    return tirx.const(v, "float32")


# ---- element-wise rules ------------------------------------------------------------------
# One entry per op: (NumPy formula, TE expression) for float operands and for integer (or
# logical) ones. NumPy formulas see float32 values as float64 and integers as int64 (the
# interpreter rounds a float result to float32 once); TE ones see float32 / int32 / bool.
Rule = tuple[Callable, Callable]


def _attach(d: OpDef, float_rule: Rule | None, other_rule: Rule | None, name: str) -> None:
    """Attach the shape rule (binary ops broadcast) and reference and lower rules that
    choose by the first input's element type."""
    def pick(x) -> Rule:
        rule = float_rule if _is_float(x) else other_rule
        assert rule is not None, f"{d.name}: no rule for {x.dtype}"  # `types` rejects it
        return rule

    if len(d.inputs) == 1:
        d.shape(lambda ins, a: ins[0].shape)
        d.reference(lambda xs, a: pick(xs[0])[0](xs[0]))

        def lower(xs, a):
            from cvmc.ops.te import elementwise
            return elementwise(xs[0], pick(xs[0])[1], name)
    else:
        d.shape(lambda ins, a: broadcast_shapes(d.name, d.input_names, [t.shape for t in ins]))
        d.reference(lambda xs, a: pick(xs[0])[0](*np_operands(xs)))

        def lower(xs, a):
            return te_broadcast(xs, pick(xs[0])[1], name)
    d.lower(lower)




# -- unary ----------------------------------------------------------------------------------
def _np_erf(x):
    return np.frompyfunc(math.erf, 1, 1)(x).astype(np.float64)


def _np_rsqrt(x):
    # 1 / sqrt(x) as a kernel computes it: two float32 operations, each rounded once
    return np.float32(1) / np.sqrt(x.astype(np.float32))


def _np_round(x):
    # |x| + 0.5 in float64 is exact for float32 x (see nnef_math's round)
    return np.copysign(np.floor(np.abs(x) + 0.5), x)


def _te_round(t, x):
    half_up = t.floor(t.abs(x).astype("float64") + t.const(0.5, "float64")).astype("float32")
    return t.copysign(half_up, x)


def _te_int_sign(t, x):
    return t.Select(x > 0, t.const(1, "int32"), t.Select(x < 0, t.const(-1, "int32"),
                                                         t.const(0, "int32")))


# The C math library's functions (within TRANSCENDENTAL_ULP): NNEF's, and three more
LIBM: dict[str, Rule] = {
    **{n: rule for n, rule in FORMULAS.items() if lookup(n).ulp and len(lookup(n).inputs) == 1},
    "erf": (_np_erf, extern("erff")), "log10": (np.log10, extern("log10f")),
    "log2": (np.log2, extern("log2f")),
}
for _name, _rule in LIBM.items():
    _attach(register(_name, ("x",), "scalar -> scalar", _ELEMWISE, ulp=TRANSCENDENTAL_ULP),
            _rule, None, _name)

FLOAT_ONLY: dict[str, Rule] = {
    # IEEE rounds sqrt correctly, so the float64 result rounded to float32 is the kernel's
    "sqrt": (np.sqrt, te_fn(lambda t, x: t.sqrt(x))),
    "rsqrt": (_np_rsqrt, te_fn(lambda t, x: _f32(1.0) / t.sqrt(x))),
    "floor": (np.floor, te_fn(lambda t, x: t.floor(x))),
    "ceil": (np.ceil, te_fn(lambda t, x: t.ceil(x))),
    "trunc": (np.trunc, te_fn(lambda t, x: t.trunc(x))),
    "round": (_np_round, te_fn(_te_round)),
}
for _name, _rule in FLOAT_ONLY.items():
    _attach(register(_name, ("x",), "scalar -> scalar", _ELEMWISE), _rule, None, _name)

# name: (float rule, integer rule, precision rule text, precision)
NUMERIC_UNARY: dict[str, tuple[Rule, Rule, str, Callable]] = {
    "abs": ((np.abs, FORMULAS["nnef.abs"][1]), (np.abs, te_fn(lambda t, x: t.abs(x))), "p_x",
            lambda ins, a: _p(ins, 0)),
    "negative": ((np.negative, FORMULAS["neg"][1]), (np.negative, lambda x: -x), "p_x",
                 lambda ins, a: _p(ins, 0)),
    # values -1, 0, 1: precision 2, or 1 when x is all zeros (precision 1)
    "sign": ((np.sign, FORMULAS["sign"][1]), (np.sign, te_fn(_te_int_sign)), "min(p_x, 2)",
             lambda ins, a: min(_p(ins, 0), 2)),
}
for _name, (_float, _int, _words, _prec) in NUMERIC_UNARY.items():
    _d = register(_name, ("x",), "numeric -> numeric", _ELEMWISE, precision_rule=_words)
    _d.precision(_prec)
    _attach(_d, _float, _int, _name)

def _classify(np_fn: Callable, tir_name: str, integer_value: bool) -> tuple[Rule, Rule]:
    """Float and integer rules of is_finite / is_inf / is_nan."""
    return ((np_fn, te_fn(lambda t, x: getattr(t, tir_name)(x))),
            (lambda x: np.full(x.shape, integer_value),
             te_fn(lambda t, x: t.const(integer_value, "bool"))))


# An integer is always finite, never infinite nor NaN.
CLASSIFY = {"is_finite": (np.isfinite, "isfinite", True), "is_inf": (np.isinf, "isinf", False),
            "is_nan": (np.isnan, "isnan", False)}
for _name, _how in CLASSIFY.items():
    _attach(register(_name, ("x",), "numeric -> logical", _ELEMWISE), *_classify(*_how), _name)

_identity = register("identity", ("x",), "? -> ?", _ELEMWISE)
_attach(_identity, (np.copy, lambda x: x), (np.copy, lambda x: x), "identity")
_identity.arith(no_arith)  # GOPS: it copies
_attach(register("logical_not", ("x",), "logical -> logical", _ELEMWISE), None,
        (np.logical_not, lambda x: ~x), "logical_not")
# ~x = -x - 1 reaches -2^(p-1), one past precision p's range
_bitwise_not = register("bitwise_not", ("x",), "integer -> integer", _ELEMWISE,
                        precision_rule="p_x + 1")
_bitwise_not.precision(lambda ins, a: _p(ins, 0) + 1)
_attach(_bitwise_not, None, (np.invert, lambda x: ~x), "bitwise_not")


# -- binary ---------------------------------------------------------------------------------
def _nonzero(t, v):
    """v with 0 replaced by 1: a zero divisor would trap (x86 idiv) even in a dead branch."""
    return t.Select(v == 0, t.const(1, "int32"), v)


def _np_int_by_nonzero(fn: Callable) -> Callable:
    """NumPy `fn(a, b)` on integers where b != 0, else 0."""
    return lambda a, b: np.where(b == 0, 0, fn(a, np.where(b == 0, 1, b)))


def _te_int_by_nonzero(fn_name: str) -> Callable:
    """TE `tirx.<fn_name>(u, v)` on integers where v != 0, else 0."""
    return te_fn(lambda t, u, v: t.Select(v == 0, t.const(0, "int32"),
                                        getattr(t, fn_name)(u, _nonzero(t, v))))


def _te_xor(p, q):
    """TE p xor q on logicals (TVM 0.27's LLVM codegen emits a float compare for != on
    bool, which LLVM rejects)."""
    return p.astype("int8") != q.astype("int8")


def _np_float_divmod(which: int) -> Callable:
    """NumPy's float32 floor_divide (0) / remainder (1): the algorithm `_te_float_divmod`
    follows, computed by NumPy in float32 (the inputs are float32 values)."""
    fn = (np.floor_divide, np.remainder)[which]
    return lambda a, b: fn(a.astype(np.float32), b.astype(np.float32))


def _te_float_divmod(which: int) -> Callable:
    """NumPy's npy_divmod in float32 (floor quotient 0, remainder 1): every step one
    correctly rounded float32 operation, so the kernel matches NumPy bit for bit."""
    def expr(t, a, b):
        zero = _f32(0.0)

        def truthy(v):  # C's `if (v)`: NaN is true (TIR's != on floats is ordered)
            return t.Or(t.isnan(v), v != zero)

        mod = t.call_pure_extern("float32", "fmodf", a, b)
        div = (a - mod) / b
        adjust = t.And(truthy(mod), _te_xor((b < zero), (mod < zero)))
        mod = t.Select(adjust, mod + b, t.Select(truthy(mod), mod, t.copysign(zero, b)))
        div = t.Select(adjust, div - _f32(1.0), div)
        floor = t.floor(div)
        floor = t.Select(div - floor > _f32(0.5), floor + _f32(1.0), floor)
        floor = t.Select(truthy(div), floor, t.copysign(zero, a / b))
        # b = 0: the quotient is a / b (inf or NaN); the remainder stays fmodf's NaN
        return t.Select(b == zero, a / b, floor) if which == 0 else mod
    return te_fn(expr)


def _np_fmax(a, b):
    """IEEE 754-2019 maximum: NaN wins, then the larger, +0 over -0."""
    big = np.where(a > b, a, np.where(b > a, b, np.where(np.signbit(a), b, a)))
    return np.where(np.isnan(a), a, np.where(np.isnan(b), b, big))


def _np_fmin(a, b):
    """IEEE 754-2019 minimum: NaN wins, then the smaller, -0 under +0."""
    small = np.where(a < b, a, np.where(b < a, b, np.where(np.signbit(a), a, b)))
    return np.where(np.isnan(a), a, np.where(np.isnan(b), b, small))


def te_fmaxmin(t, a, b, is_max: bool):
    """TE IEEE 754-2019 maximum / minimum (`_np_fmax` / `_np_fmin`)."""
    neg_a = t.reinterpret("int32", a) < t.const(0, "int32")  # sign bit (also of -0)
    if is_max:
        pick = t.Select(a > b, a, t.Select(b > a, b, t.Select(neg_a, b, a)))
    else:
        pick = t.Select(a < b, a, t.Select(b < a, b, t.Select(neg_a, a, b)))
    return t.Select(t.isnan(a), a, t.Select(t.isnan(b), b, pick))


def _np_ipow(x, y):
    """Integer x^y: exact for y >= 0 (0^0 = 1); trunc(1 / x^|y|) for y < 0."""
    negative = np.where(np.abs(x) == 1, np.power(x, np.abs(y) % 2), 0)
    return np.where(y >= 0, np.power(x, np.maximum(y, 0)), negative)


def _te_ipow(t, x, y):
    """Integer x^y by the rule of `_np_ipow`, in int64 with every product clamped to 2^31
    (no overflow for any operands). |x| <= 1 is closed-form for any y; for |x| >= 2 the
    precision rule bounds y below 20, so five square-and-multiply steps reach it."""
    i64 = "int64"
    cap = t.const(1 << 31, i64)
    base = t.abs(x).astype(i64)
    acc = t.const(1, i64)
    for bit in range(5):
        take = ((y >> bit) & 1) == 1
        acc = t.Select(take, t.min(acc * base, cap), acc)
        base = t.min(base * base, cap)
    small = t.abs(x) <= 1
    mag = t.Select(y < 0, t.Select(t.abs(x) == 1, t.const(1, i64), t.const(0, i64)),
                   t.Select(small, t.Select(y == 0, t.const(1, i64), t.abs(x).astype(i64)),
                            t.Select(y >= 32, cap, acc)))
    odd_negative = t.And(x < 0, (y & 1) == 1)
    return t.Select(odd_negative, -mag, mag).astype("int32")


def _pow_precision(ins, a):
    return power_precision(prec_max(_p(ins, 0)), prec_max(_p(ins, 1)))


def _te_left_shift(t, u, v):
    # x * 2^s in int64: shifting a negative int32 left is undefined in C
    s = t.max(v, t.const(0, "int32")).astype("int64")
    return (u.astype("int64") * (t.const(1, "int64") << s)).astype("int32")


def _te_right_shift(t, u, v):
    return u >> t.min(t.max(v, t.const(0, "int32")), t.const(31, "int32"))


def _shift_left_precision(ins, a):
    # |x| <= M, 0 <= y <= N: |x * 2^y| <= M * 2^N
    m, n = prec_max(_p(ins, 0)), prec_max(_p(ins, 1))
    return _p(ins, 0) + n if m else 1


def _max_plus_1(ins, a):
    return max(_p(ins, 0), _p(ins, 1)) + 1


def _max_p(ins, a):
    return max(_p(ins, 0), _p(ins, 1))


# name: (float rule, integer rule, precision words, precision)
NUMERIC_BINARY: dict[str, tuple[Rule, Rule, str, Callable]] = {
    "add": ((np.add, lambda x, y: x + y), (np.add, lambda x, y: x + y), "max(p_x, p_y) + 1",
            _max_plus_1),
    "sub": ((np.subtract, lambda x, y: x - y), (np.subtract, lambda x, y: x - y),
            "max(p_x, p_y) + 1", _max_plus_1),
    "mul": ((np.multiply, lambda x, y: x * y), (np.multiply, lambda x, y: x * y),
            "p_x + p_y", lambda ins, a: _p(ins, 0) + _p(ins, 1)),
    "div": ((np.divide, lambda x, y: x / y), (np_div, te_div),
            "p_x (truncating; x / 0 = 0)", lambda ins, a: _p(ins, 0)),
    "floor_div": ((_np_float_divmod(0), _te_float_divmod(0)),
                  (_np_int_by_nonzero(np.floor_divide), _te_int_by_nonzero("floordiv")),
                  "p_x (floor; x / 0 = 0)", lambda ins, a: _p(ins, 0)),
    "floor_mod": ((_np_float_divmod(1), _te_float_divmod(1)),
                  (_np_int_by_nonzero(np.remainder), _te_int_by_nonzero("floormod")),
                  "p_y (sign of y, |r| < |y|; x mod 0 = 0)", lambda ins, a: _p(ins, 1)),
    "mod": ((np.fmod, extern("fmodf")),
            (_np_int_by_nonzero(np.fmod), _te_int_by_nonzero("truncmod")),
            "min(p_x, p_y) (sign of x; x mod 0 = 0)", lambda ins, a: min(_p(ins, 0), _p(ins, 1))),
    "max": ((_np_fmax, te_fn(lambda t, x, y: te_fmaxmin(t, x, y, True))),
            (np.maximum, te_fn(lambda t, x, y: t.max(x, y))), "max(p_x, p_y)", _max_p),
    "min": ((_np_fmin, te_fn(lambda t, x, y: te_fmaxmin(t, x, y, False))),
            (np.minimum, te_fn(lambda t, x, y: t.min(x, y))), "max(p_x, p_y)", _max_p),
    "power": ((np.power, extern("powf")), (_np_ipow, te_fn(_te_ipow)),
              "bits of (2^(p_x-1) - 1)^(2^(p_y-1) - 1), at least 2", _pow_precision),
}
for _name, (_float, _int, _words, _prec) in NUMERIC_BINARY.items():
    # power's float rule is the C math library's powf
    _d = register(_name, ("x", "y"), "numeric, numeric -> numeric", _BROADCAST,
                  precision_rule=_words, aliases=("pow",) if _name == "power" else (),
                  ulp=TRANSCENDENTAL_ULP if _name == "power" else 0)
    _d.precision(_prec)
    _attach(_d, _float, _int, _name)

# name: (NumPy, TE, precision words, precision). Two's complement: and / xor of values in
# [-(2^(p-1) - 1), 2^(p-1) - 1] reach -2^(p-1) (e.g. -3 & -2 = -4 at p = 3); or stays inside.
INTEGER_BINARY: dict[str, tuple[Callable, Callable, str, Callable]] = {
    "bitwise_and": (np.bitwise_and, lambda x, y: x & y, "max(p_x, p_y) + 1", _max_plus_1),
    "bitwise_or": (np.bitwise_or, lambda x, y: x | y, "max(p_x, p_y)", _max_p),
    "bitwise_xor": (np.bitwise_xor, lambda x, y: x ^ y, "max(p_x, p_y) + 1", _max_plus_1),
    "left_shift": (lambda x, y: x << np.maximum(y, 0), te_fn(_te_left_shift),
                   "p_x + 2^(p_y-1) - 1 (counts < 0 shift by 0)", _shift_left_precision),
    "right_shift": (lambda x, y: x >> np.clip(y, 0, 31), te_fn(_te_right_shift),
                    "p_x (arithmetic; counts < 0 shift by 0)", lambda ins, a: _p(ins, 0)),
}
for _name, (_np_fn, _te_fn, _words, _prec) in INTEGER_BINARY.items():
    _d = register(_name, ("x", "y"), "integer, integer -> integer", _BROADCAST,
                  precision_rule=_words)
    _d.precision(_prec)
    _attach(_d, None, (_np_fn, _te_fn), _name)

LOGICAL_BINARY: dict[str, Rule] = {
    "logical_and": (np.logical_and, lambda x, y: x & y),
    "logical_or": (np.logical_or, lambda x, y: x | y),
    "logical_xor": (np.logical_xor, lambda x, y: _te_xor(x, y)),
}
for _name, _rule in LOGICAL_BINARY.items():
    _attach(register(_name, ("x", "y"), "logical, logical -> logical", _BROADCAST), None,
            _rule, _name)


# ---- compare, select ------------------------------------------------------------------
COMPARE_KINDS: dict[str, tuple[Callable, Callable]] = {
    "eq": (np.equal, lambda x, y: x == y), "ne": (np.not_equal, lambda x, y: x != y),
    "ge": (np.greater_equal, lambda x, y: x >= y), "gt": (np.greater, lambda x, y: x > y),
    "le": (np.less_equal, lambda x, y: x <= y), "lt": (np.less, lambda x, y: x < y),
}
compare = register("compare", ("x", "y"), "numeric, numeric -> logical", _BROADCAST,
                   attrs=(Attr("kind", "str", choices=tuple(COMPARE_KINDS)),))
compare.shape(lambda ins, a: broadcast_shapes("cinn.compare", ("x", "y"),
                                              [t.shape for t in ins]))
compare.reference(lambda xs, a: COMPARE_KINDS[a.kind][0](*np_operands(xs)))


@compare.lower
def _compare_lower(xs, a):
    # ne is true on NaN: TIR's != on floats is an ordered compare
    fn = te_ne if a.kind == "ne" and _is_float(xs[0]) else COMPARE_KINDS[a.kind][1]
    return te_broadcast(xs, fn, "compare")


select = register("select", ("condition", "true_value", "false_value"), "logical, ?, ? -> ?",
                  _BROADCAST)
select.shape(lambda ins, a: broadcast_shapes("cinn.select", select.inputs,
                                             [t.shape for t in ins]))
select.reference(lambda xs, a: np.where(*np_operands(xs)))
select.lower(lambda xs, a: te_broadcast(xs, te_select, "select"))

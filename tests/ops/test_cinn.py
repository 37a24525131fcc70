"""CINN primitives (cvmc/ops/cinn.py, cinn_array.py): hand-computed cases for every op and
every edge decision, on the reference interpreter (tests/codegen/op_cases.py compiles the
same edge data and compares the kernels with it)."""
from __future__ import annotations

import numpy as np
import pytest

from cvmc.errors import CvmcError
from cvmc.frontend.nnef import parse_nnef
from cvmc.ops import all_ops, lookup
from tests.oputil import one_op_graph, run_reference

# Every primitive of ../shared/spec/cinn-builder-primitives.txt, written from the spec's
# headings (ConstScalar ... Transpose) in snake_case. Conv is not implemented yet.
SPEC_PRIMITIVES = [
    "const_scalar",
    "abs", "acos", "acosh", "asin", "asinh", "atan", "atanh", "bitwise_not", "ceil", "cos",
    "cosh", "erf", "exp", "floor", "identity", "is_finite", "is_inf", "is_nan", "log",
    "log10", "log2", "logical_not", "negative", "round", "rsqrt", "sign", "sin", "sinh",
    "sqrt", "tan", "tanh", "trunc",
    "add", "bitwise_and", "bitwise_or", "bitwise_xor", "div", "dot", "floor_div",
    "floor_mod", "left_shift", "logical_and", "logical_or", "logical_xor", "max", "min",
    "mod", "mul", "power", "right_shift", "sub",
    "bn_grad_bias_scale", "bn_mean_variance", "broadcast_to", "compare", "concat", "conv",
    "reduce", "reshape", "reverse", "select", "slice", "transpose",
]


def test_every_spec_primitive_is_a_cinn_op():
    cinn = {d.name for d in all_ops() if "cinn" in d.seeds}
    want = {f"cinn.{p}" for p in SPEC_PRIMITIVES}
    assert want - cinn == set(), "spec primitives without a cinn.* op"
    assert cinn - want == set(), "cinn.* ops that are not spec primitives"
    assert all(lookup(n).seeds == ("cinn",) for n in want)
    assert lookup("cinn.pow") is lookup("cinn.power")


def f32(*values) -> tuple[np.ndarray, None]:
    return np.array(values, np.float32), None


def ints(values, precision: int) -> tuple[np.ndarray, int]:
    return np.array(values), precision


def ref(op: str, *inputs, **attrs) -> np.ndarray:
    """The reference result of one op (the first output)."""
    return run_reference(one_op_graph(f"cinn.{op}", list(inputs), attrs),
                         [a for a, _ in inputs])[0]


def refs(op: str, *inputs, **attrs) -> list[np.ndarray]:
    return run_reference(one_op_graph(f"cinn.{op}", list(inputs), attrs),
                         [a for a, _ in inputs])


def precision(op: str, *inputs, **attrs) -> int:
    g = one_op_graph(f"cinn.{op}", list(inputs), attrs)
    return g.types[g.outputs[0]].precision


def same_bits(got: np.ndarray, want) -> bool:
    """Equal values, the same signs of zero, NaN where NaN."""
    want = np.asarray(want, got.dtype)
    return bool(np.all((got == want) & (np.signbit(got) == np.signbit(want))
                       | (np.isnan(got) & np.isnan(want))))


# ---- unary -------------------------------------------------------------------------------
def test_round_halves_away_from_zero():
    got = ref("round", f32(0.5, 1.5, 2.5, -0.5, -2.5, 0.49999997, -0.3, -0.0, 2.4999998,
                          np.nan, -np.inf))
    assert same_bits(got, [1, 2, 3, -1, -3, 0, -0.0, -0.0, 2, np.nan, -np.inf])


def test_trunc_floor_ceil():
    x = f32(2.7, -2.7, -0.5, 0.5)
    assert same_bits(ref("trunc", x), [2, -2, -0.0, 0])
    assert same_bits(ref("floor", x), [2, -3, -1, 0])
    assert same_bits(ref("ceil", x), [3, -2, -0.0, 1])


def test_float_functions():
    assert same_bits(ref("sqrt", f32(4, -1, 0)), [2, np.nan, 0])
    assert same_bits(ref("rsqrt", f32(4, 0, 0.25)), [0.5, np.inf, 2])
    assert same_bits(ref("log2", f32(8, 0.5)), [3, -1])
    assert same_bits(ref("log10", f32(1000, 1)), [3, 0])
    assert same_bits(ref("erf", f32(0, np.inf, -np.inf)), [0, 1, -1])
    assert same_bits(ref("exp", f32(0)), [1])


def test_abs_negative_sign():
    assert same_bits(ref("sign", f32(-3, 0, -0.0, 2, np.nan)), [-1, 0, 0, 1, np.nan])
    assert ref("sign", ints([-5, 0, 7], 8)).tolist() == [-1, 0, 1]
    assert precision("sign", ints([-5, 0, 7], 8)) == 2
    assert precision("sign", ints([0, 0], 1)) == 1
    assert ref("abs", ints([-5, 0, 7], 4)).tolist() == [5, 0, 7]
    assert ref("negative", ints([-5, 0, 7], 4)).tolist() == [5, 0, -7]
    assert precision("negative", ints([-5], 4)) == 4


def test_bitwise_not_reaches_one_past_the_precision():
    assert ref("bitwise_not", ints([0, 5, -6, 127], 8)).tolist() == [-1, -6, 5, -128]
    assert precision("bitwise_not", ints([127], 8)) == 9  # -128 does not fit precision 8


def test_classify():
    x = f32(1, np.inf, -np.inf, np.nan)
    assert ref("is_finite", x).tolist() == [True, False, False, False]
    assert ref("is_inf", x).tolist() == [False, True, True, False]
    assert ref("is_nan", x).tolist() == [False, False, False, True]
    assert ref("is_finite", ints([3, -3], 3)).tolist() == [True, True]
    assert ref("is_nan", ints([3], 3)).tolist() == [False]
    assert ref("logical_not", (np.array([True, False]), None)).tolist() == [False, True]


def test_identity_keeps_type_and_precision():
    assert ref("identity", ints([3, -3], 3)).tolist() == [3, -3]
    assert precision("identity", ints([3], 5)) == 5


# ---- binary -------------------------------------------------------------------------------
X = ints([7, -7, 7, -7, 5, 0, -5], 4)
Y = ints([2, 2, -2, -2, 0, 3, 0], 3)


@pytest.mark.parametrize("op, want, prec", [
    ("div", [3, -3, -3, 3, 0, 0, 0], 4),          # truncates; x / 0 = 0
    ("floor_div", [3, -4, -4, 3, 0, 0, 0], 4),    # floors; x / 0 = 0
    ("mod", [1, -1, 1, -1, 0, 0, 0], 3),          # C: the sign of x; x % 0 = 0
    ("floor_mod", [1, 1, -1, -1, 0, 0, 0], 3),    # the sign of y; x mod 0 = 0
])
def test_integer_division_family(op, want, prec):
    assert ref(op, X, Y).tolist() == want
    assert precision(op, X, Y) == prec


def test_float_division_family():
    x, y = f32(7.5, -7.5, 1.0, 1.0, 4.0, -4.0, 0.0), f32(2, 2, 0, -0.0, -2, 2, 0)
    assert same_bits(ref("div", x, y), [3.75, -3.75, np.inf, -np.inf, -2, -2, np.nan])
    assert same_bits(ref("floor_div", x, y), [3, -4, np.inf, -np.inf, -2, -2, np.nan])
    assert same_bits(ref("floor_mod", x, y), [1.5, 0.5, np.nan, np.nan, -0.0, 0, np.nan])
    assert same_bits(ref("mod", x, y), [1.5, -1.5, np.nan, np.nan, 0, -0.0, np.nan])


def test_float_max_min_are_ieee_2019():
    x, y = f32(np.nan, 1, -0.0, 0.0, 2), f32(1, np.nan, 0.0, -0.0, -3)
    assert same_bits(ref("max", x, y), [np.nan, np.nan, 0.0, 0.0, 2])
    assert same_bits(ref("min", x, y), [np.nan, np.nan, -0.0, -0.0, -3])
    assert ref("max", ints([-3, 4], 4), ints([2], 6)).tolist() == [2, 4]
    assert precision("max", ints([-3, 4], 4), ints([2], 6)) == 6


def test_arithmetic_precisions_and_broadcasting():
    a, b = ints([[1], [-2]], 8), ints([3, 4, 5], 6)
    assert ref("add", a, b).tolist() == [[4, 5, 6], [1, 2, 3]]
    assert precision("add", a, b) == 9
    assert ref("sub", a, b).tolist() == [[-2, -3, -4], [-5, -6, -7]]
    assert ref("mul", a, b).tolist() == [[3, 4, 5], [-6, -8, -10]]
    assert precision("mul", a, b) == 14
    with pytest.raises(CvmcError, match=r"cinn.mul 'y0': precision of 'y0' would be 33"):
        one_op_graph("cinn.mul", [ints([1], 17), ints([1], 16)])


def test_integer_power():
    x = ints([2, -2, 3, 0, 0, 1, -1, -1, 2, 0, -3], 3)
    y = ints([3, 3, 0, 0, 2, -5, -3, -2, -1, -1, 1], 4)
    assert ref("power", x, y).tolist() == [8, -8, 1, 1, 0, 1, -1, 1, 0, 0, -3]
    assert precision("power", x, y) == 13  # |x| <= 3, y <= 7: 3^7 = 2187 needs 13 bits
    # x in {-1, 0, 1}: any exponent (the bound is 1)
    assert ref("power", ints([-1, 1, 0], 2), ints([2**31 - 1], 32)).tolist() == [-1, 1, 0]
    # 127^7 = 532875860165503, between 2^48 and 2^49: 49 bits and a sign
    with pytest.raises(CvmcError, match=r"cinn.power 'y0': precision of 'y0' would be 50"):
        one_op_graph("cinn.power", [ints([1], 8), ints([1], 4)])


def test_float_power():
    assert same_bits(ref("power", f32(2, -8, 4), f32(10, 1 / 3, -0.5)), [1024, np.nan, 0.5])


def test_shifts():
    assert ref("left_shift", ints([3, -3, 5], 4), ints([2, -1, 0], 3)).tolist() == [12, -3, 5]
    assert precision("left_shift", ints([3], 4), ints([2], 3)) == 7  # 4 + 2^2 - 1
    got = ref("right_shift", ints([-7, 7, -1, 100, -100, 100], 8),
              ints([1, 1, 40, 0, -2, 31], 7))
    assert got.tolist() == [-4, 3, -1, 100, -100, 0]  # floor(x / 2^y); y < 0 shifts by 0
    assert precision("right_shift", ints([1], 8), ints([1], 7)) == 8
    with pytest.raises(CvmcError, match=r"cinn.left_shift 'y0': precision of 'y0' would be 38"):
        one_op_graph("cinn.left_shift", [ints([1], 7), ints([1], 6)])  # 7 + 31


def test_bitwise():
    x, y = ints([-3, 5, 1, 3], 4), ints([-2, -8, -3, 1], 5)
    assert ref("bitwise_and", x, y).tolist() == [-4, 0, 1, 1]
    assert ref("bitwise_or", x, y).tolist() == [-1, -3, -3, 3]
    assert ref("bitwise_xor", x, y).tolist() == [3, -3, -4, 2]
    assert precision("bitwise_and", ints([-3], 3), ints([-2], 3)) == 4  # -3 & -2 = -4
    assert precision("bitwise_or", x, y) == 5
    assert precision("bitwise_xor", x, y) == 6


def test_logical():
    a, b = (np.array([True, True, False, False]), None), (np.array([True, False, True, False]),
                                                         None)
    assert ref("logical_and", a, b).tolist() == [True, False, False, False]
    assert ref("logical_or", a, b).tolist() == [True, True, True, False]
    assert ref("logical_xor", a, b).tolist() == [False, True, True, False]


@pytest.mark.parametrize("kind, want", [
    ("eq", [False, True, False, False]), ("ne", [True, False, True, True]),
    ("ge", [False, True, True, False]), ("gt", [False, False, True, False]),
    ("le", [True, True, False, False]), ("lt", [True, False, False, False]),
])
def test_compare_kinds_and_nan(kind, want):
    assert ref("compare", f32(1, 2, 3, np.nan), f32(2, 2, 2, np.nan), kind=kind).tolist() == want


def test_select_broadcasts_and_keeps_the_widest_precision():
    cond = (np.array([[True], [False]]), None)
    got = ref("select", cond, ints([1, 2, 3], 4), ints([-9], 8))
    assert got.tolist() == [[1, 2, 3], [-9, -9, -9]]
    assert precision("select", cond, ints([1, 2, 3], 4), ints([-9], 8)) == 8


# ---- dot, reduce, batch-norm statistics ----------------------------------------------------
def test_dot_shapes_and_values():
    assert ref("dot", ints([[1, 2], [3, 4]], 4), ints([[5], [6]], 4)).tolist() == [[17], [39]]
    assert ref("dot", ints([1, 2], 4), ints([[1, 2, 3], [4, 5, 6]], 4)).tolist() == [9, 12, 15]
    assert ref("dot", ints([[1, 2]], 4), ints([3, 4], 4)).tolist() == [11]
    assert ref("dot", f32(1, 2, 3), f32(4, 5, 6)).tolist() == [32.0]  # [K] x [K] -> [1]
    assert precision("dot", ints([[1, 2]], 4), ints([3, 4], 5)) == 9  # 2 * 7 * 15 = 210
    with pytest.raises(CvmcError, match=r"last extent 2 must equal y's first 3"):
        one_op_graph("cinn.dot", [ints([1, 2], 4), ints([1, 2, 3], 4)])
    with pytest.raises(CvmcError, match=r"rank 1 or 2"):
        one_op_graph("cinn.dot", [ints([[[1]]], 4), ints([1], 4)])


M = ints([[1, 2, 3], [4, 5, 6]], 4)


@pytest.mark.parametrize("kind, dim, keep, want, prec", [
    ("sum", [1], False, [6, 15], 6),          # 3 * 7 = 21: 6 bits
    ("prod", [1], False, [6, 120], 10),       # 7^3 = 343: 10 bits
    ("max", [0], False, [4, 5, 6], 4),
    ("min", [0], True, [[1, 2, 3]], 4),
    ("sum", [], False, [21], 7),              # every axis; shape [1]; 6 * 7 = 42
    ("sum", [], True, [[21]], 7),
])
def test_reduce(kind, dim, keep, want, prec):
    assert ref("reduce", M, kind=kind, dim=dim, keep_dim=keep).tolist() == want
    assert precision("reduce", M, kind=kind, dim=dim, keep_dim=keep) == prec


def test_float_reduce_max_min_zeros_and_nan():
    x = f32([-0.0, 0.0], [-0.0, -0.0], [1.0, np.nan], [0.0, 0.0])
    assert same_bits(ref("reduce", x, kind="max", dim=[1]), [0.0, -0.0, np.nan, 0.0])
    assert same_bits(ref("reduce", x, kind="min", dim=[1]), [-0.0, -0.0, np.nan, 0.0])


def test_reduce_rejects_bad_dims():
    with pytest.raises(CvmcError, match=r"'dim' must be in range \[0,2\), found \[2\]"):
        one_op_graph("cinn.reduce", [M], {"kind": "sum", "dim": [2]})
    with pytest.raises(CvmcError, match=r"must be unique"):
        one_op_graph("cinn.reduce", [M], {"kind": "sum", "dim": [1, 1]})


def test_bn_mean_variance():
    x = np.array([[[[1, 2]], [[3, -4]]], [[[5, 6]], [[-7, 8]]]], np.float32)  # [2, 2, 1, 2]
    s, sq = refs("bn_mean_variance", (x, None))
    assert s.tolist() == [14, 0] and sq.tolist() == [66, 138]


def test_bn_grad_bias_scale():
    x = np.array([[[1, 3], [2, 6]]], np.float32)  # [N=1, C=2, 2]
    grad = np.array([[[1, -1], [2, 3]]], np.float32)
    mean = np.array([2, 4], np.float32)
    bias, scale = refs("bn_grad_bias_scale", (x, None), (grad, None), (mean, None))
    assert bias.tolist() == [0, 5]
    assert scale.tolist() == [1 * -1 + -1 * 1, 2 * -2 + 3 * 2]  # sum grad * (x - mean)
    with pytest.raises(CvmcError, match=r"save_mean has shape \[3\], expected \[2\]"):
        one_op_graph("cinn.bn_grad_bias_scale", [(x, None), (grad, None),
                                                 (np.zeros(3, np.float32), None)])


# ---- data movement ------------------------------------------------------------------------
def test_broadcast_to():
    got = ref("broadcast_to", ints([1, 2], 3), out_shape=[2, 2, 3], broadcast_axes=[1])
    assert got.tolist() == [[[1, 1, 1], [2, 2, 2]]] * 2
    g = one_op_graph("cinn.broadcast_to", [(np.zeros(64, np.float32), None)],
                     {"out_shape": [1, 64, 112, 112], "broadcast_axes": [1]})  # the spec's
    assert g.types["y0"].shape == (1, 64, 112, 112)


@pytest.mark.parametrize("axes, message", [
    ([0, 1], r"must have one entry per input axis"),
    ([3], r"must be in range \[0,3\)"),
    ([2], r"input axis 0 \(extent 2\) maps to output axis 2 \(extent 3\)"),
])
def test_broadcast_to_errors(axes, message):
    with pytest.raises(CvmcError, match=message):
        one_op_graph("cinn.broadcast_to", [ints([1, 2], 3)],
                     {"out_shape": [2, 2, 3], "broadcast_axes": axes})


def test_broadcast_axes_must_increase():
    with pytest.raises(CvmcError, match=r"strictly increasing"):
        one_op_graph("cinn.broadcast_to", [ints([[1, 2]], 3)],
                     {"out_shape": [2, 2], "broadcast_axes": [1, 0]})


def test_concat():
    got = ref("concat", ints([[1], [2]], 3), ints([[3, 4], [5, 6]], 5), axis=1)
    assert got.tolist() == [[1, 3, 4], [2, 5, 6]]
    assert precision("concat", ints([[1]], 3), ints([[3]], 5)) == 5
    with pytest.raises(CvmcError, match=r"input 1 has shape \[1, 2\], expected the shape of "
                                        r"input 0 \[1, 1\] on every axis but 0"):
        one_op_graph("cinn.concat", [ints([[1]], 3), ints([[1, 2]], 3)])


def test_reshape():
    x = ints(np.arange(6).reshape(2, 3), 4)
    assert ref("reshape", x, shape=[3, -1]).tolist() == [[0, 1], [2, 3], [4, 5]]
    for shape, message in (([-1, -1], "more than one -1"), ([0, 6], "positive extents"),
                           ([4, -1], "do not divide"), ([7], "holds 7 elements")):
        with pytest.raises(CvmcError, match=message):
            one_op_graph("cinn.reshape", [x], {"shape": shape})


def test_reverse():
    x = ints(np.arange(6).reshape(2, 3), 4)
    assert ref("reverse", x, axis=[1]).tolist() == [[2, 1, 0], [5, 4, 3]]
    assert ref("reverse", x, axis=[0, 1]).tolist() == [[5, 4, 3], [2, 1, 0]]
    assert ref("reverse", x, axis=[]).tolist() == [[0, 1, 2], [3, 4, 5]]


def test_slice():
    x = ints(np.arange(12).reshape(3, 4), 5)
    got = ref("slice", x, axes=[1, 0], starts=[1, 2], ends=[3, 3])
    assert got.tolist() == [[9, 10]]
    for starts, ends in (([2], [2]), ([0], [5]), ([-1], [2])):
        with pytest.raises(CvmcError, match=r"must satisfy 0 <= start < end <= 4"):
            one_op_graph("cinn.slice", [x], {"axes": [1], "starts": starts, "ends": ends})


def test_transpose():
    x = ints(np.arange(6).reshape(1, 2, 3), 4)
    assert ref("transpose", x, axis=[2, 0, 1]).tolist() == [[[0, 3]], [[1, 4]], [[2, 5]]]
    assert ref("transpose", x, axis=[1, 0]).tolist() == [[[0, 1, 2]], [[3, 4, 5]]]
    with pytest.raises(CvmcError, match=r"permutation of \[0..1\]"):
        one_op_graph("cinn.transpose", [x], {"axis": [0, 2]})


def test_const_scalar():
    for value, dtype, prec in ((5, "int8", 4), (-(2**31 - 1), "int32", 32), (0.25, "float32", None),
                               (True, "bool", None)):
        g = one_op_graph("cinn.const_scalar", [], {"value": value})
        assert g.types["y0"].dtype == dtype and g.types["y0"].precision == prec
        assert ref("const_scalar", value=value).tolist() == value
    with pytest.raises(CvmcError, match=r"integer value 2147483648 does not fit int32"):
        one_op_graph("cinn.const_scalar", [], {"value": 2**31})
    with pytest.raises(CvmcError, match=r"not a finite float32"):
        one_op_graph("cinn.const_scalar", [], {"value": 1e39})


# ---- element types ------------------------------------------------------------------------
@pytest.mark.parametrize("op, inputs, message", [
    ("exp", [ints([1], 4)], r"input 'x0' must be a tensor<scalar>, got a tensor<integer>"),
    ("add", [(np.array([True]), None)] * 2,
     r"input 'x0' must be a tensor<scalar> or tensor<integer>, got a tensor<logical>"),
    ("add", [ints([1], 4), f32(1.0)], r"generic inputs must all have one element type"),
    ("bitwise_and", [f32(1.0), f32(1.0)], r"must be a tensor<integer>, got a tensor<scalar>"),
    ("logical_or", [ints([1], 4)] * 2, r"must be a tensor<logical>, got a tensor<integer>"),
])
def test_element_types_are_checked(op, inputs, message):
    with pytest.raises(CvmcError, match=message):
        one_op_graph(f"cinn.{op}", inputs)


# ---- text -----------------------------------------------------------------------------------
TEXT = """version 1.0;
graph g( a, b ) -> ( q, c )
{
    a = external<integer>(shape = [3], precision = 8);
    b = external<integer>(shape = [3], precision = 4);
    q = cinn.floor_div(a, b);
    c = cinn.compare(q, 0, kind = 'lt');
}
"""


def test_text_calls_cinn_ops_by_namespaced_names():
    g = parse_nnef(TEXT)
    assert [n.op for n in g.nodes] == ["cinn.floor_div", "cinn.compare"]
    assert g.types["c"].dtype == "bool"
    from cvmc.reference import reference_run
    out = reference_run(g, {"a": np.array([7, -7, 5]), "b": np.array([2, 2, 0])})
    assert out["q"].tolist() == [3, -4, 0] and out["c"].tolist() == [False, True, False]


@pytest.mark.parametrize("call, message", [
    ("cinn.flor_div(a, b)", (r"t.nnef:6:9: error: unknown operation 'cinn.flor_div'; did "
                             r"you mean 'cinn.floor_div'")),
    ("nnef.max(a, b)", (r"unknown operation 'nnef.max'; call NNEF standard operations by "
                        r"their names \('max'\)")),
    ("cinn.reshape(a, shape = [2, -1])", r"cinn.reshape 'q': the input's 3 elements"),
])
def test_text_errors_name_the_op(call, message):
    text = ("version 1.0;\ngraph g( a, b ) -> ( q )\n{\n"
            "    a = external<integer>(shape = [3], precision = 8);\n"
            "    b = external<integer>(shape = [3], precision = 4);\n"
            f"    q = {call};\n}}\n")
    with pytest.raises(CvmcError, match=message):
        parse_nnef(text, "t.nnef")


def test_an_integer_literal_is_a_scalar_where_the_op_takes_one():
    g = parse_nnef("version 1.0;\ngraph g( x, i ) -> ( y, j, z )\n{\n"
                   "    x = external<scalar>(shape = [2]);\n"
                   "    i = external<integer>(shape = [2], precision = 8);\n"
                   "    y = cinn.mul(x, 2);\n    j = cinn.mul(i, 2);\n    z = add(x, 1);\n}\n")
    # the literal's element kind (an integer one is stored by its precision: int8 here)
    literals = {n.outputs[0]: "integer" if g.types[n.inputs[1]].is_integer
                else g.types[n.inputs[1]].dtype for n in g.nodes}
    assert literals == {"y": "float32", "j": "integer", "z": "float32"}
    from cvmc.reference import reference_run
    out = reference_run(g, {"x": np.array([0.25, -1], np.float32), "i": np.array([3, -4])})
    assert out["y"].tolist() == [0.5, -2] and out["j"].tolist() == [6, -8]
    assert out["z"].tolist() == [1.25, 0]

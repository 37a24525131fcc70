"""NNEF reduce, shape, matmul and update ops: hand-computed cases (spec 4.4, 4.5), the
stated float bound for sums on arbitrary values, and stdlib compounds built on them."""
from __future__ import annotations

import numpy as np
import pytest

import cvmc
from cvmc.frontend.nnef import parse_nnef
from tests.oputil import check_op, one_op_graph, run_compiled_llvm, run_reference

F = np.float32


def ref(op, inputs, attrs, out_dtype="int32"):
    g = one_op_graph(op, inputs, attrs, (), out_dtype)
    return run_reference(g, [arr for arr, _ in inputs])


X = np.array([[1, 5, 2], [7, -3, 7]], F)


@pytest.mark.parametrize("op, attrs, want", [
    ("sum_reduce", {"axes": [1]}, [[8], [11]]),
    ("sum_reduce", {"axes": [0, 1], "normalize": True}, [[19 / 6]]),
    ("max_reduce", {"axes": [0]}, [[7, 5, 7]]),
    ("min_reduce", {"axes": [1]}, [[1], [-3]]),
    ("argmax_reduce", {"axes": [1]}, [[1], [0]]),       # row 2: 7 twice -> first
    ("argmin_reduce", {"axes": [0, 1]}, [[4]]),         # flat index of -3
])
def test_reductions_by_hand(op, attrs, want):
    got = ref(op, [(X, None)], attrs)[0]
    assert np.array_equal(got, np.array(want, got.dtype)), got


def test_arg_reductions_with_nan_and_all_minus_infinity():
    x = np.array([[2.0, np.nan, 5.0, np.nan], [-np.inf, -np.inf, -np.inf, -np.inf]], F)
    assert ref("argmax_reduce", [(x, None)], {"axes": [1]})[0].ravel().tolist() == [1, 0]
    assert ref("argmin_reduce", [(x, None)], {"axes": [1]})[0].ravel().tolist() == [1, 0]
    assert np.isnan(ref("max_reduce", [(x, None)], {"axes": [1]})[0][0, 0])


def test_max_and_min_reduce_order_signed_zeros():
    # IEEE 754-2019 maximum / minimum: -0 < +0 in either order (np.max leaves the sign of
    # equal zeros open, and the kernel kept the first: [-0, +0] gave -0 against +0)
    x = np.array([[-0.0, 0.0], [0.0, -0.0], [-0.0, -0.0]], F)
    (top,) = check_op("max_reduce", [(x, None)], {"axes": [1]})
    (low,) = check_op("min_reduce", [(x, None)], {"axes": [1]})
    assert np.signbit(top.ravel()).tolist() == [False, False, True]
    assert np.signbit(low.ravel()).tolist() == [True, True, True]


def test_matmul_by_hand():
    a = np.array([[1, 2], [3, 4]], F)
    b = np.array([[5, 6], [7, 8]], F)
    assert ref("matmul", [(a, None), (b, None)], {})[0].tolist() == [[19, 22], [43, 50]]
    assert ref("matmul", [(a, None), (b, None)], {"transposeA": True})[0].tolist() == \
        [[26, 30], [38, 44]]


@pytest.mark.parametrize("op, attrs, want", [
    ("nnef.slice", {"axes": [1], "begin": [2], "end": [0], "stride": [-1]}, [[2, 5], [7, -3]]),
    ("nnef.slice", {"axes": [1], "begin": [-2], "end": [0]}, [[5, 2], [-3, 7]]),
    ("nnef.transpose", {"axes": [1, 0]}, [[1, 7], [5, -3], [2, 7]]),
    ("nnef.tile", {"repeats": [1, 2]}, [[1, 5, 2, 1, 5, 2], [7, -3, 7, 7, -3, 7]]),
    ("pad", {"padding": [(0, 0), (2, 1)], "border": "reflect"},
     [[2, 5, 1, 5, 2, 5], [7, -3, 7, -3, 7, -3]]),
    ("pad", {"padding": [(0, 0), (2, 1)], "border": "reflect-even"},
     [[5, 1, 1, 5, 2, 2], [-3, 7, 7, -3, 7, 7]]),
    ("pad", {"padding": [(1, 0), (0, -1)], "border": "constant", "value": 9.0},
     [[9, 9], [1, 5], [7, -3]]),
    ("pad", {"padding": [(0, 0), (1, 1)], "border": "replicate"},
     [[1, 1, 5, 2, 2], [7, 7, -3, 7, 7]]),
])
def test_shape_ops_by_hand(op, attrs, want):
    got = ref(op, [(X, None)], attrs)[0]
    assert got.tolist() == want


def test_gather_counts_negative_indices_from_the_end_and_clamps():
    idx = np.array([2, -1, 5, -7])
    got = ref("gather", [(X, None), (idx, 4)], {"axis": 1})[0]
    assert got.tolist() == [[2, 2, 2, 1], [7, 7, 7, 7]]


def test_concat_split_stack_unstack_by_hand():
    a, b = np.array([[1, 2]], F), np.array([[3, 4], [5, 6]], F)
    assert ref("concat", [(a, None), (b, None)], {"axis": 0})[0].tolist() == \
        [[1, 2], [3, 4], [5, 6]]
    parts = ref("split", [(np.arange(6, dtype=F).reshape(1, 6), None)],
                {"axis": 1, "ratios": [1, 2]})
    assert [p.tolist() for p in parts] == [[[0, 1]], [[2, 3, 4, 5]]]
    assert ref("stack", [(a, None), (a * 2, None)], {"axis": 2})[0].tolist() == \
        [[[1, 2], [2, 4]]]
    assert [p.tolist() for p in ref("unstack", [(b, None)], {"axis": 0})] == [[3, 4], [5, 6]]


def test_pad_reflection_beyond_one_edge_is_refused():
    with pytest.raises(cvmc.CvmcError, match="border 'reflect' is defined for one reflection"):
        parse_nnef("version 1.0;\ngraph G(x) -> (y) { x = external(shape = [1, 3]); "
                   "y = pad(x, padding = [(0, 0), (3, 0)], border = 'reflect'); }")


def test_pad_with_border_ignore_is_refused():
    # 'ignore' gives padded positions no value: the reference read x[-1] (NumPy wraps) or
    # raised IndexError, the kernel read outside its input
    with pytest.raises(cvmc.CvmcError, match="border 'ignore' leaves the padding without"):
        parse_nnef("version 1.0;\ngraph G(x) -> (y) { x = external(shape = [1, 3]); "
                   "y = pad(x, padding = [(0, 0), (1, 1)], border = 'ignore'); }")


def gamma(n: int) -> float:
    u = 2.0**-24
    return n * u / (1 - n * u)


@pytest.mark.parametrize("op, inputs, attrs, k", [
    ("sum_reduce", [np.random.default_rng(1).standard_normal((4, 300)).astype(F)],
     {"axes": [1]}, 300),
    ("sum_reduce", [np.random.default_rng(2).standard_normal((3, 40, 5)).astype(F)],
     {"axes": [1, 2], "normalize": True}, 201),
    ("matmul", [np.random.default_rng(3).standard_normal((3, 128)).astype(F),
                np.random.default_rng(4).standard_normal((128, 5)).astype(F)], {}, 128),
])
def test_sums_are_within_the_stated_bound(op, inputs, attrs, k):
    """|compiled - reference| <= gamma(K + 1) * sum(|terms|) on arbitrary values."""
    g = one_op_graph(op, [(x, None) for x in inputs], attrs)
    want = run_reference(g, inputs)[0].astype(np.float64)
    got = run_compiled_llvm(g, inputs)[0].astype(np.float64)
    abs_graph = one_op_graph(op, [(np.abs(x), None) for x in inputs], attrs)
    magnitude = np.abs(run_reference(abs_graph, [np.abs(x) for x in inputs])[0])
    if attrs.get("normalize"):
        magnitude = magnitude * 1.0
    assert np.all(np.abs(got - want) <= gamma(k + 1) * magnitude + 1e-45)


def test_integer_tensors_move_through_generic_ops_exactly():
    x = (np.array([[100, -300, 2047]]), 12)
    out = check_op("nnef.transpose", [x], {"axes": [1, 0]})
    assert out[0].ravel().tolist() == [100, -300, 2047]

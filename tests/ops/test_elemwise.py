"""Elemwise ops: hand-computed cases, compiled (llvm) vs reference, rule errors."""
from fractions import Fraction
from math import floor

import numpy as np
import pytest

from cvmc.errors import CvmcError, OpRuleError
from cvmc.ops import lookup
from tests.oputil import check_op, one_op_graph, run_reference
from tests.oputil import rand_in_precision as rand

MAX32 = 2**31 - 1



def reference_only(op, inputs, attrs):
    """The reference interpreter's outputs for a one-op graph (no compilation)."""
    return run_reference(one_op_graph(op, inputs, attrs), [x for x, _ in inputs])


def clip_py(v: int, p: int) -> int:
    alpha = 2 ** (p - 1) - 1
    return max(-alpha, min(alpha, v))


# ---- cvm_precision ---------------------------------------------------------------------
def test_cvm_precision_hand_computed():
    x = np.array([0, 1, 2, 3, -4, 2**30, MAX32, -MAX32, 7, 8, -1])
    (y,) = check_op("cvm_precision", [(x, 32)])
    assert np.array_equal(y, [1, 1, 2, 2, 3, 31, 31, 31, 3, 4, 1])


@pytest.mark.parametrize("p", [1, 8, 20, 32])
def test_cvm_precision_matches_python_bit_length(p):
    x = rand(np.random.default_rng(p), (3, 50), p)
    (y,) = check_op("cvm_precision", [(x, p)])
    expect = [[max(abs(int(v)).bit_length(), 1) for v in row] for row in x]
    assert np.array_equal(y, expect)
    assert one_op_graph("cvm_precision", [(x, p)]).types["y0"].precision == 6


# ---- abs, negative ---------------------------------------------------------------------
def test_abs_and_negative_extremes():
    x = np.array([-MAX32, -1, 0, 1, MAX32])
    (a,) = check_op("abs", [(x, 32)])
    (n,) = check_op("negative", [(x, 32)])
    assert np.array_equal(a, [MAX32, 1, 0, 1, MAX32])
    assert np.array_equal(n, [MAX32, 1, 0, -1, -MAX32])


@pytest.mark.parametrize("op", ["abs", "negative"])
@pytest.mark.parametrize("shape, p", [((7,), 3), ((2, 3, 5), 8), ((1, 4, 1, 3), 9), ((3, 4), 32)])
def test_unary_compiled_matches_reference(op, shape, p):
    x = rand(np.random.default_rng(p), shape, p)
    (y,) = check_op(op, [(x, p)])
    assert y.dtype == (np.int8 if p <= 8 else np.int32)
    assert np.array_equal(y, np.abs(x) if op == "abs" else -x)


# ---- elemwise_add, elemwise_sub --------------------------------------------------------
def test_elemwise_add_sub_hand_computed():
    a = np.array([[1, -2], [MAX32 // 2, -(MAX32 // 2)]])
    b = np.array([[3, 4], [MAX32 // 2, MAX32 // 2]])
    (s,) = check_op("elemwise_add", [(a, 31), (b, 31)])
    (d,) = check_op("elemwise_sub", [(a, 31), (b, 31)])
    assert np.array_equal(s, [[4, 2], [MAX32 - 1, 0]])
    assert np.array_equal(d, [[-2, -6], [0, -(MAX32 - 1)]])
    g = one_op_graph("elemwise_add", [(a, 31), (b, 5)])
    assert g.types["y0"].precision == 32


@pytest.mark.parametrize("op", ["elemwise_add", "elemwise_sub"])
@pytest.mark.parametrize("shape, pa, pb", [((7,), 7, 3), ((2, 3, 5), 8, 8), ((1, 4, 1, 3), 12, 31)])
def test_elemwise_binary_compiled_matches_reference(op, shape, pa, pb):
    rng = np.random.default_rng(pa * 100 + pb)
    a, b = rand(rng, shape, pa), rand(rng, shape, pb)
    (y,) = check_op(op, [(a, pa), (b, pb)])
    assert np.array_equal(y, a + b if op == "elemwise_add" else a - b)


def test_elemwise_add_shape_mismatch():
    with pytest.raises(OpRuleError, match=r"elemwise_add: rhs has shape \(3, 2\), expected "
                                          r"the lhs shape \(2, 3\)"):
        one_op_graph("elemwise_add", [(np.zeros((2, 3), np.int64), 4),
                                      (np.zeros((3, 2), np.int64), 4)])


def test_elemwise_sub_precision_overflow():
    x = np.zeros((2,), np.int64)
    with pytest.raises(CvmcError, match=r"elemwise_sub 'y0': precision of 'y0' would be 33"):
        one_op_graph("elemwise_sub", [(x, 32), (x, 1)])


# ---- clip, cvm_clip --------------------------------------------------------------------
def test_clip_bounds_are_inclusive():
    x = np.array([-9, -8, -7, 0, 99, 100, 101])
    (y,) = check_op("clip", [(x, 8)], {"a_min": -8, "a_max": 100})
    assert np.array_equal(y, [-8, -8, -7, 0, 99, 100, 100])


@pytest.mark.parametrize("a_min, a_max, want", [
    (-8, 100, 8),              # numprec(100) = bitlen(101) + 1 = 7 + 1
    (-3, 2, 4),                # numprec(3) = bitlen(4) + 1 = 3 + 1
    (5, 127, 9),               # numprec(127) = bitlen(128) + 1 = 8 + 1
    (-(2**30 - 1), 0, 32),     # numprec(2^30 - 1) = bitlen(2^30) + 1 = 31 + 1
])
def test_clip_precision(a_min, a_max, want):
    g = one_op_graph("clip", [(np.zeros((3,), np.int64), 8)], {"a_min": a_min, "a_max": a_max})
    assert g.types["y0"].precision == want


@pytest.mark.parametrize("a_min, a_max", [(3, 3), (4, -4)])
def test_clip_rejects_empty_range(a_min, a_max):
    with pytest.raises(OpRuleError, match=rf"clip: attribute 'a_min' must be less than "
                                          rf"'a_max' \({a_max}\), got {a_min}"):
        one_op_graph("clip", [(np.zeros((2,), np.int64), 8)], {"a_min": a_min, "a_max": a_max})


def test_clip_rejects_precision_over_32():
    # numprec(2^31 - 1) = bitlen(2^31) + 1 = 33, although the bound itself fits int32
    with pytest.raises(CvmcError, match=r"clip 'y0': precision of 'y0' would be 33"):
        one_op_graph("clip", [(np.zeros((2,), np.int64), 8)], {"a_min": 0, "a_max": MAX32})


def test_cvm_clip_hand_computed():
    x = np.array([-MAX32, -5, -4, -3, 0, 3, 4, MAX32])
    (y,) = check_op("cvm_clip", [(x, 32)], {"precision": 3})
    assert np.array_equal(y, [-3, -3, -3, -3, 0, 3, 3, 3])
    (y,) = check_op("cvm_clip", [(x, 32)], {"precision": 32})
    assert np.array_equal(y, x)


@pytest.mark.parametrize("op, attrs, shape", [
    ("clip", {"a_min": -50, "a_max": 1000}, (7,)),
    ("clip", {"a_min": 7, "a_max": 9}, (2, 3, 5)),
    ("cvm_clip", {"precision": 1}, (1, 4, 1, 3)),
    ("cvm_clip", {"precision": 8}, (2, 3, 5)),
    ("cvm_clip", {"precision": 17}, (7,)),
])
def test_clip_compiled_matches_reference(op, attrs, shape):
    x = rand(np.random.default_rng(len(shape)), shape, 16)
    (y,) = check_op(op, [(x, 16)], attrs)
    lo, hi = (attrs["a_min"], attrs["a_max"]) if op == "clip" else \
        (-(2 ** (attrs["precision"] - 1) - 1), 2 ** (attrs["precision"] - 1) - 1)
    assert np.array_equal(y, np.minimum(np.maximum(x, lo), hi))


# ---- cvm_right_shift -------------------------------------------------------------------
def right_shift_py(v: int, s: int, p: int) -> int:
    """Round half up of v / 2^s (exact rationals), clipped: the spec's T, independently."""
    return clip_py(floor(Fraction(v, 2**s) + Fraction(1, 2)), p)


def test_right_shift_rounds_half_up():
    x = np.array([-3, -5, -1, 1, 3, 5, -2, 2])  # / 2: -1.5 -2.5 -0.5 0.5 1.5 2.5 -1 1
    (y,) = check_op("cvm_right_shift", [(x, 8)], {"precision": 8, "shift_bit": 1})
    assert np.array_equal(y, [-1, -2, 0, 1, 2, 3, -1, 1])


def test_right_shift_no_int32_overflow():
    # CVM-Runtime quirk #1: (x >> 0) + 1 overflows int32 there and gives -1073741823
    x = np.array([MAX32, -MAX32, MAX32 - 1])
    (y,) = check_op("cvm_right_shift", [(x, 32)], {"precision": 31, "shift_bit": 1})
    assert np.array_equal(y, [1073741823, -1073741823, 1073741823])
    (y,) = check_op("cvm_right_shift", [(x, 32)], {"precision": 32, "shift_bit": 1})
    assert np.array_equal(y, [1073741824, -1073741823, 1073741823])


@pytest.mark.parametrize("s", range(1, 33))
def test_right_shift_every_shift_bit(s):
    half = 2 ** (s - 1)
    x = [-MAX32, MAX32, -MAX32 + 1, 0, -1, 1, -half, half, -3 * half, 3 * half,
         -half - 1, -half + 1, half - 1, half + 1, -(2**30), 2**30 - 7]
    x = np.array([v for v in x if abs(v) <= MAX32], dtype=np.int64)
    for p in (32, 5):  # a wide and a clipping output precision (CVM-Runtime quirk #2)
        spec = [clip_py((int(v) // 2 ** (s - 1) + 1) // 2, p) for v in x]
        assert spec == [right_shift_py(int(v), s, p) for v in x]
        attrs = {"precision": p, "shift_bit": s}
        # compile one of the two (alternating with s) to keep the test fast
        run = check_op if (p == 5) == (s % 2 == 0) else reference_only
        (y,) = run("cvm_right_shift", [(x, 32)], attrs)
        assert y.tolist() == spec


@pytest.mark.parametrize("shape, px, p, s", [((7,), 32, 8, 24), ((2, 3, 5), 16, 16, 1),
                                             ((1, 4, 1, 3), 8, 4, 3), ((2, 3, 5), 20, 32, 32)])
def test_right_shift_compiled_matches_reference(shape, px, p, s):
    x = rand(np.random.default_rng(px + s), shape, px)
    (y,) = check_op("cvm_right_shift", [(x, px)], {"precision": p, "shift_bit": s})
    assert y.ravel().tolist() == [right_shift_py(int(v), s, p) for v in x.ravel()]


# ---- cvm_left_shift --------------------------------------------------------------------
def test_left_shift_hand_computed():
    x = np.array([-5, 3, 7, 0])
    (y,) = check_op("cvm_left_shift", [(x, 4)], {"precision": 8, "shift_bit": 3})
    assert np.array_equal(y, [-40, 24, 56, 0])
    (y,) = check_op("cvm_left_shift", [(x, 4)], {"precision": 5, "shift_bit": 3})
    assert np.array_equal(y, [-15, 15, 15, 0])


def test_left_shift_at_the_int32_limit():
    x = np.array([2**29 - 1, -(2**29 - 1), 1])
    (y,) = check_op("cvm_left_shift", [(x, 30)], {"precision": 32, "shift_bit": 2})
    assert np.array_equal(y, [2**31 - 4, -(2**31 - 4), 4])
    (y,) = check_op("cvm_left_shift", [(np.zeros(3, np.int64), 1)],
                    {"precision": 32, "shift_bit": 31})
    assert np.array_equal(y, [0, 0, 0])


@pytest.mark.parametrize("shape, px, p, s", [((7,), 8, 8, 2), ((2, 3, 5), 8, 16, 8),
                                             ((1, 4, 1, 3), 20, 32, 12)])
def test_left_shift_compiled_matches_reference(shape, px, p, s):
    x = rand(np.random.default_rng(px * s), shape, px)
    (y,) = check_op("cvm_left_shift", [(x, px)], {"precision": p, "shift_bit": s})
    assert y.ravel().tolist() == [clip_py(int(v) * 2**s, p) for v in x.ravel()]


def test_left_shift_rejects_wide_input():
    with pytest.raises(CvmcError, match=r"cvm_left_shift 'y0': data precision \+ attribute "
                                        r"'shift_bit' must be <= 32, got 30 \+ 3 = 33"):
        one_op_graph("cvm_left_shift", [(np.zeros(2, np.int64), 30)],
                     {"precision": 32, "shift_bit": 3})


# ---- attribute errors ------------------------------------------------------------------
@pytest.mark.parametrize("op, attrs, message", [
    ("cvm_right_shift", {"precision": 8, "shift_bit": 0}, r"'shift_bit' must be in \[1, 32\]"),
    ("cvm_right_shift", {"precision": 8, "shift_bit": 33}, r"'shift_bit' must be in \[1, 32\]"),
    ("cvm_right_shift", {"precision": 33, "shift_bit": 1}, r"'precision' must be in \[1, 32\]"),
    ("cvm_right_shift", {"precision": 8}, r"missing required attribute 'shift_bit"),
    ("cvm_left_shift", {"precision": 0, "shift_bit": 1}, r"'precision' must be in \[1, 32\]"),
    ("cvm_clip", {}, r"cvm_clip: missing required attribute 'precision"),
    ("clip", {"a_min": 0}, r"clip: missing required attribute 'a_max"),
    ("clip", {"a_min": 0, "a_max": 2**31}, r"'a_max' must be in \[-2147483647, 2147483647\]"),
])
def test_attribute_errors(op, attrs, message):
    with pytest.raises(OpRuleError, match=message):
        lookup(op).normalize_attrs(attrs)

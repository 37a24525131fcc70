"""Broadcast ops: spec example, hand-computed cases, compiled (llvm) vs reference, errors."""
import re
from fractions import Fraction

import numpy as np
import pytest

from cvmc.errors import CvmcError, OpRuleError
from tests.oputil import check_op, one_op_graph
from tests.oputil import rand_in_precision as rand

MAX32 = 2**31 - 1
OPS = ["broadcast_add", "broadcast_sub", "broadcast_mul", "broadcast_div", "broadcast_max",
       "broadcast_greater"]
# right-aligned pairs: equal shapes, 1-dims on either side, different ranks
# (lhs shape, lhs precision, rhs shape, rhs precision): int8 and int32 storage on both sides
CASES = [((2, 3), 8, (2, 3), 8), ((2, 3, 4), 16, (4,), 12), ((3, 1), 8, (2, 1, 5), 16),
         ((1,), 12, (2, 3), 8), ((4, 1, 3), 5, (1, 2, 1), 3), ((2, 1, 1, 3), 16, (5, 1), 16)]



def div_py(a: int, b: int) -> int:
    """Truncating division with x / 0 = 0 (int() of an exact rational truncates)."""
    return 0 if b == 0 else int(Fraction(a, b))


def test_spec_example_broadcast_add():
    x = np.array([[1, 1, 1], [1, 1, 1]])
    y = np.array([[0], [1]])
    (out,) = check_op("broadcast_add", [(x, 2), (y, 2)])
    assert np.array_equal(out, [[1, 1, 1], [2, 2, 2]])


def test_broadcast_div_truncates_and_zero_divisor():
    a = np.array([-7, 7, -7, 7, 5, 0, -MAX32, MAX32, -MAX32, 6])
    b = np.array([2, -2, -2, 2, 0, 0, 1, -1, 0, 3])
    (q,) = check_op("broadcast_div", [(a, 32), (b, 3)])
    assert np.array_equal(q, [-3, -3, 3, 3, 0, 0, -MAX32, -MAX32, 0, 2])


def test_broadcast_div_by_zero_column():
    a = np.array([[-9, 9], [4, -5]])
    b = np.array([[0], [-2]])
    (q,) = check_op("broadcast_div", [(a, 5), (b, 3)])
    assert np.array_equal(q, [[0, 0], [-2, 2]])


def test_broadcast_different_ranks_hand_computed():
    a = np.array([[[1, 2, 3]], [[4, 5, 6]]])  # (2, 1, 3)
    b = np.array([[10, 20, 30], [-1, -2, -3]])  # (2, 3): aligned on the right
    (s,) = check_op("broadcast_sub", [(a, 4), (b, 6)])
    assert s.shape == (2, 2, 3)
    assert np.array_equal(s, [[[-9, -18, -27], [2, 4, 6]], [[-6, -15, -24], [5, 7, 9]]])
    (m,) = check_op("broadcast_max", [(np.array([-5, 7]), 4), (np.array([[-1], [-9]]), 5)])
    assert np.array_equal(m, [[-1, 7], [-5, 7]])
    (p,) = check_op("broadcast_mul", [(np.array([3]), 3), (np.array([[-2, 0, 3]]), 3)])
    assert np.array_equal(p, [[-6, 0, 9]])


def test_broadcast_extremes():
    a = np.array([2**30 - 1, -(2**30 - 1)])  # the extremes of precision 31
    (s,) = check_op("broadcast_add", [(a, 31), (np.array([2**30 - 1]), 31)])
    assert np.array_equal(s, [MAX32 - 1, 0])
    (m,) = check_op("broadcast_mul", [(np.array([-(2**15 - 1)]), 16),
                                      (np.array([2**15 - 1, -(2**15 - 1)]), 16)])
    assert np.array_equal(m, [-(2**15 - 1) ** 2, (2**15 - 1) ** 2])


@pytest.mark.parametrize("op, pa, pb, want", [
    ("broadcast_add", 8, 3, 9), ("broadcast_sub", 4, 12, 13), ("broadcast_mul", 8, 7, 15),
    ("broadcast_div", 9, 20, 9), ("broadcast_max", 5, 11, 11), ("broadcast_max", 11, 5, 11),
])
def test_broadcast_precision(op, pa, pb, want):
    g = one_op_graph(op, [(np.zeros((2, 3), np.int64), pa), (np.zeros((3,), np.int64), pb)])
    assert g.types["y0"].precision == want


def test_broadcast_mul_precision_overflow():
    x = np.zeros((2,), np.int64)
    with pytest.raises(CvmcError, match=r"broadcast_mul 'y0': precision of 'y0' would be 33"):
        one_op_graph("broadcast_mul", [(x, 16), (x, 17)])


@pytest.mark.parametrize("lhs, rhs, dim", [((2, 3), (3, 2), 0), ((4,), (3,), 0),
                                           ((5, 2, 3), (4, 3), 1)])
def test_broadcast_shape_mismatch(lhs, rhs, dim):
    message = (f"broadcast_add: lhs shape {re.escape(str(lhs))} and rhs shape "
               f"{re.escape(str(rhs))} do not broadcast: aligned on the right, dimension {dim} is")
    with pytest.raises(OpRuleError, match=message):
        one_op_graph("broadcast_add", [(np.zeros(lhs, np.int64), 4),
                                       (np.zeros(rhs, np.int64), 4)])


def _oracle(op: str, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """NumPy broadcasting (also right-aligned) with Python-int division."""
    if op == "broadcast_div":
        aa, bb = np.broadcast_arrays(a, b)
        return np.array([div_py(int(u), int(v)) for u, v in zip(aa.ravel(), bb.ravel())]
                        ).reshape(aa.shape)
    fn = {"broadcast_add": np.add, "broadcast_sub": np.subtract,
          "broadcast_mul": np.multiply, "broadcast_max": np.maximum,
          "broadcast_greater": lambda u, v: np.greater(u, v).astype(np.int64)}[op]
    return fn(a, b)


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("sa, pa, sb, pb", CASES)
def test_broadcast_compiled_matches_reference(op, sa, pa, sb, pb):
    rng = np.random.default_rng(pa * 31 + pb)
    a, b = rand(rng, sa, pa), rand(rng, sb, pb)
    (y,) = check_op(op, [(a, pa), (b, pb)])
    assert np.array_equal(y, _oracle(op, a, b))


@pytest.mark.parametrize("op", OPS)
def test_broadcast_with_weight_operand(op):
    rng = np.random.default_rng(7)
    a, w = rand(rng, (2, 4, 3), 8), rand(rng, (4, 1), 6)
    (y,) = check_op(op, [(a, 8), (w, 6)], weights=(1,))
    assert np.array_equal(y, _oracle(op, a, w))


def test_broadcast_greater_cvm_runtime_example():
    """CVM-Runtime's own documentation example (src/top/tensor/broadcast.cc):
    x = [[1, 1, 1], [1, 1, 1]], y = [[0], [1]] -> [[1, 1, 1], [0, 0, 0]]."""
    (y,) = check_op("broadcast_greater", [(np.ones((2, 3), np.int64), 2),
                                          (np.array([[0], [1]]), 2)])
    assert y.tolist() == [[1, 1, 1], [0, 0, 0]]


def test_broadcast_greater_hand_computed_and_precision():
    (y,) = check_op("broadcast_greater", [(np.array([-5, 0, 7, 3]), 4),
                                          (np.array([[-6], [3]]), 5)])
    assert y.tolist() == [[1, 1, 1, 1], [0, 0, 1, 0]]
    # 0 > -1 gives 1, which precision 1 (|v| <= 0) cannot hold: the rule is max(p_a, 2).
    g = one_op_graph("broadcast_greater", [(np.zeros(2, np.int64), 1), (np.array([-1, 0]), 2)])
    assert g.types["y0"].precision == 2
    assert check_op("broadcast_greater", [(np.zeros(2, np.int64), 1),
                                          (np.array([-1, 0]), 2)])[0].tolist() == [1, 0]

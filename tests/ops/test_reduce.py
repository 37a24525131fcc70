"""Reduce ops (sum, max): spec examples, hand-computed cases, compiled vs reference, errors."""
import numpy as np
import pytest

from cvmc.errors import CvmcError, OpRuleError
from cvmc.ops import Attrs, lookup
from tests.oputil import check_op, one_op_graph
from tests.oputil import rand_in_precision as rand

SPEC_DATA = np.array([[[1, 2], [2, 3], [1, 3]],
                      [[1, 4], [4, 3], [5, 2]],
                      [[7, 1], [7, 2], [7, 3]]])



def test_spec_example_sum_axis_1():
    (y,) = check_op("sum", [(SPEC_DATA, 4)], {"axis": 1})
    assert np.array_equal(y, [[4, 8], [10, 9], [21, 6]])


def test_spec_example_sum_axes_1_2():
    (y,) = check_op("sum", [(SPEC_DATA, 4)], {"axis": [1, 2]})
    assert np.array_equal(y, [12, 19, 27])


def test_sum_everything():
    (y,) = check_op("sum", [(SPEC_DATA, 4)])
    assert y.shape == (1,) and y.tolist() == [58]
    (y,) = check_op("sum", [(SPEC_DATA, 4)], {"keepdims": True})
    assert y.shape == (1, 1, 1) and y.tolist() == [[[58]]]
    (y,) = check_op("sum", [(SPEC_DATA, 4)], {"exclude": True})  # R = U - {} = U
    assert y.shape == (1,) and y.tolist() == [58]


def test_sum_exclude_every_axis_is_identity():
    (y,) = check_op("sum", [(SPEC_DATA, 4)], {"axes": [0, 1, 2], "exclude": True})
    assert np.array_equal(y, SPEC_DATA)
    (y,) = check_op("max", [(SPEC_DATA, 4)], {"axes": [2, -2, 0], "exclude": True,
                                              "keepdims": True})
    assert np.array_equal(y, SPEC_DATA)


def test_sum_exclude_and_negative_axes():
    (y,) = check_op("sum", [(SPEC_DATA, 4)], {"axes": [-2], "exclude": True})  # axes 0, 2
    assert np.array_equal(y, [1 + 2 + 1 + 4 + 7 + 1, 2 + 3 + 4 + 3 + 7 + 2, 1 + 3 + 5 + 2 + 7 + 3])
    (y,) = check_op("sum", [(SPEC_DATA, 4)], {"axes": -1, "keepdims": True})
    assert np.array_equal(y, [[[3], [5], [4]], [[5], [7], [7]], [[8], [9], [10]]])


def test_max_all_negative_is_the_true_maximum():
    # CVM-Runtime quirk #3: with no axes it starts from 0 and returns 0 here; spec: -1
    x = -SPEC_DATA
    (y,) = check_op("max", [(x, 4)])
    assert y.shape == (1,) and y.tolist() == [-1]
    (y,) = check_op("max", [(x, 4)], {"axes": [0, 2]})
    assert np.array_equal(y, [-1, -2, -1])
    (y,) = check_op("max", [(np.full((2, 3), -2**30 + 1), 31)], {"axis": 1, "keepdims": True})
    assert np.array_equal(y, [[-2**30 + 1], [-2**30 + 1]])


@pytest.mark.parametrize("attrs, shape, sum_p, cost", [
    ({}, (1,), 8 + 5, 18),                                 # bitlen(18) = 5
    ({"axis": 1}, (3, 2), 8 + 2, 3),                       # bitlen(3) = 2
    ({"axes": [0, 2], "keepdims": True}, (1, 3, 1), 8 + 3, 6),   # bitlen(6) = 3
    ({"axes": [0, 1, 2], "exclude": True}, (3, 3, 2), 8 + 1, 1),  # Y = X, bitlen(1) = 1
    ({"axes": [-1, 0], "exclude": True}, (3, 2), 8 + 2, 3),
])
def test_reduce_shape_precision_and_cost(attrs, shape, sum_p, cost):
    x = np.zeros((3, 3, 2), np.int64)
    g = one_op_graph("sum", [(x, 8)], attrs)
    assert g.types["y0"].shape == shape and g.types["y0"].precision == sum_p
    node = g.nodes[0]
    assert lookup("sum").cost_of([g.types["x0"]], [g.types["y0"]], Attrs(node.attrs)) == cost
    g = one_op_graph("max", [(x, 8)], attrs)
    assert g.types["y0"].shape == shape and g.types["y0"].precision == 8


@pytest.mark.parametrize("op", ["sum", "max"])
@pytest.mark.parametrize("attrs, message", [
    ({"axes": [3]}, r"axis 3 is out of range for a rank-3 tensor \(expected -3..2\)"),
    ({"axis": -4}, r"axis -4 is out of range for a rank-3 tensor"),
    ({"axes": [1, -2]}, r"attribute 'axes' \[1, -2\] names axis 1 more than once"),
    ({"axes": [0, 0], "exclude": True}, r"attribute 'axes' \[0, 0\] names axis 0 more than once"),
])
def test_reduce_axis_errors(op, attrs, message):
    with pytest.raises(OpRuleError, match=rf"{op}: {message}"):
        one_op_graph(op, [(np.zeros((3, 3, 2), np.int64), 8)], attrs)


def test_reduce_attribute_errors():
    with pytest.raises(OpRuleError, match=r"sum: attribute 'keepdims' must be a logical"):
        lookup("sum").normalize_attrs({"keepdims": 1})
    with pytest.raises(OpRuleError, match=r"max: attribute 'axes' given twice"):
        lookup("max").normalize_attrs({"axes": [0], "axis": 1})


def test_sum_precision_overflow():
    with pytest.raises(CvmcError, match=r"sum 'y0': precision of 'y0' would be 34"):
        one_op_graph("sum", [(np.zeros((2, 4), np.int64), 30)])  # 30 + bitlen(8)


# (shape, attrs, the reduced axes R worked out by hand)
CASES = [
    ((2, 3, 4), {"axes": [1]}, (1,)),
    ((2, 3, 4), {"axis": -1, "keepdims": True}, (2,)),
    ((2, 3, 4), {"axes": [0, 2], "exclude": True}, (1,)),
    ((2, 3, 4), {}, (0, 1, 2)),
    ((2, 3, 4), {"keepdims": True}, (0, 1, 2)),
    ((2, 3, 4), {"exclude": True}, (0, 1, 2)),
    ((2, 3, 4), {"axes": [0, 1, 2], "exclude": True}, ()),
    ((7,), {"axes": [0]}, (0,)),
    ((2, 3, 4, 5), {"axes": [3, 0]}, (0, 3)),
    ((2, 3, 4, 5), {"axes": [-3, 2], "keepdims": True}, (1, 2)),
    ((1, 5, 1, 2, 3), {"axes": [1, 3], "exclude": True, "keepdims": True}, (0, 2, 4)),
]


def _oracle(op: str, x: np.ndarray, r: tuple[int, ...], keepdims: bool) -> np.ndarray:
    if not r:
        return x
    y = (np.sum if op == "sum" else np.max)(x, axis=r, keepdims=keepdims)
    return y.reshape(1) if y.ndim == 0 else y


@pytest.mark.parametrize("op", ["sum", "max"])
@pytest.mark.parametrize("shape, attrs, r", CASES)
def test_reduce_compiled_matches_reference(op, shape, attrs, r):
    p = 8 if len(r) % 2 else 16  # int8 and int32 storage
    x = rand(np.random.default_rng(p + len(r)), shape, p)
    (y,) = check_op(op, [(x, p)], attrs)
    assert np.array_equal(y, _oracle(op, x, r, attrs.get("keepdims", False)))


@pytest.mark.parametrize("shape, attrs, r", CASES[:4])
def test_max_all_negative_compiled(shape, attrs, r):
    x = -np.abs(rand(np.random.default_rng(1), shape, 12)) - 1
    (y,) = check_op("max", [(x, 12)], attrs)
    assert np.array_equal(y, _oracle("max", x, r, attrs.get("keepdims", False)))
    assert (y < 0).all()

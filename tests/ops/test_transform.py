"""Transform ops: hand-computed cases, NumPy as an independent oracle, compiled (llvm) vs
reference bit-exact, precision rules and user errors.

The two CVM spec files give no worked examples for these ops; the expected values below are
computed by hand from the spec formulas (readings from cvm-semantics.md).
"""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cvmc.errors import OpRuleError
from cvmc.ir import TensorType
from cvmc.ops import lookup
from tests.oputil import check_op, one_op_graph, run_reference


def _data(shape, precision=8, seed=0):
    """Random integers inside `precision` (|v| <= 2^(p-1) - 1)."""
    bound = 2 ** (precision - 1) - 1
    return np.random.default_rng(seed).integers(-bound, bound + 1, shape, dtype=np.int64)


def _ref(op, arrays, attrs=None, precision=8):
    """Reference output only (no compilation) for inputs of one precision."""
    g = one_op_graph(op, [(np.asarray(x, np.int64), precision) for x in arrays], attrs)
    return run_reference(g, [np.asarray(x, np.int64) for x in arrays])[0]


def _shape(op, shapes, attrs=None):
    d = lookup(op)
    return d.infer_shapes([TensorType(s) for s in shapes], d.normalize_attrs(attrs or {}))[0]


# ---- hand-computed cases, each also compiled -----------------------------------------------
X23 = np.array([[1, 2, 3], [4, 5, 6]])
R5 = np.arange(5)


@pytest.mark.parametrize("op, inputs, attrs, expected", [
    # repeat on the last axis: every element right after itself
    ("repeat", [X23], {"axis": -1, "repeats": 2}, [[1, 1, 2, 2, 3, 3], [4, 4, 5, 5, 6, 6]]),
    ("repeat", [X23], {"axis": 0, "repeats": 2}, [[1, 2, 3], [1, 2, 3], [4, 5, 6], [4, 5, 6]]),
    # tile: reps shorter than the rank tile the last axes, longer ones add leading axes
    ("tile", [X23], {"reps": [2]}, [[1, 2, 3, 1, 2, 3], [4, 5, 6, 4, 5, 6]]),
    ("tile", [np.array([7, 8])], {"reps": [2, 1, 2]}, [[[7, 8, 7, 8]], [[7, 8, 7, 8]]]),
    ("flatten", [np.arange(8).reshape(2, 2, 2)], {}, [[0, 1, 2, 3], [4, 5, 6, 7]]),
    ("flatten", [R5], {}, [[0], [1], [2], [3], [4]]),
    ("reshape", [X23], {"target_shape": [3, 2]}, [[1, 2], [3, 4], [5, 6]]),
    ("reshape", [X23], {"shape": [6]}, [1, 2, 3, 4, 5, 6]),
    # transpose: empty axes reverse; negative axes count from the end
    ("transpose", [X23], {}, [[1, 4], [2, 5], [3, 6]]),
    ("transpose", [np.arange(4).reshape(1, 2, 2)], {"axes": [-1, 0, -2]},
     [[[0, 2]], [[1, 3]]]),
    # slice: negative begin, negative stride, default ends (NumPy x[::-1])
    ("slice", [R5], {"begin": [], "end": [], "strides": [-1]}, [4, 3, 2, 1, 0]),
    ("slice", [R5], {"begin": [-2], "end": []}, [3, 4]),
    ("slice", [R5], {"begin": [-1], "end": [0], "strides": [-2]}, [4, 2]),
    ("slice", [R5], {"begin": [3], "end": [-6], "stride": [-1]}, [3, 2, 1, 0]),
    ("slice", [R5], {"begin": [-100], "end": [100], "strides": [3]}, [0, 3]),
    ("strided_slice", [X23], {"begin": [1, -1], "end": [2, -4], "stride": [1, -1]},
     [[6, 5, 4]]),
    ("slice_like", [X23, np.zeros((1, 2), np.int64)], {}, [[1, 2]]),
    ("slice_like", [X23, np.zeros((5, 2, 9), np.int64)], {"axes": [-1]}, [[1, 2], [4, 5]]),
    # take: indices clipped to [0, n-1]; axis None reads the flattened data
    ("take", [X23, np.array([-3, 0, 5, 99])], {}, [1, 1, 6, 6]),
    ("take", [X23, np.array([[-1, 2], [7, 1]])], {"axis": 1},
     [[[1, 3], [3, 2]], [[4, 6], [6, 5]]]),
    ("take", [X23, np.array([5, -5])], {"axis": -2}, [[4, 5, 6], [1, 2, 3]]),
    ("cvm_lut", [np.array([[0, -2], [9, 4]]), X23], {}, [[1, 1], [6, 5]]),
    ("expand_dims", [np.arange(8).reshape(2, 2, 2)], {"axis": -1},
     np.arange(8).reshape(2, 2, 2, 1)),
    ("squeeze", [np.arange(3).reshape(1, 3, 1)], {}, [0, 1, 2]),
    ("squeeze", [np.arange(3).reshape(1, 3, 1)], {"axis": 0}, [[0], [1], [2]]),
    ("squeeze", [np.array([[[5]]])], {}, [5]),
    # concatenate three inputs with different lengths on the axis
    ("concatenate", [X23, np.array([[7], [8]]), np.array([[9, 10], [11, 12]])], {},
     [[1, 2, 3, 7, 9, 10], [4, 5, 6, 8, 11, 12]]),
    ("concatenate", [np.array([[1]]), np.array([[2], [3]]), np.array([[4]])], {"axis": -2},
     [[1], [2], [3], [4]]),
    ("where", [np.array([[0, 1, 0], [-1, 0, 2]]), X23, -X23], {}, [[-1, 2, -3], [4, -5, 6]]),
    # 1-D condition: whole rows by cond[d0] (not CVM-Runtime's byte-count copy)
    ("where", [np.array([0, 3]), np.arange(8).reshape(2, 4), -np.arange(8).reshape(2, 4)], {},
     [[0, -1, -2, -3], [4, 5, 6, 7]]),
])
def test_hand_computed(op, inputs, attrs, expected):
    (y,) = check_op(op, [(np.asarray(x, np.int64), 8) for x in inputs], attrs)
    assert np.array_equal(y, np.asarray(expected))


@pytest.mark.parametrize("op, shapes, attrs, expected", [
    ("expand_dims", [(2, 3, 4)], {"axis": -1}, (2, 3, 4, 1)),
    ("expand_dims", [(2, 3, 4)], {"axis": -4, "num_newaxis": 2}, (1, 1, 2, 3, 4)),
    ("expand_dims", [(2, 3, 4)], {"axis": 1, "num_newaxis": 0}, (2, 3, 4)),
    ("expand_dims", [(2, 3)], {"axis": 2}, (2, 3, 1)),
    ("squeeze", [(1, 3, 1, 2)], {"axes": [-2]}, (1, 3, 2)),
    ("squeeze", [(1, 1)], {}, (1,)),
    ("tile", [(2, 3)], {"reps": [4, 5, 6]}, (4, 10, 18)),
    ("take", [(2, 3, 4), (5, 6)], {"axis": 1}, (2, 5, 6, 4)),
    ("take", [(2, 3, 4), (5, 6)], {}, (5, 6)),
    ("cvm_lut", [(5, 6), (256,)], {"in_dim": 256}, (5, 6)),
    ("slice", [(10, 8)], {"begin": [1], "end": [-1], "strides": [4, -3]}, (2, 3)),
    ("slice_like", [(4, 5, 6), (2, 9)], {"axis": [0]}, (2, 5, 6)),
])
def test_shapes(op, shapes, attrs, expected):
    assert _shape(op, shapes, attrs) == expected


# ---- NumPy as an independent oracle, and compiled vs reference --------------------------------
def _np_where(c, x, y):
    return np.where((c != 0).reshape(c.shape + (1,) * (x.ndim - c.ndim)), x, y)


ORACLE_CASES = [
    ("repeat", [(2, 3, 4)], {"axis": 1, "repeats": 3}, lambda x: np.repeat(x, 3, axis=1)),
    ("repeat", [(3, 5)], {"axis": -1, "repeats": 2}, lambda x: np.repeat(x, 2, axis=-1)),
    ("tile", [(2, 3, 4)], {"reps": [2, 1, 1, 3]}, lambda x: np.tile(x, (2, 1, 1, 3))),
    ("tile", [(2, 3, 4)], {"reps": [3, 2]}, lambda x: np.tile(x, (3, 2))),
    ("flatten", [(2, 3, 4)], {}, lambda x: x.reshape(2, 12)),
    ("reshape", [(2, 3, 4)], {"target_shape": [4, 1, 6]}, lambda x: x.reshape(4, 1, 6)),
    ("expand_dims", [(2, 3)], {"axis": 1, "num_newaxis": 2},
     lambda x: x.reshape(2, 1, 1, 3)),
    ("squeeze", [(1, 4, 1, 3)], {}, np.squeeze),
    ("squeeze", [(1, 4, 1, 3)], {"axes": [2]}, lambda x: np.squeeze(x, axis=2)),
    ("transpose", [(2, 3, 4)], {"axes": [1, -1, 0]}, lambda x: np.transpose(x, (1, 2, 0))),
    ("transpose", [(2, 3, 4, 5)], {}, np.transpose),
    ("slice", [(6, 7)], {"begin": [1, -2], "end": [5, 0], "strides": [2, -2]},
     lambda x: x[1:5:2, -2:0:-2]),
    ("slice", [(6, 7, 3)], {"begin": [-1], "end": [], "strides": [-1]}, lambda x: x[::-1]),
    ("strided_slice", [(4, 9)], {"begin": [0, 7], "end": [9, 20], "stride": [3]},
     lambda x: x[0:9:3, 7:20]),
    ("slice_like", [(5, 6), (3, 4)], {}, lambda x, _: x[:3, :4]),
    ("concatenate", [(2, 3, 4), (2, 1, 4), (2, 5, 4)], {"axis": 1},
     lambda *xs: np.concatenate(xs, axis=1)),
    ("concatenate", [(2, 3), (4, 3)], {"axis": 0}, lambda *xs: np.concatenate(xs, axis=0)),
    ("where", [(3, 4), (3, 4), (3, 4)], {}, _np_where),
    ("where", [(3,), (3, 2, 2), (3, 2, 2)], {}, _np_where),
]


@pytest.mark.parametrize("op, shapes, attrs, oracle, precision",
                         [(*case, (8, 16)[i % 2]) for i, case in enumerate(ORACLE_CASES)])
def test_compiled_matches_reference_and_numpy(op, shapes, attrs, oracle, precision):
    # Alternating precisions cover both storage dtypes (int8, int32) with few compilations.
    xs = [_data(s, precision, seed) for seed, s in enumerate(shapes)]
    if op == "where":
        xs[0] = xs[0] % 2  # plenty of both zero and non-zero flags
    (y,) = check_op(op, [(x, precision) for x in xs], attrs)
    assert np.array_equal(y, oracle(*xs))
    assert y.dtype == (np.int8 if precision <= 8 else np.int32)


@pytest.mark.parametrize("axis", [None, 0, 1, -1])
def test_take_matches_numpy_clip_mode(axis):
    x = _data((3, 4), 12)
    indices = np.random.default_rng(7).integers(-20, 20, (2, 5))
    (y,) = check_op("take", [(x, 12), (indices, 6)], {"axis": axis})
    assert np.array_equal(y, np.take(x, indices, axis=axis, mode="clip"))


def test_cvm_lut_with_table_weight_matches_numpy():
    table = np.arange(-127, 128)  # a 255-entry table stored as a weight
    indices = np.random.default_rng(3).integers(-300, 300, (4, 6))
    (y,) = check_op("cvm_lut", [(indices, 10), (table, 8)], {"in_dim": 255}, weights=(1,))
    assert np.array_equal(y, np.take(table, indices, mode="clip"))


@settings(max_examples=150, deadline=None)
@given(n=st.integers(1, 7), begin=st.one_of(st.none(), st.integers(-10, 10)),
       end=st.one_of(st.none(), st.integers(-10, 10)),
       stride=st.integers(-4, 4).filter(lambda s: s != 0))
def test_slice_clamping_matches_numpy(n, begin, end, stride):
    # A missing begin/end is the NumPy default, an empty NumPy result is an error here.
    x = np.arange(n)
    expected = x[begin:end:stride]
    attrs = {"begin": [] if begin is None else [begin], "end": [] if end is None else [end],
             "strides": [stride]}
    if expected.size == 0:
        with pytest.raises(OpRuleError, match="is empty"):
            _shape("slice", [(n,)], attrs)
    else:
        assert np.array_equal(_ref("slice", [x], attrs), expected)


# ---- precision -----------------------------------------------------------------------------
def _out_precision(op, inputs, attrs=None):
    g = one_op_graph(op, [(np.zeros(s, np.int64), p) for s, p in inputs], attrs)
    return g.types[g.outputs[0]].precision


@pytest.mark.parametrize("op, inputs, attrs, expected", [
    ("concatenate", [((2, 2), 5), ((2, 1), 17), ((2, 3), 9)], {}, 17),
    ("take", [((4,), 11), ((3,), 30)], {}, 11),  # the data's, not the indices'
    ("cvm_lut", [((3,), 30), ((16,), 7)], {}, 7),  # the table's
    ("where", [((2,), 31), ((2, 2), 6), ((2, 2), 13)], {}, 13),  # max(p_x, p_y), not p_cond
    ("where", [((2, 2), 2), ((2, 2), 9), ((2, 2), 4)], {}, 9),
    ("repeat", [((2, 2), 23)], {"repeats": 2}, 23),
    ("slice_like", [((4, 4), 12), ((2, 2), 3)], {}, 12),
    ("transpose", [((2, 3), 32)], {}, 32),
])
def test_precision(op, inputs, attrs, expected):
    assert _out_precision(op, inputs, attrs) == expected


# ---- user errors ---------------------------------------------------------------------------
@pytest.mark.parametrize("op, shapes, attrs, message", [
    ("reshape", [(2, 3)], {"target_shape": [4, 2]},
     r"reshape: attribute 'target_shape' \[4, 2\] has 8 elements, expected 6"),
    ("reshape", [(2, 3)], {"target_shape": [-1, 3]}, r"entries must be >= 1, got -1"),
    ("reshape", [(2, 3)], {"target_shape": [0, 6]}, r"entries must be >= 1, got 0"),
    ("repeat", [(2, 3)], {"axis": 2, "repeats": 2}, r"'axis' 2 is out of range for a rank-2"),
    ("repeat", [(2, 3)], {"repeats": 0}, r"'repeats' must be in \[1, 4096\], got 0"),
    ("repeat", [(4097, 2)], {"repeats": 4096}, r"dimension outside 1\.\.16777216"),
    ("tile", [(2, 3)], {"reps": []}, r"tile: attribute 'reps' must not be empty"),
    ("tile", [(2, 3)], {"reps": [0]}, r"'reps' must be in \[1, 4095\], got 0"),
    ("tile", [(2, 3)], {"reps": [1, 1, 1, 1, 1, 1, 2]}, r"output would have rank 7"),
    ("tile", [(1024, 1024)], {"reps": [1024, 2]}, r"more than 1073741824"),
    ("transpose", [(2, 3, 4)], {"axes": [0, 1]}, r"has 2 entries, expected 0 or 3"),
    ("transpose", [(2, 3, 4)], {"axes": [0, 1, -3]}, r"not a permutation of 0\.\.2"),
    ("transpose", [(2, 3, 4)], {"axes": [0, 1, 3]}, r"entry 3 is out of range"),
    ("slice", [(5,)], {"begin": [3], "end": [3]}, r"axis 0 \(length 5\) is empty: begin 3, end 3"),
    ("slice", [(5,)], {"begin": [1], "end": [4], "strides": [-1]}, r"axis 0 .* is empty"),
    ("slice", [(5,)], {"begin": [5], "end": []}, r"is empty: begin 5, end 5"),
    ("slice", [(5,)], {"begin": [0], "end": [2], "strides": [0]},
     r"'strides' entry 0 must be non-zero"),
    ("slice", [(5,)], {"begin": [0, 0], "end": [2]}, r"'begin' \[0, 0\] has 2 entries, more than"),
    ("slice", [(5,)], {"end": [2]}, r"missing required attribute 'begin"),
    ("slice_like", [(4, 5), (2,)], {}, r"shape_like has rank 1, expected 2"),
    ("slice_like", [(4, 5), (2,)], {"axes": [1]}, r"axis 1 is out of range for shape_like"),
    ("slice_like", [(4, 5), (6, 5)], {}, r"length 6 on axis 0, expected at most 4"),
    ("take", [(4, 5), (2,)], {"axis": 2}, r"take: attribute 'axis' 2 is out of range"),
    ("take", [(2, 2, 2, 2), (2, 2, 2, 2)], {"axis": 0}, r"output would have rank 7"),
    ("expand_dims", [(2, 3)], {"axis": 3}, r"'axis' 3 is out of range .*expected -3\.\.2"),
    ("expand_dims", [(2, 3)], {"axis": -4}, r"'axis' -4 is out of range"),
    ("expand_dims", [(2, 3)], {"axis": 0, "num_newaxis": 5}, r"output would have rank 7"),
    ("expand_dims", [(2, 3)], {}, r"missing required attribute 'axis"),
    ("squeeze", [(1, 3)], {"axes": [1]}, r"squeeze: axis 1 has length 3, expected 1"),
    ("squeeze", [(1, 3)], {"axes": [-3]}, r"entry -3 is out of range"),
    ("concatenate", [(2, 3), (3, 3)], {"axis": 1},
     r"input 1 has shape \(3, 3\), expected the shape of input 0 \(2, 3\) on every axis"),
    ("concatenate", [(2, 3), (2, 3, 1)], {"axis": 0}, r"input 1 has shape \(2, 3, 1\)"),
    ("concatenate", [(2, 3)], {"axis": 2}, r"'axis' 2 is out of range"),
    ("where", [(2, 3), (2, 3), (3, 2)], {}, r"y has shape \(3, 2\), expected the shape of x"),
    ("where", [(3,), (2, 3), (2, 3)], {}, r"condition has shape \(3,\), .* or \(2,\)"),
    ("where", [(2, 1), (2, 3), (2, 3)], {}, r"condition has shape \(2, 1\)"),
    ("cvm_lut", [(3,), (4,)], {"in_dim": 0}, r"'in_dim' must be in \[1, inf\], got 0"),
    ("cvm_lut", [(3,), (4,)], {"in_dim": 5}, r"'in_dim' 5 must be the table's size 4"),
])
def test_errors(op, shapes, attrs, message):
    with pytest.raises(OpRuleError, match=message):
        _shape(op, shapes, attrs)


def test_arity_errors():
    with pytest.raises(OpRuleError, match=r"where: expects 3 input tensors"):
        _shape("where", [(2,), (2,)])
    with pytest.raises(OpRuleError, match=r"concatenate: needs at least one input"):
        _shape("concatenate", [])

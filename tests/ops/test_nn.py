"""NN ops (conv2d, dense, max_pool2d, upsampling): reference vs independent oracles
(tvm.topi.testing, hand NumPy, hand-computed values), compiled (llvm) vs reference
bit-exact, and precision / shape / attribute errors.

The CVM spec files give no worked examples for these ops (only for sum and
broadcast_add), so the hand-computed cases below stand in for them.
"""
from __future__ import annotations

import numpy as np
import pytest
from tvm.topi.testing import conv2d_nchw_python, dilate_python, poolnd_python

from cvmc.errors import CvmcError
from cvmc.ir import TensorType
from cvmc.ops import lookup
from tests.oputil import check_op, one_op_graph
from tests.oputil import rand_in_precision as _rand


def _precision_of(op, inputs, attrs=None, weights=()):
    g = one_op_graph(op, inputs, attrs, weights)
    return g.types[g.outputs[0]].precision


# ---- conv2d -------------------------------------------------------------------------
# (data shape, weight shape, padding, stride, dilation, groups)
CONV_CASES = [
    ((1, 3, 8, 8), (4, 3, 3, 3), (1, 1), (1, 1), (1, 1), 1),
    ((2, 4, 9, 7), (6, 4, 3, 2), (0, 1), (2, 1), (1, 1), 1),
    ((1, 4, 10, 10), (5, 4, 3, 3), (2, 2), (1, 2), (2, 3), 1),
    ((1, 6, 7, 7), (6, 1, 3, 3), (1, 1), (1, 1), (1, 1), 6),    # depthwise
    ((1, 6, 8, 6), (4, 3, 3, 1), (1, 0), (2, 1), (1, 1), 2),    # general grouping
    ((1, 6, 9, 9), (6, 2, 2, 3), (1, 2), (3, 2), (2, 1), 3),    # grouped + dilated + strided
    ((1, 2, 5, 5), (3, 2, 1, 1), (0, 0), (1, 1), (1, 1), 1),    # 1x1
    ((1, 1, 3, 4), (2, 1, 3, 4), (0, 0), (1, 1), (1, 1), 1),    # kernel = whole input
]


def _conv_oracle(x, w, padding, stride, dilation, groups):
    """tvm.topi.testing's NCHW conv on a weight dilated by topi's dilate_python."""
    wd = dilate_python(w, (1, 1, *dilation))
    return conv2d_nchw_python(x, wd, stride, padding, groups)


@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("xs,ws,padding,stride,dilation,groups", CONV_CASES)
def test_conv2d_matches_topi_and_compiles(xs, ws, padding, stride, dilation, groups,
                                         with_bias):
    rng = np.random.default_rng(hash((xs, ws, with_bias)) % 2**32)
    x, w = _rand(rng, xs, 8), _rand(rng, ws, 8)
    inputs = [(x, 8), (w, 8)]
    expected = _conv_oracle(x, w, padding, stride, dilation, groups)
    if with_bias:
        b = _rand(rng, (ws[0],), 12)
        inputs.append((b, 12))
        expected = expected + b[None, :, None, None]
    attrs = {"padding": list(padding), "stride": list(stride), "dilation": list(dilation),
             "groups": groups}
    (y,) = check_op("conv2d", inputs, attrs, weights=(1, 2) if with_bias else (1,))
    assert y.dtype == np.int32
    assert np.array_equal(y, expected)


def test_conv2d_weights_as_graph_inputs():
    rng = np.random.default_rng(1)
    x, w = _rand(rng, (1, 2, 5, 5), 6), _rand(rng, (3, 2, 3, 3), 4)
    (y,) = check_op("conv2d", [(x, 6), (w, 4)], {"padding": [1, 1]})
    assert np.array_equal(y, _conv_oracle(x, w, (1, 1), (1, 1), (1, 1), 1))


def test_conv2d_hand_computed_3x3():
    # Cross-correlation (no kernel flip): out[p,q] = pad(p-1, q-1) - pad(p+1, q+1) + 10.
    x = np.arange(9, dtype=np.int64).reshape(1, 1, 3, 3)
    w = np.array([[1, 0, 0], [0, 0, 0], [0, 0, -1]], dtype=np.int64).reshape(1, 1, 3, 3)
    b = np.array([10], dtype=np.int64)
    inputs = [(x, 5), (w, 2), (b, 5)]
    (y,) = check_op("conv2d", inputs, {"padding": [1, 1]}, weights=(1, 2))
    assert np.array_equal(y[0, 0], [[6, 5, 10], [3, 2, 11], [10, 13, 14]])
    (y,) = check_op("conv2d", inputs, {"padding": [1, 1], "stride": [2, 2]}, weights=(1, 2))
    assert np.array_equal(y[0, 0], [[6, 10], [10, 14]])
    # 5 + 2 + bitlen(1*3*3 = 9) = 11; with the 5-bit bias max(11, 5) + 1 = 12.
    assert _precision_of("conv2d", inputs, {"padding": [1, 1]}, (1, 2)) == 12
    assert _precision_of("conv2d", inputs[:2], {"padding": [1, 1]}, (1,)) == 11


def test_conv2d_extreme_values_stay_exact():
    # All products 127*127 (or -) over K = 64*3*3: the largest sums 8-bit inputs allow here.
    x = np.full((1, 64, 4, 4), 127, dtype=np.int64)
    x[0, :, 0, 0] = -127
    w = np.full((2, 64, 3, 3), 127, dtype=np.int64)
    (y,) = check_op("conv2d", [(x, 8), (w, 8)], {}, weights=(1,))
    assert y[0, 0, 1, 1] == 127 * 127 * 576
    assert y[0, 0, 0, 0] == 127 * 127 * (576 - 2 * 64)


def test_conv2d_precision_rule():
    rng = np.random.default_rng(2)
    x, w = _rand(rng, (1, 64, 4, 4), 8), _rand(rng, (8, 32, 3, 3), 7)
    # IC per group = 32: 8 + 7 + bitlen(288) = 8 + 7 + 9 = 24
    assert _precision_of("conv2d", [(x, 8), (w, 7)], {"groups": 2}, (1,)) == 24
    b = _rand(rng, (8,), 30)
    assert _precision_of("conv2d", [(x, 8), (w, 7), (b, 30)], {"groups": 2}, (1, 2)) == 31


def test_conv2d_cost():
    d = lookup("conv2d")
    ins = [TensorType((1, 4, 5, 5)), TensorType((6, 2, 3, 3)), TensorType((6,))]
    a = d.normalize_attrs({"groups": 2})
    assert d.cost_of(ins[:2], [], a) == 3 * 2 * 3 * 3
    assert d.cost_of(ins, [], a) == 3 * 2 * 3 * 3 + 1


def test_conv2d_rejects_9_bit_input():
    x, w = np.zeros((1, 1, 3, 3), np.int64), np.zeros((1, 1, 3, 3), np.int64)
    with pytest.raises(CvmcError, match="data precision must be <= 8 bits, got 9"):
        one_op_graph("conv2d", [(x, 9), (w, 8)], weights=(1,))
    with pytest.raises(CvmcError, match="weight precision must be <= 8 bits, got 9"):
        one_op_graph("conv2d", [(x, 8), (w, 9)])


# (data shape, weight shape, attrs, bias shape or None, message)
CONV_ERRORS = [
    ((1, 4, 5, 5), (2, 3, 3, 3), {}, None,
     r"data has 4 channels but weight expects 3 \(IC=3 x groups=1\)"),
    ((1, 4, 5, 5), (2, 1, 3, 3), {"groups": 2}, None,
     r"data has 4 channels but weight expects 2 \(IC=1 x groups=2\)"),
    ((1, 4, 5, 5), (3, 2, 3, 3), {"groups": 2}, None,
     "weight has 3 output channels, not a multiple of groups=2"),
    ((1, 4, 5), (2, 4, 3, 3), {}, None, r"data must be 4-D \(N, C, H, W\), got shape"),
    ((1, 4, 5, 5), (2, 4, 3), {}, None, "weight must be 4-D"),
    ((1, 4, 5, 5), (2, 4, 3, 3), {}, (3,), r"bias must have shape \(2,\)"),
    ((1, 4, 5, 5), (2, 4, 3, 3), {"use_bias": True}, None,
     "'use_bias' is true but no bias input"),
    ((1, 4, 5, 5), (2, 4, 3, 3), {"use_bias": False}, (2,),
     "'use_bias' is false but a bias input"),
    ((1, 4, 5, 5), (2, 4, 3, 3), {"channels": 3}, None,
     "'channels' is 3 but weight has 2 output channels"),
    ((1, 4, 5, 5), (2, 4, 3, 3), {"kernel_size": [3, 1]}, None,
     r"'kernel_size' is \[3, 1\] but weight kernel is \[3, 3\]"),
    ((1, 4, 5, 5), (2, 4, 3, 3), {"dilation": [3, 1]}, None,
     r"dilated kernel extent 7 \(K=3, dilation=3\) exceeds the padded input 5 \(5 \+ 0"),
    ((1, 4, 5, 5), (2, 4, 3, 3), {"layout": "NHWC"}, None, "'layout' must be 'NCHW'"),
    ((1, 4, 5, 5), (2, 4, 3, 3), {"stride": [0, 1]}, None,
     r"'stride' must be in \[1, 4095\], got 0"),
    ((1, 4, 5, 5), (2, 4, 3, 3), {"padding": [4096, 0]}, None,
     r"'padding' must be in \[0, 4095\], got 4096"),
    ((1, 4, 5, 5), (2, 4, 3, 3), {"padding": [1]}, None, "'padding' must have 2 elements"),
    ((1, 4, 5, 5), (2, 4, 3, 3), {"groups": 0}, None, r"'groups' must be in \[1, inf\]"),
]


def _zero_operands(xs, ws, bs):
    """8-bit zero data and weight (and bias, when a shape is given) for error tests."""
    shapes = [xs, ws] + ([bs] if bs is not None else [])
    return [(np.zeros(s, np.int64), 8) for s in shapes]


@pytest.mark.parametrize("xs,ws,attrs,bs,message", CONV_ERRORS)
def test_conv2d_shape_and_attribute_errors(xs, ws, attrs, bs, message):
    inputs = _zero_operands(xs, ws, bs)
    with pytest.raises(CvmcError, match=message):
        one_op_graph("conv2d", inputs, attrs, weights=(1, 2))


def test_conv2d_cvm_runtime_attrs_accepted_when_consistent():
    rng = np.random.default_rng(3)
    x, w, b = _rand(rng, (1, 2, 4, 4), 8), _rand(rng, (3, 2, 3, 3), 8), _rand(rng, (3,), 8)
    attrs = {"strides": [1, 1], "padding": [1, 1], "channels": 3, "kernel_size": [3, 3],
             "use_bias": True, "layout": "NCHW", "kernel_layout": "OIHW"}
    (y,) = check_op("conv2d", [(x, 8), (w, 8), (b, 8)], attrs, weights=(1, 2))
    expected = _conv_oracle(x, w, (1, 1), (1, 1), (1, 1), 1) + b[None, :, None, None]
    assert np.array_equal(y, expected)


def test_conv2d_precision_rule_rejects_channel_mismatch_itself():
    # Quirk #6: shapes imported from elsewhere must not slip a mismatch past precision.
    d = lookup("conv2d")
    ins = [TensorType((1, 4, 5, 5), "int8", 8), TensorType((2, 3, 3, 3), "int8", 8)]
    with pytest.raises(CvmcError, match="data has 4 channels but weight expects 3"):
        d.infer_precisions(ins, d.normalize_attrs({}))


def test_conv2d_reference_is_fast_on_resnet_layer():
    # ~0.1 s here (im2col matmul); a per-element loop would take minutes.
    import time
    rng = np.random.default_rng(4)
    x, w = _rand(rng, (1, 64, 56, 56), 8), _rand(rng, (64, 64, 3, 3), 8)
    d = lookup("conv2d")
    start = time.perf_counter()
    (y,) = d.run_reference([x, w], d.normalize_attrs({"padding": [1, 1]}))
    assert time.perf_counter() - start < 10
    assert np.array_equal(y[:, :2], _conv_oracle(x, w[:2], (1, 1), (1, 1), (1, 1), 1))


# ---- dense --------------------------------------------------------------------------
@pytest.mark.parametrize("m,k,n", [(1, 1, 1), (3, 5, 4), (2, 17, 9), (4, 64, 10)])
@pytest.mark.parametrize("with_bias", [False, True])
def test_dense_matches_numpy_and_compiles(m, k, n, with_bias):
    rng = np.random.default_rng(m * 1000 + k * 10 + n)
    x, w = _rand(rng, (m, k), 8), _rand(rng, (n, k), 6)
    inputs = [(x, 8), (w, 6)]
    bias = None
    if with_bias:
        bias = _rand(rng, (n,), 16)
        inputs.append((bias, 16))
    from tvm.topi.testing import dense as topi_dense
    expected = topi_dense(x, w, bias, use_bias=with_bias)
    (y,) = check_op("dense", inputs, weights=(1, 2))
    assert np.array_equal(y, expected)


def test_dense_hand_computed():
    x = np.array([[1, 2, 3]], dtype=np.int64)
    w = np.array([[1, 0, -1], [2, 2, 2]], dtype=np.int64)
    b = np.array([5, -5], dtype=np.int64)
    (y,) = check_op("dense", [(x, 3), (w, 3), (b, 4)], {"units": 2, "use_bias": True})
    assert np.array_equal(y, [[3, 7]])
    # 3 + 3 + bitlen(3) = 8, then max(8, 4) + 1 = 9
    assert _precision_of("dense", [(x, 3), (w, 3), (b, 4)]) == 9
    assert _precision_of("dense", [(x, 3), (w, 3)]) == 8


def test_dense_at_the_int32_limit():
    # 8 + 8 + bitlen(65535) = 32 bits: the largest dense the precision rule admits.
    k = 65535
    x = np.full((1, k), 127, dtype=np.int64)
    w = np.stack([np.full(k, 127), np.full(k, -127)]).astype(np.int64)
    (y,) = check_op("dense", [(x, 8), (w, 8)], weights=(1,))
    assert np.array_equal(y, [[127 * 127 * k, -127 * 127 * k]])
    assert _precision_of("dense", [(x, 8), (w, 8)], weights=(1,)) == 32
    with pytest.raises(CvmcError, match="would be 33 bits"):
        one_op_graph("dense", [(x, 8), (w, 8), (np.zeros(2, np.int64), 8)], weights=(1, 2))


def test_dense_cost():
    d = lookup("dense")
    ins = [TensorType((2, 7)), TensorType((3, 7)), TensorType((3,))]
    a = d.normalize_attrs({})
    assert (d.cost_of(ins[:2], [], a), d.cost_of(ins, [], a)) == (21, 22)


DENSE_ERRORS = [
    ((2, 5), (3, 4), None, {}, r"data has K=5 columns but weight has 4"),
    ((2, 5, 1), (3, 5), None, {}, r"data must be 2-D \(M, K\)"),
    ((2, 5), (5,), None, {}, r"weight must be 2-D \(N, K\)"),
    ((2, 5), (3, 5), (2,), {}, r"bias must have shape \(3,\)"),
    ((2, 5), (3, 5), None, {"units": 4}, "'units' is 4 but weight has 3 rows"),
    ((2, 5), (3, 5), None, {"use_bias": True}, "'use_bias' is true but no bias input"),
]


@pytest.mark.parametrize("xs,ws,bs,attrs,message", DENSE_ERRORS)
def test_dense_shape_and_attribute_errors(xs, ws, bs, attrs, message):
    inputs = _zero_operands(xs, ws, bs)
    with pytest.raises(CvmcError, match=message):
        one_op_graph("dense", inputs, attrs)


def test_dense_rejects_9_bit_operands():
    x, w = np.zeros((1, 2), np.int64), np.zeros((1, 2), np.int64)
    with pytest.raises(CvmcError, match="dense 'y0': weight precision must be <= 8 bits, got 9"):
        one_op_graph("dense", [(x, 8), (w, 9)])


# ---- max_pool2d ---------------------------------------------------------------------
# (data shape, pool_size, padding, strides, ceil_mode)
POOL_CASES = [
    ((1, 2, 6, 6), (2, 2), (0, 0), (2, 2), False),
    ((2, 3, 7, 5), (3, 3), (1, 1), (2, 2), False),
    ((2, 3, 7, 5), (3, 3), (1, 1), (2, 2), True),
    ((1, 2, 8, 9), (3, 2), (2, 1), (1, 3), True),
    ((1, 1, 5, 5), (5, 5), (0, 0), (1, 1), False),   # one window covering everything
    ((1, 2, 6, 7), (2, 3), (1, 0), (3, 2), True),
]


@pytest.mark.parametrize("precision", [8, 32])
@pytest.mark.parametrize("xs,pool,padding,strides,ceil", POOL_CASES)
def test_max_pool2d_matches_topi_and_compiles(xs, pool, padding, strides, ceil, precision):
    rng = np.random.default_rng(sum(xs) + precision)
    x = _rand(rng, xs, precision)
    attrs = {"pool_size": list(pool), "padding": list(padding), "strides": list(strides),
             "ceil_mode": ceil}
    (y,) = check_op("max_pool2d", [(x, precision)], attrs)
    expected = poolnd_python(x.astype(np.int32), pool, strides, (1, 1), padding, padding,
                             "max", count_include_pad=False, ceil_mode=ceil, dtype="int32")
    assert y.dtype == (np.int8 if precision == 8 else np.int32)
    assert np.array_equal(y, expected)


def test_max_pool2d_hand_computed_ceil_mode_with_padding():
    # Values fall along rows and columns, so a window's max is its top-left real element.
    x = -np.arange(1, 17, dtype=np.int64).reshape(1, 1, 4, 4)
    attrs = {"pool_size": [3, 3], "padding": 1, "strides": [2, 2], "ceil_mode": True}
    # ceil((4 + 2 - 3) / 2) + 1 = 3 windows per axis, rows {0,1}, {1,2,3}, {3}
    (y,) = check_op("max_pool2d", [(x, 6)], attrs)
    assert np.array_equal(y[0, 0], [[-1, -2, -4], [-5, -6, -8], [-13, -14, -16]])
    (y,) = check_op("max_pool2d", [(x, 6)], {**attrs, "ceil_mode": False})
    assert np.array_equal(y[0, 0], [[-1, -2], [-5, -6]])


def test_max_pool2d_int_padding_equals_pair():
    x = _rand(np.random.default_rng(5), (1, 2, 5, 5), 8)
    base = {"pool_size": [2, 2], "strides": [2, 2]}
    (a,) = check_op("max_pool2d", [(x, 8)], {**base, "padding": 1})
    (b,) = check_op("max_pool2d", [(x, 8)], {**base, "padding": [1, 1]})
    assert np.array_equal(a, b)


def test_max_pool2d_precision_and_cost():
    x = np.zeros((1, 1, 4, 4), np.int64)
    assert _precision_of("max_pool2d", [(x, 13)], {"pool_size": [2, 3]}) == 13
    d = lookup("max_pool2d")
    assert d.cost_of([TensorType((1, 1, 4, 4))], [], d.normalize_attrs({"pool_size": [2, 3]})) \
        == 6


POOL_ERRORS = [
    ((1, 1, 4, 4), {"pool_size": [1, 2], "padding": 1},
     r"pool_size height must be in \(1, 6\] \(> padding 1"),
    ((1, 1, 2, 4), {"pool_size": [5, 2], "padding": [1, 0]},
     r"pool_size height must be in \(1, 4\]"),
    ((1, 1, 5, 5), {"pool_size": [1, 1], "strides": [3, 3], "ceil_mode": True},
     "last window along height starts at 6, past the input height 5"),
    ((1, 1, 4, 4), {"pool_size": [2, 2], "padding": [1, 1, 1]},
     r"'padding' must have 1 or 2 elements"),
    ((1, 1, 4, 4), {"pool_size": [2, 2], "strides": [0, 1]}, r"'strides' must be in \[1, 4095\]"),
    ((1, 1, 4, 4), {}, "missing required attribute 'pool_size"),
    ((1, 4, 4), {"pool_size": [2, 2]}, r"data must be 4-D \(N, C, H, W\)"),
    ((1, 1, 4, 4), {"pool_size": [2, 2], "layout": "NHWC"}, "'layout' must be 'NCHW'"),
]


@pytest.mark.parametrize("xs,attrs,message", POOL_ERRORS)
def test_max_pool2d_errors(xs, attrs, message):
    with pytest.raises(CvmcError, match=message):
        one_op_graph("max_pool2d", [(np.zeros(xs, np.int64), 8)], attrs)


# ---- upsampling ---------------------------------------------------------------------
def test_upsampling_hand_computed():
    x = np.array([[[[1, 2], [3, -4]]]], dtype=np.int64)
    (y,) = check_op("upsampling", [(x, 4)], {"scale": 2, "method": "NEAREST_NEIGHBOR"})
    assert np.array_equal(y[0, 0], [[1, 1, 2, 2], [1, 1, 2, 2], [3, 3, -4, -4],
                                    [3, 3, -4, -4]])
    assert _precision_of("upsampling", [(x, 4)], {"scale": 2}) == 4


@pytest.mark.parametrize("xs,scale,precision", [((1, 2, 3, 4), 1, 8), ((2, 3, 3, 2), 3, 8),
                                                ((1, 1, 2, 3), 5, 20)])
def test_upsampling_matches_numpy_and_compiles(xs, scale, precision):
    x = _rand(np.random.default_rng(scale), xs, precision)
    (y,) = check_op("upsampling", [(x, precision)], {"scale": scale})
    assert np.array_equal(y, np.kron(x, np.ones((1, 1, scale, scale), np.int64)))


@pytest.mark.parametrize("attrs,message", [
    ({"scale": 0}, r"'scale' must be in \[1, 4095\], got 0"),
    ({"scale": 4096}, r"'scale' must be in \[1, 4095\], got 4096"),
    ({"scale": 2, "method": "BILINEAR"}, "'method' must be 'NEAREST_NEIGHBOR'"),
])
def test_upsampling_attribute_errors(attrs, message):
    with pytest.raises(CvmcError, match=message):
        one_op_graph("upsampling", [(np.zeros((1, 1, 2, 2), np.int64), 8)], attrs)

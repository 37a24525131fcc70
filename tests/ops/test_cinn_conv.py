"""cinn.conv: the spec's worked examples (shapes), forward against tvm.topi.testing, the
two gradients against the adjoint identity <conv(x, w), dy> = <x, dx> = <w, dw> and a
hand-computed case, each conv type compiled for llvm against the reference."""
from __future__ import annotations

import numpy as np
import pytest
from tvm.topi.testing import conv2d_nchw_python

from cvmc.ir import TensorType
from cvmc.ops import lookup
from tests.oputil import check_op, one_op_graph, run_reference

CONV = lookup("cinn.conv")


def shape(ins, **attrs):
    a = CONV.normalize_attrs(attrs)
    return CONV.infer_shapes([TensorType(tuple(s), "float32") for s in ins], a)[0]


def test_the_spec_examples():
    common = {"strides": [1, 1], "paddings": [1, 1], "dilations": [1, 1]}
    assert shape([[16, 16, 28, 28], [32, 16, 3, 3]], **common) == (16, 32, 28, 28)
    assert shape([[32, 16, 3, 3], [16, 32, 28, 28]], conv_type="backward_data",
                 output_shape=[16, 16, 28, 28], **common) == (16, 16, 28, 28)
    assert shape([[16, 16, 28, 28], [16, 32, 28, 28]], conv_type="backward_filter",
                 output_shape=[32, 16, 3, 3], **common) == (32, 16, 3, 3)


def test_same_and_valid_padding_and_nhwc():
    assert shape([[1, 3, 7, 7], [4, 3, 3, 3]], strides=[2, 2], padding_algorithm="SAME") == \
        (1, 4, 4, 4)
    assert shape([[1, 3, 7, 7], [4, 3, 3, 3]], paddings=[5, 5], padding_algorithm="VALID") == \
        (1, 4, 5, 5)
    assert shape([[1, 7, 7, 3], [4, 3, 3, 3]], data_format="NHWC") == (1, 5, 5, 4)


def rnd(shape, seed):
    return np.random.default_rng(seed).integers(-4, 5, shape).astype(np.float32)


def ref(inputs, **attrs):
    g = one_op_graph("cinn.conv", [(x, None) for x in inputs], attrs)
    return run_reference(g, inputs)[0].astype(np.float64)


@pytest.mark.parametrize("attrs", [
    {"strides": [1, 1], "paddings": [1, 1]},
    {"strides": [2, 1], "paddings": [0, 2], "dilations": [1, 2], "groups": 2},
])
def test_forward_matches_topi(attrs):
    x, w = rnd((2, 4, 7, 6), 1), rnd((6, 4 // attrs.get("groups", 1), 3, 3), 2)
    g = attrs.get("groups", 1)
    want = np.concatenate([conv2d_nchw_python(
        x[:, i * 4 // g:(i + 1) * 4 // g].astype(np.float64), w[i * 6 // g:(i + 1) * 6 // g],
        attrs["strides"], attrs["paddings"]) for i in range(g)], axis=1) \
        if "dilations" not in attrs else None
    got = ref([x, w], **attrs)
    if want is not None:
        assert np.array_equal(got, want)
    assert got.shape == shape([x.shape, w.shape], **attrs)


@pytest.mark.parametrize("attrs", [
    {"strides": [1, 1], "paddings": [1, 1]},
    {"strides": [2, 3], "paddings": [1, 0], "dilations": [2, 1], "groups": 2},
    {"strides": [2, 2], "padding_algorithm": "SAME"},
])
def test_gradients_are_the_adjoints_of_forward(attrs):
    x, w = rnd((2, 4, 9, 8), 3), rnd((6, 4 // attrs.get("groups", 1), 3, 2), 4)
    y = ref([x, w], **attrs)
    dy = rnd(y.shape, 5)
    dx = ref([w, dy], conv_type="backward_data", output_shape=list(x.shape), **attrs)
    dw = ref([x, dy], conv_type="backward_filter", output_shape=list(w.shape), **attrs)
    forward = float((y * dy).sum())
    assert forward == float((x * dx).sum()) == float((w * dw).sum())


def test_backward_data_by_hand():
    # 1x1 input channel, 2x2 dy, 2x2 filter of ones, stride 1, no padding: dx is 3x3 with
    # every dy value added to the 2x2 window it came from
    dy = np.array([[[[1, 2], [3, 4]]]], np.float32)
    w = np.ones((1, 1, 2, 2), np.float32)
    dx = ref([w, dy], conv_type="backward_data", output_shape=[1, 1, 3, 3])
    assert dx[0, 0].tolist() == [[1, 3, 2], [4, 10, 6], [3, 7, 4]]


@pytest.mark.parametrize("conv_type, fmt", [("forward", "NCHW"), ("forward", "NHWC"),
                                            ("backward_data", "NHWC"),
                                            ("backward_filter", "NCHW")])
def test_compiled_equals_reference(conv_type, fmt):
    """Small integer values: every sum is exact in float32, so the bits must be equal."""
    x_nchw, w = (1, 4, 7, 6), (6, 2, 3, 3)
    attrs = {"strides": [2, 1], "paddings": [1, 2], "groups": 2, "data_format": fmt,
             "conv_type": conv_type}
    to_fmt = (lambda s: s) if fmt == "NCHW" else (lambda s: (s[0], *s[2:], s[1]))
    y = shape([to_fmt(x_nchw), w], **{**attrs, "conv_type": "forward"})
    if conv_type == "forward":
        inputs, extra = [rnd(to_fmt(x_nchw), 6), rnd(w, 7)], {}
    elif conv_type == "backward_data":
        inputs, extra = [rnd(w, 8), rnd(y, 9)], {"output_shape": list(to_fmt(x_nchw))}
    else:
        inputs, extra = [rnd(to_fmt(x_nchw), 10), rnd(y, 11)], {"output_shape": list(w)}
    check_op("cinn.conv", [(v, None) for v in inputs], {**attrs, **extra})

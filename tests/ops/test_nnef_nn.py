"""NNEF sliding-window, up-sampling and RoI ops (cvmc/ops/nnef_nn.py, nnef_pool.py,
nnef_resample.py): their reference rules against hand-computed cases and independent
oracles (scipy, np.pad, tvm.topi.testing, a scatter-add deconv, the spec's own deconv forms
of linear up-sampling), argument errors, and compiled results that are the same bits at
every thread count.

Compiled-vs-reference for every op and border/geometry variant: tests/codegen/op_cases.py.
"""
from __future__ import annotations

import itertools
import os
import subprocess
import sys

import numpy as np
import pytest
import scipy.ndimage
import scipy.signal

import cvmc
from cvmc.errors import CvmcError
from cvmc.frontend.nnef import parse_nnef
from tests.oputil import check_op, sum_tolerances
from tests.oputil import op_reference as ref


def row(*values) -> np.ndarray:
    """A [1, 1, n] float tensor (batch 1, channel 1, one spatial dim)."""
    return np.array(values, np.float64).reshape(1, 1, -1)


# ---- conv / deconv: hand-computed -----------------------------------------------------------
X4, DIFF = row(1, 2, 3, 4), row(1, 0, -1)  # out[i] = x~[i - 1] - x~[i + 1]


@pytest.mark.parametrize("border, want", [
    ("constant", [0 - 2, 1 - 3, 2 - 4, 3 - 0]),      # x~ = 0 1 2 3 4 0
    ("replicate", [1 - 2, 1 - 3, 2 - 4, 3 - 4]),     # x~ = 1 1 2 3 4 4
    ("reflect", [2 - 2, 1 - 3, 2 - 4, 3 - 3]),       # x~ = 2 1 2 3 4 3
    ("reflect-even", [1 - 2, 1 - 3, 2 - 4, 3 - 4]),  # x~ = 1 1 2 3 4 4
])
def test_conv_border_modes_by_hand(border, want):
    got = ref("conv", X4, DIFF, border=border, padding=[(1, 1)])
    assert np.array_equal(got, row(*want))


def test_conv_reflect_differs_from_reflect_even_two_steps_out():
    # padding 2: x~[-2] is x[2] (reflect) or x[1] (reflect-even); x~[5] x[1] or x[2]
    w = row(1, 0, 0, 0, 0)  # out[i] = x~[i - 2]
    assert np.array_equal(ref("conv", X4, w, border="reflect", padding=[(2, 2)]),
                          row(3, 2, 1, 2))
    assert np.array_equal(ref("conv", X4, w, border="reflect-even", padding=[(2, 2)]),
                          row(2, 1, 1, 2))


def test_conv_stride_dilation_and_automatic_padding_by_hand():
    x7 = row(1, 2, 3, 4, 5, 6, 7)
    # f = 2, d = 2, s = 2, no padding: out[i] = x[2i] + x[2i + 2], (7 - 3) // 2 + 1 = 3 outputs
    assert np.array_equal(ref("conv", x7, row(1, 1), stride=[2], dilation=[2],
                              padding=[(0, 0)]), row(1 + 3, 3 + 5, 5 + 7))
    # automatic: x = ceil(5 / 2) = 3, t = (3 - 1) * 2 + 3 - 5 = 2 -> (1, 1)
    assert np.array_equal(ref("conv", row(1, 2, 3, 4, 5), row(1, 1, 1), stride=[2]),
                          row(0 + 1 + 2, 2 + 3 + 4, 4 + 5 + 0))
    # automatic, asymmetric: x = 4, t = 3 * 1 + 2 - 4 = 1 -> (0, 1)
    assert np.array_equal(ref("conv", X4, row(1, 10)), row(21, 32, 43, 4))


def test_conv_negative_padding_crops():
    assert np.array_equal(ref("conv", X4, row(1), padding=[(-1, -1)]), row(2, 3))


def test_grouped_depthwise_conv_and_bias_by_hand():
    x = np.array([[[1.0, 2.0], [10.0, 20.0]]])  # [1, 2 channels, 2]
    w = np.array([[[3.0]], [[5.0]], [[7.0]], [[-1.0]]])  # [4, 1, 1]: two per channel
    want = [[3, 6], [5, 10], [70, 140], [-10, -20]]
    for groups in (2, 0):
        assert np.array_equal(ref("conv", x, w, groups=groups), [want])
    bias = np.array([[1.0, 2.0, 3.0, 4.0]])  # [1, C]: NNEF aligns it left (batch, channel)
    got = ref("conv", x, w, bias, groups=0)
    assert np.array_equal(got, [np.array(want) + [[1], [2], [3], [4]]])


def test_deconv_by_hand_is_the_scatter_of_conv():
    # out[i] = sum_j x~[(i - j) / 2] w[j] where divisible: x[0] * w at 0..2, x[1] * w at 2..4
    got = ref("deconv", row(1, 2), row(1, 10, 100), stride=[2], padding=[(0, 0)])
    assert np.array_equal(got, row(1, 10, 100 + 2, 20, 200))


def test_deconv_border_applies_to_its_input():
    # X = 1 + 3 = 4; out[i] = x~[i] + x~[i - 1] + x~[i - 2]
    got = ref("deconv", row(1, 2), row(1, 1, 1), padding=[(0, 0)], border="replicate")
    assert np.array_equal(got, row(1 + 1 + 1, 2 + 1 + 1, 2 + 2 + 1, 2 + 2 + 2))
    got = ref("deconv", row(1, 2), row(1, 1, 1), padding=[(0, 0)])
    assert np.array_equal(got, row(1, 3, 3, 2))


_PAD_MODES = {"constant": "constant", "replicate": "edge", "reflect": "reflect",
              "reflect-even": "symmetric"}


def _dilate(w: np.ndarray, d: tuple[int, ...]) -> np.ndarray:
    """A filter with d - 1 zeros between taps in each spatial dim."""
    shape = w.shape[:2] + tuple((f - 1) * k + 1 for f, k in zip(w.shape[2:], d))
    out = np.zeros(shape)
    out[(slice(None), slice(None), *(slice(None, None, k) for k in d))] = w
    return out


def _scipy_conv(x, w, padding, stride, dilation, border, groups):
    """conv by np.pad (its own border modes) and scipy.signal.correlate per channel pair."""
    pads = [(0, 0), (0, 0)] + [(max(p, 0), max(q, 0)) for p, q in padding]
    xp = np.pad(x, pads, mode=_PAD_MODES[border])
    crop = tuple(slice(-min(p, 0), xp.shape[2 + k] + min(q, 0))
                 for k, (p, q) in enumerate(padding))
    xp = xp[(slice(None), slice(None), *crop)]
    wd = _dilate(w, dilation)
    cin_g, cout_g = x.shape[1] // groups, w.shape[0] // groups
    out = []
    for b, o in itertools.product(range(x.shape[0]), range(w.shape[0])):
        g = o // cout_g
        out.append(sum(scipy.signal.correlate(xp[b, g * cin_g + c], wd[o, c], mode="valid")
                       for c in range(cin_g)))
    full = np.array(out).reshape(x.shape[0], w.shape[0], *out[0].shape)
    return full[(slice(None), slice(None), *(slice(None, None, s) for s in stride))]


@pytest.mark.parametrize("border", list(_PAD_MODES))
@pytest.mark.parametrize("geometry", [
    {"padding": [(1, 2), (2, 0)], "stride": [1, 2], "dilation": [2, 1], "groups": 1},
    {"padding": [(2, 2), (-1, 1)], "stride": [2, 3], "dilation": [1, 1], "groups": 2},
    {"padding": [(0, 1), (1, 1)], "stride": [1, 1], "dilation": [1, 2], "groups": 4},
])
def test_conv_reference_matches_scipy_with_np_pad(border, geometry):
    rng = np.random.default_rng(1)
    x, w = rng.standard_normal((2, 4, 7, 8)), rng.standard_normal((4, 4 // geometry["groups"], 3, 2))
    got = ref("conv", x, w, border=border, **geometry)
    want = _scipy_conv(x, w, geometry["padding"], geometry["stride"], geometry["dilation"],
                       border, geometry["groups"])
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


def test_conv_and_deconv_references_match_tvm_topi_testing():
    import tvm.topi.testing

    rng = np.random.default_rng(2)
    x, w = rng.standard_normal((1, 6, 9, 8)), rng.standard_normal((4, 3, 3, 3))
    got = ref("conv", x, w, groups=2, stride=[2, 1], padding=[(1, 1), (2, 2)])
    want = tvm.topi.testing.conv2d_nchw_python(x, w, (2, 1), (1, 2), groups=2)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
    wt = rng.standard_normal((6, 2, 3, 3))  # deconv filter [c, C/G, ...]
    got = ref("deconv", x, wt, groups=3, stride=[2, 2], padding=[(1, 1), (1, 1)])
    want = tvm.topi.testing.conv2d_transpose_nchw_python(x, wt, (2, 2), (1, 1), (0, 0), groups=3)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


def _scatter_deconv(x, w, padding, stride, dilation, groups, out_spatial):
    """deconv as the adjoint of conv: input value x[b, k2, i] times filter tap j lands on
    up-scaled position i * s + j * d - p (written independently of the spec's gather form)."""
    cin_g, cout_g = x.shape[1] // groups, w.shape[1]
    out = np.zeros((x.shape[0], cout_g * groups, *out_spatial))
    for b, k2 in itertools.product(range(x.shape[0]), range(x.shape[1])):
        g = k2 // cin_g
        for i in itertools.product(*(range(e) for e in x.shape[2:])):
            for j in itertools.product(*(range(f) for f in w.shape[2:])):
                pos = [ik * s + jk * d - p for ik, jk, s, d, (p, _)
                       in zip(i, j, stride, dilation, padding)]
                if all(0 <= q < e for q, e in zip(pos, out_spatial)):
                    for o in range(cout_g):
                        out[(b, g * cout_g + o, *pos)] += x[(b, k2, *i)] * w[(k2, o, *j)]
    return out


def test_deconv_reference_is_the_adjoint_of_conv():
    rng = np.random.default_rng(3)
    x, w = rng.standard_normal((1, 4, 3, 4)), rng.standard_normal((4, 3, 3, 2))
    attrs = {"padding": [(1, 0), (0, 2)], "stride": [2, 3], "dilation": [1, 2], "groups": 2}
    got = ref("deconv", x, w, **attrs)
    want = _scatter_deconv(x, w, attrs["padding"], attrs["stride"], attrs["dilation"], 2,
                           got.shape[2:])
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
    # <conv(y, w), x> == <y, deconv(x, w)> for every y: with the same filter and geometry
    # conv (C -> c channels) is deconv's (c -> C) adjoint
    y = rng.standard_normal((1, 6, *got.shape[2:]))
    conv = ref("conv", y, w, **attrs)
    assert conv.shape == x.shape
    np.testing.assert_allclose(np.sum(conv * x), np.sum(y * got), rtol=1e-10)


# ---- box / debox ------------------------------------------------------------------------
def test_box_by_hand():
    attrs = {"size": [1, 1, 3], "normalize": True}  # automatic padding (1, 1)
    assert np.array_equal(ref("box", X4, border="ignore", **attrs),
                          row(3 / 2, 6 / 3, 9 / 3, 7 / 2))
    assert np.array_equal(ref("box", X4, border="constant", **attrs),
                          row(3 / 3, 6 / 3, 9 / 3, 7 / 3))
    assert np.array_equal(ref("box", X4, size=[1, 1, 2], stride=[1, 1, 2]), row(3, 7))
    # over the batch and channel dims too (box does not tell them apart)
    x = np.arange(8.0).reshape(2, 2, 2)
    assert np.array_equal(ref("box", x, size=[2, 2, 1], padding=[(0, 0)] * 3),
                          x.sum(axis=(0, 1)).reshape(1, 1, 2))


@pytest.mark.parametrize("border, mode", [("constant", "constant"), ("replicate", "nearest"),
                                          ("reflect", "mirror"), ("reflect-even", "reflect")])
def test_box_reference_matches_scipy_uniform_filter(border, mode):
    x = np.random.default_rng(4).standard_normal((2, 3, 6, 7))
    got = ref("box", x, size=[1, 1, 3, 5], border=border, normalize=True)
    want = scipy.ndimage.uniform_filter(x, size=(1, 1, 3, 5), mode=mode)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


def test_box_is_depthwise_conv_with_ones():
    """Spec 4.3.2: box filtering in spatial dims is a depth-wise conv with all-1 weights."""
    x = np.random.default_rng(5).standard_normal((1, 3, 6, 5))
    attrs = {"stride": [2, 1], "dilation": [1, 2], "padding": [(1, 1), (2, 0)]}
    for border in ("constant", "replicate", "reflect-even"):
        conv = ref("conv", x, np.ones((3, 1, 2, 3)), groups=0, border=border, **attrs)
        box = ref("box", x, size=[1, 1, 2, 3], border=border, stride=[1, 1, 2, 1],
                  dilation=[1, 1, 1, 2], padding=[(0, 0), (0, 0), (1, 1), (2, 0)])
        np.testing.assert_allclose(box, conv, rtol=1e-12)


def test_debox_by_hand():
    assert np.array_equal(ref("debox", row(1, 2), size=[1, 1, 2], stride=[1, 1, 2],
                              padding=[(0, 0)] * 3), row(1, 1, 2, 2))
    # X = (2 - 1) * 1 + 3 - 2 = 2 ... with padding (1, 1): out[i] = sum_j x~[i + 1 - j]
    got = ref("debox", row(1, 2), size=[1, 1, 3], padding=[(0, 0), (0, 0), (1, 1)],
              border="ignore", normalize=True)
    assert np.array_equal(got, row((1 + 2) / 2, (1 + 2) / 2))
    got = ref("debox", row(1, 2), size=[1, 1, 3], padding=[(0, 0), (0, 0), (1, 1)],
              normalize=True)
    assert np.array_equal(got, row(3 / 3, 3 / 3))


# ---- argmax_pool / sample / desample ---------------------------------------------------------
def test_argmax_pool_by_hand():
    x = row(3, 1, 3, np.nan, 2, 5)
    assert ref("argmax_pool", x, size=[1, 1, 3], stride=[1, 1, 3],
               padding=[(0, 0)] * 3).tolist() == [[[0, 0]]]  # first of ties; NaN is largest
    neg = row(-1, -2)
    pad = {"size": [1, 1, 2], "padding": [(0, 0), (0, 0), (1, 0)]}
    assert ref("argmax_pool", neg, **pad).tolist() == [[[0, 0]]]  # the border 0 wins
    assert ref("argmax_pool", neg, border="ignore", **pad).tolist() == [[[1, 0]]]
    # row-major over the window: [2, 2] window, the max at (1, 0) is tap 2
    x = np.array([[1.0, 2.0], [9.0, 4.0]]).reshape(1, 1, 2, 2)
    assert ref("argmax_pool", x, size=[1, 1, 2, 2], padding=[(0, 0)] * 4).item() == 2
    # -0 and 0 tie (np.argmax): the first
    assert ref("argmax_pool", row(-0.0, 0.0), size=[1, 1, 2],
               padding=[(0, 0)] * 3).item() == 0


def test_argmax_pool_compiled_takes_the_first_of_signed_zeros():
    # -0 and +0 tie: the first tap, compiled as in the reference (TVM 0.27's simplifier
    # folded the tie away and the kernel took the +0)
    x = np.array([[[[-0.0, 0.0, 0.0, -0.0]]]], np.float32)
    (index,) = check_op("argmax_pool", [(x, None)], {"size": [1, 1, 1, 2],
                                                    "stride": [1, 1, 1, 2]})
    assert index.ravel().tolist() == [0, 0]


def test_sample_and_desample_by_hand():
    x = row(10, 20, 30, 40)
    attrs = {"size": [1, 1, 2], "stride": [1, 1, 2], "padding": [(0, 0)] * 3}
    assert np.array_equal(ref("sample", x, np.array([[[1, 0]]]), **attrs), row(20, 30))
    # indices outside [0, 2) are clamped
    assert np.array_equal(ref("sample", x, np.array([[[5, -3]]]), **attrs), row(20, 30))
    # 'ignore' reads -inf at a border position (max over an empty window)
    got = ref("sample", row(1, 2), np.array([[[0, 1]]]), size=[1, 1, 2], border="ignore",
              padding=[(0, 0), (0, 0), (1, 0)])
    assert np.array_equal(got, row(-np.inf, 2))
    # desample sums values back where the index points; an index matching no tap is dropped
    got = ref("desample", row(1, 2), np.array([[[1, 0]]]), **attrs)
    assert np.array_equal(got, row(0, 1, 2, 0))
    got = ref("desample", row(1, 2), np.array([[[7, 0]]]), **attrs)
    assert np.array_equal(got, row(0, 0, 2, 0))
    # overlapping windows sum: both outputs pick the middle position
    got = ref("desample", row(1, 2), np.array([[[1, 0]]]), size=[1, 1, 2],
              padding=[(0, 0)] * 3)
    assert np.array_equal(got, row(0, 3, 0))


@pytest.mark.parametrize("border, include_pad", [("ignore", False), ("constant", True)])
def test_max_pool_with_index_matches_tvm_topi_pool(border, include_pad):
    """argmax_pool + sample (stdlib max_pool_with_index) is tvm.topi.testing's max pool:
    'ignore' leaves the padding out, 'constant' pads zeros that take part."""
    import tvm.topi.testing

    x = np.random.default_rng(6).standard_normal((1, 2, 7, 6))
    attrs = {"size": [1, 1, 3, 2], "stride": [1, 1, 2, 2], "dilation": [1, 1, 1, 2],
             "padding": [(0, 0), (0, 0), (1, 1), (1, 0)], "border": border}
    index = ref("argmax_pool", x, **attrs)
    got = ref("sample", x, index, **attrs)
    want = tvm.topi.testing.poolnd_python(x, (3, 2), (2, 2), (1, 2), (1, 1), (1, 0), "max",
                                          count_include_pad=include_pad, dtype="float64")
    np.testing.assert_array_equal(got, want)


# ---- multilinear_upsample -------------------------------------------------------------------
def test_multilinear_upsample_by_hand():
    x = row(1, 3)
    up = {m: {b: ref("multilinear_upsample", x, factor=[2], method=m, border=b)
              for b in ("constant", "replicate")} for m in ("asymmetric", "symmetric")}
    assert np.array_equal(up["asymmetric"]["replicate"], row(1, 2, 3, 3))
    assert np.array_equal(up["asymmetric"]["constant"], row(1, 2, 3, 1.5))
    assert np.array_equal(up["symmetric"]["replicate"], row(1, 1.5, 2.5, 3))
    assert np.array_equal(up["symmetric"]["constant"], row(0.75, 1.5, 2.5, 2.25))
    aligned = ref("multilinear_upsample", x, factor=[2], method="aligned")
    np.testing.assert_allclose(aligned, row(1, 5 / 3, 7 / 3, 3), rtol=1e-15)
    # reflect reads x[1] left of x[0]; reflect-even x[0] again
    assert np.array_equal(ref("multilinear_upsample", x, factor=[2], border="reflect"),
                          row(0.25 * 3 + 0.75, 1.5, 2.5, 0.75 * 3 + 0.25))
    # an extent of 1 with 'aligned' samples index 0
    assert np.array_equal(ref("multilinear_upsample", row(4), factor=[3], method="aligned"),
                          row(4, 4, 4))


@pytest.mark.parametrize("border", ["constant", "replicate", "reflect", "reflect-even"])
def test_multilinear_upsample_is_the_spec_deconv(border):
    """Spec 4.3.4: linear / bilinear 2x up-sampling as depth-wise deconvs with fixed weights.
    The spec's (non-normative) asymmetric forms pad [(0, 1)], which shifts the result one
    output to the right of the method's definition (out[0] = x[0]); the Khronos C++ runtime
    pads 1 before, as here."""
    x = np.random.default_rng(7).standard_normal((2, 3, 4, 5))
    c = x.shape[1]
    sym = np.array([0.25, 0.75, 0.75, 0.25])
    asym = np.array([0.5, 1.0, 0.5])
    for method, w1, pad in (("symmetric", sym, (1, 1)), ("asymmetric", asym, (1, 0))):
        want = ref("deconv", x, np.tile(np.outer(w1, w1), (c, 1, 1, 1)), stride=[2, 2],
                   padding=[pad, pad], border=border, groups=c)
        got = ref("multilinear_upsample", x, factor=[2, 2], method=method, border=border)
        np.testing.assert_allclose(got, want, rtol=1e-13, atol=1e-13)
        want = ref("deconv", x[:, :, 0], np.tile(w1, (c, 1, 1)), stride=[2], padding=[pad],
                   border=border, groups=c)
        got = ref("multilinear_upsample", x[:, :, 0], factor=[2], method=method,
                  border=border)
        np.testing.assert_allclose(got, want, rtol=1e-13, atol=1e-13)


# ---- RoI ops -------------------------------------------------------------------------------
GRID = np.arange(16.0).reshape(1, 1, 4, 4)


def roi(op: str, x, rois, batch=None, **attrs):
    """The op's reference on float rois and (default: zeros) batch indices."""
    rois = np.asarray(rois, np.float64).reshape(-1, 4)
    batch = np.zeros(len(rois), np.int64) if batch is None else np.asarray(batch)
    return ref(op, x, rois, batch, **attrs)


def test_roi_pool_by_hand():
    size = {"output_size": [2, 2]}
    assert roi("avg_roi_pool", GRID, [0, 0, 4, 4], **size).tolist() == \
        [[[[2.5, 4.5], [10.5, 12.5]]]]
    assert roi("max_roi_pool", GRID, [0, 0, 4, 4], **size).tolist() == [[[[5, 7], [13, 15]]]]
    # coordinates round to (1, 0, 3, 2); 2 rows of 1 row each, 1 column cell of 2 columns
    assert roi("avg_roi_pool", GRID, [0.6, -0.4, 3.4, 2.49], output_size=[2, 1]).tolist() == \
        [[[[4.5], [8.5]]]]
    # r_H = 2 < p_H = 3: cells of 1 row at stride 0 all read row y0
    assert roi("max_roi_pool", GRID, [1, 0, 3, 4], output_size=[3, 1]).tolist() == \
        [[[[7], [7], [7]]]]
    # outside the input reads 0, which counts (avg) and takes part (max); empty cells give 0
    one = GRID + 1
    assert roi("avg_roi_pool", one, [-1, 0, 1, 1], output_size=[1, 1]).item() == 0.5
    assert roi("max_roi_pool", -one, [-1, 0, 1, 1], output_size=[1, 1]).item() == 0.0
    assert roi("max_roi_pool", -one, [0, 0, 1, 1], output_size=[1, 1]).item() == -1.0
    assert roi("avg_roi_pool", one, [1, 1, 1, 3], output_size=[1, 1]).item() == 0.0
    # NaN propagates through max; 0 wins over -0
    nan = GRID.copy()
    nan[0, 0, 0, 1] = np.nan
    assert np.isnan(roi("max_roi_pool", nan, [0, 0, 2, 2], output_size=[1, 1]).item())
    zeros = np.array([-0.0, 0.0, -0.0, -0.0]).reshape(1, 1, 2, 2)
    assert not np.signbit(roi("max_roi_pool", zeros, [0, 0, 2, 2], output_size=[1, 1]).item())
    assert np.signbit(roi("max_roi_pool", np.full((1, 1, 2, 2), -0.0), [0, 0, 2, 2],
                          output_size=[1, 1]).item())
    # batch indices clamp into [0, batch)
    two = np.concatenate([GRID, GRID + 100])
    assert roi("avg_roi_pool", two, [0, 0, 1, 1], batch=[5], output_size=[1, 1]).item() == 100


def test_roi_resample_by_hand():
    x = np.array([[0.0, 1.0], [2.0, 3.0]]).reshape(1, 1, 2, 2)
    assert roi("roi_resample", x, [0, 0, 1, 1], output_size=[1, 1]).item() == 0.0
    assert roi("roi_resample", x, [0.5, 0.5, 1.5, 1.5], output_size=[1, 1],
               method="asymmetric").item() == 1.5
    assert np.array_equal(roi("roi_resample", x, [0, 0, 2, 2], output_size=[2, 2],
                              method="aligned"), x)
    # beyond the input the replicate border holds the edge value
    assert roi("roi_resample", x, [5, -7, 6, -6], output_size=[1, 1],
               method="asymmetric").item() == 2.0


@pytest.mark.parametrize("method", ["symmetric", "asymmetric", "aligned"])
def test_roi_resample_of_the_whole_input_is_multilinear_upsample(method):
    x = np.random.default_rng(8).standard_normal((1, 2, 3, 4))
    got = roi("roi_resample", x, [0, 0, 3, 4], output_size=[6, 12], method=method)
    want = ref("multilinear_upsample", x, factor=[2, 3], method=method)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


# ---- argument errors ------------------------------------------------------------------------
def _check(body: str, inputs: str = "x = external<scalar>(shape = [1, 1, 4]);"):
    parse_nnef(f"version 1.0;\ngraph g( x ) -> ( y )\n{{\n    {inputs}\n    {body}\n}}\n",
               "g.nnef")


@pytest.mark.parametrize("body, message", [
    ("y = box(x, size = [1, 1, 3], border = 'reflect', padding = [(0, 0), (0, 0), (4, 0)]);",
     ("border 'reflect' is defined for one reflection, but dimension 2 \\(extent 4\\) is read "
     "at indices -4..3, beyond the -3..6 that one reflection reaches")),
    (("y = box(x, size = [1, 1, 6], border = 'reflect-even', "
     "padding = [(0, 0), (0, 0), (0, 5)]);"), "read at indices 0..8, beyond the -4..7"),
    ("y = multilinear_upsample(x, factor = [2], border = 'reflect');",
     "border 'reflect' needs spatial extents of at least 2"),
    ("y = box(x, size = [1, 1, 3], padding = [(0, 0), (0, 0), (16777217, 0)]);",
     "'padding' items must be in"),
])
def test_argument_errors_name_the_op_and_rule(body, message):
    inputs = "x = external<scalar>(shape = [1, 1, 4]);" if "upsample" not in body else \
        "x = external<scalar>(shape = [1, 1, 1]);"
    with pytest.raises(CvmcError, match=message):
        _check(body, inputs)


def test_reflect_within_one_reflection_is_accepted():
    _check("y = box(x, size = [1, 1, 3], border = 'reflect', padding = [(0, 0), (0, 0), (3, 0)]);")
    _check("y = box(x, size = [1, 1, 3], border = 'reflect-even', "
           "padding = [(0, 0), (0, 0), (0, 4)]);")


def test_argmax_pool_window_bound():
    from cvmc.ops.infer import retype

    text = """version 1.0;
graph g( x ) -> ( y )
{
    x = external<scalar>(shape = [1, 32768, 32768]);
    y = argmax_pool(x, size = [1, 32768, 32768]);
}
"""
    with pytest.raises(CvmcError, match="a window of 1073741824 taps is more than cvmc "
                                        "supports \\(2\\^29\\)"):
        retype(parse_nnef(text, "g.nnef"))


# ---- compiled ------------------------------------------------------------------------------
def test_sum_bound_can_fail():
    """The conv bound is tight enough to catch a wrong term: dropping one tap fails it."""
    rng = np.random.default_rng(9)
    x, w = rng.standard_normal((1, 2, 5)).astype(np.float32), \
        rng.standard_normal((3, 2, 3)).astype(np.float32)
    inputs = [(x, None), (w, None)]
    (tol,) = sum_tolerances("conv", inputs, {}, terms=2 * 3)
    wrong = ref("conv", x, w[:, :, :2], padding=[(1, 0)])
    right = ref("conv", x, w)
    assert (np.abs(right - wrong) > tol).any()
    check_op("conv", inputs, {}, terms=2 * 3)


GRAPH = """version 1.0;
graph D( x ) -> ( y, z, u )
{
    x = external<scalar>(shape = [1, 16, 24, 24]);
    w = variable<scalar>(shape = [32, 16, 3, 3], label = "w");
    b = variable<scalar>(shape = [1, 32], label = "b");
    y = conv(x, w, b, border = 'reflect', stride = [2, 2]);
    z = avg_pool(x, size = [1, 1, 3, 3], stride = [1, 1, 2, 2], border = 'ignore');
    u = multilinear_upsample(y, factor = [2, 2]);
}
"""

RUN = """
import hashlib, sys
import numpy as np
import cvmc_runtime
model = cvmc_runtime.load(sys.argv[1])
feeds = dict(np.load(sys.argv[2]))
for _ in range(5):
    out = model.run(feeds)
    print(hashlib.sha256(b"".join(out[k].tobytes() for k in sorted(out))).hexdigest())
"""


def test_same_bits_every_run_and_thread_count(tmp_path):
    rng = np.random.default_rng(10)
    weights = {"w": rng.standard_normal((32, 16, 3, 3)).astype(np.float32),
               "b": rng.standard_normal((1, 32)).astype(np.float32)}
    g = parse_nnef(GRAPH, "d.nnef")
    g = g.replace(constants={**g.constants, **weights})
    cvmc.compile(g, tmp_path / "d.cvmx", target="llvm")
    x = rng.standard_normal((1, 16, 24, 24)).astype(np.float32)
    np.savez(tmp_path / "feeds.npz", x=x)
    (tmp_path / "run.py").write_text(RUN)
    digests = {}
    for threads in (1, 2):
        env = {**os.environ, "TVM_NUM_THREADS": str(threads)}
        proc = subprocess.run([sys.executable, str(tmp_path / "run.py"), str(tmp_path / "d.cvmx"),
                               str(tmp_path / "feeds.npz")], capture_output=True, text=True,
                              env=env, timeout=300, check=False)
        assert proc.returncode == 0, proc.stderr
        digests[threads] = proc.stdout.split()
    assert len(digests[1]) == 5 and len(set(digests[1] + digests[2])) == 1
    # and those bits are the reference's within the conv bound
    import cvmc_runtime

    got = cvmc_runtime.load(tmp_path / "d.cvmx").run({"x": x})
    want = cvmc.reference_run(g, {"x": x})
    (tol,) = sum_tolerances("conv", [(x, None), (weights["w"], None), (weights["b"], None)],
                            {"border": "reflect", "stride": [2, 2]}, terms=16 * 9 + 1)
    assert np.all(np.abs(got["y"].astype(np.float64) - want["y"]) <= tol)

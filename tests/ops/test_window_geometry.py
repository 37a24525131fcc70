"""Degenerate window geometry (issue 22, item 8): every conv-like op refuses, with the
rule's words, a window whose padding (given or automatic) reaches past the input further
than both the filter size and the input extent, and strides, dilations or dilated kernels
beyond 2^24 (window positions must fit int32 in the kernels)."""
from __future__ import annotations

import numpy as np
import pytest

from cvmc.errors import CvmcError
from cvmc.frontend.nnef import parse_nnef
from tests.oputil import one_op_graph

DOC = ("version 1.0;\ngraph G(x) -> (y) {\n  x = external(shape = [1, 1, 4, 4]);\n"
       "  w = constant(shape = [1, 1, 3, 3], value = [1.0]);\n  y = {call};\n}\n")
DEGENERATE = "at least the filter size 3 and more than the input extent 4"


@pytest.mark.parametrize("call, words", [
    # automatic padding: t = (4 - 1) + 2 * 10^6 + 1 - 4, 10^6 before and after
    ("conv(x, w, dilation = [1000000, 1000000])",
     f"conv 'y': padding 1000000 before spatial axis 0 (K=3, dilation=1000000) is {DEGENERATE}"),
    ("conv(x, w, dilation = [1, 5])",
     f"padding 5 before spatial axis 1 (K=3, dilation=5) is {DEGENERATE}"),
    ("conv(x, w, padding = [(0, 0), (0, 5)])", "padding 5 after spatial axis 1"),
    ("deconv(x, w, dilation = [1000000, 1])",
     "deconv 'y': padding 1000000 before spatial axis 0 (K=3, dilation=1000000)"),
    ("conv(x, w, dilation = [1000000000000, 1])",
     "dilation 1000000000000 along spatial axis 0 is outside 1..16777216"),
    ("conv(x, w, stride = [1, 1000000000000])",
     "stride 1000000000000 along spatial axis 1 is outside 1..16777216"),
    ("box(x, size = [1, 1, 3, 3], dilation = [1, 1, 1000000, 1])",
     "box 'y': padding 1000000 before input axis 2"),
    ("max_pool(x, size = [1, 1, 3, 3], dilation = [1, 1, 1, 1000000])",
     "padding 1000000 before input axis 3"),
    ("debox(x, size = [1, 1, 3, 3], stride = [1, 1, 100000000, 1])",
     "stride 100000000 along input axis 2 is outside 1..16777216"),
])
def test_nnef_degenerate_window_is_refused(call, words):
    with pytest.raises(CvmcError) as e:
        parse_nnef(DOC.replace("{call}", call), "g.nnef")
    assert words in e.value.message and e.value.span.line == 5, e.value.message


@pytest.mark.parametrize("call", [
    "conv(x, w)", "conv(x, w, dilation = [2, 2])",  # 'same' padding 2 < the input extent
    "conv(x, w, padding = [(2, 2), (4, 4)], dilation = [2, 4])",  # padding = dilation
    "conv(x, w, stride = [4, 4])", "max_pool(x, size = [1, 1, 8, 8])",
    "deconv(x, w, stride = [3, 3], dilation = [2, 2])",
])
def test_nnef_ordinary_windows_still_pass(call):
    parse_nnef(DOC.replace("{call}", call), "g.nnef")


def test_a_same_conv_on_a_1x1_input_passes():
    """Padding up to the filter size stays legal whatever the input (NNEF 4.3 recommends
    it): a 3x3 'same' conv and a 5x5 one over a 1x1 map."""
    for k in (3, 5):
        parse_nnef(DOC.replace("4, 4]", "1, 1]").replace("3, 3]", f"{k}, {k}]")
                   .replace("{call}", "conv(x, w)"), "g.nnef")


def _float(*shape):
    return np.zeros(shape, np.float32), None


@pytest.mark.parametrize("op, attrs, words", [
    ("onednn.convolution", {"strides": [1, 1], "pads_begin": [0, 0], "pads_end": [0, 0],
                            "dilations": [1000000, 1], "auto_pad": "same_upper",
                            "data_format": "NCX", "weights_format": "OIX"},
     "padding 1000000 before spatial axis 0"),
    ("onednn.convolution", {"strides": [1, 1], "pads_begin": [0, 9], "pads_end": [0, 0],
                            "dilations": [1, 1], "data_format": "NCX",
                            "weights_format": "OIX"},
     "padding 9 before spatial axis 1"),
    ("cinn.conv", {"dilations": [1, 1000000], "padding_algorithm": "SAME"},
     "padding 1000000 before spatial axis 1"),
])
def test_onednn_and_cinn_degenerate_window_is_refused(op, attrs, words):
    with pytest.raises(CvmcError) as e:
        one_op_graph(op, [_float(1, 1, 4, 4), _float(1, 1, 3, 3)], attrs, weights=(1,))
    assert words in e.value.message and DEGENERATE in e.value.message, e.value.message

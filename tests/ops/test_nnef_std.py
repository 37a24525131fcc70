"""Shape rules of the NNEF standard primitives (cvmc/ops/nnef_std*.py).

Oracle: the Khronos `nnef` parser's `infer_shapes` on a one-op document per case; where
its checks are laxer or differ from spec chapter 4, hand-computed cases from the spec's
formulas instead (each says why).
"""
from __future__ import annotations

import ast
import re
from pathlib import Path

import nnef
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import cvmc.ops  # noqa: F401  (registers every op)
from cvmc.errors import OpRuleError
from cvmc.ir.graph import TensorType
from cvmc.ops import lookup
from cvmc.ops.registry import REQUIRED

_DTYPE = {"scalar": "float32", "logical": "bool", "integer": "int32"}


def entry(name: str):
    """The registry entry a document's `name(...)` resolves to for NNEF semantics."""
    return lookup(f"nnef.{name}") or lookup(name)


def ours(name: str, inputs: list, attrs: dict) -> list[tuple[int, ...]]:
    """Output shapes from the registry; inputs are shapes or (shape, nnef type) pairs."""
    d = entry(name.split("<")[0])  # cast<integer>: the generic type is the frontend's
    assert d is not None and not d.integer_op, name
    types = [TensorType(tuple(s), _DTYPE[t]) for s, t in map(_typed, inputs)]
    return d.infer_shapes(types, d.normalize_attrs(attrs))


def _typed(inp):
    return inp if isinstance(inp, tuple) and isinstance(inp[1], str) else (inp, "scalar")


def _lit(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return f"'{v}'"
    if isinstance(v, tuple):
        return "(" + ", ".join(_lit(x) for x in v) + ")"
    if isinstance(v, list):
        return "[" + ", ".join(_lit(x) for x in v) + "]"
    return str(v)


def oracle(name: str, inputs: list, attrs: dict, n_out: int = 1, array_in: bool = False):
    """Output shapes from the Khronos parser, or None when its shape inference rejects."""
    ins = [f"i{k}" for k in range(len(inputs))]
    outs = [f"o{k}" for k in range(n_out)]
    body = [f"i{k} = external<{t}>(shape = {_lit(list(s))});"
            for k, (s, t) in enumerate(map(_typed, inputs))]
    args = [_lit_ids(ins)] if array_in else list(ins)
    args += [f"{k} = {_lit(v)}" for k, v in attrs.items()]
    lhs = _lit_ids(outs) if n_out > 1 or name in ("split", "unstack") else outs[0]
    body.append(f"{lhs} = {name}({', '.join(args)});")
    text = (f"version 1.0;\ngraph G({', '.join(ins)}) -> ({', '.join(outs)})\n{{\n  "
            + "\n  ".join(body) + "\n}\n")
    try:  # the parser runs the shape check of array-result ops (split) while parsing
        graph = nnef.parse_string(text)
    except AssertionError:
        return None
    try:  # TypeError: the parser fails formatting its message for array results
        nnef.infer_shapes(graph)
    except (nnef.Error, AssertionError, IndexError, TypeError):
        return None
    return [tuple(graph.tensors[o].shape) for o in outs]


def _lit_ids(names: list[str]) -> str:
    return "[" + ", ".join(names) + "]"


# (nnef name, inputs, attrs, number of outputs); each is run through both sides
AGREE = [
    ("exp", [[2, 3]], {}, 1),
    ("not", [([4], "logical")], {}, 1),
    ("cast<integer>", [[1, 2]], {}, 1),
    ("add", [[1, 16, 32, 32], [1, 16]], {}, 1),  # khr_op_add_aligned: aligned LEFT
    ("add", [[2, 1, 3], [1, 4, 1]], {}, 1),
    ("sub", [[], [2, 3]], {}, 1),
    ("mul", [[1, 16, 32, 32], [16]], {}, 1),  # [16] lines up with the batch dim
    ("pow", [[2, 16], [16]], {}, 1),  # numpy would accept; NNEF aligns 16 with 2
    ("lt", [[3], [3]], {}, 1),
    ("and", [([2, 2], "logical"), ([1], "logical")], {}, 1),
    ("select", [([1, 3], "logical"), [2, 3], [2, 1]], {}, 1),
    ("select", [([2], "logical"), [3, 1], [1, 4]], {}, 1),
    ("sum_reduce", [[2, 3, 4]], {"axes": [0, 2]}, 1),
    ("sum_reduce", [[2, 3, 4]], {"axes": [1], "normalize": True}, 1),
    ("argmax_reduce", [[2, 3]], {"axes": [1]}, 1),
    ("any_reduce", [([2, 3], "logical")], {"axes": []}, 1),
    ("max_reduce", [[2, 1, 3]], {"axes": [3]}, 1),  # tract_softmax_quant_bad_axes
    ("matmul", [[2, 3], [3, 4]], {}, 1),
    ("matmul", [[3, 2], [3, 4]], {"transposeA": True}, 1),
    ("matmul", [[2, 3], [4, 3]], {"transposeB": True}, 1),
    ("matmul", [[3, 2], [4, 3]], {"transposeA": True, "transposeB": True}, 1),
    ("matmul", [[2, 1, 3, 4], [1, 5, 4, 2]], {}, 1),
    ("matmul", [[2, 3], [4, 3]], {}, 1),
    ("matmul", [[2, 3], [3]], {}, 1),
    ("reshape", [[1, 2, 3, 4]], {"shape": [6], "axis_start": 1, "axis_count": 2}, 1),
    ("reshape", [[2, 3, 4]], {"shape": [0, -1]}, 1),
    ("reshape", [[2, 3, 4]], {"shape": [4, -1, 2]}, 1),
    ("reshape", [[2, 3, 4]], {"shape": [1, 2, 3, 4], "axis_start": 0}, 1),
    ("reshape", [[2, 3, 4]], {"shape": [5, -1]}, 1),
    ("reshape", [[2, 3, 4]], {"shape": [7, 3]}, 1),
    ("reshape", [[2, 3, 4]], {"shape": [-1, -1]}, 1),
    ("reshape", [[2, 3, 4]], {"shape": [2], "axis_start": 3, "axis_count": 1}, 1),
    ("unsqueeze", [[2, 3]], {"axes": [0, 3]}, 1),
    ("unsqueeze", [[2, 3]], {"axes": [1]}, 1),
    ("unsqueeze", [[2, 3]], {"axes": [3]}, 1),
    ("transpose", [[1, 16, 32, 32]], {"axes": [0, 2, 3, 1]}, 1),  # khr_op_transpose
    ("transpose", [[2, 3, 4, 5]], {"axes": [1, 0]}, 1),  # permutes the leading axes only
    ("transpose", [[2, 3, 4]], {"axes": []}, 1),  # no change (CVM: reverse)
    ("transpose", [[2, 3, 4]], {"axes": [0, 2]}, 1),
    ("transpose", [[2, 3]], {"axes": [0, 1, 2]}, 1),
    ("squeeze", [[4, 1, 32, 1, 32]], {"axes": [1, 3]}, 1),  # khr_op_squeeze
    ("squeeze", [[1, 3, 1]], {"axes": []}, 1),  # no change (CVM: all unit dims)
    ("squeeze", [[1, 3, 1]], {"axes": [3]}, 1),
    ("split", [[1, 6, 4]], {"axis": 1, "ratios": [1, 2]}, 2),
    ("split", [[1, 6, 4]], {"axis": 2, "ratios": [3, 1]}, 2),
    ("split", [[1, 6, 4]], {"axis": 1, "ratios": [4, 1]}, 2),
    ("split", [[1, 6, 4]], {"axis": 3, "ratios": [1, 1]}, 2),
    ("unstack", [[2, 3, 4]], {"axis": 1}, 3),
    ("unstack", [[2, 3, 4]], {"axis": 3}, 1),
    ("slice", [[1, 16, 32, 32]], {"axes": [2, 3], "begin": [1, 1], "end": [-1, -1]}, 1),
    ("slice", [[5, 6]], {"axes": [1], "begin": [2], "end": [0]}, 1),
    ("slice", [[5, 6]], {"axes": [0, 1], "begin": [0, 1], "end": [5, 6], "stride": [2, 2]}, 1),
    ("slice", [[5, 6]], {"axes": [1], "begin": [-1], "end": [-100], "stride": [-1]}, 1),
    ("slice", [[5, 6]], {"axes": [1], "begin": [4], "end": [1], "stride": [-2]}, 1),
    ("slice", [[5, 6]], {"axes": [1], "begin": [0], "end": [100]}, 1),
    ("slice", [[5, 6]], {"axes": [1], "begin": [4], "end": [2]}, 1),
    ("slice", [[5, 6]], {"axes": [2], "begin": [0], "end": [1]}, 1),
    ("slice", [[5, 6]], {"axes": [1], "begin": [0, 1], "end": [1]}, 1),
    ("pad", [[1, 3, 4, 4]], {"padding": [(0, 0), (0, 0), (1, 2), (2, 1)]}, 1),
    ("pad", [[1, 3, 4, 4]], {"padding": [(1, 2), (2, 1)], "border": "reflect"}, 1),
    ("tile", [[2, 3]], {"repeats": [2, 1]}, 1),
    ("tile", [[2, 3]], {"repeats": [2]}, 1),
    ("gather", [[1, 16, 32, 32], ([8], "integer")], {"axis": 1}, 1),  # khr_op_gather
    ("gather", [[4, 5], ([2, 3], "integer")], {}, 1),
    ("gather", [[4, 5], ([2], "integer")], {"axis": 2}, 1),
    ("conv", [[1, 3, 32], [16, 3, 5], [1, 16]],
     {"stride": [1], "dilation": [1], "padding": []}, 1),  # khr_op_conv1d
    ("conv", [[1, 3, 10, 10], [8, 3, 3, 3]], {"padding": [(1, 1), (2, 2)], "stride": [2, 2]}, 1),
    ("conv", [[1, 3, 11, 9], [8, 3, 3, 3]], {"stride": [2, 3]}, 1),
    ("conv", [[1, 3, 11, 9], [8, 3, 3, 2]], {"padding": [(0, 0), (0, 1)], "dilation": [2, 3]}, 1),
    ("conv", [[1, 4, 8, 8], [4, 1, 3, 3]], {"groups": 0}, 1),
    ("conv", [[1, 4, 8, 8], [6, 2, 3, 3]], {"groups": 2}, 1),
    ("conv", [[1, 4, 8, 8], [6, 2, 3, 3]], {}, 1),
    ("conv", [[1, 4, 8, 8], [6, 2, 3, 3]], {"groups": 4}, 1),
    ("conv", [[1, 3, 8], [16, 3, 5], [1, 7]], {}, 1),
    ("conv", [[1, 3, 8, 8], [16, 3, 5]], {}, 1),
    ("conv", [[1, 3, 8, 8], [16, 3, 3, 3]], {"stride": [1]}, 1),
    ("conv", [[1, 3, 8, 8], [16, 3, 3, 3]], {"padding": [(1, 1)]}, 1),
    ("deconv", [[1, 16, 32, 32], [16, 3, 5, 5], [1, 3]], {"padding": []}, 1),  # khr_op_deconv2d
    ("deconv", [[1, 16, 5, 7], [16, 3, 3, 3]], {"stride": [2, 2]}, 1),
    ("deconv", [[1, 16, 5, 7], [16, 3, 3, 3]], {"stride": [2, 2], "padding": [(1, 1), (0, 1)]}, 1),
    ("deconv", [[1, 16, 5, 7], [16, 3, 3, 3]],
     {"stride": [2, 2], "padding": [(1, 1), (1, 1)], "output_shape": [1, 3, 10, 14]}, 1),
    ("deconv", [[1, 16, 5, 7], [16, 3, 3, 3]],
     {"stride": [2, 2], "padding": [(1, 1), (1, 1)], "output_shape": [1, 3, 12, 14]}, 1),
    ("deconv", [[1, 16, 5, 7], [16, 3, 3, 3]], {"output_shape": [1, 4, 5, 7]}, 1),
    ("deconv", [[1, 4, 6, 6], [4, 1, 3, 3]], {"groups": 0}, 1),
    ("deconv", [[1, 4, 6, 6], [8, 1, 3, 3]], {}, 1),
    ("box", [[1, 16, 32, 32]], {"size": [1, 1, 3, 3], "stride": [1, 1, 2, 2]}, 1),
    ("box", [[1, 16, 32, 31]], {"size": [1, 1, 3, 3], "stride": [1, 1, 2, 2],
                                "padding": [(0, 0), (0, 0), (1, 1), (0, 0)], "border": "ignore"}, 1),
    ("box", [[2, 16, 9, 9]], {"size": [2, 4, 3, 3], "stride": [1, 4, 1, 1],
                              "dilation": [1, 1, 2, 2], "padding": [(0, 0)] * 4}, 1),
    ("box", [[1, 16, 32, 32]], {"size": [3, 3]}, 1),
    ("box", [[1, 16, 32, 32]], {"size": [1, 1, 3, 3], "stride": [2, 2]}, 1),
    ("debox", [[1, 16, 4, 5]], {"size": [1, 1, 2, 2], "stride": [1, 1, 2, 2]}, 1),
    ("debox", [[1, 16, 4, 5]], {"size": [1, 1, 3, 3], "stride": [1, 1, 2, 2],
                                "padding": [(0, 0), (0, 0), (1, 1), (1, 0)]}, 1),
    ("debox", [[1, 16, 4, 5]], {"size": [1, 1, 3, 3], "stride": [1, 1, 2, 2],
                                "padding": [(0, 0)] * 4, "output_shape": [1, 16, 10, 11]}, 1),
    ("debox", [[1, 16, 4, 5]], {"size": [1, 1, 3, 3], "stride": [1, 1, 2, 2],
                                "padding": [(0, 0)] * 4, "output_shape": [1, 16, 12, 11]}, 1),
    ("argmax_pool", [[1, 2, 7, 7]], {"size": [1, 1, 3, 3], "stride": [1, 1, 2, 2],
                                     "padding": [(0, 0)] * 4, "border": "ignore"}, 1),
    ("multilinear_upsample", [[1, 3, 4, 5]], {"factor": [2, 3]}, 1),
    ("multilinear_upsample", [[1, 3, 4, 5]], {"factor": [2], "method": "aligned"}, 1),
    ("avg_roi_pool", [[1, 16, 32, 32], [8, 4], ([8], "integer")], {"output_size": [16, 16]}, 1),
    ("max_roi_pool", [[2, 16, 32, 32], [3, 4], ([3], "integer")], {"output_size": [2, 3]}, 1),
    ("roi_resample", [[2, 16, 32, 32], [3, 4], ([3], "integer")], {"output_size": [2, 3]}, 1),
    ("avg_roi_pool", [[1, 16, 32, 32], [8, 5], ([8], "integer")], {"output_size": [4, 4]}, 1),
    ("avg_roi_pool", [[1, 16, 32, 32], [8, 4], ([7], "integer")], {"output_size": [4, 4]}, 1),
    ("avg_roi_pool", [[1, 16, 32, 32], [8, 4], ([8], "integer")], {"output_size": [4]}, 1),
]


def _ids(cases):
    return [f"{c[0]}-{k}" for k, c in enumerate(cases)]


@pytest.mark.parametrize("name,inputs,attrs,n_out", AGREE, ids=_ids(AGREE))
def test_agrees_with_khronos_parser(name, inputs, attrs, n_out):
    want = oracle(name, inputs, attrs, n_out)
    if want is None:
        with pytest.raises(OpRuleError, match=name):
            ours(name, inputs, attrs)
    else:
        assert ours(name, inputs, attrs) == want


ARRAY_IN = [  # ops taking a tensor array: the oracle call spells `op([i0, i1], ...)`
    ("concat", [[1, 2, 3], [1, 4, 3]], {"axis": 1}),
    ("concat", [[1, 2, 3], [1, 4, 3], [1, 1, 3]], {"axis": 1}),
    ("concat", [[1, 2, 3], [1, 4, 2]], {"axis": 1}),
    ("concat", [[1, 2, 3], [1, 2]], {"axis": 1}),
    ("concat", [[1, 2, 3]], {"axis": 3}),
    ("stack", [[2, 3], [2, 3], [2, 3]], {"axis": 2}),
    ("stack", [[2, 3], [2, 3]], {"axis": 0}),
    ("stack", [[2, 3], [2, 4]], {"axis": 0}),
    ("stack", [[2, 3]], {"axis": 3}),
]


@pytest.mark.parametrize("name,inputs,attrs", ARRAY_IN, ids=_ids(ARRAY_IN))
def test_array_input_ops_agree_with_khronos_parser(name, inputs, attrs):
    want = oracle(name, inputs, attrs, array_in=True)
    if want is None:
        with pytest.raises(OpRuleError, match=name):
            ours(name, inputs, attrs)
    else:
        assert ours(name, inputs, attrs) == want


def test_bad_axes_message_matches_khronos_wording():
    with pytest.raises(OpRuleError, match=r"max_reduce: axes must be in range \[0,3\), "
                                          r"found \[3\]"):
        ours("max_reduce", [[2, 1, 3]], {"axes": [3]})


def test_broadcast_error_names_operands():
    with pytest.raises(OpRuleError, match=r"add: .*dimension 0.*x \[2, 16\] vs y \[16\]"):
        ours("add", [[2, 16], [16]], {})


# ---- where spec chapter 4 is stricter than (or differs from) the Khronos parser -----------
@pytest.mark.parametrize("name,inputs,attrs,why", [
    ("sum_reduce", [[2, 3]], {"axes": [1, 1]}, "4.4: items in axes must be unique"),
    ("unsqueeze", [[2, 3]], {"axes": [0, 0]}, "duplicate insert position"),
    ("squeeze", [[2, 3]], {"axes": [1]}, "4.5.1: squeeze removes singleton dims"),
    ("slice", [[5, 6]], {"axes": [1], "begin": [3], "end": [3]}, "4.5.4: end > begin"),
    ("pad", [[1, 4]], {"padding": [(0, 0), (-2, -2)]}, "extents must stay positive"),
    ("conv", [[1, 3, 4], [8, 3, 7]], {"padding": [(1, 1)]}, "4.3: p + X + q >= f_d"),
    ("conv", [[1, 3, 8], [16, 3, 5], [16]], {}, "4.3.1: bias batch dim must be singular"),
    ("deconv", [[1, 16, 2], [16, 3, 5]], {"padding": [(3, 3)]}, "output extent 0"),
    ("desample", [[1, 1, 2, 2], ([1, 1, 2, 2], "integer")],
     {"size": [1, 1, 2, 2], "border": "ignore"}, "4.3.3: desample border is 'constant'"),
    ("conv", [[1, 3, 8, 8], [16, 3, 3, 3]], {"border": "ignore"}, "4.3.1 border list"),
    ("multilinear_upsample", [[1, 3, 4]], {"factor": [2], "method": "linear"}, "4.3.4"),
])
def test_spec_rejects(name, inputs, attrs, why):
    with pytest.raises(OpRuleError, match=name):
        ours(name, inputs, attrs)


def test_conv_bias_singular_channel_is_accepted():
    # spec 4.3.1: "The channel dimension of bias must equal the batch dimension of filter
    # or must be singular" (the Khronos parser rejects [1, 1]); output [1, 16, 8]
    assert ours("conv", [[1, 3, 8], [16, 3, 5], [1, 1]], {}) == [(1, 16, 8)]
    assert ours("conv", [[1, 3, 8], [16, 3, 5], []], {}) == [(1, 16, 8)]


def test_sample_index_has_the_output_shape():
    # spec 4.3.3: index shape == output shape for sample (the parser compares it with the
    # input instead); 2x2 windows, stride 2, no padding on [1,1,4,6] -> [1,1,2,3]
    attrs = {"size": [1, 1, 2, 2], "stride": [1, 1, 2, 2], "padding": [(0, 0)] * 4}
    index = ([1, 1, 2, 3], "integer")
    assert ours("sample", [[1, 1, 4, 6], index], attrs) == [(1, 1, 2, 3)]
    with pytest.raises(OpRuleError, match="sample: 'index' shape"):
        ours("sample", [[1, 1, 4, 6], ([1, 1, 4, 6], "integer")], attrs)
    # desample maps back up: index has the (down-scaled) input shape
    assert ours("desample", [[1, 1, 2, 3], index], attrs) == [(1, 1, 4, 6)]
    with pytest.raises(OpRuleError, match="desample: 'index' shape"):
        ours("desample", [[1, 1, 2, 3], ([1, 1, 4, 6], "integer")], attrs)


@pytest.mark.parametrize("shape,attrs", [
    ([1, 3, 9, 9], {"size": [1, 1, 3, 3], "stride": [1, 1, 2, 2], "border": "ignore"}),
    ([1, 3, 9, 8], {"size": [1, 1, 3, 3], "stride": [1, 1, 2, 2],
                    "padding": [(0, 0), (0, 0), (1, 1), (0, 1)]}),
    ([2, 3, 5, 5], {"size": [1, 1, 2, 2], "dilation": [1, 1, 2, 2], "padding": [(0, 0)] * 4}),
])
def test_max_pool_expansion_matches_parser_max_pool(shape, attrs):
    # stdlib max_pool = max_pool_with_index = argmax_pool + sample; the parser infers
    # max_pool atomically, so both primitives together must reproduce its shape
    (want,) = oracle("max_pool", [shape], attrs)
    (index,) = ours("argmax_pool", [shape], attrs)
    assert index == want
    assert ours("sample", [shape, (list(index), "integer")], attrs) == [want]


def test_update_shapes_must_match():
    assert ours("update", [[2, 3], [2, 3]], {}) == [(2, 3)]
    with pytest.raises(OpRuleError, match=r"update: shape of update value \[3, 2\]"):
        ours("update", [[2, 3], [3, 2]], {})


def test_roi_batch_index_spec_shape_n_by_1_is_accepted():
    # spec 4.6.1: batch_index has shape (N, 1); the parser's tests use (N)
    assert ours("avg_roi_pool", [[1, 16, 32, 32], [8, 4], ([8, 1], "integer")],
                {"output_size": [7, 7]}) == [(8, 16, 7, 7)]


def test_signatures_follow_stdlib_defaults():
    conv = entry("conv")
    assert conv.inputs == ("input", "filter", "bias?")
    a = conv.normalize_attrs({})
    assert (a.border, a.padding, a.stride, a.dilation, a.groups) == ("constant", (), (), (), 1)
    for name in ("reshape", "slice", "tile", "transpose", "squeeze"):
        assert entry(name).name == f"nnef.{name}"  # bare names are the CVM ops
    assert entry("reshape").normalize_attrs({"shape": [2]}).axis_count == -1
    assert entry("split").variadic_outputs and entry("concat").variadic
    assert lookup("nnef.tile").attr("repeats") is not None and lookup("tile").attr("repeats") is None


def test_unknown_border_is_rejected_with_choices():
    with pytest.raises(OpRuleError, match="border.*'constant'"):
        entry("pad").normalize_attrs({"padding": [(0, 0)], "border": "wrap"})


# ---- property tests against the parser ---------------------------------------------------
_dims = st.lists(st.integers(1, 3), min_size=0, max_size=4)


@settings(max_examples=40, deadline=None)
@given(x=_dims, y=_dims)
def test_binary_broadcast_property(x, y):
    want = oracle("add", [x, y], {})
    if want is None:
        with pytest.raises(OpRuleError):
            ours("add", [x, y], {})
    else:
        assert ours("add", [x, y], {}) == want


@settings(max_examples=40, deadline=None)
@given(extent=st.integers(1, 12), f=st.integers(1, 4), s=st.integers(1, 3),
       d=st.integers(1, 2), pad=st.none() | st.tuples(st.integers(0, 2), st.integers(0, 2)))
def test_conv_output_size_property(extent, f, s, d, pad):
    attrs = {"stride": [s], "dilation": [d], "padding": [pad] if pad else []}
    inputs = [[1, 2, extent], [4, 2, f]]
    fd = (f - 1) * d + 1
    if pad and pad[0] + extent + pad[1] < fd:  # spec 4.3: the numerator must be >= 0
        with pytest.raises(OpRuleError, match="dilated window"):
            ours("conv", inputs, attrs)
        return
    if pad and any(p >= f and p > extent for p in pad):  # degenerate: cvmc refuses it
        with pytest.raises(OpRuleError, match="at least the filter size"):
            ours("conv", inputs, attrs)
        return
    assert ours("conv", inputs, attrs) == oracle("conv", inputs, attrs)
    # deconv maps the conv output back; with auto padding X = x * s
    (out,) = ours("conv", inputs, attrs)
    back = [[1, 4, out[2]], [4, 2, f]]
    want_up = out[2] * s if not pad else (out[2] - 1) * s + fd - sum(pad)
    if want_up < 1:  # e.g. x=1, s=2, padding (0,1): X = 0 is no tensor
        with pytest.raises(OpRuleError, match="positive extents"):
            ours("deconv", back, attrs)
    elif pad and any(p >= f and p > want_up for p in pad):
        # the same degenerate geometry as conv's, seen from the deconv's output X (its
        # conv twin's input): extent 2, f=1, s=2, padding (0,2) crops X to 1 < 2
        with pytest.raises(OpRuleError, match="at least the filter size"):
            ours("deconv", back, attrs)
    else:
        assert ours("deconv", back, attrs) == [(1, 2, want_up)]


# ---- every stdlib primitive has an entry with its declared signature ---------------------
STDLIB = Path(__file__).resolve().parents[2] / "cvmc" / "frontend" / "stdlib.nnef"
_DECL = re.compile(r"(\w+)\s*(?:<[^>]*>)?\s*\((.*)\)\s*->\s*\((.*)\)\s*;", re.DOTALL)
_NOT_OPS = ("external", "variable", "constant")  # graph inputs and weights, not nodes


def _params(text: str) -> list[tuple[str, str, str | None]]:
    """(name, type, default literal) per parameter; commas inside (...) don't split."""
    parts, depth, cur = [], 0, ""
    for ch in text + ",":
        depth += (ch == "(") - (ch == ")")
        if ch == "," and depth == 0:
            name, rest = cur.split(":", 1)
            typ, _, default = rest.partition("=")
            parts.append((name.strip(), typ.strip(), default.strip() or None))
            cur = ""
        else:
            cur += ch
    return parts


def _primitives():
    text = re.sub(r"#.*", "", STDLIB.read_text())
    chunks = [c for c in text.split("fragment ")[1:] if "{" not in c]  # no body: primitive
    return [m for m in map(_DECL.match, chunks) if m.group(1) not in _NOT_OPS]


def _literal(text: str):
    return ast.literal_eval(text.replace("true", "True").replace("false", "False"))


@pytest.mark.parametrize("decl", _primitives(), ids=lambda m: m.group(1))
def test_stdlib_primitive_has_matching_entry(decl):
    name, params, results = decl.group(1), _params(decl.group(2)), _params(decl.group(3))
    d = entry(name)
    assert d is not None, f"no registry entry for NNEF primitive {name}"
    inputs = [("*" if t.endswith("[]") else "") + n + ("?" if dflt else "")
              for n, t, dflt in params if t.startswith("tensor")]
    assert list(d.inputs) == inputs
    # element kinds: `tensor<scalar>` -> scalar, `tensor<?>[]` -> ?[], `tensor<>` -> any
    kinds = [re.sub(r"tensor<(\w*|\?)>", lambda m: m.group(1) or "any", t.replace(" ", ""))
             for _, t, _ in params if t.startswith("tensor")]
    result = re.sub(r"tensor<(\w*|\?)>(\[\])?", r"\1", results[0][1].replace(" ", ""))
    assert (list(d.in_kinds), d.out_kind) == (kinds, result), d.types
    attrs = [(n, t, dflt) for n, t, dflt in params if not t.startswith("tensor")]
    assert [a.name for a in d.attrs] == [n for n, _, _ in attrs]
    for (n, t, dflt), at in zip(attrs, d.attrs):
        assert at.nnef_type == t.replace(" ", ""), n
        if dflt is None:
            assert at.default is REQUIRED, n
        else:
            assert at.normalize(name, at.default) == at.normalize(name, _literal(dflt)), n
    array_result = results[0][1].endswith("[]")
    assert d.variadic_outputs == array_result and len(d.outputs) == len(results)

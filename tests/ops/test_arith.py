"""GOPS counts (`arith` rules): hand-computed operations of a few shapes per op family."""
from __future__ import annotations

import pytest

from cvmc.ir.graph import TensorType
from cvmc.ops import all_ops, lookup
from cvmc.ops.registry import Fusion


def count(op: str, shapes: list[tuple[int, ...]], dtype: str = "float32", precision=None,
          out_shape: tuple[int, ...] | None = None, **attrs) -> int:
    """arith_ops of one `op` node on inputs of `shapes`; checks the output shape when given
    (the counts below are worked out for it)."""
    d = lookup(op)
    a = d.normalize_attrs(attrs)
    ins = [TensorType(tuple(s), dtype, precision) for s in shapes]
    outs = [TensorType(s, dtype, precision) for s in d.infer_shapes(ins, a)]
    if out_shape is not None:
        assert outs[0].shape == out_shape
    return d.arith_ops(ins, outs, a)


INT8 = {"dtype": "int8", "precision": 8}

CASES = [
    # convolutions: 2 per multiply-add, output elements x C/groups x taps
    ("conv 4->6 g2 3x3 /2", lambda: count(
        "conv", [(1, 4, 9, 9), (6, 2, 3, 3)], padding=[(0, 0), (0, 0)], stride=[2, 2],
        groups=2, out_shape=(1, 6, 4, 4)), 2 * 96 * 2 * 9),
    ("conv depthwise 5x5", lambda: count(
        "conv", [(1, 8, 6, 6), (8, 1, 5, 5)], padding=[(2, 2), (2, 2)], groups=8,
        out_shape=(1, 8, 6, 6)), 2 * 288 * 25),
    # deconv: every input element meets C_out/groups x taps filter values
    ("deconv 4->6 3x3 /2", lambda: count(
        "deconv", [(1, 4, 5, 5), (4, 6, 3, 3)], padding=[(0, 0), (0, 0)], stride=[2, 2],
        out_shape=(1, 6, 11, 11)), 2 * 100 * 6 * 9),
    ("conv_packed (float) 4->6 3x3, OIHW8o", lambda: count(
        "conv_packed", [(1, 4, 5, 5), (1, 4, 3, 3, 8)], padding=[(1, 1), (1, 1)],
        channels=6, out_shape=(1, 6, 5, 5)), 2 * 150 * 4 * 9),
    ("depthwise_conv2d_blocked 3x3", lambda: count(
        "depthwise_conv2d_blocked", [(1, 1, 4, 4, 16), (1, 1, 3, 3, 16)], padding=[1, 1],
        out_shape=(1, 1, 4, 4, 16), **INT8), 2 * 256 * 9),
    # attention scores: D multiply-adds per score, then softmax's max, sub, exp, sum, div
    ("attention_scores 2 heads 3x5, D 4", lambda: count(
        "attention_scores", [(1, 2, 3, 4), (1, 2, 4, 5)], out_shape=(1, 2, 3, 5)),
     30 * (2 * 4 + 5)),
    ("conv2d int8 g2", lambda: count(
        "conv2d", [(1, 4, 5, 5), (6, 2, 3, 3)], padding=[1, 1], groups=2,
        out_shape=(1, 6, 5, 5), **INT8), 2 * 150 * 18),
    ("onednn conv XIO", lambda: count(
        "onednn.convolution", [(1, 5, 5, 4), (3, 3, 4, 6)], strides=[1, 1],
        pads_begin=[0, 0], pads_end=[0, 0], dilations=[1, 1], out_shape=(1, 3, 3, 6)),
     2 * 54 * 36),
    ("cinn conv backward_data", lambda: count(
        "cinn.conv", [(6, 4, 3, 3), (1, 6, 3, 3)], strides=[1, 1], paddings=[0, 0],
        dilations=[1, 1], conv_type="backward_data", output_shape=[1, 4, 5, 5],
        out_shape=(1, 4, 5, 5)), 2 * 54 * 36),
    # matrix products: output elements x K
    ("matmul batched", lambda: count("matmul", [(2, 3, 4), (2, 4, 5)],
                                     out_shape=(2, 3, 5)), 2 * 30 * 4),
    ("matmul transposed B", lambda: count("matmul", [(3, 4), (5, 4)], transposeB=True,
                                          out_shape=(3, 5)), 2 * 15 * 4),
    ("matmul transposed A", lambda: count("matmul", [(4, 3), (4, 5)], transposeA=True,
                                          out_shape=(3, 5)), 2 * 15 * 4),
    # packed B (P, K, C): 5 columns in one panel of 16, the padding columns not counted
    ("matmul_packed", lambda: count("matmul_packed", [(2, 3, 4), (1, 1, 4, 16)], columns=5,
                                    out_shape=(2, 3, 5)), 2 * 30 * 4),
    ("dense int8", lambda: count("dense", [(2, 7), (3, 7)], out_shape=(2, 3), **INT8),
     2 * 6 * 7),
    ("cinn dot", lambda: count("cinn.dot", [(3, 4), (4, 2)], out_shape=(3, 2)), 2 * 6 * 4),
    # windows: taps per output element
    ("box 3x3 /2", lambda: count(
        "box", [(1, 2, 7, 7)], size=[1, 1, 3, 3], stride=[1, 1, 2, 2],
        padding=[(0, 0), (0, 0), (1, 1), (1, 1)], out_shape=(1, 2, 4, 4)), 32 * 9),
    ("argmax_pool 2x2", lambda: count(
        "argmax_pool", [(1, 3, 4, 4)], size=[1, 1, 2, 2], stride=[1, 1, 2, 2],
        padding=[(0, 0)] * 4, out_shape=(1, 3, 2, 2)), 12 * 4),
    ("max_window 3x3 /2", lambda: count(
        "nnef.max_window", [(1, 2, 7, 7)], size=[1, 1, 3, 3], stride=[1, 1, 2, 2],
        padding=[(0, 0), (0, 0), (1, 1), (1, 1)], out_shape=(1, 2, 4, 4)), 32 * 9),
    ("debox 2x2 /2", lambda: count(
        "debox", [(1, 1, 3, 3)], size=[1, 1, 2, 2], stride=[1, 1, 2, 2],
        padding=[(0, 0)] * 4, out_shape=(1, 1, 6, 6)), 9 * 4),
    ("max_pool2d_blocked int8 3x3 /2", lambda: count(
        "max_pool2d_blocked", [(1, 1, 8, 8, 16)], pool_size=[3, 3], strides=[2, 2],
        padding=[1, 1], out_shape=(1, 1, 4, 4, 16), **INT8), 256 * 9),
    ("max_pool2d int8 3x3 /2", lambda: count(
        "max_pool2d", [(1, 4, 8, 8)], pool_size=[3, 3], strides=[2, 2], padding=[1, 1],
        out_shape=(1, 4, 4, 4), **INT8), 64 * 9),
    ("multilinear_upsample x2", lambda: count(
        "multilinear_upsample", [(1, 2, 3, 3)], factor=[2, 2], out_shape=(1, 2, 6, 6)),
     2 * 72 * 4),
    # reductions: input elements
    ("sum_reduce", lambda: count("sum_reduce", [(2, 3, 4)], axes=[1],
                                 out_shape=(2, 1, 4)), 24),
    ("argmax_reduce", lambda: count("argmax_reduce", [(2, 3, 4)], axes=[1, 2]), 24),
    ("cinn reduce", lambda: count("cinn.reduce", [(5, 6)], kind="max", dim=[0]), 30),
    ("sum int8", lambda: count("sum", [(3, 4)], axes=[1], out_shape=(3,), **INT8), 12),
    # element-wise: output elements x (inputs - 1), at least 1
    ("add broadcast", lambda: count("add", [(2, 3), (1, 3)], out_shape=(2, 3)), 6),
    ("exp", lambda: count("exp", [(2, 3)]), 6),
    ("select", lambda: count("select", [(2, 3), (2, 3), (2, 3)], dtype="bool"), 12),
    ("elemwise_add int8", lambda: count("elemwise_add", [(4, 5), (4, 5)], **INT8), 20),
    # data movement: nothing to count
    ("transpose", lambda: count("nnef.transpose", [(2, 3, 4)], axes=[2, 0, 1]), 0),
    ("concat", lambda: count("concat", [(2, 3), (2, 5)], axis=1, out_shape=(2, 8)), 0),
    ("reshape int8", lambda: count("reshape", [(2, 6)], shape=[3, 4], **INT8), 0),
    ("sample", lambda: count("sample", [(1, 1, 4, 4), (1, 1, 2, 2)], size=[1, 1, 2, 2],
                             stride=[1, 1, 2, 2], padding=[(0, 0)] * 4), 0),
    ("copy", lambda: count("copy", [(3, 3)]), 0),
]


@pytest.mark.parametrize("compute, expected", [c[1:] for c in CASES],
                         ids=[c[0] for c in CASES])
def test_counts(compute, expected):
    assert compute() == expected


def test_every_compute_op_has_a_rule():
    """The fusion-kind default fits element-wise, broadcast, injective and reduction ops;
    every other op (convolutions, windows, opaque NNEF ops) says what it computes."""
    bare = [d.name for d in all_ops() if "arith" not in d.rules
            and d.fusion not in (Fusion.ELEMWISE, Fusion.BROADCAST, Fusion.INJECTIVE,
                                 Fusion.REDUCTION)]
    assert bare == []

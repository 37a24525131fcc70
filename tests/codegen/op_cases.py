"""One small representative case per compute op, shared by the CUDA build and GPU tests.

A case lists its inputs as (array, precision) pairs, the attributes and which inputs are
weights; arrays are random inside the precision unless the op needs structured data.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from cvmc.ops.nnef_math import TRANSCENDENTAL, TRANSCENDENTAL_ULP
from tests.oputil import rand_in_precision


def rand(shape: tuple[int, ...], precision: int, seed: int = 0) -> tuple[np.ndarray, int]:
    """Random integers with |v| <= 2^(p-1) - 1, paired with their precision."""
    return rand_in_precision(np.random.default_rng(seed), shape, precision), precision


@dataclass
class OpCase:
    """A one-op graph: inputs [(array, precision)] (precision None for float32 and bool
    arrays), attributes, indices of weights."""

    op: str
    inputs: list[tuple[np.ndarray, int | None]]
    attrs: dict = field(default_factory=dict)
    weights: tuple[int, ...] = ()
    ulp: int = 0  # float results: units in the last place allowed from the reference
    out_dtype: str = "int32"  # what a `cast` converts to


_BOXES = np.array([[[0, 90, 0, 0, 10, 10], [0, 80, 1, 1, 11, 11], [1, 70, 0, 0, 10, 10],
                    [0, 60, 20, 20, 30, 30], [-1, 50, 0, 0, 5, 5]]])

def packed_conv_inputs(oc: int, c: int, kh: int, kw: int, seed: int):
    """(weight OIHW, weight packed OIHW16o4i, 128 * sum(weight) per output channel), the
    packing written here with NumPy: zero-pad O to 16 and I to 4, split, transpose."""
    w = rand((oc, c, kh, kw), 8, seed)[0]
    padded = np.pad(w, ((0, -oc % 16), (0, -c % 4), (0, 0), (0, 0)))
    blocks = padded.reshape(padded.shape[0] // 16, 16, padded.shape[1] // 4, 4, kh, kw)
    return w, blocks.transpose(0, 2, 4, 5, 1, 3), 128 * w.sum(axis=(1, 2, 3))


_W, _WP, _COMP = packed_conv_inputs(20, 6, 3, 2, 11)

CASES: list[OpCase] = [
    *[OpCase(op, [rand((2, 3, 4), 8, 1), rand((3, 1), 8, 2)])
      for op in ("broadcast_add", "broadcast_sub", "broadcast_mul", "broadcast_div",
                 "broadcast_max", "broadcast_greater")],
    *[OpCase(op, [rand((3, 17), 12)]) for op in ("abs", "cvm_precision", "negative", "relu")],
    *[OpCase(op, [rand((3, 17), 12, 1), rand((3, 17), 9, 2)])
      for op in ("elemwise_add", "elemwise_sub")],
    OpCase("clip", [rand((4, 9), 10)], {"a_min": -100, "a_max": 50}),
    OpCase("cvm_clip", [rand((4, 9), 12)], {"precision": 6}),
    OpCase("cvm_right_shift", [rand((4, 9), 20)], {"precision": 8, "shift_bit": 5}),
    OpCase("cvm_left_shift", [rand((4, 9), 8)], {"precision": 12, "shift_bit": 3}),
    OpCase("conv2d", [rand((1, 3, 8, 8), 8, 1), rand((4, 3, 3, 3), 8, 2), rand((4,), 12, 3)],
           {"padding": [1, 1], "stride": [1, 1]}, weights=(1, 2)),
    OpCase("dense", [rand((2, 16), 8, 1), rand((5, 16), 8, 2), rand((5,), 12, 3)],
           weights=(1, 2)),
    OpCase("max_pool2d", [rand((1, 2, 6, 6), 8)], {"pool_size": [3, 3], "strides": [2, 2],
                                                   "padding": [1, 1]}),
    OpCase("upsampling", [rand((1, 2, 3, 3), 8)], {"scale": 2}),
    OpCase("sum", [rand((2, 5, 3), 10)], {"axes": [1]}),
    OpCase("max", [rand((2, 5, 3), 10)], {"axes": [0, 2], "keepdims": True}),
    OpCase("flatten", [rand((2, 3, 4), 8)]),
    OpCase("reshape", [rand((2, 3, 4), 8)], {"target_shape": [4, 6]}),
    OpCase("expand_dims", [rand((2, 3), 8)], {"axis": 1, "num_newaxis": 2}),
    OpCase("squeeze", [rand((2, 1, 3), 8)], {"axes": [1]}),
    OpCase("repeat", [rand((2, 3), 8)], {"axis": 1, "repeats": 2}),
    OpCase("tile", [rand((2, 3), 8)], {"reps": [2, 1]}),
    OpCase("transpose", [rand((2, 3, 4), 8)], {"axes": [2, 0, 1]}),
    OpCase("slice", [rand((5, 6), 8)], {"begin": [1, 0], "end": [4, 6], "strides": [2, 1]}),
    OpCase("slice_like", [rand((5, 6), 8, 1), rand((3, 4), 8, 2)]),
    OpCase("take", [rand((4, 5), 12, 1), (np.array([[0, 3], [9, -2]]), 6)], {"axis": 1}),
    OpCase("cvm_lut", [(np.array([[0, 5, 255], [3, 300, -1]]), 10), rand((256,), 8, 2)],
           {"in_dim": 255}, weights=(1,)),
    OpCase("concatenate", [rand((2, 3), 8, 1), rand((2, 2), 12, 2)], {"axis": 1}),
    OpCase("where", [(np.array([[1, 0, 2], [0, 0, 1]]), 3), rand((2, 3), 8, 1),
                     rand((2, 3), 10, 2)]),
    OpCase("get_valid_count", [(_BOXES, 8)], {"score_threshold": 55}),
    OpCase("non_max_suppression", [(_BOXES, 8), (np.array([4]), 8)], {"iou_threshold": 50}),
    OpCase("layout_transform", [rand((20, 6, 3, 2), 8, 12)],
           {"src_layout": "OIHW", "dst_layout": "OIHW16o4i"}),
    OpCase("conv2d_packed", [rand((1, 6, 7, 5), 8, 13), (_WP, 8), (_COMP, 20),
                             rand((20,), 12, 14)],
           {"padding": [1, 2], "stride": [2, 1], "dilation": [1, 2], "channels": 20},
           weights=(1, 2, 3)),
    # Geometries whose reads reach the edges of their inputs (buffer-bounds class tests):
    # ceil_mode's last window overhangs the input even with zero padding.
    OpCase("max_pool2d", [(np.array([[[[-5, -6, -7], [-8, -9, -10], [-11, -12, -13]]]]), 8)],
           {"pool_size": [2, 2], "strides": [2, 2], "padding": [0, 0], "ceil_mode": True}),
    OpCase("max_pool2d", [rand((1, 2, 7, 7), 8, 4)], {"pool_size": [3, 2], "strides": [2, 3],
                                                      "padding": [1, 0], "ceil_mode": True}),
    OpCase("conv2d", [rand((1, 2, 9, 7), 8, 5), rand((3, 2, 3, 2), 8, 6)],
           {"stride": [2, 3], "dilation": [2, 1]}, weights=(1,)),
    OpCase("conv2d", [rand((1, 4, 5, 5), 8, 7), rand((4, 2, 3, 3), 8, 8)],
           {"padding": [2, 1], "groups": 2}, weights=(1,)),
    OpCase("slice", [rand((5, 6), 8, 9)], {"begin": [-1, 5], "end": [-6, 0],
                                           "strides": [-2, -3]}),
    OpCase("take", [rand((4, 5), 12, 10), (np.array([0, 4, -1, 7, -9]), 6)]),
    OpCase("max_pool2d", [rand((1, 1, 7, 5), 8, 11)], {"pool_size": [2, 3], "strides": [3, 2],
                                                       "padding": [0, 0], "ceil_mode": True}),
    OpCase("slice", [rand((5, 6), 8, 12)], {"begin": [-10, 2], "end": [100, 100],
                                            "strides": [1, 2]}),
    OpCase("slice", [rand((5, 6), 8, 13)], {"begin": [10, 0], "end": [-100, 6],
                                            "strides": [-1, 5]}),
    OpCase("take", [rand((5, 3), 12, 14), (np.array([[4, 0], [-7, 100]]), 8)], {"axis": 0}),
    OpCase("upsampling", [rand((1, 2, 2, 3), 8, 15)], {"scale": 3}),
    OpCase("concatenate", [rand((1, 3), 8, 16), rand((2, 3), 8, 17), rand((1, 3), 8, 18)],
           {"axis": 0}),
    *[OpCase("get_valid_count", [(_BOXES, 8)], {"score_threshold": t}) for t in (-100, 100)],
    *[OpCase("non_max_suppression", [(_BOXES, 8), (np.array([v]), 8)],
             {"iou_threshold": 50, "top_k": 3, "max_output_size": 2}) for v in (9, -3)],
]


# ---- NNEF element-wise ops (float32 / bool) ----------------------------------------------
def frand(shape: tuple[int, ...], seed: int = 0, scale: float = 3.0,
          lo: float | None = None) -> tuple[np.ndarray, None]:
    """Random float32 values (normal, times `scale`; uniform in [lo, lo + scale) with lo)."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape) * scale if lo is None else lo + rng.random(shape) * scale
    return x.astype(np.float32), None


def brand(shape: tuple[int, ...], seed: int = 0) -> tuple[np.ndarray, None]:
    """Random logical values."""
    return np.random.default_rng(seed).random(shape) < 0.5, None


# Values where float kernels go wrong: signed zeros, infinities, NaN, halves (round),
# the largest float32 and values just below 0.5 (0.49999997 + 0.5 rounds to 1 in float32).
EDGES = (np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 0.5, -0.5, 1.5, -2.5, 0.49999997,
                   -0.49999997, 3.4028235e38, -1e-45, 2.5e9, -2.5e9, 7.0], np.float32), None)
# Domains of the transcendental functions (inside, so results are finite).
_DOMAIN = {"log": (1e-3, 50.0), "asin": (-1.0, 2.0), "acos": (-1.0, 2.0),
           "acosh": (1.0, 20.0), "atanh": (-1.0, 2.0), "tan": (-1.5, 3.0)}

NNEF_CASES: list[OpCase] = [
    *[OpCase(name, [frand((3, 17), 20, *((_DOMAIN[name][1], _DOMAIN[name][0])
                                        if name in _DOMAIN else (3.0,)))],
             ulp=TRANSCENDENTAL_ULP) for name in TRANSCENDENTAL],
    *[OpCase(name, [EDGES]) for name in ("neg", "rcp", "nnef.abs", "sign", "floor", "ceil",
                                         "round")],
    OpCase("round", [frand((4, 33), 21)]),
    *[OpCase(name, [frand((2, 3, 4), 22), frand((2, 3), 23)])
      for name in ("add", "sub", "mul", "div", "lt", "gt", "le", "ge", "eq", "ne")],
    OpCase("div", [EDGES, (EDGES[0][::-1].copy(), None)]),
    *[OpCase(name, [EDGES, (EDGES[0][::-1].copy(), None)])
      for name in ("eq", "ne", "lt", "ge")],
    OpCase("pow", [frand((3, 5), 24, 4.0, 0.0), frand((3, 1), 25, 4.0, -2.0)],
           ulp=TRANSCENDENTAL_ULP),
    *[OpCase(name, [brand((2, 3), 26), brand((2, 1), 27)]) for name in ("and", "or")],
    OpCase("not", [brand((5,), 28)]),
    OpCase("copy", [frand((2, 3), 29)]),
    OpCase("copy", [rand((2, 3), 12, 30)]),
    OpCase("select", [brand((2, 3, 4), 31), frand((2, 3), 32), frand((1,), 33)]),
    OpCase("select", [brand((2, 3), 34), rand((2, 3), 8, 35), rand((2, 3), 12, 36)]),
    OpCase("cast", [EDGES], out_dtype="int32"),
    OpCase("cast", [EDGES], out_dtype="bool"),
    OpCase("cast", [rand((7,), 20, 37)], out_dtype="float32"),
    OpCase("cast", [brand((7,), 38)], out_dtype="float32"),
    OpCase("cast", [(np.array([3, -3, 0, 1]), 3)], out_dtype="bool"),
]
CASES += NNEF_CASES


def case_id(case: OpCase) -> str:
    """Test id of a case: the op name."""
    return case.op


# ---- oneDNN convolution (float32 and integer) ---------------------------------------------
def exact_floats(shape: tuple[int, ...], seed: int) -> tuple[np.ndarray, None]:
    """float32 multiples of 1/4 in [-4, 4]: a convolution of them sums exactly in any order
    (products are multiples of 1/16 and every partial sum stays far below 2^20), so the
    compiled kernel must give the reference's bits."""
    return (np.random.default_rng(seed).integers(-16, 17, shape) / 4).astype(np.float32), None


def _conv(r: int, **attrs) -> dict:
    """onednn.convolution attributes: dense, unpadded, stride 1 unless given."""
    return {"strides": [1] * r, "pads_begin": [0] * r, "pads_end": [0] * r,
            "dilations": [1] * r, **attrs}


ONEDNN_CASES: list[OpCase] = [
    # NXC / XIO (the defaults), groups, stride, dilation, same_upper, bias
    OpCase("onednn.convolution", [exact_floats((1, 7, 6, 4), 90), exact_floats((3, 2, 2, 6), 91),
                                  exact_floats((6,), 92)],
           _conv(2, strides=[2, 1], dilations=[1, 2], groups=2, auto_pad="same_upper"),
           weights=(1, 2)),
    OpCase("onednn.convolution", [exact_floats((2, 3, 9), 93), exact_floats((4, 3, 3), 94)],
           _conv(1, strides=[2], auto_pad="valid", data_format="NCX", weights_format="OIX"),
           weights=(1,)),
    OpCase("onednn.convolution", [exact_floats((1, 2, 4, 5, 3), 95),
                                  exact_floats((2, 3, 2, 2, 4), 96)],
           _conv(3, strides=[1, 2, 1], auto_pad="same_lower", data_format="NCX"), weights=(1,)),
    OpCase("onednn.convolution", [rand((1, 4, 6, 5), 8, 97), rand((6, 4, 3, 2), 8, 98),
                                  rand((6,), 16, 99)],
           _conv(2, pads_begin=[1, 0], pads_end=[2, 1], data_format="NCX",
                 weights_format="OIX"), weights=(1, 2)),
    OpCase("onednn.convolution", [rand((2, 8, 3), 8, 100), rand((3, 1, 3), 8, 101)],
           _conv(1, groups=3, dilations=[2], auto_pad="same_upper"), weights=(1,)),
    OpCase("onednn.convolution", [rand((1, 4, 3, 2, 3), 8, 102), rand((4, 3, 2, 2, 1), 8, 103)],
           _conv(3, strides=[2, 1, 1], pads_end=[1, 0, 0], weights_format="OIX"),
           weights=(1,)),
]
CASES += ONEDNN_CASES

"""Every op's test record: small representative cases (compiled vs reference, also the CUDA
build and GPU tests), and for a CVM op its spec oracle and CVM-Runtime JSON round trip.

A case lists its inputs as (array, precision) pairs, the attributes and which inputs are
weights; arrays are random inside the precision unless the op needs structured data. An
op's first case is its record: `spec` and `export` drive tests/ops/test_spec_oracle.py and
tests/frontend/test_cvm_json.py (`specs()`, `exports()`), its entry's `ulp` the float bound.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

import tests.spec_oracles as so
from cvmc.ops import all_ops, lookup
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
    out_dtype: str = "int32"  # what a `cast` converts to
    # float sums: the roundings per term (K) of tests.oputil.sum_bound, and the inputs whose
    # magnitudes make the terms' magnitudes (None: every float input)
    terms: int = 0
    magnitude: tuple[int, ...] | None = None
    # An op's first case is its test record; for a CVM op it also names the formal spec's
    # oracle (tests/ops/test_spec_oracle.py), and for an op CVM-Runtime runs the operands
    # and attributes of its node in the JSON export round trip (tests/frontend/
    # test_cvm_json.py): "x" (the graph input, X_SHAPE, precision 8), an earlier node's
    # output, or an array (a weight).
    spec: so.Spec | None = None
    export: tuple[list, dict] | None = None

    @property
    def ulp(self) -> int:
        """Float results: units in the last place allowed from the reference (the op's
        registry entry states them)."""
        return lookup(self.op).ulp

    def check_args(self) -> dict:
        """Keyword arguments of tests.oputil.check_op for this case."""
        return {"attrs": self.attrs, "weights": self.weights, "ulp": self.ulp,
                "out_dtype": self.out_dtype, "terms": self.terms, "magnitude": self.magnitude}

    def tolerances(self) -> list:
        """Per output: the absolute bound of a sum-like case, else None."""
        from tests.oputil import sum_tolerances

        if not self.terms:
            return [None] * len(lookup(self.op).outputs)
        return sum_tolerances(self.op, self.inputs, self.attrs, self.terms, self.magnitude)


_BOXES = np.array([[[0, 90, 0, 0, 10, 10], [0, 80, 1, 1, 11, 11], [1, 70, 0, 0, 10, 10],
                    [0, 60, 20, 20, 30, 30], [-1, 50, 0, 0, 5, 5]]])

def packed_conv_inputs(oc: int, c: int, kh: int, kw: int, seed: int):
    """(weight OIHW, weight packed OIHW16o4i, 128 * sum(weight) per output channel), the
    packing written here with NumPy: zero-pad O to 16 and I to 4, split, transpose."""
    w = rand((oc, c, kh, kw), 8, seed)[0]
    padded = np.pad(w, ((0, -oc % 16), (0, -c % 4), (0, 0), (0, 0)))
    blocks = padded.reshape(padded.shape[0] // 16, 16, padded.shape[1] // 4, 4, kh, kw)
    return w, blocks.transpose(0, 2, 4, 5, 1, 3), 128 * w.sum(axis=(1, 2, 3))


def blocked_nchw(shape: tuple[int, ...], precision: int, seed: int):
    """(random NCHW data with C channels as NCHW16c, precision): zero-pad C to 16, split
    it, move the 16 inside (the padding channels are zero, as a layout_transform makes)."""
    x = rand(shape, precision, seed)[0]
    n, c, h, w = x.shape
    x = np.pad(x, ((0, 0), (0, -c % 16), (0, 0), (0, 0)))
    return x.reshape(n, -1, 16, h, w).transpose(0, 1, 3, 4, 2), precision


def depthwise_weight(c: int, kh: int, kw: int, seed: int):
    """(a depthwise weight (C, 1, KH, KW) as OIHW16o: C zero-padded to 16, split, the 16
    innermost, precision 8)."""
    w = np.pad(rand((c, 1, kh, kw), 8, seed)[0], ((0, -c % 16), (0, 0), (0, 0), (0, 0)))
    return w.reshape(-1, 16, 1, kh, kw).transpose(0, 2, 3, 4, 1), 8


_W, _WP, _COMP = packed_conv_inputs(20, 6, 3, 2, 11)
_, _WP32, _COMP32 = packed_conv_inputs(32, 16, 3, 3, 21)  # NCHW16c in and out

# The CVM-Runtime JSON round trip's graph input "x" (tests/frontend/test_cvm_json.py)
X_SHAPE = (1, 2, 4, 4)
_EXPORT_RNG = np.random.default_rng(7)


def weight(shape: tuple[int, ...], lo: int = -9, hi: int = 10) -> np.ndarray:
    """A random int32 weight in [lo, hi) for an `export` record."""
    return _EXPORT_RNG.integers(lo, hi, shape).astype(np.int32)


def _boxes() -> np.ndarray:
    """(1, 4, 6) rows [class, score, x1, y1, x2, y2] for get_valid_count / nms."""
    return np.array([[[0, 9, 0, 0, 4, 4], [0, 8, 1, 1, 5, 5], [1, -1, 0, 0, 2, 2],
                      [1, 7, 6, 6, 9, 9]]], dtype=np.int32)


def _bcast(op: str, oracle, precision, shape: tuple[int, ...]) -> OpCase:
    """A CVM broadcast op's record (spec None: CVM-Runtime's own op)."""
    return OpCase(op, [rand((2, 3, 4), 8, 1), rand((3, 1), 8, 2)],
                  spec=so.Spec(so.gen_broadcast, so.broadcast(oracle), precision)
                  if oracle else None, export=(["x", weight(shape)], {}))


def _unary(op: str, oracle, precision) -> OpCase:
    """A CVM unary op's record."""
    return OpCase(op, [rand((3, 17), 12)], spec=so.Spec(so.gen_unary, so.unary(oracle),
                                                         precision), export=(["x"], {}))


def _p_conv(c, ys) -> list[int]:
    return so.p_conv(so.volume(c.x(1).shape[1:]), c)


CASES: list[OpCase] = [
    # The first case of each CVM op is its test record: also its spec oracle and its
    # CVM-Runtime JSON round trip.
    _bcast("broadcast_add", lambda a, b: a + b, so.p_add, (1, 2, 1, 1)),
    _bcast("broadcast_sub", lambda a, b: a - b, so.p_add, (2, 1, 1)),
    _bcast("broadcast_mul", lambda a, b: a * b, lambda c, ys: [c.p(0) + c.p(1)], (1, 1, 4)),
    _bcast("broadcast_div", so.divide, so.p_first, (1, 2, 1, 1)),
    _bcast("broadcast_max", max, lambda c, ys: [max(c.p(0), c.p(1))], (1, 2, 4, 1)),
    _bcast("broadcast_greater", None, None, (1, 1, 1, 4)),
    _unary("abs", lambda x: x if x >= 0 else -x, so.p_first),
    _unary("cvm_precision", lambda x: so.ceil_log2(abs(x) + 1) if x else 1, lambda c, ys: [6]),
    _unary("negative", lambda x: -x, so.p_first),
    _unary("relu", lambda x: max(0, x), so.p_first),
    *[OpCase(op, [rand((3, 17), 12, 1), rand((3, 17), 9, 2)],
             spec=so.Spec(so.gen_binary, so.binary(f), so.p_add),
             export=(["x", weight(X_SHAPE)], {}))
      for op, f in (("elemwise_add", lambda a, b: a + b), ("elemwise_sub", lambda a, b: a - b))],
    OpCase("clip", [rand((4, 9), 10)], {"a_min": -100, "a_max": 50},
           spec=so.Spec(so.gen_clip, so.clip_oracle, lambda c, ys: [
               so.numprec(max(abs(c.attrs["a_min"]), abs(c.attrs["a_max"])))]),
           export=(["x"], {"a_min": -5, "a_max": 9})),
    OpCase("cvm_clip", [rand((4, 9), 12)], {"precision": 6},
           spec=so.Spec(so.gen_cvm_clip, so.cvm_clip_oracle, so.p_attr),
           export=(["x"], {"precision": 4})),
    OpCase("cvm_right_shift", [rand((4, 9), 20)], {"precision": 8, "shift_bit": 5},
           spec=so.Spec(so.gen_right_shift, so.right_shift_oracle, so.p_attr),
           export=(["x"], {"precision": 6, "shift_bit": 2})),
    OpCase("cvm_left_shift", [rand((4, 9), 8)], {"precision": 12, "shift_bit": 3},
           spec=so.Spec(so.gen_left_shift, so.left_shift_oracle, so.p_attr),
           export=(["x"], {"precision": 12, "shift_bit": 3})),
    OpCase("conv2d", [rand((1, 3, 8, 8), 8, 1), rand((4, 3, 3, 3), 8, 2), rand((4,), 12, 3)],
           {"padding": [1, 1], "stride": [1, 1]}, weights=(1, 2),
           spec=so.Spec(so.gen_conv2d, so.conv2d_oracle, _p_conv),
           export=(["x", weight((3, 2, 3, 3)), weight((3,))],
                   {"padding": (1, 1), "stride": (2, 2), "channels": 3, "kernel_size": (3, 3),
                    "use_bias": True})),
    OpCase("dense", [rand((2, 16), 8, 1), rand((5, 16), 8, 2), rand((5,), 12, 3)],
           weights=(1, 2),
           spec=so.Spec(so.gen_dense, so.dense_oracle,
                        lambda c, ys: so.p_conv(c.x(1).shape[1], c)),
           export=([weight((2, 5)), weight((3, 5)), weight((3,))],
                   {"units": 3, "use_bias": True})),
    OpCase("max_pool2d", [rand((1, 2, 6, 6), 8)], {"pool_size": [3, 3], "strides": [2, 2],
                                                   "padding": [1, 1]},
           spec=so.Spec(so.gen_max_pool2d, so.max_pool2d_oracle, so.p_first),
           export=(["x"], {"pool_size": (2, 2), "strides": (2, 2)})),
    OpCase("upsampling", [rand((1, 2, 3, 3), 8)], {"scale": 2},
           spec=so.Spec(so.gen_upsampling, so.upsampling_oracle, so.p_first),
           export=(["x"], {"scale": 2})),
    OpCase("sum", [rand((2, 5, 3), 10)], {"axes": [1]},
           spec=so.Spec(so.gen_reduce, so.reduce_oracle(sum), so.p_sum),
           export=(["x"], {"axes": (1,)})),
    OpCase("max", [rand((2, 5, 3), 10)], {"axes": [0, 2], "keepdims": True},
           spec=so.Spec(so.gen_reduce, so.reduce_oracle(max), so.p_first),
           export=(["x"], {"axes": (2, 3), "keepdims": True})),
    OpCase("flatten", [rand((2, 3, 4), 8)],
           spec=so.Spec(so.gen_unary, so.flatten_oracle, so.p_first), export=(["x"], {})),
    OpCase("reshape", [rand((2, 3, 4), 8)], {"target_shape": [4, 6]},
           spec=so.Spec(so.gen_reshape, so.reshape_oracle, so.p_first),
           export=(["x"], {"shape": (2, 16)})),
    OpCase("expand_dims", [rand((2, 3), 8)], {"axis": 1, "num_newaxis": 2},
           spec=so.Spec(so.gen_expand_dims, so.expand_dims_oracle, so.p_first),
           export=(["x"], {"axis": -1})),
    OpCase("squeeze", [rand((2, 1, 3), 8)], {"axes": [1]},
           spec=so.Spec(so.gen_squeeze, so.squeeze_oracle, so.p_first),
           export=(["x"], {"axis": (0,)})),
    OpCase("repeat", [rand((2, 3), 8)], {"axis": 1, "repeats": 2},
           spec=so.Spec(so.gen_repeat, so.repeat_oracle, so.p_first),
           export=(["x"], {"repeats": 2, "axis": 1})),
    OpCase("tile", [rand((2, 3), 8)], {"reps": [2, 1]},
           spec=so.Spec(so.gen_tile, so.tile_oracle, so.p_first),
           export=(["x"], {"reps": (1, 2)})),
    OpCase("transpose", [rand((2, 3, 4), 8)], {"axes": [2, 0, 1]},
           spec=so.Spec(so.gen_transpose, so.transpose_oracle, so.p_first),
           export=(["x"], {"axes": (0, 2, 3, 1)})),
    OpCase("slice", [rand((5, 6), 8)], {"begin": [1, 0], "end": [4, 6], "strides": [2, 1]},
           spec=so.Spec(so.gen_slice, so.slice_oracle, so.p_first),
           export=(["x"], {"begin": (0, 1), "end": (1, 2)})),
    OpCase("slice_like", [rand((5, 6), 8, 1), rand((3, 4), 8, 2)],
           spec=so.Spec(so.gen_slice_like, so.slice_like_oracle, so.p_first),
           export=(["x", weight((1, 1, 2, 2))], {})),
    OpCase("take", [rand((4, 5), 12, 1), (np.array([[0, 3], [9, -2]]), 6)], {"axis": 1},
           spec=so.Spec(so.gen_take, lambda c: [so.take(c.x(0), c.x(1), c.attrs.get("axis"))],
                        so.p_first),
           export=(["x", weight((3,), 0, 4)], {"axis": 2})),
    OpCase("cvm_lut", [(np.array([[0, 5, 255], [3, 300, -1]]), 10), rand((256,), 8, 2)],
           {"in_dim": 256}, weights=(1,),
           spec=so.Spec(so.gen_cvm_lut, lambda c: [so.take(c.x(1), c.x(0), None)],
                        lambda c, ys: [c.p(1)]),
           export=(["x", weight((256,), -100, 100)], {})),
    OpCase("concatenate", [rand((2, 3), 8, 1), rand((2, 2), 12, 2)], {"axis": 1},
           spec=so.Spec(so.gen_concatenate, so.concatenate_oracle, so.p_max_inputs),
           export=(["x", "x"], {"axis": 1})),
    OpCase("where", [(np.array([[1, 0, 2], [0, 0, 1]]), 3), rand((2, 3), 8, 1),
                     rand((2, 3), 10, 2)],
           # so.SPEC_EXCEPTIONS["where-precision"]
           spec=so.Spec(so.gen_where, so.where_oracle, lambda c, ys: [max(c.p(1), c.p(2))]),
           # the condition as wide as x
           export=([weight(X_SHAPE, -127, 128), "x", weight(X_SHAPE)], {})),
    OpCase("get_valid_count", [(_BOXES, 8)], {"score_threshold": 55},
           spec=so.Spec(so.gen_get_valid_count, so.get_valid_count_oracle,
                        so.p_get_valid_count),
           export=([_boxes()], {"score_threshold": 0})),
    OpCase("non_max_suppression", [(_BOXES, 8), (np.array([4]), 8)], {"iou_threshold": 50},
           spec=so.Spec(so.gen_nms, so.nms_oracle, so.p_fill),
           export=(["get_valid_count_out1", "get_valid_count"],
                   {"iou_threshold": 5, "force_suppress": True})),
    OpCase("layout_transform", [rand((20, 6, 3, 2), 8, 12)],
           {"src_layout": "OIHW", "dst_layout": "OIHW16o4i"}),
    OpCase("conv2d_packed", [rand((1, 6, 7, 5), 8, 13), (_WP, 8), (_COMP, 20),
                             rand((20,), 12, 14)],
           {"padding": [1, 2], "stride": [2, 1], "dilation": [1, 2], "channels": 20},
           weights=(1, 2, 3)),
    OpCase("conv2d_packed", [rand((1, 1, 6, 5, 16), 8, 22), (_WP32, 8), (_COMP32, 20),
                             rand((32,), 12, 23)],
           {"padding": [1, 1], "stride": [1, 2], "channels": 32, "data_layout": "NCHW16c",
            "out_layout": "NCHW16c"}, weights=(1, 2, 3)),
    OpCase("layout_transform", [rand((1, 2, 3, 4, 16), 8, 24)],
           {"src_layout": "NCHW16c", "dst_layout": "NCHW"}),
    # 20 channels (a padded block), 7x7, stride 2, padding, bias
    OpCase("depthwise_conv2d_blocked", [blocked_nchw((1, 20, 7, 7), 8, 25),
                                        depthwise_weight(20, 3, 3, 26), rand((32,), 12, 27)],
           {"padding": [1, 1], "stride": [2, 2]}, weights=(1, 2)),
    # 1x1 spatial, every tap but the centre in the padding; no bias
    OpCase("depthwise_conv2d_blocked", [blocked_nchw((1, 32, 1, 1), 8, 28),
                                        depthwise_weight(32, 3, 3, 29)], {"padding": [1, 1]},
           weights=(1,)),
    # a 5x3 window, uneven strides and padding, dilation, 2 images
    OpCase("depthwise_conv2d_blocked", [blocked_nchw((2, 16, 9, 14), 8, 30),
                                        depthwise_weight(16, 5, 3, 31), rand((16,), 8, 32)],
           {"padding": [2, 1], "stride": [1, 2], "dilation": [1, 2]}, weights=(1, 2)),
    # no padding, 7x7 output
    OpCase("depthwise_conv2d_blocked", [blocked_nchw((1, 16, 9, 9), 8, 33),
                                        depthwise_weight(16, 3, 3, 34)], weights=(1,)),
    OpCase("max_pool2d_blocked", [blocked_nchw((1, 20, 7, 7), 8, 35)],
           {"pool_size": [3, 3], "strides": [2, 2], "padding": [1, 1]}),
    OpCase("max_pool2d_blocked", [blocked_nchw((1, 16, 1, 1), 8, 36)], {"pool_size": [1, 1]}),
    OpCase("max_pool2d_blocked", [blocked_nchw((2, 32, 8, 10), 8, 37)],
           {"pool_size": [3, 2], "strides": [2, 3], "padding": [1, 0], "ceil_mode": True}),
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
    # depth-wise, stride 2, pad 1 (the depthwise schedule), and a padded 3x3 conv
    OpCase("conv2d", [rand((1, 4, 9, 16), 8, 26), rand((4, 1, 3, 3), 8, 27)],
           {"padding": [1, 1], "stride": [2, 2], "groups": 4}, weights=(1,)),
    OpCase("conv2d", [rand((1, 3, 6, 16), 8, 28), rand((4, 3, 3, 3), 8, 29)],
           {"padding": [1, 1], "stride": [1, 1]}, weights=(1,)),
    # A window above _MAX_UNROLLED_WINDOW taps stays a reduction.
    OpCase("max_pool2d", [rand((1, 2, 10, 11), 8, 25)], {"pool_size": [9, 9], "strides": [1, 2],
                                                         "padding": [1, 1]}),
    # Border columns on both sides of a test-free interior (the CPU schedule splits them).
    OpCase("max_pool2d", [rand((1, 3, 5, 21), 8, 15)], {"pool_size": [3, 3], "strides": [2, 2],
                                                        "padding": [1, 1]}),
    OpCase("slice", [rand((5, 6), 8, 12)], {"begin": [-10, 2], "end": [100, 100],
                                            "strides": [1, 2]}),
    OpCase("slice", [rand((5, 6), 8, 13)], {"begin": [10, 0], "end": [-100, 6],
                                            "strides": [-1, 5]}),
    OpCase("take", [rand((5, 3), 12, 14), (np.array([[4, 0], [-7, 100]]), 8)], {"axis": 0}),
    OpCase("upsampling", [rand((1, 2, 2, 3), 8, 15)], {"scale": 3}),
    OpCase("concatenate", [rand((1, 3), 8, 16), rand((2, 3), 8, 17), rand((1, 3), 8, 18)],
           {"axis": 0}),
    # A batch of 2 whose output is one pixel of one channel: the register tile covers the
    # whole output, and vectorising the loop around the reduction computed every batch
    # from the last one (found by the spec-oracle property test).
    *[OpCase("conv2d", [rand((2, 2, 2, 3), 8, 19), rand((1, 2, 2, 3), 8, 20),
                        rand((1,), 12, 21)],
             {"padding": [1, 1], "stride": [3, 3], "dilation": [1, 2]}, weights=w)
      for w in ((), (1, 2))],
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
# NNEF's unary functions of the C math library (their entries state a ulp bound)
TRANSCENDENTAL = [d.name for d in all_ops()
                  if d.family == "nnef" and d.ulp and len(d.inputs) == 1]
# Domains of the transcendental functions (inside, so results are finite).
_DOMAIN = {"log": (1e-3, 50.0), "asin": (-1.0, 2.0), "acos": (-1.0, 2.0),
           "acosh": (1.0, 20.0), "atanh": (-1.0, 2.0), "tan": (-1.5, 3.0)}

NNEF_CASES: list[OpCase] = [
    *[OpCase(name, [frand((3, 17), 20, *((_DOMAIN[name][1], _DOMAIN[name][0])
                                        if name in _DOMAIN else (3.0,)))])
      for name in TRANSCENDENTAL],
    *[OpCase(name, [EDGES]) for name in ("neg", "rcp", "nnef.abs", "sign", "floor", "ceil",
                                         "round")],
    OpCase("round", [frand((4, 33), 21)]),
    *[OpCase(name, [frand((2, 3, 4), 22), frand((2, 3), 23)])
      for name in ("add", "sub", "mul", "div", "lt", "gt", "le", "ge", "eq", "ne")],
    OpCase("div", [EDGES, (EDGES[0][::-1].copy(), None)]),
    *[OpCase(name, [EDGES, (EDGES[0][::-1].copy(), None)])
      for name in ("eq", "ne", "lt", "ge")],
    OpCase("pow", [frand((3, 5), 24, 4.0, 0.0), frand((3, 1), 25, 4.0, -2.0)]),
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


# ---- NNEF sliding-window, up-sampling and RoI ops (float32) --------------------------------
def _ties(shape: tuple[int, ...], seed: int) -> tuple[np.ndarray, None]:
    """Floats from a few levels (many ties in a window) with a NaN and a -inf."""
    x = np.random.default_rng(seed).integers(-3, 3, shape).astype(np.float32)
    x.flat[5], x.flat[-4] = np.nan, -np.inf
    return x, None


def _indices(shape: tuple[int, ...], volume: int, seed: int) -> tuple[np.ndarray, int]:
    """Window indices, a few of them outside [0, volume) (clamped / ignored)."""
    return np.random.default_rng(seed).integers(-2, volume + 2, shape), 8


def _multilinear_terms(m: int) -> int:
    """K of multilinear_upsample: 2^m corner terms, m weights and m - 1 products per term."""
    return 2**m + 2 * m - 1


_ROIS = (np.array([[0.4, 1.6, 4.2, 5.0],      # inside
                   [-2.0, -1.0, 3.0, 2.6],    # reaching outside (zeros take part)
                   [1.0, 1.0, 1.0, 3.0],      # empty in y: 0
                   [2.5, 0.0, 4.0, 9.7],      # rows narrower than the cells (stride 0)
                   [7.0, 8.0, 9.0, 12.0],     # entirely outside
                   [np.nan, 1.0, 3.0, 4.0]],  # NaN rounds to 0
                  np.float32), None)
_BATCH = (np.array([0, 1, 0, 5, 1, -1]), 4)  # 5 and -1 clamp into [0, 2)
_ROI_X = frand((2, 3, 6, 7), 60)

NNEF_CASES += [
    # conv: grouped, asymmetric and negative padding, stride with dilation, bias [1, C]
    OpCase("conv", [frand((1, 4, 6, 7), 40), frand((6, 2, 3, 2), 41), frand((1, 6), 42)],
           {"groups": 2, "padding": [(-1, 2), (0, 2)], "stride": [2, 1], "dilation": [1, 2]},
           weights=(1, 2), terms=2 * 3 * 2 + 1),
    # depth-wise (groups = 0, multiplier 2), automatic padding, stride 2 with dilation 2
    OpCase("conv", [frand((1, 3, 7, 7), 43), frand((6, 1, 3, 3), 44)],
           {"groups": 0, "border": "reflect", "stride": [2, 2], "dilation": [2, 2]},
           weights=(1,), terms=9 + 1),
    OpCase("conv", [frand((2, 3, 9), 45), frand((4, 3, 4), 46), frand((), 47)],
           {"border": "replicate", "padding": [(2, 1)], "stride": [3]}, weights=(1,),
           terms=12 + 1),
    OpCase("conv", [frand((1, 2, 4, 4, 3), 48), frand((2, 2, 2, 3, 2), 49)],
           {"border": "reflect-even"}, weights=(1,), terms=24 + 1),
    # deconv: stride 2, asymmetric padding, bias
    OpCase("deconv", [frand((1, 4, 3, 4), 50), frand((4, 3, 3, 3), 51), frand((1, 3), 52)],
           {"stride": [2, 2], "padding": [(1, 1), (0, 1)]}, weights=(1, 2), terms=36 + 1),
    # depth-wise with output_shape and automatic padding
    OpCase("deconv", [frand((1, 3, 4, 4), 53), frand((3, 1, 3, 3), 54)],
           {"groups": 0, "stride": [2, 2], "output_shape": [1, 3, 8, 7]}, weights=(1,),
           terms=9 + 1),
    OpCase("deconv", [frand((1, 4, 3, 3), 55), frand((4, 1, 2, 2), 56)],
           {"groups": 2, "border": "replicate", "stride": [2, 2], "dilation": [2, 2],
            "padding": [(1, 0), (0, 1)]}, weights=(1,), terms=8 + 1),
    # negative padding: reads one index beyond each edge, reflected
    OpCase("deconv", [frand((1, 2, 5), 57), frand((2, 2, 3), 58)],
           {"border": "reflect", "stride": [2], "padding": [(-1, -1)]}, weights=(1,),
           terms=6 + 1),
    # Padded convs and pools whose padding taps lie before and after the input (issue 22,
    # item 0: a Select loaded them; MobileNet-v2's depth-wise stride-2 pad-1 conv faulted).
    OpCase("conv", [frand((1, 4, 9, 16), 110), frand((4, 1, 3, 3), 111)],
           {"groups": 0, "padding": [(1, 1), (1, 1)], "stride": [2, 2]}, weights=(1,),
           terms=9 + 1),
    OpCase("conv", [frand((1, 3, 6, 16), 112), frand((4, 3, 3, 3), 113), frand((1, 4), 114)],
           {"padding": [(1, 1), (1, 1)]}, weights=(1, 2), terms=27 + 1),
    OpCase("box", [frand((1, 2, 7, 16), 115)],
           {"size": [1, 1, 3, 3], "stride": [1, 1, 2, 2], "border": "ignore",
            "padding": [(0, 0), (0, 0), (1, 1), (1, 1)], "normalize": True}, terms=9 + 1),
    OpCase("argmax_pool", [frand((1, 2, 7, 16), 116)],
           {"size": [1, 1, 3, 3], "stride": [1, 1, 2, 2], "border": "ignore",
            "padding": [(0, 0), (0, 0), (1, 1), (1, 1)]}),
    OpCase("box", [frand((1, 2, 5, 6), 61)], {"size": [1, 1, 3, 3], "stride": [1, 1, 2, 2],
                                              "border": "ignore", "normalize": True},
           terms=9 + 1),
    OpCase("box", [frand((2, 3, 5, 5), 62)],
           {"size": [1, 2, 2, 3], "padding": [(0, 0), (0, 1), (1, 0), (2, 1)],
            "dilation": [1, 1, 2, 1]}, terms=12),
    OpCase("box", [frand((3, 2, 4, 5), 63)], {"size": [2, 1, 3, 2], "border": "reflect-even",
                                              "normalize": True}, terms=12 + 1),
    OpCase("box", [frand((1, 2, 6, 6), 64)], {"size": [1, 1, 1, 1], "stride": [1, 1, 2, 3],
                                              "padding": [(0, 0)] * 4}, terms=1),
    # avg_pool with a constant border: the cpu-box rule (columns in lanes, taps unrolled)
    OpCase("box", [frand((1, 3, 9, 16), 68)],
           {"size": [1, 1, 3, 3], "padding": [(0, 0), (0, 0), (1, 1), (1, 1)],
            "normalize": True}, terms=9 + 1),
    OpCase("debox", [frand((1, 2, 3, 3), 65)],
           {"size": [1, 1, 3, 3], "stride": [1, 1, 2, 2], "normalize": True,
            "padding": [(0, 0), (0, 0), (1, 1), (1, 1)]}, terms=9 + 1),
    OpCase("debox", [frand((1, 2, 3, 4), 66)],
           {"size": [1, 1, 2, 3], "stride": [1, 1, 2, 2], "border": "ignore",
            "normalize": True, "output_shape": [1, 2, 6, 8]}, terms=6 + 1),
    OpCase("debox", [frand((1, 1, 4, 4), 67)],
           {"size": [1, 1, 3, 2], "stride": [1, 1, 1, 2], "dilation": [1, 1, 2, 1],
            "border": "replicate", "padding": [(0, 0)] * 4}, terms=6),
    OpCase("argmax_pool", [_ties((1, 2, 5, 6), 68)],
           {"size": [1, 1, 3, 3], "stride": [1, 1, 2, 2], "border": "ignore"}),
    OpCase("argmax_pool", [(-np.abs(frand((1, 2, 4, 4), 69)[0]), None)],
           {"size": [1, 1, 3, 3], "padding": [(0, 0), (0, 0), (1, 1), (1, 1)]}),
    OpCase("argmax_pool", [_ties((1, 2, 6, 6), 70)],
           {"size": [1, 1, 2, 2], "dilation": [1, 1, 2, 2], "border": "reflect",
            "padding": [(0, 0), (0, 0), (1, 0), (0, 1)]}),
    OpCase("argmax_pool", [frand((1, 3, 4, 5), 71)], {"size": [1, 1, 4, 5], "padding": []}),
    OpCase("sample", [frand((1, 2, 5, 6), 72), _indices((1, 2, 3, 3), 9, 73)],
           {"size": [1, 1, 3, 3], "stride": [1, 1, 2, 2], "border": "replicate"}),
    OpCase("sample", [frand((1, 1, 4, 4), 74), _indices((1, 1, 4, 4), 9, 75)],
           {"size": [1, 1, 3, 3], "border": "ignore"}),
    OpCase("sample", [frand((1, 2, 4, 4), 76), _indices((1, 2, 4, 4), 4, 77)],
           {"size": [1, 1, 2, 2], "border": "constant", "padding": [(0, 0), (0, 0), (1, 0),
                                                                   (1, 0)]}),
    OpCase("sample", [frand((1, 2, 4, 4), 78), _indices((1, 2, 2, 2), 9, 79)],
           {"size": [1, 1, 3, 3], "stride": [1, 1, 2, 2], "border": "reflect-even"}),
    OpCase("desample", [frand((1, 2, 3, 3), 80), _indices((1, 2, 3, 3), 9, 81)],
           {"size": [1, 1, 3, 3], "stride": [1, 1, 2, 2],
            "padding": [(0, 0), (0, 0), (1, 1), (1, 1)]}, terms=9),
    OpCase("desample", [frand((1, 2, 3, 3), 82), _indices((1, 2, 3, 3), 4, 83)],
           {"size": [1, 1, 2, 2], "stride": [1, 1, 2, 2], "output_shape": [1, 2, 6, 5]},
           terms=4),
    OpCase("multilinear_upsample", [frand((1, 2, 3, 4), 84)],
           {"factor": [2, 3], "method": "symmetric", "border": "constant"},
           terms=_multilinear_terms(2)),
    OpCase("multilinear_upsample", [frand((2, 1, 3, 3), 85)],
           {"factor": [3, 2], "method": "asymmetric", "border": "replicate"},
           terms=_multilinear_terms(2)),
    OpCase("multilinear_upsample", [frand((1, 2, 2, 3), 86)],
           {"factor": [2, 2], "method": "aligned", "border": "reflect"},
           terms=_multilinear_terms(2)),
    OpCase("multilinear_upsample", [frand((1, 2, 5), 87)],
           {"factor": [4], "method": "symmetric", "border": "reflect-even"},
           terms=_multilinear_terms(1)),
    OpCase("multilinear_upsample", [frand((1, 2, 1, 3), 88)],
           {"factor": [3, 2], "method": "aligned", "border": "constant"},
           terms=_multilinear_terms(2)),
    OpCase("multilinear_upsample", [frand((1, 1, 2, 3, 2), 89)],
           {"factor": [2, 2, 3], "method": "asymmetric", "border": "constant"},
           terms=_multilinear_terms(3)),
    OpCase("avg_roi_pool", [_ROI_X, _ROIS, _BATCH], {"output_size": [2, 3]},
           terms=6 * 7 + 2, magnitude=(0,)),
    OpCase("max_roi_pool", [_ROI_X, _ROIS, _BATCH], {"output_size": [2, 3]}),
    OpCase("max_roi_pool", [_ties((2, 3, 6, 7), 90), _ROIS, (_BATCH[0].reshape(-1, 1), 4)],
           {"output_size": [3, 2]}),
    OpCase("avg_roi_pool", [frand((1, 2, 9), 91), (np.array([[1.2, 7.9], [-3.0, 2.0]],
                                                            np.float32), None),
                            (np.array([0, 0]), 2)], {"output_size": [4]},
           terms=9 + 2, magnitude=(0,)),
    *[OpCase("roi_resample", [_ROI_X, _ROIS, _BATCH], {"output_size": [3, 4], "method": m},
             terms=2**2 + 3 * 2, magnitude=(0,))
      for m in ("symmetric", "asymmetric", "aligned")],
    OpCase("roi_resample", [frand((1, 2, 9), 92), (np.array([[1.2, 7.9]], np.float32), None),
                            (np.array([[0]]), 2)], {"output_size": [1], "method": "aligned"},
           terms=2 + 3, magnitude=(0,)),
]


def _zeros_and_specials(shape: tuple[int, ...], seed: int) -> tuple[np.ndarray, None]:
    """Floats from {-0, +0, +-1, +-inf, NaN}: windows of equal zeros of both signs (the
    first tap wins), NaN (it wins) and infinities."""
    levels = np.array([-0.0, 0.0, -0.0, 0.0, 1.0, -1.0, np.inf, -np.inf, np.nan], np.float32)
    return np.random.default_rng(seed).choice(levels, shape), None


_POOL_3X3_S2 = {"size": [1, 1, 3, 3], "stride": [1, 1, 2, 2],
                "padding": [(0, 0), (0, 0), (1, 1), (1, 1)]}
# max_window (the stdlib's max_pool as one reduction): its reference is argmax_pool then
# sample; the kernels take the cpu-max-window row (NCHW, window on rows and columns) or,
# for any other window, the default one
NNEF_CASES += [
    OpCase("nnef.max_window", [_zeros_and_specials((1, 3, 9, 16), 93)],
           {**_POOL_3X3_S2, "border": "ignore"}),
    OpCase("nnef.max_window", [_zeros_and_specials((2, 2, 7, 9), 94)], _POOL_3X3_S2),
    OpCase("nnef.max_window", [(-np.abs(frand((1, 2, 6, 6), 95)[0]), None)],
           {**_POOL_3X3_S2, "stride": [1, 1, 1, 1]}),  # negative: the 0 border wins
    # windows wholly in the padding: -inf ('ignore'), 0 ('constant')
    *[OpCase("nnef.max_window", [_ties((1, 2, 4, 5), 96)],
             {"size": [1, 1, 2, 2], "border": border,
              "padding": [(0, 0), (0, 0), (2, 2), (3, 2)]}) for border in ("ignore", "constant")],
    OpCase("nnef.max_window", [_ties((1, 2, 6, 7), 97)],
           {"size": [1, 1, 2, 3], "dilation": [1, 1, 2, 1], "border": "reflect",
            "padding": [(0, 0), (0, 0), (1, 0), (1, 1)]}),
    OpCase("nnef.max_window", [_zeros_and_specials((2, 3, 5, 6), 98)],
           {"size": [2, 1, 3, 2], "border": "replicate"}),  # a window over the batch too
    OpCase("nnef.max_window", [frand((1, 2, 5, 5), 99)], {"size": [1, 1, 1, 1]}),
    OpCase("nnef.max_window", [_ties((1, 2, 7, 7), 100)], {"size": [1, 1, 7, 7],
                                                           "padding": []}),  # global
    # the stdlib's max, min, clamp as one op each: NaN, infinities and zeros of both signs
    *[OpCase(name, [EDGES, (EDGES[0][::-1].copy(), None)])
      for name in ("nnef.select_max", "nnef.select_min")],
    OpCase("nnef.select_max", [frand((2, 3, 4), 101), (np.array([0.0], np.float32), None)]),
    OpCase("nnef.select_clamp", [EDGES, (np.array([-0.0], np.float32), None),
                                 (np.array([6.0], np.float32), None)]),
    OpCase("nnef.select_clamp", [frand((2, 3, 4), 102), frand((2, 3), 103),
                                 frand((2, 1), 104)]),
]
CASES += NNEF_CASES


# ---- NNEF reduce, shape, matmul and update ops ------------------------------------------
def irand(shape: tuple[int, ...], seed: int = 0, bound: int = 8) -> tuple[np.ndarray, None]:
    """Small integer-valued float32 values: their float32 sums and products are exact, so
    a compiled reduction must equal the reference bit for bit (the bound-based tests with
    arbitrary values are in tests/ops/test_nnef_tensor.py)."""
    rng = np.random.default_rng(seed)
    return rng.integers(-bound, bound + 1, shape).astype(np.float32), None


_NAN_ROWS = (np.array([[1.0, np.nan, 3.0, np.nan], [2.0, 2.0, -1.0, 2.0],
                       [-np.inf, -np.inf, -np.inf, -np.inf]], np.float32), None)

NNEF_TENSOR_CASES: list[OpCase] = [
    OpCase("sum_reduce", [irand((2, 3, 4), 40)], {"axes": [0, 2]}),
    OpCase("sum_reduce", [irand((3, 8), 41)], {"axes": [1], "normalize": True}),
    *[OpCase(f"{k}_reduce", [frand((3, 5, 2), 42)], {"axes": [1, 2]})
      for k in ("max", "min", "argmax", "argmin")],
    *[OpCase(f"{k}_reduce", [_NAN_ROWS], {"axes": [1]})
      for k in ("max", "min", "argmax", "argmin")],
    *[OpCase(f"{k}_reduce", [brand((4, 3), 43)], {"axes": [0]}) for k in ("any", "all")],
    OpCase("matmul", [irand((2, 3, 5), 44), irand((1, 5, 4), 45)]),
    OpCase("matmul", [irand((5, 3), 46), irand((4, 5), 47)],
           {"transposeA": True, "transposeB": True}),
    # 13 rows (prime): the register tile's last row block is masked (guard pages check it)
    OpCase("matmul", [irand((13, 6), 246), irand((6, 16), 247)]),
    OpCase("nnef.reshape", [frand((2, 3, 4), 48)], {"shape": [0, -1, 2], "axis_start": 1}),
    OpCase("nnef.reshape", [rand((2, 6), 12, 49)], {"shape": [3, 4]}),
    OpCase("nnef.transpose", [frand((2, 3, 4), 50)], {"axes": [1, 0]}),
    OpCase("concat", [frand((2, 1), 51), frand((2, 3), 52), frand((2, 2), 53)], {"axis": 1}),
    OpCase("concat", [rand((1, 3), 8, 54), rand((2, 3), 12, 55)], {"axis": 0}),
    OpCase("split", [frand((2, 6), 56)], {"axis": 1, "ratios": [1, 2]}),
    OpCase("stack", [frand((2, 3), 57), frand((2, 3), 58)], {"axis": 1}),
    OpCase("unstack", [frand((2, 3), 59)], {"axis": 1}),
    OpCase("nnef.slice", [frand((5, 6), 60)], {"axes": [0, 1], "begin": [1, -1],
                                               "end": [5, 0], "stride": [2, -2]}),
    OpCase("nnef.slice", [rand((4, 5), 10, 61)], {"axes": [1], "begin": [-3], "end": [0]}),
    OpCase("nnef.squeeze", [frand((2, 1, 3, 1), 62)], {"axes": [1, 3]}),
    OpCase("unsqueeze", [frand((2, 3), 63)], {"axes": [0, 3]}),
    OpCase("nnef.tile", [frand((2, 3), 64)], {"repeats": [2, 3]}),
    *[OpCase("pad", [frand((3, 4), 65)], {"padding": [(1, 2), (2, 1)], "border": b,
                                          "value": 1.5})
      for b in ("constant", "replicate", "reflect", "reflect-even")],
    OpCase("pad", [frand((3, 4), 66)], {"padding": [(2, 2), (3, 3)], "border": "reflect"}),
    OpCase("pad", [frand((3, 4), 67)], {"padding": [(3, -1), (4, 0)], "border": "reflect-even"}),
    OpCase("gather", [frand((4, 3), 68), (np.array([[0, 3], [-1, 9], [-9, 2]]), 8)],
           {"axis": 0}),
    OpCase("gather", [rand((2, 5), 12, 69), (np.array([4, 0, -2]), 4)], {"axis": 1}),
    OpCase("update", [frand((2, 3), 70), frand((2, 3), 71)]),
]
CASES += NNEF_TENSOR_CASES


def case_id(case: OpCase) -> str:
    """Test id of a case: the op name."""
    return case.op


# ---- CINN primitives (cvmc/ops/cinn.py) ---------------------------------------------------
_FLOAT_DOMAIN = {**_DOMAIN, "log10": (1e-3, 50.0), "log2": (1e-3, 50.0), "sqrt": (0.0, 40.0),
                 "rsqrt": (1e-3, 40.0)}
# Divisors for the integer division family: zeros, both signs (x / 0 = 0 is a decision).
_DIVISORS = (np.array([[0], [3], [-5]]), 4)
_FLOAT_ZEROS = (np.array([[0.0, -0.0, 1.0, np.nan], [-0.0, -0.0, -0.0, 2.0],
                          [-0.0, 0.0, -1.0, -np.inf]], np.float32), None)
_REV = (EDGES[0][::-1].copy(), None)

CINN_CASES: list[OpCase] = [
    *[OpCase(f"cinn.{name}", [frand((3, 17), 40, *((_FLOAT_DOMAIN[name][1], _FLOAT_DOMAIN[name][0])
                                                    if name in _FLOAT_DOMAIN else (3.0,)))])
      for name in (*TRANSCENDENTAL, "erf", "log10", "log2")],
    *[OpCase(f"cinn.{name}", [EDGES]) for name in ("sqrt", "rsqrt", "floor", "ceil", "trunc",
                                                   "round", "abs", "negative", "sign",
                                                   "is_finite", "is_inf", "is_nan", "identity")],
    OpCase("cinn.round", [frand((4, 33), 41)]),
    OpCase("cinn.rsqrt", [frand((4, 33), 42, 40.0, 1e-3)]),
    *[OpCase(f"cinn.{name}", [rand((3, 17), 12, 43)])
      for name in ("abs", "negative", "sign", "is_finite", "is_inf", "is_nan", "identity",
                   "bitwise_not")],
    OpCase("cinn.sign", [(np.zeros((4,), np.int64), 1)]),
    OpCase("cinn.identity", [brand((2, 3), 44)]),
    OpCase("cinn.logical_not", [brand((5,), 45)]),
    *[OpCase(f"cinn.{name}", [frand((2, 3, 4), 46), frand((3, 1), 47)])
      for name in ("add", "sub", "mul", "div", "floor_div", "floor_mod", "mod", "max", "min")],
    *[OpCase(f"cinn.{name}", [EDGES, _REV])
      for name in ("div", "floor_div", "floor_mod", "mod", "max", "min")],
    *[OpCase(f"cinn.{name}", [_FLOAT_ZEROS, (_FLOAT_ZEROS[0][::-1].copy(), None)])
      for name in ("floor_div", "floor_mod", "max", "min")],
    *[OpCase(f"cinn.{name}", [rand((3, 4), 8, 48), rand((3, 1), 6, 49)])
      for name in ("add", "sub", "mul", "max", "min", "bitwise_and", "bitwise_or", "bitwise_xor")],
    *[OpCase(f"cinn.{name}", [rand((3, 4), 8, 50), _DIVISORS])
      for name in ("div", "floor_div", "floor_mod", "mod")],
    OpCase("cinn.power", [frand((3, 5), 51, 4.0, 0.0), frand((3, 1), 52, 4.0, -2.0)]),
    OpCase("cinn.power", [(np.array([[-7, -2, -1, 0, 1, 2, 7]]), 4),
                          (np.array([[0], [1], [2], [3], [-1], [-2]]), 3)]),
    OpCase("cinn.power", [(np.array([[-1, 0, 1]]), 2),
                          (np.array([[0], [1], [31], [2**30 + 1], [-(2**31 - 1)]]), 32)]),
    OpCase("cinn.left_shift", [rand((3, 4), 8, 53), (np.array([[-2], [0], [3]]), 3)]),
    OpCase("cinn.right_shift", [rand((4, 3), 12, 54),
                                (np.array([[-3], [0], [5], [40]]), 7)]),
    *[OpCase(f"cinn.{name}", [brand((2, 3), 55), brand((2, 1), 56)])
      for name in ("logical_and", "logical_or", "logical_xor")],
    *[OpCase("cinn.compare", [EDGES, _REV], {"kind": kind})
      for kind in ("eq", "ne", "ge", "gt", "le", "lt")],
    OpCase("cinn.compare", [rand((3, 4), 8, 57), rand((4,), 8, 58)], {"kind": "le"}),
    OpCase("cinn.select", [brand((2, 3, 4), 59), frand((3, 4), 60), frand((1,), 61)]),
    OpCase("cinn.select", [brand((2, 3), 62), rand((2, 3), 8, 63), rand((3,), 12, 64)]),
    OpCase("cinn.dot", [frand((4, 5), 65), frand((5, 3), 66)], terms=5),
    OpCase("cinn.dot", [frand((5,), 67), frand((5, 3), 68)], terms=5),
    OpCase("cinn.dot", [frand((4, 5), 69), frand((5,), 70)], terms=5),
    OpCase("cinn.dot", [frand((5,), 71), frand((5,), 72)], terms=5),
    OpCase("cinn.dot", [rand((3, 4), 8, 73), rand((4, 2), 8, 74)]),
    OpCase("cinn.reduce", [frand((3, 4, 5), 75)], {"kind": "sum", "dim": [1]}, terms=4),
    OpCase("cinn.reduce", [frand((3, 4, 5), 76)], {"kind": "sum", "dim": [], "keep_dim": True},
           terms=60),
    # a product of K factors rounds K - 1 times, relative to the product of the magnitudes
    OpCase("cinn.reduce", [frand((3, 4), 77, 2.0, 0.5)], {"kind": "prod", "dim": [1]},
           terms=4),
    *[OpCase("cinn.reduce", [_FLOAT_ZEROS], {"kind": kind, "dim": [1]}) for kind in ("max", "min")],
    *[OpCase("cinn.reduce", [frand((3, 4, 5), 78)], {"kind": kind, "dim": [0, 2],
                                                     "keep_dim": True}) for kind in ("max", "min")],
    *[OpCase("cinn.reduce", [rand((3, 4, 5), 6, 79)], {"kind": kind, "dim": [2]})
      for kind in ("sum", "prod", "max", "min")],
    OpCase("cinn.bn_mean_variance", [frand((2, 3, 4, 5), 80)], terms=40),
    # x >= 0 >= save_mean, so grad * (x - save_mean) with |grad| is each term's magnitude;
    # x - save_mean rounds once more
    OpCase("cinn.bn_grad_bias_scale", [frand((2, 3, 4, 5), 81, 3.0, 0.0), frand((2, 3, 4, 5), 82),
                                       frand((3,), 83, 3.0, -3.0)], terms=40 + 1, magnitude=(1,)),
    OpCase("cinn.broadcast_to", [frand((3, 1), 84)], {"out_shape": [2, 3, 4],
                                                      "broadcast_axes": [1, 2]}),
    OpCase("cinn.broadcast_to", [rand((4,), 8, 85)], {"out_shape": [2, 4, 3],
                                                      "broadcast_axes": [1]}),
    OpCase("cinn.concat", [frand((2, 3), 86), frand((2, 1), 87), frand((2, 2), 88)], {"axis": 1}),
    OpCase("cinn.concat", [rand((1, 3), 8, 89), rand((2, 3), 12, 90)]),
    OpCase("cinn.reshape", [frand((2, 3, 4), 91)], {"shape": [4, -1]}),
    OpCase("cinn.reverse", [rand((2, 3, 4), 8, 92)], {"axis": [0, 2]}),
    OpCase("cinn.slice", [frand((5, 6, 2), 93)], {"axes": [1, 0], "starts": [2, 1],
                                                  "ends": [6, 4]}),
    OpCase("cinn.transpose", [rand((2, 3, 4), 8, 94)], {"axis": [2, 0, 1]}),
    OpCase("cinn.transpose", [brand((2, 3, 4), 95)], {"axis": [1, 0]}),
    *[OpCase("cinn.const_scalar", [], {"value": v}) for v in (-5, 0.25, True)],
    # conv on small integer values (float32 sums exact: the bits must be equal)
    OpCase("cinn.conv", [irand((1, 6, 5, 4), 96), irand((6, 2, 3, 2), 97)],
           {"strides": [2, 1], "groups": 2, "data_format": "NHWC",
            "padding_algorithm": "SAME"}),
    # depth-wise, stride 2, pad 1 (padding taps on both sides of the input)
    OpCase("cinn.conv", [irand((1, 4, 9, 16), 102), irand((4, 1, 3, 3), 103)],
           {"strides": [2, 2], "paddings": [1, 1], "groups": 4}),
    OpCase("cinn.conv", [irand((4, 2, 3, 3), 98), irand((1, 4, 3, 1), 99)],
           {"strides": [2, 2], "paddings": [1, 0], "conv_type": "backward_data",
            "output_shape": [1, 2, 5, 4]}),
    OpCase("cinn.conv", [irand((1, 2, 5, 4), 100), irand((1, 4, 3, 1), 101)],
           {"strides": [2, 2], "paddings": [1, 0], "conv_type": "backward_filter",
            "output_shape": [4, 2, 3, 3]}),
]
CASES += CINN_CASES


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
    # depth-wise, stride 2, pad 1, float
    OpCase("onednn.convolution", [exact_floats((1, 4, 9, 16), 104),
                                  exact_floats((4, 1, 3, 3), 105)],
           _conv(2, strides=[2, 2], pads_begin=[1, 1], pads_end=[1, 1], groups=4,
                 data_format="NCX", weights_format="OIX"), weights=(1,)),
    OpCase("onednn.convolution", [rand((2, 8, 3), 8, 100), rand((3, 1, 3), 8, 101)],
           _conv(1, groups=3, dilations=[2], auto_pad="same_upper"), weights=(1,)),
    OpCase("onednn.convolution", [rand((1, 4, 3, 2, 3), 8, 102), rand((4, 3, 2, 2, 1), 8, 103)],
           _conv(3, strides=[2, 1, 1], pads_end=[1, 0, 0], weights_format="OIX"),
           weights=(1,)),
]
CASES += ONEDNN_CASES


# ---- conv_packed: NNEF's float conv on a filter packed OIHW{B}o (cvmc/ops/packed_llvm.py) --
def packed_filter(w: tuple[np.ndarray, None], block: int) -> tuple[np.ndarray, None]:
    """An OIHW filter packed OIHW{block}o, written here with NumPy: zero-pad O to a multiple
    of `block`, split it into (O / block, block) and move the block last."""
    arr = np.pad(w[0], ((0, -w[0].shape[0] % block), (0, 0), (0, 0), (0, 0)))
    return arr.reshape(-1, block, *arr.shape[1:]).transpose(0, 2, 3, 4, 1).copy(), None


def _packed_case(x, w, bias, block: int, attrs: dict, exact: bool = False) -> OpCase:
    """conv_packed of data `x` and filter `w` (OIHW, packed here), `bias` (or None); sums
    within conv's bound (K = C/G * KH * KW + 1), bit-exact on integer-valued data."""
    oc, cg, kh, kw = w[0].shape
    inputs = [x, packed_filter(w, block), *([bias] if bias is not None else [])]
    return OpCase("conv_packed", inputs, {**attrs, "channels": oc},
                  weights=tuple(range(1, len(inputs))), terms=0 if exact else cg * kh * kw + 1)


CONV_PACKED_CASES = [
    # 3x3, pad 1, 12 output channels (a padded block of 8), bias [1, OC]
    _packed_case(frand((1, 5, 9, 11), 120), frand((12, 5, 3, 3), 121), frand((1, 12), 122),
                 8, {"padding": [(1, 1), (1, 1)]}),
    # stride 2 with dilation 2, asymmetric padding, 20 channels in blocks of 16 (AVX-512)
    _packed_case(frand((2, 3, 12, 10), 123), frand((20, 3, 3, 2), 124), None, 16,
                 {"padding": [(2, 1), (0, 1)], "stride": [2, 2], "dilation": [2, 2]}),
    # grouped: 2 groups of 8 output channels; depth-wise with multiplier 8 (groups = C)
    _packed_case(frand((1, 4, 7, 9), 125), frand((16, 2, 3, 3), 126), frand((1, 16), 127),
                 8, {"padding": [(1, 1), (1, 1)]}),
    _packed_case(frand((1, 3, 8, 8), 128), frand((24, 1, 3, 3), 129), None, 8,
                 {"padding": [(1, 1), (1, 1)], "stride": [2, 2]}),
    # 1x1, 24 channels; the 7x7 stride-2 stem (3 -> 8), automatic padding
    _packed_case(frand((1, 16, 6, 13), 130), frand((24, 16, 1, 1), 131), frand((1, 24), 132),
                 8, {}),
    _packed_case(frand((1, 3, 23, 23), 133), frand((8, 3, 7, 7), 134), frand((1, 8), 135),
                 8, {"padding": [(3, 3), (3, 3)], "stride": [2, 2]}),
    # integer-valued data: every partial sum is exact, so the kernel equals the reference
    _packed_case(irand((1, 8, 10, 10), 136), irand((10, 8, 3, 3), 137), irand((1, 10), 138),
                 8, {"padding": [(1, 1), (1, 1)]}, exact=True),
]
CASES += CONV_PACKED_CASES
# ---- float activations blocked NCHW{B}c (block-float-activations, cvmc/ops/packed_llvm.py)
def blocked_float(x: tuple[np.ndarray, None], block: int) -> tuple[np.ndarray, None]:
    """NCHW float data as NCHW{block}c, written here with NumPy: zero-pad C to a multiple
    of `block`, split it and move the block last."""
    arr = np.pad(x[0], ((0, 0), (0, -x[0].shape[1] % block), (0, 0), (0, 0)))
    n, c, h, w = arr.shape
    return arr.reshape(n, c // block, block, h, w).transpose(0, 1, 3, 4, 2).copy(), None


CASES += [
    OpCase("float_layout_transform", [frand((1, 12, 3, 5), 170)],
           {"src_layout": "NCHW", "dst_layout": "NCHW8c"}),
    OpCase("float_layout_transform", [frand((2, 2, 3, 4, 8), 171)],
           {"src_layout": "NCHW8c", "dst_layout": "NCHW"}),
    # 3x3 on 12 blocked channels (a padded block), 16 blocked out, bias
    OpCase("conv_packed_blocked", [blocked_float(frand((1, 12, 9, 11), 172), 8),
                                   packed_filter(frand((16, 12, 3, 3), 173), 8),
                                   frand((1, 16), 174)],
           {"padding": [(1, 1), (1, 1)], "channels": 16, "data_layout": "NCHW8c",
            "out_layout": "NCHW8c"}, weights=(1, 2), terms=12 * 9 + 1),
    # 1x1 from NCHW to NCHW8c on integer values: every partial sum exact, the reference's bits
    OpCase("conv_packed_blocked", [irand((1, 16, 5, 7), 175),
                                   packed_filter(irand((24, 16, 1, 1), 176), 8)],
           {"channels": 24, "out_layout": "NCHW8c"}, weights=(1,)),
    # depth-wise 3x3 stride 2 on NCHW8c, the filter packed (C/8, 1, KH, KW, 8), bias
    OpCase("depthwise_conv_blocked", [blocked_float(frand((1, 16, 9, 9), 177), 8),
                                      packed_filter(frand((16, 1, 3, 3), 178), 8),
                                      frand((1, 16), 179)],
           {"padding": [(1, 1), (1, 1)], "stride": [2, 2]}, weights=(1, 2), terms=9 + 1),
]
# ---- matmul_packed: matmul on a B packed in column panels (cvmc/ops/packed_llvm.py) ----------
def column_panels(b: tuple[np.ndarray, None], cols: int) -> tuple[np.ndarray, None]:
    """B (*batch, K, N) packed (*batch, P, K, cols), written here with NumPy: zero-pad N to
    a multiple of `cols`, split it into (P, cols) and move P before K."""
    arr = b[0]
    arr = np.pad(arr, [(0, 0)] * (arr.ndim - 1) + [(0, -arr.shape[-1] % cols)])
    arr = arr.reshape(*arr.shape[:-1], -1, cols)
    return np.swapaxes(arr, -3, -2).copy(), None


CASES += [
    # 20 columns in 2 panels of 16 (the second padded), B's batch broadcast over A's
    OpCase("matmul_packed", [frand((2, 5, 24), 160), column_panels(frand((1, 24, 20), 161), 16)],
           {"columns": 20}, weights=(1,), terms=24),
    # 13 rows (a masked last row tile), K = 263 (prime: a partial last K block), 9 panels of
    # 16 (K-blocked), on integer values: every partial sum is exact, the reference's bits
    OpCase("matmul_packed", [irand((13, 263), 162), column_panels(irand((263, 136), 163), 16)],
           {"columns": 136}, weights=(1,)),
]
# NNEF conv cases the float layout pass packs on the CPU (the compiled graph holds
# conv_packed): channels not a multiple of 8, 1x1, depth-wise with multiplier 1 (not
# packed: its own rule), a 7x7 stride-2 stem with bias
CASES += [
    OpCase("conv", [frand((1, 6, 8, 9), 140), frand((11, 6, 3, 3), 141), frand((1, 11), 142)],
           {"padding": [(1, 1), (1, 1)]}, weights=(1, 2), terms=6 * 9 + 1),
    OpCase("conv", [frand((1, 24, 5, 7), 143), frand((16, 24, 1, 1), 144)], {},
           weights=(1,), terms=24 + 1),
    OpCase("conv", [frand((1, 8, 9, 9), 145), frand((8, 1, 3, 3), 146), frand((1, 8), 147)],
           {"groups": 0, "padding": [(1, 1), (1, 1)], "stride": [2, 2]}, weights=(1, 2),
           terms=9 + 1),
    # depth-wise, stride 1 on 7 columns (the depth-wise rule's narrow-row path)
    OpCase("conv", [frand((1, 4, 7, 7), 151), frand((4, 1, 3, 3), 152), frand((1, 4), 153)],
           {"groups": 0, "padding": [(1, 1), (1, 1)]}, weights=(1, 2), terms=9 + 1),
    OpCase("conv", [frand((1, 3, 30, 30), 148), frand((16, 3, 7, 7), 149), frand((1, 16), 150)],
           {"padding": [(3, 3), (3, 3)], "stride": [2, 2]}, weights=(1, 2), terms=3 * 49 + 1),
]


def specs() -> dict[str, so.Spec]:
    """The formal spec's oracle of every CVM op, from its test record."""
    return {c.op: c.spec for c in CASES if c.spec is not None}


def exports() -> dict[str, tuple[list, dict]]:
    """Every CVM-Runtime op's node in the JSON export round trip, from its test record."""
    return {c.op: c.export for c in CASES if c.export is not None}


def _balanced_rows(shape: tuple[int, int], seed: int) -> tuple[np.ndarray, None]:
    """Rows of 2 + U[0, 1) with half of each row negated: every |x - mean(row)| >= 1.5, so
    layer_norm's bound (cvmc/ops/transformer.py) is within its entry's ULP."""
    rng = np.random.default_rng(seed)
    x = (2 + rng.random(shape)) * np.where(np.arange(shape[1]) % 2, -1, 1)
    return rng.permuted(x, axis=1).astype(np.float32), None


# ---- transformer ops (cvmc/passes/transformer.py makes them of exporters' chains) ------
CASES += [
    OpCase("layer_norm", [_balanced_rows((3, 8), 110)], {"axes": [1], "epsilon": 1e-5}),
    OpCase("fused_softmax", [frand((2, 3, 8), 111)], {"axes": [2]}),
    # its bound, 64 u |x| (cvmc/ops/transformer.py), within gamma(128) gelu_erf(|x|) >= 64 u |x|
    OpCase("gelu_erf", [frand((4, 33), 112)], terms=126),
    # D = N = 8, every sum_d |q'_d k'_d| <= 6.05: its bound (cvmc/ops/transformer.py),
    # (2 gamma(10) 6.05 + gamma(18)) |y| ~ 139 u |y|, within 160 ULP
    OpCase("attention_scores", [frand((2, 3, 8, 8), 113, 2.0), frand((2, 3, 8, 8), 114, 2.0)],
           {"q_scale": 0.35355338, "k_scale": 0.35355338, "scale": 1.0}),
    # a causal mask, 0 or -inf (exact adds): the same bound
    OpCase("attention_scores", [frand((2, 3, 8, 8), 113, 2.0), frand((2, 3, 8, 8), 114, 2.0),
                                (np.triu(np.full((1, 1, 8, 8), -np.inf, np.float32), 1), None)],
           {"q_scale": 0.35355338, "k_scale": 0.35355338, "transposeB": True}),
]

"""One small representative case per compute op, shared by the CUDA build and GPU tests.

A case lists its inputs as (array, precision) pairs, the attributes and which inputs are
weights; arrays are random inside the precision unless the op needs structured data.
"""
from __future__ import annotations

from collections.abc import Callable
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
    # float sums: (input arrays) -> absolute bound per output (see `sum_tolerance`)
    tolerance: Callable[[list[np.ndarray]], list[np.ndarray]] | None = None


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


# ---- CINN primitives (cvmc/ops/cinn.py) ---------------------------------------------------
def sum_tolerance(k: int, abs_sum: np.ndarray) -> np.ndarray:
    """The bound of a float32 sum of k terms against the reference's float64 one:
    (k + 2) * 2^-24 * sum(|terms|) (k - 1 additions and one rounding of each term's
    product by the kernel, one rounding of the reference result to float32)."""
    return (k + 2) * 2.0**-24 * abs_sum


def _sum_bound(axes: tuple[int, ...] | None, keep: bool = False):
    """Tolerance of a reduce sum of input 0 over `axes` (None: all)."""
    def bound(xs):
        x = np.abs(xs[0].astype(np.float64))
        k = x.size // np.sum(x, axis=axes, keepdims=True).size
        return [sum_tolerance(k, np.sum(x, axis=axes, keepdims=keep))]
    return bound


def _prod_bound(axes: tuple[int, ...]):
    """Tolerance of a reduce prod: each of the k - 1 products rounds once (relative)."""
    def bound(xs):
        x = np.abs(xs[0].astype(np.float64))
        return [sum_tolerance(x.shape[axes[0]], np.prod(x, axis=axes))]
    return bound


def _dot_bound(xs):
    x, y = (np.abs(v.astype(np.float64)) for v in xs)
    return [sum_tolerance(x.shape[-1], np.reshape(np.dot(x, y), -1 if x.ndim + y.ndim == 2
                                                   else np.dot(x, y).shape))]


def _bn_mean_variance_bound(xs):
    x = xs[0].astype(np.float64)
    axes = (0, 2, 3)
    k = x.size // x.shape[1]
    return [sum_tolerance(k, np.sum(np.abs(x), axis=axes)), sum_tolerance(k, np.sum(x * x, axis=axes))]


def _bn_grad_bound(xs):
    x, grad, mean = (v.astype(np.float64) for v in xs)
    axes = (0, 2, 3)
    k = x.size // x.shape[1]
    terms = np.abs(grad * (x - mean.reshape(1, -1, 1, 1)))
    # x - mean rounds once more per term: k + 1
    return [sum_tolerance(k, np.sum(np.abs(grad), axis=axes)),
            sum_tolerance(k + 1, np.sum(terms, axis=axes))]


_FLOAT_DOMAIN = {**_DOMAIN, "log10": (1e-3, 50.0), "log2": (1e-3, 50.0), "sqrt": (0.0, 40.0),
                 "rsqrt": (1e-3, 40.0)}
# Divisors for the integer division family: zeros, both signs (x / 0 = 0 is a decision).
_DIVISORS = (np.array([[0], [3], [-5]]), 4)
_FLOAT_ZEROS = (np.array([[0.0, -0.0, 1.0, np.nan], [-0.0, -0.0, -0.0, 2.0],
                          [-0.0, 0.0, -1.0, -np.inf]], np.float32), None)
_REV = (EDGES[0][::-1].copy(), None)

CINN_CASES: list[OpCase] = [
    *[OpCase(f"cinn.{name}", [frand((3, 17), 40, *((_FLOAT_DOMAIN[name][1], _FLOAT_DOMAIN[name][0])
                                                    if name in _FLOAT_DOMAIN else (3.0,)))],
             ulp=TRANSCENDENTAL_ULP) for name in (*TRANSCENDENTAL, "erf", "log10", "log2")],
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
    OpCase("cinn.power", [frand((3, 5), 51, 4.0, 0.0), frand((3, 1), 52, 4.0, -2.0)],
           ulp=TRANSCENDENTAL_ULP),
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
    OpCase("cinn.dot", [frand((4, 5), 65), frand((5, 3), 66)], tolerance=_dot_bound),
    OpCase("cinn.dot", [frand((5,), 67), frand((5, 3), 68)], tolerance=_dot_bound),
    OpCase("cinn.dot", [frand((4, 5), 69), frand((5,), 70)], tolerance=_dot_bound),
    OpCase("cinn.dot", [frand((5,), 71), frand((5,), 72)], tolerance=_dot_bound),
    OpCase("cinn.dot", [rand((3, 4), 8, 73), rand((4, 2), 8, 74)]),
    OpCase("cinn.reduce", [frand((3, 4, 5), 75)], {"kind": "sum", "dim": [1]},
           tolerance=_sum_bound((1,))),
    OpCase("cinn.reduce", [frand((3, 4, 5), 76)], {"kind": "sum", "dim": [], "keep_dim": True},
           tolerance=_sum_bound(None, True)),
    OpCase("cinn.reduce", [frand((3, 4), 77, 2.0, 0.5)], {"kind": "prod", "dim": [1]},
           tolerance=_prod_bound((1,))),
    *[OpCase("cinn.reduce", [_FLOAT_ZEROS], {"kind": kind, "dim": [1]}) for kind in ("max", "min")],
    *[OpCase("cinn.reduce", [frand((3, 4, 5), 78)], {"kind": kind, "dim": [0, 2],
                                                     "keep_dim": True}) for kind in ("max", "min")],
    *[OpCase("cinn.reduce", [rand((3, 4, 5), 6, 79)], {"kind": kind, "dim": [2]})
      for kind in ("sum", "prod", "max", "min")],
    OpCase("cinn.bn_mean_variance", [frand((2, 3, 4, 5), 80)], tolerance=_bn_mean_variance_bound),
    OpCase("cinn.bn_grad_bias_scale", [frand((2, 3, 4, 5), 81), frand((2, 3, 4, 5), 82),
                                       frand((3,), 83)], tolerance=_bn_grad_bound),
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
]
CASES += CINN_CASES

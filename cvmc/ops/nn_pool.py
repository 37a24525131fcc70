"""CVM NN operators: max_pool2d, upsampling.

Spec: ../shared/spec/cvm-operators-formal.txt, "NN Operators"; precision rules from
../shared/design/cvm-semantics.md. Attribute bounds as `nn`'s (CVM-Runtime's
`VerifyAttrRange`).
"""
from __future__ import annotations

import functools
import math

import numpy as np

from cvmc.ops.common import DATA_INTERVAL, INT32_MIN, data_interval, require
from cvmc.ops.nn import ATTR_HI, gather_windows, pair_attr, require_rank
from cvmc.ops.registry import Attr, Fusion, op

# ---- max_pool2d -----------------------------------------------------------------------
max_pool2d = op(
    "max_pool2d", family="nn", inputs=("data",), fusion=Fusion.OUT_ELEMWISE,
    attrs=(
        Attr("pool_size", "ints", lo=1, hi=ATTR_HI, length=2),
        # One int (or a 1-element list) means PH = PW, as in the spec and CVM-Runtime.
        Attr("padding", "ints", (0, 0), lo=0, hi=ATTR_HI, scalar_ok=True),
        pair_attr("strides", 1, (1, 1), aliases=("stride",)),
        Attr("ceil_mode", "bool", False),
        Attr("layout", "str", "NCHW", choices=("NCHW",)),
    ),
    # every window holds data (`_pool_out_size`), so the padding never reaches the result
    precision_rule="p_x", interval_rule=DATA_INTERVAL)
max_pool2d.interval(data_interval)


def _pool_padding(a) -> tuple[int, int]:
    """(PH, PW) from a 1- or 2-element padding attribute."""
    pad = tuple(a.padding)
    require(len(pad) in (1, 2), f"max_pool2d: attribute 'padding' must have 1 or 2 elements "
                                f"(PH = PW, or (PH, PW)), got {list(pad)}")
    return (pad[0], pad[0]) if len(pad) == 1 else pad


def _pool_out_size(axis: str, size: int, pad: int, k: int, stride: int, ceil: bool) -> int:
    """Spec: ceil_func((size + 2*pad - k) / stride) + 1, after the spec's window checks."""
    require(pad < k <= size + 2 * pad,
            f"max_pool2d: pool_size {axis} must be in ({pad}, {size + 2 * pad}] "
            f"(> padding {pad}, <= input {size} + 2*padding), got {k}")
    span = size + 2 * pad - k
    out = (-(-span // stride) if ceil else span // stride) + 1
    # ceil_mode can add a window that starts past the input: it would hold only padding
    # (INT32_MIN). CVM-Runtime rejects that case too ("min_o_h < H").
    start = (out - 1) * stride - pad
    require(start < size, f"max_pool2d: with ceil_mode the last window along {axis} starts "
                          f"at {start}, past the input {axis} {size}; it would hold only "
                          f"padding (use a smaller stride or ceil_mode=false)")
    return out


def pool_geometry(shape, a) -> tuple[int, int, int, int]:
    """(PH, PW, OH, OW) for an (N, C, H, W) input."""
    ph, pw = _pool_padding(a)
    (kh, kw), (sh, sw) = a.pool_size, a.strides
    oh = _pool_out_size("height", shape[2], ph, kh, sh, a.ceil_mode)
    ow = _pool_out_size("width", shape[3], pw, kw, sw, a.ceil_mode)
    return ph, pw, oh, ow


@max_pool2d.shape
def _max_pool2d_shape(ins, a):
    require_rank("max_pool2d", "data", ins[0], 4, "(N, C, H, W)")
    _, _, oh, ow = pool_geometry(ins[0].shape, a)
    return (*ins[0].shape[:2], oh, ow)


@max_pool2d.precision
def _max_pool2d_precision(ins, a):
    return ins[0].precision


@max_pool2d.reference
def max_pool2d_reference(xs, a):
    """max_pool2d's spec on int64 arrays (max_pool2d_blocked's too, on unblocked data)."""
    # Y[n,i,p,q] = max{pad(p*SH - PH + ki, q*SW - PW + kj) : ki < PSH, kj < PSW},
    # pad() = INT32_MIN outside the input. Padding "after" covers ceil_mode's extra window.
    x = xs[0]
    ph, pw, oh, ow = pool_geometry(x.shape, a)
    (kh, kw), (sh, sw) = a.pool_size, a.strides
    after_h = max(ph, (oh - 1) * sh + kh - ph - x.shape[2])
    after_w = max(pw, (ow - 1) * sw + kw - pw - x.shape[3])
    xp = np.pad(x, ((0, 0), (0, 0), (ph, after_h), (pw, after_w)), constant_values=INT32_MIN)
    taps = gather_windows(xp, oh, ow, (kh, kw), (sh, sw), (1, 1))
    return taps.max(axis=(2, 3))


# Windows up to this many taps are unrolled into a chain of maxima (a larger one, which
# the attributes allow, stays a reduction: the chain's expression grows with the window).
_MAX_UNROLLED_WINDOW = 64


@max_pool2d.lower
def _max_pool2d_lower(xs, a):
    return lower_max_pool(xs[0], a, "max_pool2d")


def lower_max_pool(x, a, name: str):
    """TE of max_pool2d on `x` (N, C, H, W), or (N, C/16, H, W, 16) blocked: rows and
    columns are axes 2 and 3 in both layouts, a blocked tensor's inner channel axis rides
    along (`cvmc.ops.packed`'s max_pool2d_blocked)."""
    from cvmc.ops.te import INTERIOR, shape_of, te, tirx
    ph, pw, oh, ow = pool_geometry(shape_of(x), a)
    (kh, kw), (sh, sw) = a.pool_size, a.strides
    h, w = shape_of(x)[2:4]
    # Output columns whose whole window lies inside the input: q*SW - PW >= 0 and
    # q*SW - PW + KW <= W. There the clamps below vanish (the CPU schedule splits them off).
    start = min(-(-pw // sw), ow)
    stop = max(start, min(ow, (w - kw + pw) // sw + 1))
    ry = te.reduce_axis((0, kh), name="ry")
    rx = te.reduce_axis((0, kw), name="rx")

    def window_max(n, c, p, q, *inner):
        # A tap in the padding reads the nearest input pixel instead: every window holds
        # at least one input pixel (the shape rule) and its pixels are contiguous, so
        # that nearest pixel is in the window too and the maximum is unchanged -- with
        # no test in the loop and no read outside the input (ceil_mode included).
        def tap(ky, kx):
            i = tirx.max(tirx.min(p * sh + ky - ph, h - 1), 0)
            return x[(n, c, i, tirx.max(tirx.min(q * sw + kx - pw, w - 1), 0), *inner)]
        if kh * kw > _MAX_UNROLLED_WINDOW:
            return te.max(tap(ry, rx), axis=[ry, rx])
        # Unrolled, the pooling block is all spatial and its output columns vectorise
        # (ResNet-18's 3x3/2 pool on 64x112x112, with the interior split: 0.93 -> 0.048 ms
        # at 1 thread).
        return functools.reduce(tirx.max, [tap(ky, kx) for ky in range(kh)
                                           for kx in range(kw)])
    shape = shape_of(x)
    if len(shape) == 5:
        return te.compute((*shape[:2], oh, ow, shape[4]),
                          lambda n, c, p, q, ci: window_max(n, c, p, q, ci), name=name,
                          attrs={INTERIOR: [3, start, stop]})
    return te.compute((*shape[:2], oh, ow), lambda n, c, p, q: window_max(n, c, p, q),
                      name=name, attrs={INTERIOR: [3, start, stop]})


@max_pool2d.arith
def window_compares(ins, outs, a):
    """The arith rule of a max pool (max_pool2d's, max_pool2d_blocked's): one comparison
    per window tap of each output element."""
    return outs[0].size * math.prod(a.pool_size)


@max_pool2d.cost
def window_taps(ins, outs, a):
    """The cost rule of a max pool (max_pool2d's, max_pool2d_blocked's): its window's taps
    per output element."""
    return a.pool_size[0] * a.pool_size[1]


# ---- upsampling -----------------------------------------------------------------------
upsampling = op(
    "upsampling", family="nn", inputs=("data",), fusion=Fusion.INJECTIVE,
    attrs=(
        Attr("scale", "int", lo=1, hi=ATTR_HI),
        Attr("method", "str", "NEAREST_NEIGHBOR", choices=("NEAREST_NEIGHBOR",)),
        Attr("layout", "str", "NCHW", choices=("NCHW",)),
    ),
    precision_rule="p_x", interval_rule=DATA_INTERVAL)
upsampling.interval(data_interval)


@upsampling.shape
def _upsampling_shape(ins, a):
    require_rank("upsampling", "data", ins[0], 4, "(N, C, H, W)")
    n, c, h, w = ins[0].shape
    return (n, c, h * a.scale, w * a.scale)


@upsampling.precision
def _upsampling_precision(ins, a):
    return ins[0].precision


@upsampling.reference
def _upsampling_reference(xs, a):
    # Y[n, i, h, w] = X[n, i, h // scale, w // scale]
    x, s = xs[0], a.scale
    rows = np.arange(x.shape[2] * s) // s
    cols = np.arange(x.shape[3] * s) // s
    return x[:, :, rows[:, None], cols[None, :]]


@upsampling.lower
def _upsampling_lower(xs, a):
    from cvmc.ops.te import shape_of, te
    x, s = xs[0], a.scale
    n, c, h, w = shape_of(x)
    # Indices are non-negative, so TIR's floor division equals the spec's floor.
    return te.compute((n, c, h * s, w * s), lambda b, i, p, q: x[b, i, p // s, q // s],
                      name="upsampling")

"""The canonical N-d convolution: one NumPy reference and one TE lowering.

For src (N, C, X1..Xr) in NCX order, weights (OC, C/G, K1..Kr) in OIX order, G groups of
ICG = C/G input and OCG = OC/G output channels, per spatial dimension d a stride S_d, a
dilation D_d (1: dense) and zero padding PB_d before / PE_d after the input:

    O_d = floor((X_d + PB_d + PE_d - DK_d) / S_d) + 1,   DK_d = 1 + (K_d - 1) * D_d
    dst[n, g*OCG + o, y1..yr] = bias[g*OCG + o]
        + sum_{i < ICG} sum_{k1 < K1} .. sum_{kr < Kr}
              src[n, g*ICG + i, y1*S_1 + k1*D_1 - PB_1, ..] * weights[g*OCG + o, i, k1, ..]

where src reads 0 outside the input (a negative pad crops it). This is oneDNN Graph's
Convolution (../shared/spec/onednn-convolution.txt, dilation 1 = dense) and the one
definition of a forward convolution in cvmc: CVM's conv2d (r = 2, PB = PE, NCHW / OIHW,
8-bit integers), NNEF's conv (its 'constant' border, any padding; groups 0 = one group per
channel) and CINN's conv are its special cases, each to be defined by calling these two
functions (onednn.convolution does). Integer operands compute exactly (int64 in the
reference, int32 in the kernels, which the callers' precision rules keep from
overflowing); float32 operands compute in float64 in the reference (rounded to float32
once by the interpreter) and in float32 in the kernels.
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from cvmc.ops.common import check_window
from cvmc.ops.nn import exact_matmul


def out_size(op_name: str, axis: int, size: int, k: int, stride: int, dilation: int,
             pad_begin: int, pad_end: int) -> int:
    """O = floor((X + PB + PE - DK) / S) + 1, DK = 1 + (K - 1) * D, after `check_window`
    (the dilated kernel fits in the padded input, and the geometry is not degenerate)."""
    check_window(op_name, f"spatial axis {axis}", size, k, stride, dilation, pad_begin,
                 pad_end)
    return (size + pad_begin + pad_end - 1 - (k - 1) * dilation) // stride + 1


def out_sizes(op_name: str, x_shape: Sequence[int], w_shape: Sequence[int],
              strides: Sequence[int], dilations: Sequence[int], pads_begin: Sequence[int],
              pads_end: Sequence[int]) -> tuple[int, ...]:
    """The output spatial sizes for NCX / OIX shapes."""
    return tuple(out_size(op_name, d, *geom) for d, geom in enumerate(zip(
        x_shape[2:], w_shape[2:], strides, dilations, pads_begin, pads_end)))


def conv_nd_reference(x: np.ndarray, w: np.ndarray, b: np.ndarray | None,
                      strides: Sequence[int], pads_begin: Sequence[int],
                      pads_end: Sequence[int], dilations: Sequence[int],
                      groups: int) -> np.ndarray:
    """dst (N, OC, O1..Or) of the module formula for NCX `x`, OIX `w`, optional (OC,) `b`:
    float64 for float inputs, int64 (exact) for integer ones."""
    n, _, *size = x.shape
    oc, icg, *k = w.shape
    r = len(size)
    out = out_sizes("convolution", x.shape, w.shape, strides, dilations, pads_begin,
                    pads_end)
    xp = _zero_pad(x, pads_begin, pads_end)
    # taps[n, c, k1..kr, y1..yr] = xp[n, c, y1*S_1 + k1*D_1, ..]: one index array per
    # spatial dim, shaped to broadcast over (k1..kr, y1..yr)
    index = []
    for d in range(r):
        rows = (np.arange(k[d]) * dilations[d])[:, None] + (np.arange(out[d]) * strides[d])
        shape = [1] * (2 * r)
        shape[d], shape[r + d] = k[d], out[d]
        index.append(rows.reshape(shape))
    taps = xp[(slice(None), slice(None), *index)]
    # per group: (OCG, ICG*K) @ (ICG*K, O) with channel g*ICG + i and output g*OCG + o
    cols = taps.reshape(n, groups, icg * int(np.prod(k)), int(np.prod(out)))
    wmat = w.reshape(groups, oc // groups, icg * int(np.prod(k)))
    if x.dtype.kind == "f":
        y = np.matmul(wmat.astype(np.float64), cols.astype(np.float64))
    else:
        y = exact_matmul(wmat, cols)
    y = y.reshape(n, oc, *out)
    return y if b is None else y + b.reshape(oc, *[1] * r)


def _zero_pad(x: np.ndarray, begin: Sequence[int], end: Sequence[int]) -> np.ndarray:
    """`x` with begin[d] zeros before and end[d] after spatial dim d (negative: cropped)."""
    xp = np.pad(x, [(0, 0), (0, 0), *((max(b, 0), max(e, 0)) for b, e in zip(begin, end))])
    crop = [slice(max(-b, 0), n - max(-e, 0)) for n, b, e in zip(xp.shape[2:], begin, end)]
    return xp[(slice(None), slice(None), *crop)]


def conv_nd_compute(x, w, b, strides: Sequence[int], pads_begin: Sequence[int],
                    pads_end: Sequence[int], dilations: Sequence[int], groups: int,
                    name: str, channels_last: bool = False):
    """TE of the module formula for NCX `x`, OIX `w`, optional (OC,) `b` (te.Tensors, all
    float32 or all int32; integer `x` must hold 8-bit values, as every integer
    convolution's precision rule requires); dst is NCX, or NXC with `channels_last` (the
    reduction itself writes that order: a transposing epilogue after it would defeat
    dlight's CUDA reduction rules)."""
    from cvmc.ops.te import shape_of, te

    n, c, *size = shape_of(x)
    oc, icg, *k = shape_of(w)
    out = out_sizes(name, (n, c, *size), (oc, icg, *k), strides, dilations, pads_begin,
                    pads_end)
    ocg = oc // groups
    read = padded_input(x, size, k, out, strides, dilations, pads_begin, name)
    rc = te.reduce_axis((0, icg), name="rc")
    rk = [te.reduce_axis((0, kd), name=f"rk{d}") for d, kd in enumerate(k)]

    def ncx(*i):
        """(n, o, y1..yr) of a dst index."""
        return (i[0], i[-1], *i[1:-1]) if channels_last else i

    def acc(*i):
        b_, o, *y = ncx(*i)
        taps = [yd * s + kd * dd for yd, s, kd, dd in zip(y, strides, rk, dilations)]
        return te.sum(read(b_, o // ocg * icg + rc, *taps) * w[(o, rc, *rk)],
                      axis=[rc, *rk])
    dst = te.compute((n, *out, oc) if channels_last else (n, oc, *out), acc, name=name)
    if b is None:
        return dst
    return te.compute(dst.shape, lambda *i: dst(*i) + b[ncx(*i)[1]], name=f"{name}_bias")


def padded_input(x, size, k, out, strides, dilations, pads_begin, name: str):
    """(n, c, p1..pr) -> x[n, c, p1 - PB_1, ..] inside the input, 0 outside (padded
    coordinates), as a materialised stage when any read can fall outside the input."""
    from cvmc.ops.te import MATERIALIZE, te, tirx

    # extent of padded coordinates read: the last tap of the last output, plus one
    extent = [(o - 1) * s + (kd - 1) * dd + 1
              for o, s, kd, dd in zip(out, strides, k, dilations)]
    low = [pb > 0 for pb in pads_begin]
    high = [e > xd + pb for e, xd, pb in zip(extent, size, pads_begin)]
    zero = tirx.const(0, x.dtype)

    def element(b_, c_, *p):
        tests = [t for d, pd in enumerate(p)
                 for need, t in ((low[d], pd >= pads_begin[d]),
                                 (high[d], pd < size[d] + pads_begin[d])) if need]
        pixel = x(b_, c_, *[pd - pb for pd, pb in zip(p, pads_begin)])
        return tirx.if_then_else(tirx.all(*tests), pixel, zero) if tests else pixel

    if not any(low) and not any(high):
        return element  # every read inside the input (a negative pad only shifts them)
    # Its own stage, kept as a buffer by the CPU schedule: the reduction then reads without
    # a bounds test and vectorises. Integer data has 8 bits (|x| <= 127): stored as int8,
    # exactly, in a quarter of the bytes.
    store = "int8" if str(x.dtype) == "int32" else str(x.dtype)
    stage = te.compute((*x.shape[:2], *extent), lambda *i: element(*i).astype(store),
                       name=f"{name}_pad", attrs={MATERIALIZE: 1})
    return lambda *i: stage(*i).astype(x.dtype)

"""oneDNN Graph's Convolution (../shared/spec/onednn-convolution.txt): `onednn.convolution`.

One N-d convolution (1, 2 or 3 spatial dims) on float32 tensors, or on CVM integers (8-bit
src and weights, int32 result with a precision like conv2d's). The arithmetic is the
canonical `cvmc.ops.conv_nd`; this module maps oneDNN's attributes onto it:
- data_format NXC / NCX and weights_format XIO / OIX: transposes to NCX / OIX before, and
  back to NXC after (NXC and XIO are oneDNN's defaults).
- dilations: 1 is dense (the spec's DK = 1 + (K - 1) * D; oneDNN's primitive API and
  benchdnn count from 0 instead).
- auto_pad (oneDNN's shape inference, src/graph/interface/shape_infer.cpp `infer_auto_pad`;
  the spec lists the values only): `none` takes pads_begin / pads_end; `valid` pads
  nothing; `same_upper` / `same_lower` pad P = max(0, (ceil(X / S) - 1) * S + DK - X) in
  total, so that O = ceil(X / S), with the odd element at the end (upper: floor(P / 2)
  before) or at the beginning (lower: ceil(P / 2) before). pads_begin / pads_end must still
  be given with one value per spatial dim, and are then ignored.
The element type is the operands' (`types` "?, ?, ? -> ?": all float32, or all integer);
an integer result takes its precision from the precision rule.
"""
from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from cvmc.ops.common import bitlen, mac_ops, require
from cvmc.ops.conv_nd import conv_nd_compute, conv_nd_reference, out_sizes
from cvmc.ops.nn import bias_precision, require_low_precision
from cvmc.ops.registry import Attr, Fusion, op
from cvmc.ops.transform import MAX_DIM, MAX_VOLUME

NAME = "onednn.convolution"

convolution = op(
    NAME, family="nn", seeds=("onednn",), inputs=("src", "weights", "bias?"),
    fusion=Fusion.OUT_ELEMWISE, types="?, ?, ? -> ?", multiply_add=True,
    attrs=(
        # Bounded so that every padded coordinate stays far inside int32.
        Attr("strides", "ints", lo=1, hi=MAX_DIM),
        Attr("pads_begin", "ints", lo=0, hi=MAX_DIM),
        Attr("pads_end", "ints", lo=0, hi=MAX_DIM),
        Attr("dilations", "ints", lo=1, hi=MAX_DIM),
        Attr("auto_pad", "str", "none", choices=("none", "same_upper", "same_lower", "valid")),
        Attr("groups", "int", 1, lo=1, hi=MAX_DIM),
        Attr("data_format", "str", "NXC", choices=("NXC", "NCX")),
        Attr("weights_format", "str", "XIO", choices=("XIO", "OIX")),
    ),
    precision_rule="integer operands: p_src + p_weights + bitlen(IC/groups * K1*..*Kr); with "
                   "bias max(that, p_bias) + 1; p_src, p_weights <= 8")


def _to_ncx(r: int, data_format: str) -> tuple[int, ...]:
    """The axes of a src in `data_format` that make it NCX (for np.transpose)."""
    return tuple(range(r + 2)) if data_format == "NCX" else (0, r + 1, *range(1, r + 1))


def _from_ncx(r: int, data_format: str) -> tuple[int, ...]:
    """The axes of an NCX dst that make it `data_format`."""
    return tuple(range(r + 2)) if data_format == "NCX" else (0, *range(2, r + 2), 1)


def _to_oix(r: int, weights_format: str) -> tuple[int, ...]:
    """The axes of weights in `weights_format` that make them OIX."""
    return tuple(range(r + 2)) if weights_format == "OIX" else (r + 1, r, *range(r))


def _permuted(shape: Sequence[int], axes: Sequence[int]) -> tuple[int, ...]:
    return tuple(shape[i] for i in axes)


def auto_pads(x: Sequence[int], k: Sequence[int], a) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(pads_begin, pads_end) after auto_pad (see the module docstring), for the spatial
    sizes `x` and kernel sizes `k`."""
    if a.auto_pad == "none":
        return tuple(a.pads_begin), tuple(a.pads_end)
    if a.auto_pad == "valid":
        return (0,) * len(x), (0,) * len(x)
    begin, end = [], []
    for xd, kd, s, d in zip(x, k, a.strides, a.dilations):
        total = max(0, (-(-xd // s) - 1) * s + 1 + (kd - 1) * d - xd)
        before = total // 2 if a.auto_pad == "same_upper" else (total + 1) // 2
        begin.append(before)
        end.append(total - before)
    return tuple(begin), tuple(end)


def _geometry(ins, a):
    """(src NCX shape, weights OIX shape, pads_begin, pads_end) after checking the
    operands against the attributes."""
    x, w = ins[0], ins[1]
    for operand, t in zip(("src", "weights", "bias"), ins):
        require(t.dtype != "bool", f"{NAME}: {operand} must be float32 or integer, got a "
                                   f"tensor<logical>")
    r = x.ndim - 2
    require(1 <= r <= 3, f"{NAME}: src must have rank 3, 4 or 5 (batch, channels and 1 to 3 "
                         f"spatial dims), got shape {list(x.shape)}")
    require(w.ndim == x.ndim, f"{NAME}: weights must have rank {x.ndim} (as src), got shape "
                              f"{list(w.shape)}")
    for name in ("strides", "pads_begin", "pads_end", "dilations"):
        require(len(a[name]) == r, f"{NAME}: attribute '{name}' must have {r} values (one per "
                                   f"spatial dim), got {list(a[name])}")
    xs = _permuted(x.shape, _to_ncx(r, a.data_format))
    ws = _permuted(w.shape, _to_oix(r, a.weights_format))
    (c, oc, icg), g = (xs[1], *ws[:2]), a.groups
    require(c % g == 0 and oc % g == 0,
            f"{NAME}: groups={g} must divide the input channels ({c}) and the output "
            f"channels ({oc})")
    require(icg == c // g, f"{NAME}: weights have {icg} input channels per group, expected "
                           f"{c // g} (src channels {c} / groups {g}; {a.weights_format})")
    pb, pe = auto_pads(xs[2:], ws[2:], a)
    padded = (*xs[:2], *(xd + b + e for xd, b, e in zip(xs[2:], pb, pe)))
    # The padded src is a buffer of its own in the kernel: bounded as any tensor.
    require(all(d <= MAX_DIM for d in padded) and int(np.prod(padded, dtype=object)) <=
            MAX_VOLUME, f"{NAME}: the zero-padded src {list(padded)} exceeds the tensor "
                        f"limits (dims <= {MAX_DIM}, <= {MAX_VOLUME} elements)")
    return xs, ws, pb, pe


@convolution.shape
def _shape(ins, a):
    xs, ws, pb, pe = _geometry(ins, a)
    out = out_sizes(NAME, xs, ws, a.strides, a.dilations, pb, pe)
    if len(ins) == 3:
        require(ins[2].shape == (ws[0],), f"{NAME}: bias must have shape [{ws[0]}] (one per "
                                          f"output channel), got {list(ins[2].shape)}")
    return _permuted((xs[0], ws[0], *out), _from_ncx(len(out), a.data_format))


@convolution.precision
def _precision(ins, a):
    require_low_precision(NAME, ins, ("src", "weights"))
    _, ws, _, _ = _geometry(ins, a)
    taps = ws[1] * int(np.prod(ws[2:]))
    return bias_precision(ins[0].precision + ins[1].precision + bitlen(taps), ins)


@convolution.reference
def _reference(xs, a):
    r = xs[0].ndim - 2
    x = np.transpose(xs[0], _to_ncx(r, a.data_format))
    w = np.transpose(xs[1], _to_oix(r, a.weights_format))
    pb, pe = auto_pads(x.shape[2:], w.shape[2:], a)
    y = conv_nd_reference(x, w, xs[2] if len(xs) == 3 else None, a.strides, pb, pe,
                          a.dilations, a.groups)
    return np.transpose(y, _from_ncx(r, a.data_format))


@convolution.arith
def _arith(ins, outs, a):
    """2 per multiply-add: every output element sums IC/groups x taps products, the
    weights' volume per output channel."""
    w = ins[1].shape
    oc = w[0] if a.weights_format == "OIX" else w[-1]
    return mac_ops(outs[0].size, math.prod(w) // oc)


@convolution.lower
def _lower(xs, a):
    r = len(xs[0].shape) - 2
    x = _te_transpose(xs[0], _to_ncx(r, a.data_format), "src_ncx")
    w = _te_transpose(xs[1], _to_oix(r, a.weights_format), "weights_oix")
    pb, pe = auto_pads([int(d) for d in x.shape[2:]], [int(d) for d in w.shape[2:]], a)
    return conv_nd_compute(x, w, xs[2] if len(xs) == 3 else None, a.strides, pb, pe,
                           a.dilations, a.groups, "convolution", a.data_format == "NXC")


def _te_transpose(t, axes: Sequence[int], name: str):
    """TE of np.transpose(t, axes); `t` itself for the identity."""
    if tuple(axes) == tuple(range(len(axes))):
        return t
    from cvmc.ops.te import te

    def element(*i):
        index = [None] * len(axes)
        for j, axis in enumerate(axes):
            index[axis] = i[j]
        return t(*index)
    return te.compute(_permuted(t.shape, axes), element, name=name)

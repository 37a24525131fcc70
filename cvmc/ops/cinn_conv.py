"""CINN's `Conv` primitive (../shared/spec/cinn-builder-primitives.txt): `cinn.conv`.

    conv(lhs, rhs, strides, paddings, dilations, groups, conv_type, data_format,
         padding_algorithm, output_shape)

float32 tensors, 2-D (N, C, H, W) data in `data_format` NCHW or NHWC; filters are always
OIHW, (O, C/groups, KH, KW), as Paddle's. Three conv types:
- forward: lhs = x, rhs = filter; the canonical convolution (`conv_nd`) with symmetric
  padding `paddings` = [PH, PW];
- backward_data: lhs = filter, rhs = dy (N, O, OH, OW); the result (`output_shape` =
  x's NCHW shape) is the gradient of forward's output with respect to x:
  dx[n, c, h, w] = sum over (o, kh, kw) with h = oh*SH + kh*DH - PH (and w likewise) of
  dy[n, o, oh, ow] * filter[o, c - g*C/G, kh, kw], o in c's group g;
- backward_filter: lhs = x, rhs = dy; the result (`output_shape` = the filter's shape) is
  the gradient with respect to the filter:
  dfilter[o, i, kh, kw] = sum over (n, oh, ow) of dy[n, o, oh, ow] * x[n, g*C/G + i,
  oh*SH + kh*DH - PH, ow*SW + kw*DW - PW] (0 outside x).
`padding_algorithm` EXPLICIT uses `paddings`; VALID pads nothing; SAME pads so that the
output is ceil(X / S), the total split with the smaller half first (Paddle's rule).
NHWC applies to x and dy (dx, forward's output too). Accuracy as every sum in cvmc: within
gamma(K + 2) * sum(|terms|), K the terms one output sums.
"""
from __future__ import annotations

import math

import numpy as np

from cvmc.ops.common import mac_ops, require
from cvmc.ops.conv_nd import conv_nd_compute, conv_nd_reference, out_sizes
from cvmc.ops.registry import Attr, Fusion, op

_MAX = 1 << 24

conv = op(
    "cinn.conv", family="nn", seeds=("cinn",), inputs=("lhs", "rhs"),
    fusion=Fusion.OUT_ELEMWISE, types="scalar, scalar -> scalar", multiply_add=True,
    attrs=(
        Attr("strides", "ints", (1, 1), lo=1, hi=_MAX, length=2),
        Attr("paddings", "ints", (0, 0), lo=0, hi=_MAX, length=2),
        Attr("dilations", "ints", (1, 1), lo=1, hi=_MAX, length=2),
        Attr("groups", "int", 1, lo=1, hi=_MAX),
        Attr("conv_type", "str", "forward",
             choices=("forward", "backward_data", "backward_filter")),
        Attr("data_format", "str", "NCHW", choices=("NCHW", "NHWC")),
        Attr("padding_algorithm", "str", "EXPLICIT", choices=("EXPLICIT", "SAME", "VALID")),
        Attr("output_shape", "ints", (), lo=1, hi=_MAX),
    ))


def _nchw(shape, a) -> tuple[int, ...]:
    """An x / dy shape in NCHW order."""
    return tuple(shape) if a.data_format == "NCHW" else (shape[0], shape[3], *shape[1:3])


def _pad_pair(x_hw, k_hw, a) -> tuple[list[int], list[int]]:
    """(pads before, pads after) per spatial dim: `paddings` on both sides (EXPLICIT),
    none (VALID), or the total that makes the output ceil(X / S), the smaller half first
    (SAME)."""
    if a.padding_algorithm == "EXPLICIT":
        return list(a.paddings), list(a.paddings)
    if a.padding_algorithm == "VALID":
        return [0, 0], [0, 0]
    total = [max(0, (-(-x // s) - 1) * s + (k - 1) * d + 1 - x)
             for x, k, s, d in zip(x_hw, k_hw, a.strides, a.dilations)]
    return [t // 2 for t in total], [t - t // 2 for t in total]


def _geometry(x_nchw, w_oihw, a) -> tuple[int, ...]:
    """Forward's output (N, O, OH, OW), checking channels, groups and the window."""
    n, c, *x_hw = x_nchw
    o, icg, *k_hw = w_oihw
    require(c == icg * a.groups and o % a.groups == 0,
            f"cinn.conv: x has {c} channels and the filter {o} x {icg} (O x C/groups) with "
            f"groups {a.groups}: expected C = C/groups * groups and O divisible by groups")
    before, after = _pad_pair(x_hw, k_hw, a)
    return (n, o, *out_sizes("cinn.conv", x_nchw, w_oihw, a.strides, a.dilations, before,
                             after))


@conv.shape
def _shape(ins, a):
    for t, what in zip(ins, ("lhs", "rhs")):
        require(len(t.shape) == 4, f"cinn.conv: {what} must have rank 4, got {list(t.shape)}")
    if a.conv_type == "forward":
        y = _geometry(_nchw(ins[0].shape, a), ins[1].shape, a)
        return y if a.data_format == "NCHW" else (y[0], *y[2:], y[1])
    require(len(a.output_shape) == 4, f"cinn.conv: conv_type {a.conv_type} needs the "
                                      f"output_shape (4 values), got {list(a.output_shape)}")
    if a.conv_type == "backward_data":  # lhs = filter, rhs = dy; output = x
        x, w = _nchw(a.output_shape, a), ins[0].shape
    else:  # backward_filter: lhs = x, rhs = dy; output = the filter
        x, w = _nchw(ins[0].shape, a), tuple(a.output_shape)
    dy, want = _nchw(ins[1].shape, a), _geometry(x, w, a)
    require(tuple(dy) == want, f"cinn.conv: dy has shape {list(dy)} (NCHW), but forward "
                               f"of x {list(x)} with the filter {list(w)} gives {list(want)}")
    return tuple(a.output_shape)


def _to_nchw(v, a):
    return v if a.data_format == "NCHW" else np.transpose(v, (0, 3, 1, 2))


def _from_nchw(v, a):
    return v if a.data_format == "NCHW" else np.transpose(v, (0, 2, 3, 1))


@conv.reference
def _reference(xs, a):
    lhs, rhs = xs
    if a.conv_type == "forward":
        x = _to_nchw(lhs, a)
        before, after = _pad_pair(x.shape[2:], rhs.shape[2:], a)
        return _from_nchw(conv_nd_reference(x, rhs, None, a.strides, before, after,
                                            a.dilations, a.groups), a)
    if a.conv_type == "backward_data":
        w, dy = lhs, _to_nchw(rhs, a)
        x_shape = _nchw(a.output_shape, a)
        dx = np.zeros(x_shape, np.float64)
        before, _ = _pad_pair(x_shape[2:], w.shape[2:], a)
        _scatter(dx, dy, w, a, before)  # the adjoint, written as the spec's sum
        return _from_nchw(dx, a)
    x, dy = _to_nchw(lhs, a), _to_nchw(rhs, a)
    before, _ = _pad_pair(x.shape[2:], a.output_shape[2:], a)
    return _filter_gradient(x, dy, a.output_shape, a, before)


def _scatter(dx, dy, w, a, before) -> None:
    """dx += every product dy[n, o, oh, ow] * w[o, i, kh, kw] at the x position it came
    from (h = oh*SH + kh*DH - PH), inside x."""
    o, icg, kh, kw = w.shape
    ocg = o // a.groups
    for p in range(kh):
        for q in range(kw):
            rows = np.arange(dy.shape[2]) * a.strides[0] + p * a.dilations[0] - before[0]
            cols = np.arange(dy.shape[3]) * a.strides[1] + q * a.dilations[1] - before[1]
            r_ok, c_ok = (rows >= 0) & (rows < dx.shape[2]), (cols >= 0) & (cols < dx.shape[3])
            for g in range(a.groups):
                contrib = np.einsum("noyx,oi->niyx", dy[:, g * ocg:(g + 1) * ocg],
                                    w[g * ocg:(g + 1) * ocg, :, p, q].astype(np.float64))
                sub = contrib[:, :, r_ok][:, :, :, c_ok]
                dx[:, g * icg:(g + 1) * icg][:, :, rows[r_ok][:, None], cols[c_ok]] += sub


def _filter_gradient(x, dy, w_shape, a, before):
    """dfilter[o, i, kh, kw] = sum over (n, oh, ow) of dy * the x tap it multiplied."""
    o, icg, kh, kw = w_shape
    ocg = o // a.groups
    dw = np.zeros(w_shape, np.float64)
    for p in range(kh):
        for q in range(kw):
            rows = np.arange(dy.shape[2]) * a.strides[0] + p * a.dilations[0] - before[0]
            cols = np.arange(dy.shape[3]) * a.strides[1] + q * a.dilations[1] - before[1]
            r_ok, c_ok = (rows >= 0) & (rows < x.shape[2]), (cols >= 0) & (cols < x.shape[3])
            taps = np.zeros(x.shape[:2] + dy.shape[2:], np.float64)
            taps[:, :, np.flatnonzero(r_ok)[:, None], np.flatnonzero(c_ok)] = \
                x[:, :, rows[r_ok][:, None], cols[c_ok]]
            for g in range(a.groups):
                dw[g * ocg:(g + 1) * ocg, :, p, q] = np.einsum(
                    "noyx,niyx->oi", dy[:, g * ocg:(g + 1) * ocg],
                    taps[:, g * icg:(g + 1) * icg])
    return dw


@conv.arith
def _arith(ins, outs, a):
    """2 per multiply-add: the three conv types do forward's products, dy's elements x the
    filter's C/G x taps."""
    dy, filt = {"forward": (outs[0], ins[1]), "backward_data": (ins[1], ins[0]),
                "backward_filter": (ins[1], outs[0])}[a.conv_type]
    return mac_ops(dy.size, math.prod(filt.shape[1:]))


@conv.lower
def _lower(xs, a):
    from cvmc.ops.te import clamped_index, shape_of, te, tirx
    lhs, rhs = xs

    def nchw(t):
        if a.data_format == "NCHW":
            return t
        n, h, w, c = shape_of(t)
        return te.compute((n, c, h, w), lambda b, ch, i, j: t[b, i, j, ch], name="to_nchw")

    # An NHWC result is written by the reduction itself, not transposed after it: a
    # transposing epilogue defeats dlight's CUDA reduction rules.
    nhwc = a.data_format == "NHWC"
    if a.conv_type == "forward":
        x = nchw(lhs)
        before, after = _pad_pair(shape_of(x)[2:], shape_of(rhs)[2:], a)
        return conv_nd_compute(x, rhs, None, a.strides, before, after, a.dilations, a.groups,
                               "cinn_conv", channels_last=nhwc)
    (sh, sw), (dh, dw) = a.strides, a.dilations
    if a.conv_type == "backward_data":
        w, dy = lhs, nchw(rhs)
        n, c, h, wd = _nchw(a.output_shape, a)
        o, icg, kh, kw = shape_of(w)
        ocg = o // a.groups
        before, _ = _pad_pair((h, wd), (kh, kw), a)
        oh, ow = shape_of(dy)[2:]
        ro = te.reduce_axis((0, ocg), name="ro")
        rh, rw = te.reduce_axis((0, kh), name="rh"), te.reduce_axis((0, kw), name="rw")

        def dx(*index):
            b, ch, i, j = (index[0], index[3], *index[1:3]) if nhwc else index
            # the dy position whose tap (rh, rw) reads x[i, j]: i = y*SH + rh*DH - PH
            ti, tj = i + before[0] - rh * dh, j + before[1] - rw * dw
            (safe_y, in_y), (safe_x, in_x) = (clamped_index(tirx.floordiv(ti, sh), oh),
                                              clamped_index(tirx.floordiv(tj, sw), ow))
            hit = tirx.all(tirx.floormod(ti, sh) == 0, tirx.floormod(tj, sw) == 0, in_y, in_x)
            oc = ch // icg * ocg + ro
            term = dy[b, oc, safe_y, safe_x] * w[oc, ch % icg, rh, rw]
            return te.sum(tirx.Select(hit, term, tirx.const(0.0, "float32")), axis=[ro, rh, rw])
        return te.compute((n, h, wd, c) if nhwc else (n, c, h, wd), dx, name="cinn_conv_dx")
    x, dy = nchw(lhs), nchw(rhs)
    o, icg, kh, kw = a.output_shape
    ocg = o // a.groups
    n, _, h, wd = shape_of(x)
    before, _ = _pad_pair((h, wd), (kh, kw), a)
    oh, ow = shape_of(dy)[2:]
    rn, ry, rx = (te.reduce_axis((0, e), name=nm) for e, nm in ((n, "rn"), (oh, "ry"), (ow, "rx")))

    def dfilter(oc, i, p, q):
        (row, in_row), (col, in_col) = (clamped_index(ry * sh + p * dh - before[0], h),
                                        clamped_index(rx * sw + q * dw - before[1], wd))
        inside = tirx.all(in_row, in_col)
        tap = x[rn, oc // ocg * icg + i, row, col]
        return te.sum(tirx.Select(inside, dy[rn, oc, ry, rx] * tap, tirx.const(0.0, "float32")),
                      axis=[rn, ry, rx])
    return te.compute((o, icg, kh, kw), dfilter, name="cinn_conv_dfilter")

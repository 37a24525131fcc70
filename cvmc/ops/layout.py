"""Layout operators: the packed forms that fast kernels want, visible in the IR.

The packing pass (`cvmc/passes/layout.py`) rewrites a `conv2d` whose weight is a constant
into `conv2d_packed` on a `layout_transform`-ed weight; constant folding then packs the
weight and computes the VNNI compensation at compile time, so no kernel repacks per call.
Neither op comes from a seed spec: they are cvmc's own (seed "cvmc"), and each has a
literal NumPy reference like every other op, so the reference interpreter runs the
packed graph too.
"""
from __future__ import annotations

import math
import re

import numpy as np

from cvmc.ops.common import bitlen, require
from cvmc.ops.conv_nd import padded_input
from cvmc.ops.nn import (
    add_bias,
    bias_precision,
    conv2d_reference,
    conv_out_hw,
    exact_matmul,
    gather_windows,
    max_pool2d_reference,
    pair_attr,
    pool_geometry,
    require_low_precision,
    require_rank,
    lower_max_pool,
    max_pool2d,
)
from cvmc.ops.nnef_math import te_broadcast
from cvmc.ops.nnef_nn import conv_geometry, conv_reference
from cvmc.ops.nnef_std_nn import conv_shape, window_attrs
from cvmc.ops.registry import Attr, Attrs, Fusion, op

# ---- layout_transform -----------------------------------------------------------------
# A layout names each axis by an upper-case letter ("OIHW"); a blocked layout lists the
# outer axes in their new order, then inner blocks "<factor><letter>" ("OIHW16o4i": O split
# into O/16 outer and 16 inner, I into I/4 and 4). An axis is padded with zeros up to a
# multiple of its factor. The inverse (a blocked source, a plain destination: "NCHW16c" ->
# "NCHW") merges each block back into its axis, padding included.
_BLOCK = re.compile(r"(\d+)([a-z])")

layout_transform = op(
    "layout_transform", family="layout", inputs=("data",), fusion=Fusion.INJECTIVE,
    attrs=(Attr("src_layout", "str"), Attr("dst_layout", "str")),
    precision_rule="p_x", seeds=("cvmc",))


def _plain(layout: str) -> bool:
    return layout.isalpha() and layout.isupper()


def _parse_layouts(a, ndim: int) -> tuple[str, str, list[tuple[int, str]]]:
    """(plain axes, blocked outer axes, [(factor, axis letter), ...]) after checking them;
    `ndim` is the rank of the source."""
    inverse = not _plain(a.src_layout) and _plain(a.dst_layout)
    plain, blocked = (a.dst_layout, a.src_layout) if inverse else (a.src_layout, a.dst_layout)
    outer = blocked.rstrip("0123456789abcdefghijklmnopqrstuvwxyz")
    tail = blocked[len(outer):]
    blocks = [(int(f), letter.upper()) for f, letter in _BLOCK.findall(tail)]
    ok = (_plain(plain) and len(set(plain)) == len(plain)
          and ndim == len(plain) + (len(blocks) if inverse else 0)
          and sorted(outer) == sorted(plain) and "".join(f"{f}{x.lower()}" for f, x in blocks)
          == tail and all(f >= 1 and x in plain for f, x in blocks)
          and len({x for _, x in blocks}) == len(blocks))
    require(ok, f"layout_transform: cannot transform a rank-{ndim} tensor from "
                f"'{a.src_layout}' to '{a.dst_layout}' (expected e.g. 'OIHW' -> 'OIHW16o4i' "
                f"or 'NCHW16c' -> 'NCHW')")
    return plain, outer, blocks


def _inverse(a) -> bool:
    return not _plain(a.src_layout)


def _transformed_shape(shape: tuple[int, ...], a) -> tuple[int, ...]:
    """The destination shape: each blocked axis divided (rounding up) by its factor, or,
    for the inverse, multiplied back."""
    plain, outer, blocks = _parse_layouts(a, len(shape))
    factor = {x: f for f, x in blocks}
    if _inverse(a):
        return tuple(shape[outer.index(x)] * factor.get(x, 1) for x in plain)
    return (*(-(-shape[plain.index(x)] // factor.get(x, 1)) for x in outer),
            *(f for f, _ in blocks))


@layout_transform.shape
def _layout_transform_shape(ins, a):
    return _transformed_shape(ins[0].shape, a)


@layout_transform.precision
def _layout_transform_precision(ins, a):
    return ins[0].precision


@layout_transform.reference
def _layout_transform_reference(xs, a):
    x = xs[0]
    plain, outer, blocks = _parse_layouts(a, x.ndim)
    factor = {ax: f for f, ax in blocks}
    if _inverse(a):
        # Put each axis's inner block right after its outer part, then merge the two.
        inner = {ax: len(outer) + k for k, (_, ax) in enumerate(blocks)}
        order = [k for ax in plain
                 for k in (outer.index(ax), *((inner[ax],) if ax in factor else ()))]
        return x.transpose(order).reshape(_transformed_shape(x.shape, a))
    # Pad each blocked axis to a multiple of its factor, split it into (outer, inner),
    # then order the axes as the destination names them.
    x = np.pad(x, [(0, -d % factor.get(ax, 1)) for d, ax in zip(x.shape, plain)])
    split = x.reshape([n for d, ax in zip(x.shape, plain)
                       for n in ((d // factor[ax], factor[ax]) if ax in factor else (d,))])
    position, k = {}, 0
    for ax in plain:
        position[ax] = k
        k += 2 if ax in factor else 1
    order = [position[ax] for ax in outer] + [position[ax] + 1 for _, ax in blocks]
    return split.transpose(order)


@layout_transform.lower
def _layout_transform_lower(xs, a):
    from cvmc.ops.te import const
    return _lower_layout_transform(xs[0], a, const(0))


def _lower_layout_transform(x, a, zero):
    """The transform of TE tensor `x`; padding elements are `zero`."""
    from cvmc.ops.te import shape_of, te, tirx
    shape = shape_of(x)
    plain, outer, blocks = _parse_layouts(a, len(shape))
    factor = {ax: f for f, ax in blocks}

    def unblock(*i):
        index = dict(zip(plain, i))
        return x[(*(index[ax] // factor.get(ax, 1) for ax in outer),
                  *(index[ax] % f for f, ax in blocks))]

    def block(*i):
        index = {ax: i[k] for k, ax in enumerate(outer)}
        for k, (f, ax) in enumerate(blocks):
            index[ax] = index[ax] * f + i[len(outer) + k]
        coords = [index[ax] for ax in plain]
        inside = [c < d for c, d, ax in zip(coords, shape, plain) if ax in factor]
        value = x[tuple(coords)]
        return tirx.if_then_else(tirx.all(*inside), value, zero) if inside else value
    return te.compute(_transformed_shape(shape, a), unblock if _inverse(a) else block,
                      name="layout_transform")


# The float activations' transform (`block_float_activations`): layout_transform's rules on
# float32, padding elements 0.0. Exact (it moves values).
float_layout_transform = op(
    "float_layout_transform", family="layout", backends=("llvm",),
    inputs=("data",), fusion=Fusion.INJECTIVE,
    attrs=layout_transform.attrs, seeds=("cvmc",), types="scalar -> scalar")
float_layout_transform.shape(_layout_transform_shape)
float_layout_transform.reference(_layout_transform_reference)


@float_layout_transform.lower
def _float_layout_transform_lower(xs, a):
    from cvmc.ops.te import tirx
    return _lower_layout_transform(xs[0], a, tirx.const(0, xs[0].dtype))


# ---- conv2d_packed --------------------------------------------------------------------
# y = sum_{c, ky, kx} u[n, c, p*SH + ky*DH, q*SW + kx*DW] * W[o, c, ky, kx] - comp[o] (+ B[o])
# with u = pad(x + 128, 128) (every value in 1..255: an unsigned byte) and W the weight in
# layout OIHW16o4i. With comp = 128 * sum(W[o]) this is exactly conv2d(x, W) (+ B): the
# form VNNI's u8 x s8 dot product computes (x86 `vpdpbusd`). Sums stay inside int32 while
# 255 * 127 * C*KH*KW < 2^31, i.e. C*KH*KW <= MAX_PACKED_REDUCTION (the pass checks it).
#
# Activations may stay blocked between such convs (the pass `block-activations`):
# `data_layout` / `out_layout` "NCHW16c" read the data as (N, C/16, H, W, 16) and write the
# result as (N, OC/16, OH, OW, 16), the layout the kernel's accumulators have, so no kernel
# transposes 16 channels x a row of pixels. Blocked tensors hold whole blocks only: the
# shape rule requires OC % 16 == 0 for a blocked output (the pass blocks only those).
OC_BLOCK, IC_BLOCK = 16, 4
MAX_PACKED_REDUCTION = (2**31 - 1) // (255 * 127)  # 66,311
WEIGHT_LAYOUT = f"OIHW{OC_BLOCK}o{IC_BLOCK}i"
BLOCKED_LAYOUT = f"NCHW{OC_BLOCK}c"
_ACTIVATION_LAYOUTS = ("NCHW", BLOCKED_LAYOUT)

conv2d_packed = op(
    "conv2d_packed", family="layout", inputs=("data", "weight", "compensation", "bias?"),
    fusion=Fusion.OUT_ELEMWISE, seeds=("cvmc",),
    attrs=(
        pair_attr("padding", 0, (0, 0)),
        pair_attr("stride", 1, (1, 1)),
        pair_attr("dilation", 1, (1, 1)),
        Attr("channels", "int", lo=1),  # OC before padding to a multiple of 16
        # Grouped: each group of OC / groups (a multiple of 16) output channels reads its
        # C / groups input channels, whose 4-channel words are padded per group.
        Attr("groups", "int", 1, lo=1),
        Attr("data_layout", "str", "NCHW", choices=_ACTIVATION_LAYOUTS),
        Attr("out_layout", "str", "NCHW", choices=_ACTIVATION_LAYOUTS),
    ),
    precision_rule="as conv2d: p_x + p_w + bitlen(C*KH*KW); with bias max(that, p_b) + 1")

_TO_BLOCKED = Attrs(src_layout="NCHW", dst_layout=BLOCKED_LAYOUT)
_TO_PLAIN = Attrs(src_layout=BLOCKED_LAYOUT, dst_layout="NCHW")


def _data_shape(ins, a) -> tuple[int, int, int, int]:
    """The data's (N, C, H, W), whichever its layout."""
    x = ins[0]
    if a.data_layout == "NCHW":
        require_rank("conv2d_packed", "data", x, 4, "(N, C, H, W)")
        return x.shape
    require_rank("conv2d_packed", "data", x, 5, f"(N, C/{OC_BLOCK}, H, W, {OC_BLOCK})")
    require(x.shape[4] == OC_BLOCK, f"conv2d_packed: data in layout {BLOCKED_LAYOUT} must "
                                    f"have {OC_BLOCK} channels in its last axis")
    return _transformed_shape(x.shape, _TO_PLAIN)


def _packed_geometry(ins, a) -> tuple[int, int, int, int]:
    """(C, OC, KH, KW) after checking the packed weight against data and attributes."""
    require_rank("conv2d_packed", "weight", ins[1], 6, f"(OC/{OC_BLOCK}, C/{IC_BLOCK}, KH, KW, "
                                                        f"{OC_BLOCK}, {IC_BLOCK})")
    c, (ocb, icb, kh, kw, ob, ib) = _data_shape(ins, a)[1], ins[1].shape
    oc, g = a.channels, a.groups
    require(c % g == 0 and (g == 1 or oc % (g * OC_BLOCK) == 0 and a.data_layout == "NCHW"),
            f"conv2d_packed: groups={g} needs C ({c}) a multiple of groups, OC ({oc}) a "
            f"multiple of 16 x groups and NCHW data")
    require((ob, ib) == (OC_BLOCK, IC_BLOCK) and icb == -(-(c // g) // IC_BLOCK)
            and ocb == -(-oc // OC_BLOCK),
            f"conv2d_packed: weight shape {list(ins[1].shape)} does not pack {oc} output and "
            f"{c // g} input channels as {WEIGHT_LAYOUT}")
    c //= g  # the channels each output channel reads
    require(a.out_layout == "NCHW" or oc % OC_BLOCK == 0,
            f"conv2d_packed: out_layout {BLOCKED_LAYOUT} needs a multiple of {OC_BLOCK} "
            f"output channels, got {oc}")
    require(ins[2].shape == (oc,), f"conv2d_packed: compensation must have shape ({oc},)")
    if len(ins) == 4:
        require(ins[3].shape == (oc,), f"conv2d_packed: bias must have shape ({oc},)")
    require(c * kh * kw <= MAX_PACKED_REDUCTION,
            f"conv2d_packed: reduction length C*KH*KW = {c * kh * kw} exceeds "
            f"{MAX_PACKED_REDUCTION} (255*127*K would overflow int32)")
    return c, oc, kh, kw


@conv2d_packed.shape
def _conv2d_packed_shape(ins, a):
    _, oc, kh, kw = _packed_geometry(ins, a)
    data = _data_shape(ins, a)
    out = (data[0], oc, *conv_out_hw(data, (oc, data[1], kh, kw), a))
    return out if a.out_layout == "NCHW" else _transformed_shape(out, _TO_BLOCKED)


@conv2d_packed.precision
def _conv2d_packed_precision(ins, a):
    c, _, kh, kw = _packed_geometry(ins, a)
    require_low_precision("conv2d_packed", ins)
    bias = ins[:2] + ins[3:]  # the bias rule reads the bias at index 2
    return bias_precision(ins[0].precision + ins[1].precision + bitlen(c * kh * kw), bias)


def _unpacked_weight(wp: np.ndarray, oc: int, c: int) -> np.ndarray:
    """OIHW16o4i -> OIHW with the padding channels dropped."""
    ocb, icb, kh, kw, ob, ib = wp.shape
    return wp.transpose(0, 4, 1, 5, 2, 3).reshape(ocb * ob, icb * ib, kh, kw)[:oc, :c]


@conv2d_packed.reference
def _conv2d_packed_reference(xs, a):
    x, wp, comp = xs[0], xs[1], xs[2]
    if a.data_layout != "NCHW":
        x = _layout_transform_reference([x], _TO_PLAIN)
    n, c = x.shape[:2]
    g = a.groups
    w = _unpacked_weight(wp, a.channels, c // g)  # (OC, C / groups, KH, KW)
    oc, cg, kh, kw = w.shape
    (ph, pw), stride, dil = a.padding, a.stride, a.dilation
    u = np.pad(x + 128, ((0, 0), (0, 0), (ph, ph), (pw, pw)), constant_values=128)
    oh, ow = conv_out_hw(x.shape, w.shape, a)
    taps = gather_windows(u, oh, ow, (kh, kw), stride, dil)  # (n, C, KH, KW, OH, OW)
    # per group: output channels group*OC/g + o read input channels group*C/g + i
    y = exact_matmul(w.reshape(g, oc // g, cg * kh * kw),
                      taps.reshape(n, g, cg * kh * kw, oh * ow))
    y = add_bias(y.reshape(n, oc, oh, ow) - comp.reshape(1, oc, 1, 1), xs[:2] + xs[3:], 1)
    return y if a.out_layout == "NCHW" else _layout_transform_reference([y], _TO_BLOCKED)


@conv2d_packed.lower
def _conv2d_packed_lower(xs, a):
    from cvmc.ops.te import INTERIOR, MATERIALIZE, const, shape_of, te, tirx
    x, wp, comp = xs[0], xs[1], xs[2]
    blocked_in = a.data_layout != "NCHW"
    n, c, h, w = _transformed_shape(shape_of(x), _TO_PLAIN) if blocked_in else shape_of(x)
    ocb, icb, kh, kw = shape_of(wp)[:4]
    (ph, pw), (sh, sw), (dh, dw) = a.padding, a.stride, a.dilation
    oh, ow = conv_out_hw((n, c, h, w), (a.channels, c, kh, kw), a)
    # The unsigned bytes keep the data's channel blocking: NCHW4c for NCHW data, NCHW16c
    # (4 words of 4 channels per pixel) for NCHW16c data, which then needs no
    # de-interleaving, only padding and + 128.
    group = OC_BLOCK // IC_BLOCK if blocked_in else 1  # 4-channel words per block
    # Per group (one group unless grouped): `blocks` channel blocks of the bytes hold its
    # C / groups channels (padded per group), and `ocb / groups` output channel blocks read
    # them.
    g = a.groups
    cg, blocks = c // g, icb // group

    def in_group(index, per_group: int):
        """(group, index within the group) of `index` ((0, index) without groups)."""
        return (index // per_group, index % per_group) if g > 1 else (0, index)

    def pixel(b, channel, i, j):
        if blocked_in:
            return x[b, channel // OC_BLOCK, i, j, channel % OC_BLOCK]
        return x[b, tirx.min(channel, c - 1), i, j]

    def byte(b, cb, i, j, ci):
        grp, block = in_group(cb, blocks)
        local = block * IC_BLOCK * group + ci  # the channel within its group
        channel = grp * cg + local
        inside = tirx.all(local < cg, i >= ph, i < h + ph, j >= pw, j < w + pw)
        value = pixel(b, channel, i - ph, j - pw) + 128
        return tirx.if_then_else(inside, value, const(128)).astype("uint8")
    # Kept as a buffer (the VNNI loop reads 4 channels of one pixel as one 32-bit word);
    # its columns outside [pw, w + pw) are padding (the schedule copies the others
    # without a test).
    u = te.compute((n, g * blocks, h + 2 * ph, w + 2 * pw, IC_BLOCK * group), byte,
                   name="conv2d_packed_data", attrs={MATERIALIZE: 1, INTERIOR: [3, pw, w + pw]})
    rcb = te.reduce_axis((0, icb), name="rcb")
    ry = te.reduce_axis((0, kh), name="ry")
    rx = te.reduce_axis((0, kw), name="rx")
    rci = te.reduce_axis((0, IC_BLOCK), name="rci")

    def dot(b, ob, p, q, oi):
        word = in_group(ob, ocb // g)[0] * blocks + rcb // group
        tap = u[b, word, p * sh + ry * dh, q * sw + rx * dw,
                rcb % group * IC_BLOCK + rci].astype("int32")
        return te.sum(tap * wp[ob, rcb, ry, rx, oi, rci].astype("int32"),
                      axis=[rcb, ry, rx, rci])
    acc = te.compute((n, ocb, oh, ow, OC_BLOCK), dot, name="conv2d_packed_acc")
    bias = xs[3] if len(xs) == 4 else None

    def result(b, o, p, q, oi):
        value = acc[b, o // OC_BLOCK, p, q, o % OC_BLOCK] if oi is None else acc[b, o, p, q, oi]
        channel = o if oi is None else o * OC_BLOCK + oi
        value = value - comp[channel]
        return value if bias is None else value + bias[channel]
    if a.out_layout == "NCHW":
        return te.compute((n, a.channels, oh, ow), lambda b, o, p, q: result(b, o, p, q, None),
                          name="conv2d_packed")
    return te.compute(acc.shape, result, name="conv2d_packed")


@conv2d_packed.cost
def _conv2d_packed_cost(ins, outs, a):
    c, _, kh, kw = _packed_geometry(ins, a)
    return 3 * c * kh * kw + (1 if len(ins) == 4 else 0)


# ---- conv_packed (float) --------------------------------------------------------------
# NNEF's float `conv` (2-D, 'constant' border) on a weight packed OIHW{B}o at compile time
# (`cvmc/passes/layout_float.py`): filter (OC/B, C/G, KH, KW, B), the B output channels of
# a block in the vector lanes (B = 8 on AVX2, 16 on AVX-512), zero-padded up to a multiple
# of B. The kernel's accumulator is (N, OC/B, OH, OW, B): one FMA per input value and
# output block, the register tile several output columns x blocks. Each output sums its
# C/G * KH * KW terms in one fixed order (input channel, kernel row, kernel column), then
# adds the bias: the order, and so the bits, do not depend on the thread count; the sum
# bound is conv's (docs/float.md: gamma(K + 2) * S, K = C/G * KH * KW + 1). The reference
# is `conv`'s on the unpacked weight: the oracle. Grouped convs need whole blocks per group
# (OC / G a multiple of B); the groups are C / (the filter's C/G).
conv_packed = op(
    "conv_packed", family="layout", backends=("llvm",),
    inputs=("input", "filter", "bias?"),
    fusion=Fusion.OUT_ELEMWISE, seeds=("cvmc",), types="scalar, scalar, scalar -> scalar",
    attrs=(*window_attrs(("constant",)), Attr("channels", "int", lo=1)))


def _unpacked_filter_shape(name: str, x, wp, a) -> tuple[int, ...]:
    """The OIHW filter shape of packed filter shape `wp` after checking it against `x`."""
    require(len(x) == 4 and len(wp) == 5,
            f"{name}: expected 4-D input and a filter packed (OC/B, C/G, KH, KW, B), got "
            f"input {list(x)} and filter {list(wp)}")
    ocb, cg, kh, kw, block = wp
    require(ocb == -(-a.channels // block) and cg >= 1 and x[1] % cg == 0 and
            (x[1] == cg or (a.channels // (x[1] // cg)) % block == 0),
            f"{name}: filter {list(wp)} does not pack {a.channels} output channels of "
            f"{x[1]}-channel input as OIHW{block}o in whole blocks per group")
    return a.channels, cg, kh, kw


def _unpacked_filter(wp: np.ndarray, oc: int) -> np.ndarray:
    """OIHW{B}o -> OIHW with the padding channels dropped."""
    ocb, cg, kh, kw, block = wp.shape
    return wp.transpose(0, 4, 1, 2, 3).reshape(ocb * block, cg, kh, kw)[:oc]


def _conv_attrs(a, channels: int, cg: int) -> Attrs:
    """conv's attributes: `a` and the groups (input channels / filter channels `cg`)."""
    return Attrs({**a, "groups": channels // cg})


@conv_packed.shape
def _conv_packed_shape(ins, a):
    x, wp = ins[0].shape, ins[1].shape
    w = _unpacked_filter_shape("conv_packed", x, wp, a)
    return conv_shape("conv_packed", [x, w, *(t.shape for t in ins[2:])],
                      _conv_attrs(a, x[1], w[1]))


_CONV_REFERENCE = conv_reference("conv", False)


@conv_packed.reference
def _conv_packed_reference(xs, a):
    w = _unpacked_filter(xs[1], a.channels)
    return _CONV_REFERENCE([xs[0], w, *xs[2:]], _conv_attrs(a, xs[0].shape[1], w.shape[1]))


@conv_packed.lower
def _conv_packed_lower(xs, a):
    return _nchw_result(xs, *_conv_packed_acc(xs[0], xs[1], a, 0), "conv_packed")


def _conv_packed_acc(x, wp, a, data_block: int):
    """(the accumulator (N, OC/B, OH, OW, B), the NCHW output shape) of a conv_packed
    kernel on NCHW data (`data_block` 0) or NCHW{data_block}c data (one group)."""
    from cvmc.ops.te import shape_of, te

    ocb, cg, kh, kw, block = shape_of(wp)
    nchw = shape_of(x)
    if data_block:  # one group: the filter's channels, the block's padding left out
        nchw = (nchw[0], cg, nchw[2], nchw[3])
    out, dims, groups = conv_geometry("conv_packed", _conv_attrs(a, nchw[1], cg), nchw,
                                       (a.channels, cg, kh, kw), False)
    blocks_per_group = ocb // groups
    # Blocked data pads its lane axis by nothing: the padded stage stays NCHW{B}c.
    lanes = [data_block] if data_block else []
    padded = padded_input(x, [d.X for d in dims] + lanes, [kh, kw] + [1] * len(lanes),
                          [d.x for d in dims] + lanes, [d.s for d in dims] + [1] * len(lanes),
                          [d.d for d in dims] + [1] * len(lanes),
                          [d.p for d in dims] + [0] * len(lanes), "conv_packed")
    rc = te.reduce_axis((0, cg), "rc")
    ry = te.reduce_axis((0, kh), "ry")
    rx = te.reduce_axis((0, kw), "rx")
    (sh, sw), (dh, dw) = [d.s for d in dims], [d.d for d in dims]

    def tap(b, channel, i, j):
        if data_block:  # only the real channels: padding lanes are never read
            return padded(b, channel // data_block, i, j, channel % data_block)
        return padded(b, channel, i, j)

    def dot(b, ob, p, q, oi):
        channel = ob // blocks_per_group * cg + rc
        return te.sum(tap(b, channel, p * sh + ry * dh, q * sw + rx * dw) *
                      wp[ob, rc, ry, rx, oi], axis=[rc, ry, rx])
    acc = te.compute((out[0], ocb, out[2], out[3], block), dot, name="conv_packed_acc")
    return acc, out


def _nchw_result(xs, acc, out, name: str):
    """The NCHW output of accumulator `acc` (N, OC/B, OH, OW, B), plus the bias xs[2]."""
    from cvmc.ops.te import te

    block = acc.shape[4]
    y = te.compute(out, lambda b, o, p, q: acc[b, o // block, p, q, o % block], name=name)
    return y if len(xs) == 2 else te_broadcast([y, xs[2]], lambda s, c: s + c, f"{name}_bias")


# GOPS: C/G x taps multiply-adds per output element, as conv's
# 2 per multiply-add: output elements x C/G x KH x KW (the `arith` rule counts a node's total)
conv_packed.arith(lambda ins, outs, a: 2 * outs[0].size * math.prod(ins[1].shape[1:4]))
conv_packed.cost(lambda ins, outs, a: math.prod(ins[1].shape[1:4]))


# ---- conv_packed_blocked, depthwise_conv_blocked (float, NCHW{B}c activations) ---------
# The float layout pass (`block_float_activations`) keeps activations between float convs
# in NCHW{B}c, B the filter block (8 on AVX2, 16 on AVX-512): (N, C/B, H, W, B), B
# channels of a pixel one vector. `conv_packed_blocked` is conv_packed reading its data
# and/or writing its result in that layout (`data_layout` / `out_layout`): the register
# tile then stores whole B-channel vectors, and reads B channels of a pixel next to each
# other. Blocked data needs one group; it may hold padding channels (C not a multiple of
# B), which the reduction never reads (it runs over the filter's C channels); a blocked
# result needs whole blocks (OC % B == 0). `depthwise_conv_blocked` is NNEF's depth-wise
# conv (groups = C, multiplier 1) on NCHW{B}c data and a filter packed (C/B, 1, KH, KW, B),
# the B channels of a block in the vector lanes; padding channels compute what their
# (zero) filter gives and stay padding. Both sum each output's terms in the order conv_packed
# does (input channel, kernel row, kernel column, then the bias): the bound is conv's. The
# bias is NNEF conv's ([1, OC] or one value), read per channel. References: conv's on the
# unblocked data and unpacked filter, then blocked.
_FLOAT_LAYOUTS = ("NCHW", "NCHW8c", "NCHW16c")


def _to_plain(block: int) -> Attrs:
    return Attrs(src_layout=f"NCHW{block}c", dst_layout="NCHW")


def _to_blocked(block: int) -> Attrs:
    return Attrs(src_layout="NCHW", dst_layout=f"NCHW{block}c")


def _layout_block(name: str, layout: str, block: int) -> int:
    """0 for NCHW, else B after checking that `layout` is NCHW{B}c of the filter's B."""
    require(layout in ("NCHW", f"NCHW{block}c"),
            f"{name}: layout '{layout}' does not match the filter's block of {block} "
            f"channels (expected 'NCHW' or 'NCHW{block}c')")
    return 0 if layout == "NCHW" else block


def _blocked_input_shape(name: str, x, block: int) -> tuple[int, ...]:
    """The NCHW shape (padding channels included) of NCHW{block}c data `x`."""
    require(len(x) == 5 and x[4] == block,
            f"{name}: data in layout NCHW{block}c must be (N, C/{block}, H, W, {block}), "
            f"got {list(x)}")
    return _transformed_shape(x, _to_plain(block))


conv_packed_blocked = op(
    "conv_packed_blocked", family="layout", backends=("llvm",),
    inputs=("input", "filter", "bias?"),
    fusion=Fusion.OUT_ELEMWISE, seeds=("cvmc",), types="scalar, scalar, scalar -> scalar",
    attrs=(*window_attrs(("constant",)), Attr("channels", "int", lo=1),
           Attr("data_layout", "str", "NCHW", choices=_FLOAT_LAYOUTS),
           Attr("out_layout", "str", "NCHW", choices=_FLOAT_LAYOUTS)))


def _blocked_conv_layouts(ins, a) -> tuple[tuple[int, ...], int, int]:
    """(the NCHW data shape with only its real channels, data block, output block) of a
    conv_packed_blocked after checking its layouts."""
    name, block, cg = "conv_packed_blocked", ins[1].shape[-1], ins[1].shape[1]
    data, out = (_layout_block(name, layout, block) for layout in (a.data_layout,
                                                                    a.out_layout))
    x = ins[0].shape
    if data:
        padded = _blocked_input_shape(name, x, block)
        require(cg <= padded[1] < cg + block,
                f"{name}: blocked data of {padded[1]} channels (padding included) does not "
                f"hold the filter's {cg} input channels in one group")
        x = (padded[0], cg, *padded[2:])
    require(not out or a.channels % block == 0,
            f"{name}: out_layout NCHW{block}c needs a multiple of {block} output channels, "
            f"got {a.channels}")
    return x, data, out


@conv_packed_blocked.shape
def _conv_packed_blocked_shape(ins, a):
    x, _, out = _blocked_conv_layouts(ins, a)
    w = _unpacked_filter_shape("conv_packed_blocked", x, ins[1].shape, a)
    y = conv_shape("conv_packed_blocked", [x, w, *(t.shape for t in ins[2:])],
                   _conv_attrs(a, x[1], w[1]))
    return _transformed_shape(tuple(y), _to_blocked(out)) if out else y


def _unblocked(x: np.ndarray, block: int, channels: int | None = None) -> np.ndarray:
    """NCHW{block}c -> NCHW (the first `channels` channels; all: None); NCHW as it is."""
    return _layout_transform_reference([x], _to_plain(block))[:, :channels] if block else x


def _blocked(y: np.ndarray, block: int) -> np.ndarray:
    return _layout_transform_reference([y], _to_blocked(block)) if block else y


@conv_packed_blocked.reference
def _conv_packed_blocked_reference(xs, a):
    _, data, out = _blocked_conv_layouts(xs, a)
    x = _unblocked(xs[0], data, xs[1].shape[1])
    return _blocked(_conv_packed_reference([x, *xs[1:]], a), out)


@conv_packed_blocked.lower
def _conv_packed_blocked_lower(xs, a):
    from cvmc.ops.te import shape_of, te

    block = shape_of(xs[1])[4]
    data, out = (_layout_block("conv_packed_blocked", v, block)
                 for v in (a.data_layout, a.out_layout))
    acc, nchw = _conv_packed_acc(xs[0], xs[1], a, data)
    if not out:
        return _nchw_result(xs, acc, nchw, "conv_packed_blocked")
    if len(xs) == 2:
        return acc
    return te.compute(acc.shape, lambda b, o, p, q, oi: acc[b, o, p, q, oi] +
                      _channel_value(xs[2], o * block + oi), name="conv_packed_blocked_bias")


def _channel_value(bias, channel):
    """NNEF conv's bias ([1, C], or one value broadcast) at `channel`."""
    from cvmc.ops.te import shape_of

    shape = shape_of(bias)
    return bias(*(channel if k == 1 and e > 1 else 0 for k, e in enumerate(shape)))


# GOPS: as conv_packed's (a blocked result has whole blocks: no padding channel counted)
conv_packed_blocked.arith(lambda ins, outs, a: 2 * outs[0].size * math.prod(ins[1].shape[1:4]))
conv_packed_blocked.cost(lambda ins, outs, a: math.prod(ins[1].shape[1:4]))


depthwise_conv_blocked = op(
    "depthwise_conv_blocked", family="layout", backends=("llvm",),
    inputs=("input", "filter", "bias?"),
    fusion=Fusion.OUT_ELEMWISE, seeds=("cvmc",), types="scalar, scalar, scalar -> scalar",
    attrs=window_attrs(("constant",)))


def _depthwise_float_geometry(ins, a) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(the NCHW data shape, padding channels included; the OIHW filter shape)."""
    name, w = "depthwise_conv_blocked", ins[1].shape
    require(len(w) == 5 and w[1] == 1, f"{name}: expected a filter packed (C/B, 1, KH, KW, B), "
                                       f"got {list(w)}")
    x = _blocked_input_shape(name, ins[0].shape, w[4])
    require(w[0] * w[4] == x[1], f"{name}: filter {list(w)} does not pack the {x[1]} "
                                 f"channels of the data")
    return x, (x[1], 1, w[2], w[3])


@depthwise_conv_blocked.shape
def _depthwise_conv_blocked_shape(ins, a):
    x, w = _depthwise_float_geometry(ins, a)
    y = conv_shape("depthwise_conv_blocked", [x, w, *(t.shape for t in ins[2:])],
                   _conv_attrs(a, x[1], 1))
    return _transformed_shape(tuple(y), _to_blocked(ins[1].shape[4]))


@depthwise_conv_blocked.reference
def _depthwise_conv_blocked_reference(xs, a):
    block = xs[1].shape[4]
    x, w = _unblocked(xs[0], block), _unpacked_filter(xs[1], xs[0].shape[1] * block)
    return _blocked(_CONV_REFERENCE([x, w, *xs[2:]], _conv_attrs(a, x.shape[1], 1)), block)


@depthwise_conv_blocked.lower
def _depthwise_conv_blocked_lower(xs, a):
    from cvmc.ops.te import shape_of, te

    x, w = xs[0], xs[1]
    n, cb, h, wd, block = shape_of(x)
    kh, kw = shape_of(w)[2:4]
    out, dims, _ = conv_geometry("depthwise_conv_blocked",
                                  _conv_attrs(a, cb * block, 1), (n, cb * block, h, wd),
                                  (cb * block, 1, kh, kw), False)
    padded = padded_input(x, [d.X for d in dims] + [block], [kh, kw, 1],
                          [d.x for d in dims] + [block], [d.s for d in dims] + [1],
                          [d.d for d in dims] + [1], [d.p for d in dims] + [0],
                          "depthwise_conv_blocked")
    ry = te.reduce_axis((0, kh), "ry")
    rx = te.reduce_axis((0, kw), "rx")
    (sh, sw), (dh, dw) = [d.s for d in dims], [d.d for d in dims]
    y = te.compute((n, cb, out[2], out[3], block), lambda b, c, p, q, ci: te.sum(
        padded(b, c, p * sh + ry * dh, q * sw + rx * dw, ci) * w[c, 0, ry, rx, ci],
        axis=[ry, rx]), name="depthwise_conv_blocked")
    if len(xs) == 2:
        return y
    return te.compute(y.shape, lambda b, c, p, q, ci: y[b, c, p, q, ci] +
                      _channel_value(xs[2], c * block + ci), name="depthwise_conv_blocked_bias")


@depthwise_conv_blocked.arith
def _depthwise_conv_blocked_arith(ins, outs, a):
    """2 per multiply-add: KH x KW per output element (padding channels included)."""
    return 2 * outs[0].size * ins[1].shape[2] * ins[1].shape[3]


depthwise_conv_blocked.cost(lambda ins, outs, a: ins[1].shape[2] * ins[1].shape[3])


# ---- depthwise_conv2d_blocked, max_pool2d_blocked --------------------------------------
# The ops between packed convs that keep activations blocked (`block_activations`): a
# depthwise conv2d (groups == C == OC) and max_pool2d on NCHW16c data, writing NCHW16c.
# Each computes exactly the CVM op on the unblocked tensor of C/16 * 16 channels (padding
# channels included: their data and weights are zero). The depthwise weight is OIHW16o,
# (C/16, 1, KH, KW, 16): the 16 channels of a block, one per vector lane, next to each
# other for every tap.
DEPTHWISE_WEIGHT_LAYOUT = f"OIHW{OC_BLOCK}o"
_WEIGHT_TO_PLAIN = Attrs(src_layout=DEPTHWISE_WEIGHT_LAYOUT, dst_layout="OIHW")

depthwise_conv2d_blocked = op(
    "depthwise_conv2d_blocked", family="layout", inputs=("data", "weight", "bias?"),
    fusion=Fusion.OUT_ELEMWISE, seeds=("cvmc",),
    attrs=(
        pair_attr("padding", 0, (0, 0)),
        pair_attr("stride", 1, (1, 1)),
        pair_attr("dilation", 1, (1, 1)),
    ),
    precision_rule="as depthwise conv2d: p_x + p_w + bitlen(KH*KW); with bias max(that, "
                   "p_b) + 1")


def _blocked_data_shape(opname: str, x) -> tuple[int, int, int, int]:
    """(N, C, H, W) of NCHW16c data, C counting the padding channels."""
    require_rank(opname, "data", x, 5, f"(N, C/{OC_BLOCK}, H, W, {OC_BLOCK})")
    require(x.shape[4] == OC_BLOCK, f"{opname}: data in layout {BLOCKED_LAYOUT} must have "
                                    f"{OC_BLOCK} channels in its last axis")
    return _transformed_shape(x.shape, _TO_PLAIN)


def _depthwise_geometry(ins, a) -> tuple[tuple[int, int, int, int], int, int]:
    """((N, C, H, W), KH, KW) after checking the weight (and bias) against the data."""
    data = _blocked_data_shape("depthwise_conv2d_blocked", ins[0])
    require_rank("depthwise_conv2d_blocked", "weight", ins[1], 5,
                  f"(C/{OC_BLOCK}, 1, KH, KW, {OC_BLOCK})")
    cb, one, kh, kw, ob = ins[1].shape
    require((cb, one, ob) == (data[1] // OC_BLOCK, 1, OC_BLOCK),
            f"depthwise_conv2d_blocked: weight shape {list(ins[1].shape)} is not "
            f"{DEPTHWISE_WEIGHT_LAYOUT} for {data[1]} channels")
    if len(ins) == 3:
        require(ins[2].shape == (data[1],),
                f"depthwise_conv2d_blocked: bias must have shape ({data[1]},)")
    return data, kh, kw


@depthwise_conv2d_blocked.shape
def _depthwise_blocked_shape(ins, a):
    data, kh, kw = _depthwise_geometry(ins, a)
    out = (*data[:2], *conv_out_hw(data, (data[1], 1, kh, kw), a))
    return _transformed_shape(out, _TO_BLOCKED)


@depthwise_conv2d_blocked.precision
def _depthwise_blocked_precision(ins, a):
    _, kh, kw = _depthwise_geometry(ins, a)
    require_low_precision("depthwise_conv2d_blocked", ins)
    return bias_precision(ins[0].precision + ins[1].precision + bitlen(kh * kw), ins)


def _depthwise_attrs(a, groups: int) -> Attrs:
    """CVM conv2d's attributes for the depthwise conv of `a` with `groups` groups."""
    return Attrs(padding=a.padding, stride=a.stride, dilation=a.dilation, groups=groups)


@depthwise_conv2d_blocked.reference
def _depthwise_blocked_reference(xs, a):
    x = _layout_transform_reference([xs[0]], _TO_PLAIN)
    w = _layout_transform_reference([xs[1]], _WEIGHT_TO_PLAIN)
    y = conv2d_reference([x, w, *xs[2:]], _depthwise_attrs(a, x.shape[1]))
    return _layout_transform_reference([y], _TO_BLOCKED)


@depthwise_conv2d_blocked.lower
def _depthwise_blocked_lower(xs, a):
    from cvmc.ops.te import MATERIALIZE, const, shape_of, te, tirx
    x, w = xs[0], xs[1]
    n, cb, h, wd, ob = shape_of(x)
    kh, kw = shape_of(w)[2:4]
    (ph, pw), (sh, sw), (dh, dw) = a.padding, a.stride, a.dilation
    oh, ow = conv_out_hw((n, cb * ob, h, wd), (cb * ob, 1, kh, kw), a)
    read = x
    if ph or pw:
        # The padded input as its own int8 stage (data precision <= 8: exact), so the
        # conv's inner loop reads without a bounds test; 16 channels of a pixel stay one
        # 16-byte vector.
        def padded(b, c, i, j, ci):
            inside = tirx.all(i >= ph, i < h + ph, j >= pw, j < wd + pw)
            return tirx.if_then_else(inside, x[b, c, i - ph, j - pw, ci].astype("int8"),
                                     const(0, "int8"))
        read = te.compute((n, cb, h + 2 * ph, wd + 2 * pw, ob), padded,
                          name="depthwise_conv2d_blocked_pad", attrs={MATERIALIZE: 1})
    ry = te.reduce_axis((0, kh), name="ry")
    rx = te.reduce_axis((0, kw), name="rx")

    def acc(b, c, p, q, ci):
        # int32 products (|x * w| <= 128 * 128) summed exactly: the precision rule keeps
        # the sum inside int32.
        pixel = read[b, c, p * sh + ry * dh, q * sw + rx * dw, ci].astype("int32")
        return te.sum(pixel * w[c, 0, ry, rx, ci].astype("int32"), axis=[ry, rx])
    y = te.compute((n, cb, oh, ow, ob), acc, name="depthwise_conv2d_blocked")
    if len(xs) < 3:
        return y
    bias = xs[2]
    return te.compute(y.shape, lambda b, c, p, q, ci: y[b, c, p, q, ci] + bias[c * ob + ci],
                      name="depthwise_conv2d_blocked_bias")


@depthwise_conv2d_blocked.arith
def _depthwise_blocked_arith(ins, outs, a):
    """2 per multiply-add: KH x KW per output element."""
    return 2 * outs[0].size * ins[1].shape[2] * ins[1].shape[3]


@depthwise_conv2d_blocked.cost
def _depthwise_blocked_cost(ins, outs, a):
    return 3 * ins[1].shape[2] * ins[1].shape[3] + (1 if len(ins) == 3 else 0)


max_pool2d_blocked = op(
    "max_pool2d_blocked", family="layout", inputs=("data",), fusion=Fusion.OUT_ELEMWISE,
    seeds=("cvmc",), attrs=tuple(x for x in max_pool2d.attrs if x.name != "layout"),
    precision_rule="p_x")


@max_pool2d_blocked.shape
def _max_pool2d_blocked_shape(ins, a):
    data = _blocked_data_shape("max_pool2d_blocked", ins[0])
    _, _, oh, ow = pool_geometry(data, a)
    return (*ins[0].shape[:2], oh, ow, OC_BLOCK)


@max_pool2d_blocked.precision
def _max_pool2d_blocked_precision(ins, a):
    return ins[0].precision


@max_pool2d_blocked.reference
def _max_pool2d_blocked_reference(xs, a):
    y = max_pool2d_reference([_layout_transform_reference([xs[0]], _TO_PLAIN)], a)
    return _layout_transform_reference([y], _TO_BLOCKED)


@max_pool2d_blocked.lower
def _max_pool2d_blocked_lower(xs, a):
    return lower_max_pool(xs[0], a, "max_pool2d_blocked")


@max_pool2d_blocked.cost
def _max_pool2d_blocked_cost(ins, outs, a):
    return a.pool_size[0] * a.pool_size[1]

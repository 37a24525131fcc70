"""The packed integer ops that the llvm and cuda backends both compile: conv2d_packed
(the VNNI / dp4a form of conv2d on a packed weight) and the ops between packed convs that
keep activations blocked (depthwise_conv2d_blocked, max_pool2d_blocked).

Only the layout pass (`cvmc/passes/layout.py`) writes them; each computes exactly the CVM
op it replaces, and its reference is that op's on the unpacked tensors, so the reference
interpreter runs the packed graph too.
"""
from __future__ import annotations

import numpy as np

from cvmc.ops.common import DATA_INTERVAL, bitlen, data_interval, mac_ops, require
from cvmc.ops.layout import layout_transform_reference, transformed_shape
from cvmc.ops.nn import (
    add_bias,
    bias_precision,
    conv2d_reference,
    conv_out_hw,
    exact_matmul,
    gather_windows,
    pair_attr,
    require_low_precision,
    require_rank,
)
from cvmc.ops.nn_pool import (
    lower_max_pool,
    max_pool2d,
    max_pool2d_reference,
    pool_geometry,
    window_compares,
    window_taps,
)
from cvmc.ops.registry import Attr, Attrs, Fusion, op

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
    fusion=Fusion.OUT_ELEMWISE, seeds=("cvmc",), multiply_add=True,
    epilogue_on=("llvm", "cuda"),
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
    return transformed_shape(x.shape, _TO_PLAIN)


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
    return out if a.out_layout == "NCHW" else transformed_shape(out, _TO_BLOCKED)


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
        x = layout_transform_reference([x], _TO_PLAIN)
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
    return y if a.out_layout == "NCHW" else layout_transform_reference([y], _TO_BLOCKED)


@conv2d_packed.lower
def _conv2d_packed_lower(xs, a):
    from cvmc.ops.te import INTERIOR, MATERIALIZE, const, shape_of, te, tirx
    x, wp, comp = xs[0], xs[1], xs[2]
    blocked_in = a.data_layout != "NCHW"
    n, c, h, w = transformed_shape(shape_of(x), _TO_PLAIN) if blocked_in else shape_of(x)
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


@conv2d_packed.arith
def _conv2d_packed_arith(ins, outs, a):
    """2 per multiply-add: output elements x C/groups x KH x KW (data NCHW or NCHW16c)."""
    data, weight = ins[0].shape, ins[1].shape
    channels = data[1] * (data[4] if len(data) == 5 else 1)
    return mac_ops(outs[0].size, channels // a.groups * weight[2] * weight[3])


@conv2d_packed.cost
def _conv2d_packed_cost(ins, outs, a):
    c, _, kh, kw = _packed_geometry(ins, a)
    return 3 * c * kh * kw + (1 if len(ins) == 4 else 0)


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
    return transformed_shape(x.shape, _TO_PLAIN)


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
    return transformed_shape(out, _TO_BLOCKED)


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
    x = layout_transform_reference([xs[0]], _TO_PLAIN)
    w = layout_transform_reference([xs[1]], _WEIGHT_TO_PLAIN)
    y = conv2d_reference([x, w, *xs[2:]], _depthwise_attrs(a, x.shape[1]))
    return layout_transform_reference([y], _TO_BLOCKED)


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
    precision_rule="p_x", interval_rule=DATA_INTERVAL)
max_pool2d_blocked.interval(data_interval)


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
    y = max_pool2d_reference([layout_transform_reference([xs[0]], _TO_PLAIN)], a)
    return layout_transform_reference([y], _TO_BLOCKED)


@max_pool2d_blocked.lower
def _max_pool2d_blocked_lower(xs, a):
    return lower_max_pool(xs[0], a, "max_pool2d_blocked")


max_pool2d_blocked.arith(window_compares)
max_pool2d_blocked.cost(window_taps)

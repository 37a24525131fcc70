"""The float packed ops only the llvm backend compiles (`OpDef.backends`; CUDA refuses
them): float_layout_transform, conv_packed, conv_packed_blocked and depthwise_conv_blocked,
which the llvm pipeline's float layout passes write (`cvmc/passes/layout_float.py`), and
matmul_packed, which `pack-matmul-weights` writes (`cvmc/passes/matmul_weights.py`).

Each reference is the NNEF op's on the unpacked, unblocked tensors: the oracle, which the
reference interpreter runs on the packed graph too.
"""
from __future__ import annotations

import math

import numpy as np

from cvmc.ops.common import mac_ops, require
from cvmc.ops.conv_nd import padded_input
from cvmc.ops.layout import (
    layout_transform,
    layout_transform_reference,
    layout_transform_shape,
    lower_layout_transform,
    transformed_shape,
)
from cvmc.ops.nnef_math import te_broadcast
from cvmc.ops.nnef_nn import conv_geometry, conv_reference
from cvmc.ops.nnef_std import matmul_shape
from cvmc.ops.nnef_std_nn import conv_shape, window_attrs
from cvmc.ops.registry import Attr, Attrs, Fusion, op

# The float activations' transform (`block_float_activations`): layout_transform's rules on
# float32, padding elements 0.0. Exact (it moves values).
float_layout_transform = op(
    "float_layout_transform", family="layout", backends=("llvm",),
    inputs=("data",), fusion=Fusion.INJECTIVE,
    attrs=layout_transform.attrs, seeds=("cvmc",), types="scalar -> scalar")
float_layout_transform.shape(layout_transform_shape)
float_layout_transform.reference(layout_transform_reference)


@float_layout_transform.lower
def _float_layout_transform_lower(xs, a):
    from cvmc.ops.te import tirx
    return lower_layout_transform(xs[0], a, tirx.const(0, xs[0].dtype))


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
    return transformed_shape(x, _to_plain(block))


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
    return transformed_shape(tuple(y), _to_blocked(out)) if out else y


def _unblocked(x: np.ndarray, block: int, channels: int | None = None) -> np.ndarray:
    """NCHW{block}c -> NCHW (the first `channels` channels; all: None); NCHW as it is."""
    return layout_transform_reference([x], _to_plain(block))[:, :channels] if block else x


def _blocked(y: np.ndarray, block: int) -> np.ndarray:
    return layout_transform_reference([y], _to_blocked(block)) if block else y


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
    return transformed_shape(tuple(y), _to_blocked(ins[1].shape[4]))


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


# ---- matmul_packed --------------------------------------------------------------------
# matmul_packed: NNEF's float `matmul` on a B packed at compile time into column panels.
#
# `matmul(A, B)` with a constant B (*batch, K, N) (a linear layer's weight, transposed back by
# `untranspose-matmul-weights`) becomes `matmul_packed(A, Bp, columns = N)` on
#
#     Bp = (*batch, P, K, C),  Bp[..., p, k, c] = B[..., k, p * C + c]  (0 where p * C + c >= N)
#
# (`cvmc/passes/matmul_weights.py` writes the pad/reshape/transpose chain that constant folding
# evaluates): P = ceil(N / C) column panels, each a contiguous K x C block, C = 2 vectors of
# float32 (16 on AVX2, 32 on AVX-512) the width of the kernel's register tile. The kernel
# (`cvmc/lowering/x86_matmul.py`) then reads a panel's rows one after the other instead of
# one row of B every N floats, and can keep a K block of a panel in L1. Each output element
# is the sum of its K products in the order k = 0, 1, ... (one thread per element, never
# split): matmul's bound (docs/float.md), the same bits at any thread count. The reference is
# matmul's on the unpacked B: the oracle.
matmul_packed = op(
    "matmul_packed", family="layout", backends=("llvm",),
    inputs=("A", "B"), seeds=("cvmc",),
    types="scalar, scalar -> scalar", attrs=(Attr("columns", "int", lo=1),),
    # its kernel takes the element-wise epilogue (bias, activation, residual) under its tile
    fusion=Fusion.OUT_ELEMWISE, multiply_add=True)
# GOPS: B packed (*batch, P, K, C): K multiply-adds per output element, as matmul's
matmul_packed.arith(lambda ins, outs, a: mac_ops(outs[0].size, ins[1].shape[-2]))

_PLAIN = Attrs(transposeA=False, transposeB=False)


def unpacked_shape(a, bp, columns: int) -> tuple[int, ...]:
    """B's (*batch, K, N) shape for A's shape `a` and packed shape `bp` (*batch, P, K, C),
    after checking them."""
    require(len(bp) == len(a) + 1 and len(a) >= 2,
            f"matmul_packed: B packed (*batch, P, K, C) must have A's rank + 1, got A "
            f"{list(a)} and B {list(bp)}")
    *batch, panels, k, cols = bp
    require(panels == -(-columns // cols),
            f"matmul_packed: {panels} panels of {cols} columns do not pack {columns} columns")
    return (*batch, k, columns)


@matmul_packed.shape
def _matmul_packed_shape(ins, a):
    sa, sb = ins[0].shape, ins[1].shape
    return matmul_shape("matmul_packed", [sa, unpacked_shape(sa, sb, a.columns)], _PLAIN)


def unpack(bp: np.ndarray, columns: int) -> np.ndarray:
    """(*batch, P, K, C) -> (*batch, K, N): the panels side by side, padding dropped."""
    *batch, panels, k, cols = bp.shape
    return np.swapaxes(bp, -3, -2).reshape(*batch, k, panels * cols)[..., :columns]


@matmul_packed.reference
def _matmul_packed_reference(xs, a):
    return np.matmul(xs[0], unpack(xs[1], a.columns))


@matmul_packed.lower
def _matmul_packed_lower(xs, a):
    from cvmc.ops.te import shape_of, te

    A, Bp = xs
    sa, sb = shape_of(A), shape_of(Bp)
    *_, panels, k_extent, cols = sb
    batch = [max(p, q) for p, q in zip(sa[:-2], sb[:-3])]
    k = te.reduce_axis((0, k_extent), name="k")

    def bidx(shape, b):
        return [0 if e == 1 else i for e, i in zip(shape, b)]

    def dot(*o):
        *b, i, j = o
        return te.sum(A(*bidx(sa[:-2], b), i, k) * Bp(*bidx(sb[:-3], b), j // cols, k, j % cols),
                      axis=k)
    # The accumulator covers whole panels; the result drops the padding columns.
    acc = te.compute((*batch, sa[-2], panels * cols), dot, name="matmul_packed_acc")
    return te.compute((*batch, sa[-2], a.columns), lambda *o: acc(*o), name="matmul_packed")

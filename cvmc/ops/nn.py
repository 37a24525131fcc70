"""CVM NN operators: conv2d, dense, relu (max_pool2d and upsampling: `nn_pool`).

Spec: ../shared/spec/cvm-operators-formal.txt, "NN Operators"; precision rules from
../shared/design/cvm-semantics.md. Attribute bounds follow CVM-Runtime's
`VerifyAttrRange`: [lo, max_attr) with max_attr = 4096, so the inclusive upper bound
is MAX_ATTR - 1.
"""
from __future__ import annotations

import math

import numpy as np

from cvmc.ops.common import bitlen, check_window_fits, mac_ops, monotone_interval, require
from cvmc.ops.registry import MAX_ATTR, Attr, Fusion, op

ATTR_HI = MAX_ATTR - 1  # the inclusive upper bound of the NN attributes


def pair_attr(name: str, lo: int, default, aliases: tuple[str, ...] = (),
               cvm_name: str = "") -> Attr:
    """A length-2 integer list attribute bounded by [lo, max_attr)."""
    return Attr(name, "ints", default, lo=lo, hi=ATTR_HI, length=2, aliases=aliases,
                cvm_name=cvm_name)


def _shape_str(shape) -> str:
    return "(" + ", ".join(str(d) for d in shape) + ")"


def require_rank(opname: str, operand: str, t, rank: int, dims: str) -> None:
    """Raise unless operand `t` has the given rank; `dims` names the expected axes."""
    require(t.ndim == rank, f"{opname}: {operand} must be {rank}-D {dims}, "
                            f"got shape {_shape_str(t.shape)}")


def require_low_precision(opname: str, ins, operands: tuple[str, str] = ("data", "weight")
                           ) -> None:
    """conv2d / dense multiply 8-bit operands only (CVM-Runtime: 'must be INT8')."""
    for operand, t in zip(operands, ins):
        require(t.precision <= 8, f"{opname}: {operand} precision must be <= 8 bits, "
                                  f"got {t.precision}")


def bias_precision(p: int, ins) -> int:
    """The shared bias rule: `max(P, p_b) + 1` when a bias is given, else P."""
    return max(p, ins[2].precision) + 1 if len(ins) == 3 else p


def _check_bias(opname: str, ins, a, n_out: int) -> None:
    """Bias (when given) must be (n_out,); `use_bias` (when given) must agree with it."""
    has_bias = len(ins) == 3
    if has_bias:
        require(ins[2].shape == (n_out,), f"{opname}: bias must have shape ({n_out},) "
                                          f"(one per output channel), got "
                                          f"{_shape_str(ins[2].shape)}")
    if a.use_bias is not None:
        require(a.use_bias == has_bias,
                f"{opname}: attribute 'use_bias' is {str(a.use_bias).lower()} but "
                f"{'a' if has_bias else 'no'} bias input is given")


def exact_matmul(lhs: np.ndarray, rhs: np.ndarray) -> np.ndarray:
    """Integer `lhs @ rhs` (batched), computed with float64 BLAS and returned as int64.

    Exact: both operands hold values of at most 8 bits (|v| <= 127), so each product is
    below 2^14, and the precision rule (p_x + p_w + bitlen(K) <= 32) bounds every partial
    sum below 2^31, far inside float64's exact integer range (2^53) whatever the
    summation order. NumPy's int64 matmul has no BLAS and is ~100x slower.
    """
    return np.matmul(lhs.astype(np.float64), rhs.astype(np.float64)).astype(np.int64)


def add_bias(y: np.ndarray, xs, axis: int) -> np.ndarray:
    """y + B broadcast along `axis` (the output-channel axis), if a bias is given."""
    if len(xs) < 3:
        return y
    shape = [1] * y.ndim
    shape[axis] = -1
    return y + xs[2].reshape(shape)


def _lower_bias(y, xs, axis: int, name: str):
    """TE: y + B[index along axis] as its own stage (the sum stays a pure reduction)."""
    if len(xs) < 3:
        return y
    from cvmc.ops.te import te
    b = xs[2]
    return te.compute(y.shape, lambda *i: y(*i) + b[i[axis]], name=name)


def _padded_reader(x, ph: int, pw: int, value: int, rows: int, cols: int,
                   dtype: str | None = None):
    """(n, c, i, j) -> x[n, c, i - ph, j - pw] inside the input, `value` outside (spec pad()),
    converted to `dtype` if given (inside the select, so that a stage storing it stores the
    select itself: the pattern TVM's `decompose_padding` recognises).

    `rows` x `cols` is the extent of padded coordinates the consumer reads. A bound is
    tested only where a read can cross it: the low side when there is padding, the high
    side when the reads reach past the input (padding, or ceil_mode's overhanging last
    window even with zero padding).
    """
    from cvmc.ops.te import const, tirx
    h, w = int(x.shape[2]), int(x.shape[3])
    low_h, low_w, high_h, high_w = ph > 0, pw > 0, rows > h + ph, cols > w + pw

    def read(n, c, i, j):
        tests = [t for need, t in ((low_h, i >= ph), (high_h, i < h + ph), (low_w, j >= pw),
                                   (high_w, j < w + pw)) if need]
        pixel = x[n, c, i - ph, j - pw]
        if dtype:
            pixel = pixel.astype(dtype)
        return tirx.if_then_else(tirx.all(*tests), pixel, const(value, dtype or "int32")) \
            if tests else pixel
    return read


def _window_rows(out: int, stride: int, k: int, dil: int) -> np.ndarray:
    """Padded-input coordinates of every tap: [tap, out] = tap*dil + out*stride."""
    return (np.arange(k) * dil)[:, None] + (np.arange(out) * stride)[None, :]


def gather_windows(xp: np.ndarray, oh: int, ow: int, k, stride, dil) -> np.ndarray:
    """taps[n, c, ki, kj, p, q] = xp[n, c, ki*DH + p*SH, kj*DW + q*SW] (xp already padded)."""
    rows = _window_rows(oh, stride[0], k[0], dil[0])
    cols = _window_rows(ow, stride[1], k[1], dil[1])
    return xp[:, :, rows[:, None, :, None], cols[None, :, None, :]]


# ---- conv2d ---------------------------------------------------------------------------
conv2d = op(
    "conv2d", family="nn", inputs=("data", "weight", "bias?"), fusion=Fusion.OUT_ELEMWISE,
    multiply_add=True, packed_on=("llvm", "cuda"), epilogue_on=("llvm", "cuda"),
    attrs=(
        pair_attr("padding", 0, (0, 0)),
        pair_attr("stride", 1, (1, 1), aliases=("strides",), cvm_name="strides"),
        pair_attr("dilation", 1, (1, 1)),
        Attr("groups", "int", 1, lo=1),
        # CVM-Runtime attributes: optional, and when given they must agree with the inputs;
        # CVM-Runtime requires them, so export writes them from the weight's shape and the
        # bias where a node leaves them unset.
        Attr("channels", "int?", None, lo=1, cvm_derive=lambda shapes: shapes[1][0]),
        Attr("kernel_size", "ints", None, lo=1, length=2,
             cvm_derive=lambda shapes: tuple(shapes[1][2:])),
        Attr("use_bias", "bool", None, cvm_derive=lambda shapes: len(shapes) == 3),
        Attr("layout", "str", "NCHW", choices=("NCHW",)),
        Attr("kernel_layout", "str", "OIHW", choices=("OIHW",)),
    ),
    precision_rule="p_x + p_w + bitlen(IC*KH*KW); with bias max(that, p_b) + 1; "
                   "p_x, p_w <= 8")


def _check_conv_channels(ins, a) -> None:
    """C == IC x groups and OC % groups == 0 (CVM-Runtime reads past the weight otherwise)."""
    require_rank("conv2d", "data", ins[0], 4, "(N, C, H, W)")
    require_rank("conv2d", "weight", ins[1], 4, "(OC, IC, KH, KW)")
    c, (oc, ic) = ins[0].shape[1], ins[1].shape[:2]
    g = a.groups
    require(c == ic * g, f"conv2d: data has {c} channels but weight expects {ic * g} "
                         f"(IC={ic} x groups={g})")
    require(oc % g == 0, f"conv2d: weight has {oc} output channels, not a multiple of "
                         f"groups={g}")


def _conv_out_size(axis: str, size: int, pad: int, k: int, dil: int, stride: int) -> int:
    """Spec: floor((size + 2*pad - dil*(k-1) - 1) / stride) + 1, with the kernel inside.
    The spec bounds padding, stride and dilation by max_attr (4096) and defines every
    geometry inside those bounds, degenerate ones included: only the fit is checked."""
    check_window_fits("conv2d", axis, size, k, dil, pad, pad)
    return (size + 2 * pad - dil * (k - 1) - 1) // stride + 1


def conv_out_hw(x_shape, w_shape, a) -> tuple[int, int]:
    """(Y_HMAX, Y_WMAX) of the spec for data (N, C, H, W) and weight (OC, IC, KH, KW)."""
    return tuple(_conv_out_size(axis, x_shape[2 + i], a.padding[i], w_shape[2 + i],
                                a.dilation[i], a.stride[i])
                 for i, axis in enumerate(("height", "width")))


@conv2d.shape
def _conv2d_shape(ins, a):
    _check_conv_channels(ins, a)
    n = ins[0].shape[0]
    oc, _, kh, kw = ins[1].shape
    if a.channels is not None:
        require(a.channels == oc, f"conv2d: attribute 'channels' is {a.channels} but weight "
                                  f"has {oc} output channels")
    if a.kernel_size is not None:
        require(tuple(a.kernel_size) == (kh, kw),
                f"conv2d: attribute 'kernel_size' is {list(a.kernel_size)} but weight kernel "
                f"is [{kh}, {kw}]")
    _check_bias("conv2d", ins, a, oc)
    return (n, oc, *conv_out_hw(ins[0].shape, ins[1].shape, a))


@conv2d.precision
def _conv2d_precision(ins, a):
    require_low_precision("conv2d", ins)
    _check_conv_channels(ins, a)
    _, ic, kh, kw = ins[1].shape
    return bias_precision(ins[0].precision + ins[1].precision + bitlen(ic * kh * kw), ins)


@conv2d.reference
def conv2d_reference(xs, a):
    """conv2d's spec on int64 arrays (conv2d_packed's reference too, on unpacked weights)."""
    # Y[n,oc,p,q] = sum_ic kernel(n, (oc // OPG)*IC + ic, p, q, oc, ic) (+ B[oc]), with
    # kernel = sum_{ki<KH, kj<KW} pad(p*SH - PH + ki*DH, q*SW - PW + kj*DW) * W[oc,ic,ki,kj].
    # The spec's sums run "to KH" inclusive, a typo: W has only KH rows.
    x, w = xs[0], xs[1]
    n = x.shape[0]
    oc, ic, kh, kw = w.shape
    g = a.groups
    (ph, pw), stride, dil = a.padding, a.stride, a.dilation
    xp = np.pad(x, ((0, 0), (0, 0), (ph, ph), (pw, pw)))  # pad(): 0 outside the input
    oh, ow = conv_out_hw(x.shape, w.shape, a)
    taps = gather_windows(xp, oh, ow, (kh, kw), stride, dil)  # (n, C, KH, KW, OH, OW)
    # im2col per group: channel j = group*IC + ic, output channel oc = group*OPG + o.
    cols = taps.reshape(n, g, ic * kh * kw, oh * ow)
    y = exact_matmul(w.reshape(g, oc // g, ic * kh * kw), cols)  # (n, g, OPG, OH*OW)
    return add_bias(y.reshape(n, oc, oh, ow), xs, 1)


@conv2d.lower
def _conv2d_lower(xs, a):
    from cvmc.ops.te import DEPTHWISE, MATERIALIZE, shape_of, te
    x, w = xs[0], xs[1]
    n = shape_of(x)[0]
    oc, ic, kh, kw = shape_of(w)
    (sh, sw), (dh, dw) = a.stride, a.dilation
    opg = oc // a.groups
    oh, ow = conv_out_hw(shape_of(x), shape_of(w), a)
    _, c, h, wd = shape_of(x)
    padded = (n, c, h + 2 * a.padding[0], wd + 2 * a.padding[1])
    if a.padding[0] or a.padding[1]:
        # Its own stage, marked for the CPU schedule to keep as a buffer: the conv's inner
        # loop then reads without a bounds test and vectorises (other schedules inline it).
        # Stored as int8: conv2d's data has precision <= 8 (|x| <= 127), so the narrowing
        # is exact, and the buffer is a quarter of an int32 one.
        stage = te.compute(padded, _padded_reader(x, a.padding[0], a.padding[1], 0, padded[2],
                                                  padded[3], "int8"),
                           name="conv2d_pad", attrs={MATERIALIZE: 1})
        read = lambda *i: stage(*i).astype("int32")
    else:
        read = x
    rc = te.reduce_axis((0, ic), name="rc")
    ry = te.reduce_axis((0, kh), name="ry")
    rx = te.reduce_axis((0, kw), name="rx")

    def acc(b, o, p, q):
        # int32 inputs: products < 2^14 and the precision rule keeps the sum inside int32.
        pixel = read(b, o // opg * ic + rc, p * sh + ry * dh, q * sw + rx * dw)
        return te.sum(pixel * w[o, rc, ry, rx], axis=[rc, ry, rx])
    # Depthwise (one input channel per group, one output channel per input channel): the
    # op says so on its block, and the CPU schedule table gives that block its own rule.
    y = te.compute((n, oc, oh, ow), acc, name="conv2d",
                   attrs={DEPTHWISE: 1} if a.groups == c == oc else {})
    return _lower_bias(y, xs, 1, "conv2d_bias")


@conv2d.arith
def _conv2d_arith(ins, outs, a):
    """2 per multiply-add: output elements x C/groups x KH x KW."""
    return mac_ops(outs[0].size, math.prod(ins[1].shape[1:]))


@conv2d.cost
def _conv2d_cost(ins, outs, a):
    _, ic, kh, kw = ins[1].shape
    return 3 * ic * kh * kw + (1 if len(ins) == 3 else 0)


# ---- dense ----------------------------------------------------------------------------
dense = op(
    "dense", family="nn", inputs=("data", "weight", "bias?"), fusion=Fusion.OUT_ELEMWISE,
    multiply_add=True, epilogue_on=("llvm", "cuda"),
    # CUDA keeps dense as it is (its own dp4a rule, a warp per output): as a conv on one
    # pixel it gives too few threads (H200: dense 1024 -> 1000 81 us, under 15 us as
    # dlight's GEMV on int32)
    packed_on=("llvm",),
    attrs=(
        # CVM-Runtime attributes: optional, and when given they must agree with the inputs
        # (export writes them from the weight's shape and the bias, as for conv2d).
        Attr("units", "int?", None, lo=1, cvm_derive=lambda shapes: shapes[1][0]),
        Attr("use_bias", "bool", None, cvm_derive=lambda shapes: len(shapes) == 3),
    ),
    precision_rule="p_x + p_w + bitlen(K); with bias max(that, p_b) + 1; p_x, p_w <= 8")


@dense.shape
def _dense_shape(ins, a):
    require_rank("dense", "data", ins[0], 2, "(M, K)")
    require_rank("dense", "weight", ins[1], 2, "(N, K)")
    (m, k), (units, wk) = ins[0].shape, ins[1].shape
    require(k == wk, f"dense: data has K={k} columns but weight has {wk} "
                     f"(weight must be (N, K) = (units, {k}))")
    if a.units is not None:
        require(a.units == units, f"dense: attribute 'units' is {a.units} but weight has "
                                  f"{units} rows")
    _check_bias("dense", ins, a, units)
    return (m, units)


@dense.precision
def _dense_precision(ins, a):
    require_low_precision("dense", ins)
    return bias_precision(ins[0].precision + ins[1].precision + bitlen(ins[1].shape[-1]), ins)


@dense.reference
def _dense_reference(xs, a):
    # Y = X W^T (+ B)
    return add_bias(exact_matmul(xs[0], xs[1].T), xs, 1)


@dense.lower
def _dense_lower(xs, a):
    from cvmc.ops.te import shape_of, te
    x, w = xs[0], xs[1]
    (m, k), units = shape_of(x), shape_of(w)[0]
    rk = te.reduce_axis((0, k), name="rk")
    y = te.compute((m, units), lambda i, j: te.sum(x[i, rk] * w[j, rk], axis=rk), name="dense")
    return _lower_bias(y, xs, 1, "dense_bias")


@dense.arith
def _dense_arith(ins, outs, a):
    """2 per multiply-add: output elements x input features."""
    return mac_ops(outs[0].size, ins[1].shape[1])


@dense.cost
def _dense_cost(ins, outs, a):
    return 3 * ins[1].shape[1] + (1 if len(ins) == 3 else 0)


# ---- relu -----------------------------------------------------------------------------
relu = op("relu", family="nn", inputs=("data",), fusion=Fusion.ELEMWISE, precision_rule="p_x",
          interval_rule="[max(lo, 0), max(hi, 0)]")
relu.interval(monotone_interval(lambda x, a: max(x, 0)))


@relu.shape
def _relu_shape(ins, a):
    return ins[0].shape


@relu.precision
def _relu_precision(ins, a):
    return ins[0].precision


@relu.reference
def _relu_reference(xs, a):
    return np.maximum(xs[0], 0)


@relu.lower
def _relu_lower(xs, a):
    from cvmc.ops.te import const, elementwise, tirx
    return elementwise(xs[0], lambda v: tirx.max(v, const(0)), "relu")

"""The quantize pass: each float layer becomes CVM integer ops (built with GraphBuilder), by
the first entry of `LAYER_RULES`, a table of (match, rewrite), that matches it.

Every integer tensor t stands for the real t / scale (symmetric, per tensor); a layer's
result is requantized to its calibrated scale at the activation bits. The rules:
- conv -> conv2d, deconv -> conv2d over the zero-upsampled input, matmul / linear -> dense
  (weights 8 bits, per tensor or per output channel; bias at s_x * s_w clipped to the
  accumulator's precision), then requantize;
- add / sub of two tensors (residuals) or of a tensor and a weight: both operands at a
  common scale at 16 bits; mul: two tensors at the product's operand bits
  (`product_operands`: up to 16, so that int32 holds the product), a tensor and a weight at
  the activation bits and 8; then the op and a requantization;
- matmul of two activations -> broadcast_mul of the operands (at the product's operand
  bits), one expanded on each side, then sum over the inner axis, then requantize;
- concat: each input requantized to the output's scale; a model output that is a concat
  (or its reshape / transpose) of parts at different scales keeps each part at its own
  scale (the output bits each, so the concat is one integer tensor of that precision):
  its scale is one per slice along the axis (quantization.json's per-slice form);
- avg pool (box) -> depthwise conv2d with unit weights, divided by its tap count inside the
  requantization (per position where 'ignore' borders change the count); mean / sum
  reduce -> sum, the same way;
- max pool -> max_pool2d; reshape / squeeze / unsqueeze -> reshape; transpose; slice; nearest
  upsampling (debox) -> upsampling; split -> one slice per part: scale and precision pass
  through;
- multilinear_upsample (bilinear resize): per spatial axis two takes times the spec's
  integer weights, added; then requantize;
- softmax: max-subtracted exponentials from a cvm_lut, summed, one rounded integer divide;
- any other layer that applies one real function to each element (sigmoid, tanh, exp,
  clamp, ...): relu or clip when that is what it computes on the input's integer grid
  (exact), else a cvm_lut of the function on that grid; a clamp to [0, hi] between a
  conv / dense and convs / denses only: on the whole grid, at an offset
  (`shifted_clamps`), computed by the layer before it.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from cvmc_runtime import quantize, sliced_scale

from cvmc.builder import GraphBuilder, Var
from cvmc.errors import CvmcError
from cvmc.ir import Graph, Node
from cvmc.ir.rewrite import match
from cvmc.ops import lookup
from cvmc.ops.common import bitlen, prec_max
from cvmc.ops.nnef_std import slice_starts
from cvmc.ops.registry import Attrs
from cvmc.passes.transformer import SOFTMAX, softmax_axes
from cvmc.quantize.fixedpoint import FixedPointError, plan_requant
from cvmc.quantize.layers import Layers, apply_elementwise, is_elementwise, unsupported

WIDE = 16  # bits of the common scale that add / sub operands meet at
PRODUCT_BITS = 16  # the most bits of an operand of a product of two activations
# softmax's most output bits: its divide's numerator 2 (2^(b-1) - 1) e + sum(e), e < 2^15,
# has precision (b + 1) + 16 + 1 <= 32
SOFTMAX_BITS = 14


@dataclass(frozen=True)
class QTensor:
    """An integer value of the graph being built, the scale it is at and its offset: the
    integer t stands for the real t / scale + offset (a nonzero offset only on a clamp to
    [0, hi] folded into the layer before it, `shifted_clamps`)."""

    var: Var
    scale: float | np.ndarray
    offset: float = 0.0

    @property
    def precision(self) -> int:
        """Its inferred precision."""
        return self.var.precision


@dataclass(frozen=True)
class Options:
    """What the user chose: activation and output bits, per-channel weights, the most
    bits of an operand of a product of two activations (`product_bits`), and whether a
    clamp to [0, hi] that only convs and denses read uses the whole grid (`shifted`,
    `shifted_clamps`)."""

    bits: int = 8
    output_bits: int = 8
    per_channel: bool = False
    output_range_bits: int = 0  # of output_bits: outputs' thresholds 2^R times calibrated
    product_bits: int = PRODUCT_BITS
    shifted: bool = True
    weight_bits: int = 8  # of conv and dense weights (7: AVX2's exact vpmaddubsw path)


class Rewriter:
    """Builds the integer graph of a float layer graph, layer by layer."""

    sliced_outputs = True  # a concat output's parts each at its own scale (`concat`)

    def __init__(self, layers: Layers, thresholds: dict[str, float], options: Options):
        self.layers, self.g = layers, layers.graph
        self.thr, self.opt = thresholds, options
        self.b = GraphBuilder(self.g.name)
        self.values: dict[str, QTensor] = {}
        self.operand_bits, self.wide = product_operands(layers, options)
        self.shifted = shifted_clamps(layers) if options.shifted else {}
        # a concat output's parts at their own scales, and the reshapes after it (`concat`)
        self.sliced: set[str] = set()

    def scale(self, name: str, bits: int) -> float:
        """The scale that maps `name`'s threshold to the largest `bits`-bit integer."""
        return prec_max(bits) / self.thr[name]

    def requant(self, t: QTensor, scale, bits: int) -> QTensor:
        """`t` at another scale and `bits` bits (fixed point, `plan_requant`)."""
        ratio = np.asarray(scale, np.float64) / np.asarray(t.scale, np.float64)
        if ratio.size == 1 and float(ratio.reshape(-1)[0]) == 1.0 and t.precision <= bits:
            return t
        plan = plan_requant(ratio, t.precision, bits)
        x = t.var
        if plan.pre_shift:
            x = self.b.cvm_right_shift(x, precision=plan.clip_precision,
                                       shift_bit=plan.pre_shift)
        elif plan.clip_precision < t.precision:
            x = self.b.cvm_clip(x, precision=plan.clip_precision)
        m = plan.multiplier
        x = self.b.broadcast_mul(x, self.b.constant(m.reshape(m.shape or (1,)).astype(np.int32)))
        x = self.b.cvm_right_shift(x, precision=bits, shift_bit=plan.shift)
        return QTensor(x, scale)

    def at_bits(self, name: str, bits: int) -> QTensor:
        """Input `name` at no more than `bits` bits (requantized to its own scale if wider)."""
        t = self.values[name]
        return t if t.precision <= bits else self.requant(t, self.scale(name, bits), bits)

    def out_bits(self, node: Node) -> int:
        """The bits of a layer's result: the output bits for a model output, more than the
        activation bits where it feeds a product of two activations (`product_operands`)."""
        return self.opt.output_bits if node.name in self.g.outputs else \
            self.wide.get(node.name, self.opt.bits)

    def finish(self, node: Node, acc: QTensor) -> None:
        """Requantize a wide result to the layer's calibrated scale (to the clamp after it
        on its shifted grid, `shift_of`, where the layer is one of `shifted_clamps`: `acc`
        then holds the shift)."""
        if node.name in self.shifted:
            clamp = self.shifted[node.name]
            scale, offset = self.shift_of(clamp)
            y = self.requant(acc, scale, self.opt.bits)
            self.values[clamp] = QTensor(y.var, scale, offset)
            return
        bits = self.out_bits(node)
        self.values[node.name] = self.requant(acc, self.scale(node.name, bits), bits)

    def shift_of(self, clamp: str) -> tuple[float, float]:
        """(scale, offset) of a clamp to [0, hi] on the whole grid: [0, threshold] as
        [-top, top], scale 2 top / threshold, offset top / scale (so that the integer -top
        stands for 0 exactly: the requantization's saturation at -top is the clamp's 0)."""
        scale = 2 * self.scale(clamp, self.opt.bits)
        return scale, prec_max(self.opt.bits) / scale

    # ---- the rules ---------------------------------------------------------------------
    def weights(self, w: np.ndarray, axis: int) -> tuple[np.ndarray, np.ndarray]:
        """Integer weights of `weight_bits` and their scales (one per `axis` entry, or one
        in all)."""
        w = w.astype(np.float64)
        others = tuple(a for a in range(w.ndim) if a != axis)
        absmax = np.abs(w).max(axis=others, keepdims=True) if self.opt.per_channel \
            else np.full([1] * w.ndim, np.abs(w).max())
        scale = prec_max(self.opt.weight_bits) / np.where(absmax > 0, absmax, 1.0)
        return quantize("weight", w * scale, 1.0, self.opt.weight_bits), scale.reshape(-1)

    def linear_layer(self, node: Node, x: str, w: np.ndarray, bias: np.ndarray | None,
                     make, channel_axis: int = 1) -> None:
        """conv / dense: integer weights and bias, the op (`make`), a requantization (per
        output channel scales along `channel_axis` of the result)."""
        xq = self.at_bits(x, 8)
        wq, ws = self.weights(w, 0)
        k = int(np.prod(w.shape[1:]))
        acc_prec = xq.precision + bitlen(int(np.abs(wq).max()) + 1) + 1 + bitlen(k)
        acc_scale = xq.scale * np.broadcast_to(ws, (w.shape[0],))
        args = [xq.var, self.b.constant(wq.astype(np.int32))]
        # x at an offset c: sum w (q / s + c) = (sum w_q q + c s sum w_q) / (s s_w), c s an
        # integer (`shift_of`); the clamp after this layer on its shifted grid: its real 0
        # is -top, so c' s_acc (its offset in accumulator units) comes off the accumulator
        shift = round(xq.offset * xq.scale) * wq.reshape(len(wq), -1).sum(1)
        if node.name in self.shifted:
            shift = shift - np.round(self.shift_of(self.shifted[node.name])[1] * acc_scale)
        if bias is not None or np.any(shift):
            real = np.zeros(w.shape[0]) if bias is None else \
                np.broadcast_to(bias.reshape(-1), (w.shape[0],))
            bq = quantize("bias", real * acc_scale, 1.0, acc_prec).astype(np.int64) + shift
            args.append(self.b.constant(bq.astype(np.int32)))
        shape = (-1,) + (1,) * (self.g.types[node.name].ndim - 1 - channel_axis)
        y = make(*args)
        self.finish(node, QTensor(y, acc_scale.reshape(shape) if ws.size > 1
                                  else float(acc_scale[0])))

    def padding(self, node: Node, pads, window, strides, dilation) -> list[tuple[int, int]]:
        """(before, after) padding of the spatial axes (NNEF's [] is automatic: the output
        shape's total, the smaller half first)."""
        ins = self.g.types[node.inputs[0]].shape[-len(window):]
        outs = self.g.types[node.name].shape[-len(window):]
        if not pads:
            total = [max(0, (o - 1) * s + (k - 1) * d + 1 - i)
                     for i, o, k, s, d in zip(ins, outs, window, strides, dilation)]
            pads = [(t // 2, t - t // 2) for t in total]
        return [tuple(p) for p in list(pads)[-len(window):]]

    def pad(self, x: Var, pairs: list[tuple[int, int]], fill: int) -> tuple[Var, list[int]]:
        """CVM pads both sides of an axis alike: x with an asymmetric padding's excess over
        its smaller side concatenated as blocks of `fill`, and the padding left per side."""
        for axis, (before, after) in enumerate(pairs, len(x.shape) - len(pairs)):
            m = min(before, after)
            for extra, first in ((before - m, True), (after - m, False)):
                if extra:
                    shape = [*x.shape[:axis], extra, *x.shape[axis + 1:]]
                    block = self.b.constant(np.full(shape, fill, np.int32))
                    x = self.b.concatenate([block, x] if first else [x, block], axis=axis)
        return x, [min(p) for p in pairs]

    def conv(self, node: Node) -> None:
        """NNEF conv -> conv2d (zero padding; an asymmetric padding's excess concatenated
        as zeros, `pad`; for a shifted input, whose real 0 is not the integer 0, a
        correction per output position where the window reaches the padding)."""
        a = node.attrs
        if len(node.inputs) < 2 or node.inputs[1] not in self.g.constants:
            raise unsupported(node, "the filter must be a weight")
        w = self.g.constants[node.inputs[1]]
        stride, dilation = list(a["stride"]) or [1, 1], list(a["dilation"]) or [1, 1]
        pairs = self.padding(node, a["padding"], w.shape[2:], stride, dilation)
        if any(map(any, pairs)) and a.get("border") not in ("constant", None):
            raise unsupported(node, f"border {a.get('border')!r}: conv2d pads with zeros")
        bias = self.g.constants.get(node.inputs[2]) if len(node.inputs) > 2 else None
        groups = a.get("groups", 1) or self.g.types[node.inputs[0]].shape[1]
        t = self.values[node.inputs[0]]
        zero = -round(t.offset * t.scale)  # the integer that stands for the real 0

        def make(x: Var, *args: Var) -> Var:
            x, padding = self.pad(x, pairs, 0)
            y = self.b.conv2d(x, *args, padding=padding, stride=stride, dilation=dilation,
                              groups=groups)
            if not (zero and any(map(any, pairs))):
                return y
            # a shifted input's padding: the integer 0 stands for the real offset, so each
            # position takes zero * (the sum of the weights on its padded taps)
            shape = self.g.types[node.inputs[0]].shape
            taps = np.pad(np.zeros(shape), [(0, 0), (0, 0), *pairs], constant_values=1)
            padded = lookup("conv2d").run_reference(
                [taps, self.weights(w, 0)[0]],
                Attrs({"padding": [0, 0], "stride": stride, "dilation": dilation,
                       "groups": groups}))[0]
            return self.b.broadcast_add(y, self.b.constant((zero * padded).astype(np.int32)))
        self.linear_layer(node, node.inputs[0], w, bias, make)

    def deconv(self, node: Node) -> None:
        """deconv (transposed conv) -> a conv2d over the input zero-upsampled by the stride
        (`upsampling`, then times a 0/1 mask), with the filter flipped and its channels
        swapped, padded (k - 1) d - p_before on each side; a slice keeps the deconv's
        output (the rest reads only the zeros past the input)."""
        a = node.attrs
        if len(node.inputs) < 2 or node.inputs[1] not in self.g.constants:
            raise unsupported(node, "the filter must be a weight")
        w = self.g.constants[node.inputs[1]]
        window = w.shape[2:]
        x_shape, out_shape = self.g.types[node.inputs[0]].shape, self.g.types[node.name].shape
        stride, dilation = list(a["stride"]) or [1, 1], list(a["dilation"]) or [1, 1]
        pads = list(a["padding"]) or [  # automatic: the total the output shape implies
            (t // 2, t - t // 2) for t in ((i - 1) * s + (k - 1) * d + 1 - o for i, o, k, s, d
                                           in zip(x_shape[2:], out_shape[2:], window, stride,
                                                  dilation))]
        conv_pad = [(k - 1) * d - p for k, d, (p, _) in zip(window, dilation, pads)]
        if len(window) != 2 or len(set(stride)) != 1 or min(conv_pad) < 0 or any(
                i * s + 2 * c - (k - 1) * d < o for i, s, c, k, d, o in zip(
                    x_shape[2:], stride, conv_pad, window, dilation, out_shape[2:])):
            raise unsupported(node, f"stride {stride}, padding {pads}: only 2-D deconvs "
                                    f"with equal strides and padding below the filter's "
                                    f"extent map to conv2d")
        if any(p for pair in pads for p in pair) and a.get("border") not in ("constant", None):
            raise unsupported(node, f"border {a.get('border')!r}: conv2d pads with zeros")
        groups = a.get("groups", 1) or x_shape[1]
        cin, cout_g = w.shape[:2]
        conv_w = w.reshape(groups, cin // groups, cout_g, *window).swapaxes(1, 2).reshape(
            groups * cout_g, cin // groups, *window)[:, :, ::-1, ::-1]
        bias = self.g.constants.get(node.inputs[2]) if len(node.inputs) > 2 else None
        s = stride[0]

        def make(x: Var, *args: Var) -> Var:
            if s > 1:
                mask = np.zeros((1, 1, x_shape[2] * s, x_shape[3] * s), np.int32)
                mask[:, :, ::s, ::s] = 1
                up = self.b.broadcast_mul(self.b.upsampling(x, scale=s), self.b.constant(mask))
                x = self.b.cvm_clip(up, precision=x.precision)
            y = self.b.conv2d(x, *args, padding=conv_pad, stride=[1, 1], dilation=dilation,
                              groups=groups)
            if tuple(y.shape) == tuple(out_shape):
                return y
            return self.b.nnef_slice(y, begin=[0] * 4, end=list(out_shape), strides=[1] * 4)
        self.linear_layer(node, node.inputs[0], conv_w, bias, make)

    def matmul(self, node: Node) -> None:
        """matmul by a weight -> dense without bias; of two activations -> `product`."""
        if not self.layers.weights_of(node):
            return self.product(node)
        self.dense(node, node, None)

    def product(self, node: Node) -> None:
        """matmul of two activations (attention's q k^T, its product with v), A [..., M, K]
        and B [..., K, N] at the activation bits: A as [..., M, 1, K] times B as
        [..., 1, N, K] (`broadcast_mul`), summed over K (`sum`): precision p_a + p_b +
        bitlen(K), scale s_a s_b; then a requantization."""
        a, b = node.inputs
        rank = self.g.types[a].ndim
        if self.g.types[b].ndim != rank or rank + 1 > 6:
            raise unsupported(node, "only a matmul of two activations of one rank, at most 5, "
                                    "maps to broadcast_mul and sum")
        bits = self.operand_bits[node.name]
        qa, qb = self.at_bits(a, bits), self.at_bits(b, bits)

        def rows(v: Var, transposed: bool) -> Var:  # [..., rows, K]
            if not transposed:
                return v
            return self.b.nnef_transpose(v, axes=[*range(rank - 2), rank - 1, rank - 2])
        va = rows(qa.var, node.attrs.get("transposeA", False))
        vb = rows(qb.var, not node.attrs.get("transposeB", False))
        va = self.b.nnef_reshape(va, target_shape=[*va.shape[:-1], 1, va.shape[-1]])
        vb = self.b.nnef_reshape(vb, target_shape=[*vb.shape[:-2], 1, *vb.shape[-2:]])
        y = self.b.sum(self.b.broadcast_mul(va, vb), axes=[rank])
        self.finish(node, QTensor(y, qa.scale * qb.scale))

    def dense(self, node: Node, matmul: Node, bias: np.ndarray | None) -> None:
        """matmul by a weight (+ a weight bias) -> dense (an activation of rank above 2
        reshaped to rows and back)."""
        x, w = matmul.inputs
        rank = self.g.types[x].ndim
        w = self.g.constants.get(w)
        if w is None or matmul.attrs.get("transposeA") or rank < 2 or w.ndim < 2 \
                or any(d != 1 for d in w.shape[:-2]):
            raise unsupported(node, "only an activation times a weight matrix maps to dense")
        w = w.reshape(w.shape[-2:])  # leading unit axes (an unsqueezed weight) dropped
        w = w if matmul.attrs.get("transposeB") else w.T
        out = list(self.g.types[node.name].shape)

        def make(v: Var, *args: Var) -> Var:
            if rank == 2:
                return self.b.dense(v, *args)
            rows = self.b.nnef_reshape(v, target_shape=[int(np.prod(v.shape[:-1])), v.shape[-1]])
            return self.b.nnef_reshape(self.b.dense(rows, *args), target_shape=out)
        self.linear_layer(node, x, w, bias, make, rank - 1)

    def linear(self, node: Node) -> None:
        """A compound layer of matmul then add (NNEF linear): dense with bias."""
        body = self.layers.bodies[node.name]
        matmul = next(n for n in body if n.op == "matmul")
        add = body[-1]
        bias = next((self.g.constants[i] for i in add.inputs if i in self.g.constants), None)
        self.dense(node, matmul, bias)

    def operand(self, name: str, scale: float, bits: int) -> Var:
        """An add / sub / concat operand at `scale`: a tensor requantized, a weight quantized."""
        if name in self.g.constants:
            return self.b.constant(quantize(name, self.g.constants[name], scale, bits)
                                   .astype(np.int32))
        return self.requant(self.values[name], scale, bits).var

    def factor(self, name: str, bits: int) -> QTensor:
        """A mul operand: a tensor at no more than `bits` bits, or a weight at 8 bits."""
        if name not in self.g.constants:
            return self.at_bits(name, bits)
        scale = prec_max(8) / self.threshold_of(name)
        w = quantize(name, self.g.constants[name], scale, 8).astype(np.int32)
        return QTensor(self.b.constant(w), scale)

    def threshold_of(self, name: str) -> float:
        """A tensor's threshold, or a weight's absmax."""
        if name in self.g.constants:
            return float(np.abs(self.g.constants[name]).max()) or 1.0
        return self.thr[name]

    def binary(self, node: Node) -> None:
        """add / sub / mul of two values (at least one a tensor)."""
        a, b = node.inputs
        same = self.g.types[a].shape == self.g.types[b].shape
        if node.op == "mul":
            bits = self.operand_bits.get(node.name, self.opt.bits)
            qa, qb = self.factor(a, bits), self.factor(b, bits)
            y = self.b.broadcast_mul(qa.var, qb.var)
            return self.finish(node, QTensor(y, qa.scale * qb.scale))
        scale = prec_max(WIDE) / max(self.threshold_of(a), self.threshold_of(b))
        va, vb = self.operand(a, scale, WIDE), self.operand(b, scale, WIDE)
        op = ("elemwise_" if same else "broadcast_") + node.op
        self.finish(node, QTensor(getattr(self.b, op)(va, vb), scale))

    def concat(self, node: Node) -> None:
        """concat: every input at the output's scale; for a model output (`sliced_outputs`,
        `reaches_output`) whose parts' thresholds differ, each part at its own threshold's
        scale (times the outputs' 2^R), the output's scale one per slice along the axis."""
        bits, axis = self.out_bits(node), node.attrs["axis"]
        scales = [self.scale(node.name, bits)] * len(node.inputs)
        if self.sliced_outputs and self.reaches_output(node.name):
            part = [prec_max(bits) / (self.threshold_of(i) * 2.0 ** self.opt.output_range_bits)
                    for i in node.inputs]
            if len(set(part)) > 1:
                scales = part
        parts = [self.operand(i, s, bits) for i, s in zip(node.inputs, scales)]
        y = self.b.concatenate(parts, axis=axis)
        if len(set(scales)) == 1:
            self.values[node.name] = QTensor(y, scales[0])
            return
        sizes = [self.g.types[i].shape[axis] for i in node.inputs]
        self.sliced.add(node.name)
        self.values[node.name] = QTensor(y, sliced_scale(scales, axis % len(y.shape), sizes,
                                                         len(y.shape)))

    def reaches_output(self, name: str) -> bool:
        """Whether `name` is a model output that no layer reads, or is read only by one
        reshape / squeeze / unsqueeze / transpose whose result does the same."""
        readers = [n for n in self.g.nodes if name in n.inputs]
        if name in self.g.outputs:
            return not readers
        return len(readers) == 1 and readers[0].op in RESHAPES and \
            self.reaches_output(readers[0].name)

    def pool_geometry(self, node: Node, attrs):
        """(window, strides, (before, after) padding) of a 2-D NCHW pool, or the unsupported
        error."""
        size, stride = list(attrs["size"]), list(attrs["stride"]) or [1] * 4
        dil = list(attrs["dilation"]) or [1] * 4
        if len(size) != 4 or size[:2] != [1, 1] or stride[:2] != [1, 1] or set(dil) != {1} \
                or any(p for pair in list(attrs["padding"])[:2] for p in pair):
            raise unsupported(node, "only 2-D NCHW windows map to CVM pools")
        return size[2:], stride[2:], self.padding(node, attrs["padding"], size[2:],
                                                  stride[2:], dil[2:])

    def avg_pool(self, node: Node) -> None:
        """box (normalized: average pool) -> depthwise conv2d with unit weights, divided
        in the requantization by each position's tap count."""
        x = node.inputs[0]
        window, strides, pairs = self.pool_geometry(node, node.attrs)
        padded = any(map(any, pairs))
        if padded and node.attrs.get("border") not in ("ignore", "constant"):
            raise unsupported(node, f"border {node.attrs.get('border')!r}: only 'constant' "
                                    f"(zeros) and 'ignore' average pools map to CVM")
        xq = self.at_bits(x, 8)
        channels = self.g.types[x].shape[1]
        ones = self.b.constant(np.ones((channels, 1, *window), np.int32))
        xp, padding = self.pad(xq.var, pairs, 0)
        y = self.b.conv2d(xp, ones, padding=padding, stride=strides, groups=channels)
        taps = np.prod(window)
        if node.attrs.get("normalize") and node.attrs.get("border") == "ignore" and padded:
            counts = lookup("box").run_reference(
                [np.ones((1, 1, *self.g.types[x].shape[2:]))],
                Attrs({**node.attrs, "normalize": False}))[0]
            taps = counts
        elif not node.attrs.get("normalize"):
            taps = 1
        self.finish(node, QTensor(y, xq.scale * np.asarray(taps, np.float64)))

    def sum_reduce(self, node: Node) -> None:
        """sum_reduce (normalized: mean_reduce, global pooling) -> sum, then the division by
        the element count inside the requantization."""
        x = node.inputs[0]
        xq = self.at_bits(x, self.opt.bits)
        axes = list(node.attrs["axes"])
        count = self.g.types[x].size // self.g.types[node.name].size
        y = self.b.sum(xq.var, axes=axes, keepdims=True)
        self.finish(node, QTensor(y, xq.scale * (count if node.attrs.get("normalize") else 1)))

    def max_pool(self, node: Node) -> None:
        """max_pool (argmax_pool + sample) -> max_pool2d; the scale and offset pass."""
        pool = next(n for n in self.layers.bodies[node.name] if n.op == "argmax_pool")
        window, strides, pairs = self.pool_geometry(node, pool.attrs)
        if any(map(any, pairs)) and pool.attrs.get("border") not in ("ignore", "-infinity"):
            raise unsupported(node, f"border {pool.attrs.get('border')!r}: max_pool2d's "
                                    f"padding takes no part ('ignore')")
        t = self.values[node.inputs[0]]
        # an excess of padding on one side: blocks of the least value, which no max picks
        x, padding = self.pad(t.var, pairs, -prec_max(t.precision))
        y = self.b.max_pool2d(x, pool_size=window, strides=strides, padding=padding)
        self.values[node.name] = QTensor(y, t.scale, t.offset)

    def movement(self, node: Node) -> None:
        """reshape, squeeze, unsqueeze, transpose, slice, nearest upsampling: the scale
        and offset pass."""
        t = self.values[node.inputs[0]]
        if node.op == "nnef.transpose":
            axes = list(node.attrs["axes"])
            rank = self.g.types[node.name].ndim
            y = self.b.nnef_transpose(t.var, axes=axes + list(range(len(axes), rank)))
        elif node.op == "nnef.slice":  # CVM's slice: every axis, its first and end index
            a = Attrs(node.attrs)
            stride = dict(zip(a.axes, a.stride or [1] * len(a.axes)))
            if any(s < 0 for s in stride.values()):
                raise unsupported(node, "a negative stride has no CVM slice form here")
            begin = slice_starts(self.g.types[node.inputs[0]].shape, a)
            steps = [stride.get(k, 1) for k in range(len(begin))]
            end = [b + s * (n - 1) + 1 for b, s, n in
                   zip(begin, steps, self.g.types[node.name].shape)]
            y = self.b.nnef_slice(t.var, begin=begin, end=end, strides=steps)  # text `slice`
        elif node.op == "debox":
            factor = set(node.attrs["size"][2:]) | set(node.attrs["stride"][2:])
            if len(factor) != 1 or list(node.attrs["size"])[:2] != [1, 1] or any(
                    p for pair in node.attrs["padding"] for p in pair):
                raise unsupported(node, "only equal nearest-neighbour factors map to "
                                        "upsampling")
            y = self.b.upsampling(t.var, scale=factor.pop())
        else:
            y = self.b.nnef_reshape(t.var, target_shape=list(self.g.types[node.name].shape))
        scale = t.scale
        if node.inputs[0] in self.sliced:  # a concat's scale per slice, moved alike
            scale = moved_scale(t.scale, self.g.types[node.inputs[0]].shape,
                                self.g.types[node.name].shape,
                                axes if node.op == "nnef.transpose" else None)
            self.sliced.add(node.name)
        self.values[node.name] = QTensor(y, scale, t.offset)

    def gather(self, node: Node) -> None:
        """gather by weight indices (torch's split of packed q, k, v) -> take (and a reshape
        for a scalar index); the scale and offset pass."""
        t = self.values[node.inputs[0]]
        index = np.asarray(self.g.constants[node.inputs[1]]).astype(np.int64)
        axis = node.attrs["axis"] % self.g.types[node.inputs[0]].ndim
        size = self.g.types[node.inputs[0]].shape[axis]
        if not ((index >= -size) & (index < size)).all():
            raise unsupported(node, f"an index outside the axis of {size} (take clamps it)")
        # CVM-Runtime holds no rank-0 tensor: a scalar index as [i], its axis reshaped away
        y = self.b.take(t.var, self.b.constant((index % size).astype(np.int32).reshape(
            index.shape or (1,))), axis=axis)
        if not index.shape:
            y = self.b.nnef_reshape(y, target_shape=list(self.g.types[node.name].shape))
        self.values[node.name] = QTensor(y, t.scale, t.offset)

    def upsample(self, node: Node) -> None:
        """multilinear_upsample (bilinear resize), border 'replicate': along each spatial
        axis output[i] = ((den - num_i) x[j_i] + num_i x[j_i + 1]) / den with the spec's
        exact integer weights, as two `take`s (which clamp an index outside the input: the
        replicated border), `broadcast_mul` by the weights and an add; the divisions by
        den go into the scale; then a requantization."""
        a = node.attrs
        if a["border"] != "replicate":
            raise unsupported(node, f"border {a['border']!r}: only 'replicate' maps to take")
        t = self.at_bits(node.inputs[0], self.opt.bits)
        x, scale = t.var, t.scale
        rank = self.g.types[node.name].ndim
        for axis, (n, f) in enumerate(zip(self.g.types[node.inputs[0]].shape[2:], a["factor"]),
                                      2):
            i = np.arange(n * f)
            t_num, den = {"asymmetric": (i, f), "symmetric": (2 * i - f + 1, 2 * f)}.get(
                a["method"], (i * (n - 1), n * f - 1) if n > 1 else (0 * i, 1))
            j, num = t_num // den, t_num % den
            weight_shape = (-1,) + (1,) * (rank - 1 - axis)
            terms = [self.b.broadcast_mul(
                self.b.take(x, self.b.constant((j + c).astype(np.int32)), axis=axis),
                self.b.constant(w.reshape(weight_shape).astype(np.int32)))
                for c, w in ((0, den - num), (1, num))]
            x, scale = self.b.broadcast_add(*terms), scale * den
        self.finish(node, QTensor(x, scale))

    def split(self, node: Node) -> None:
        """split: one CVM slice per part; the scale passes."""
        t = self.values[node.inputs[0]]
        shape, axis = self.g.types[node.inputs[0]].shape, node.attrs["axis"] % len(
            self.g.types[node.inputs[0]].shape)
        start = 0
        for out in node.outputs:
            size = self.g.types[out].shape[axis]
            begin = [start if k == axis else 0 for k in range(len(shape))]
            end = [start + size if k == axis else n for k, n in enumerate(shape)]
            y = self.b.nnef_slice(t.var, begin=begin, end=end, strides=[1] * len(shape))
            self.values[out] = QTensor(y, t.scale)
            start += size

    def softmax(self, node: Node) -> None:
        """softmax: e = LUT(x - max) = round(exp(.) * 2^14), then round(out_max * e / sum e)
        as one integer divide (half up); the result's scale is out_max."""
        axes = list(next(n for n in self.layers.bodies[node.name] if n.op == "max_reduce")
                    .attrs["axes"])
        bits = min(self.out_bits(node), SOFTMAX_BITS)
        xq = self.at_bits(node.inputs[0], self.opt.bits)
        span = 2 * prec_max(xq.precision)
        z = self.b.broadcast_sub(xq.var, self.b.nnef_max(xq.var, axes=axes, keepdims=True))
        idx = self.b.broadcast_add(z, self.b.constant(np.array([span], np.int32)))
        table = np.round(np.exp((np.arange(span + 1) - span) / xq.scale) * 2 ** 14)
        e = self.b.cvm_lut(idx, self.b.constant(table.astype(np.int32)))
        total = self.b.sum(e, axes=axes, keepdims=True)
        two_top = self.b.constant(np.array([2 * prec_max(bits)], np.int32))
        num = self.b.broadcast_add(self.b.broadcast_mul(e, two_top), total)
        den = self.b.broadcast_mul(total, self.b.constant(np.array([2], np.int32)))
        y = self.b.cvm_clip(self.b.broadcast_div(num, den), precision=bits)
        self.values[node.name] = QTensor(y, float(prec_max(bits)))

    def elementwise(self, node: Node) -> None:
        """One real function per element: relu / clip when exact on the input grid, else a
        cvm_lut of the function, quantized to the layer's scale. A clamp to [0, hi] that
        feeds a product takes its input at the product's operand bits (relu / clip on any
        grid); every other layer at the activation bits (a table's index)."""
        (x,) = self.layers.activations_of(node)
        wide = node.name in self.wide and _clamps_at_zero(self.layers, node)
        xq = self.at_bits(x, self.out_bits(node) if wide else self.opt.bits)
        top = prec_max(xq.precision)
        grid = np.arange(-top, top + 1)
        f = apply_elementwise(self.layers, node, grid / xq.scale)
        finite = np.isfinite(f)
        # A function finite only above (or below) some point, as sqrt(var + eps) or log:
        # the table spans that part of the grid, and cvm_lut clamps the others' indices
        # into it (f of the nearest integer where it is finite).
        first, last = int(finite.argmax()), len(f) - 1 - int(finite[::-1].argmax())
        if not finite[first:last + 1].all() or (first > 0 and last < len(f) - 1):
            raise unsupported(node, "the function is not finite on the input's range")
        grid, f = grid[first:last + 1], f[first:last + 1]
        low, high = f.min(), f.max()
        if len(grid) == 2 * top + 1 and np.allclose(f, np.clip(grid / xq.scale, low, high),
                                                      rtol=1e-6, atol=1e-9 / xq.scale):
            lo, hi = int(np.round(low * xq.scale)), int(np.round(high * xq.scale))
            y = self.b.relu(xq.var) if lo == 0 and hi == top else \
                xq.var if (lo, hi) == (-top, top) else self.b.clip(xq.var, a_min=lo, a_max=hi)
            self.values[node.name] = QTensor(y, xq.scale)
            return
        bits = self.out_bits(node)
        scale = self.scale(node.name, bits)
        idx = xq.var if grid[0] == 0 else \
            self.b.broadcast_add(xq.var, self.b.constant(np.array([-grid[0]], np.int32)))
        table = quantize(node.name, f, scale, bits).astype(np.int32)
        self.values[node.name] = QTensor(self.b.cvm_lut(idx, self.b.constant(table)), scale)

    def layer(self, node: Node) -> None:
        """Quantize one layer by its rule (`rule_of`)."""
        if node.name in self.shifted.values():
            return  # computed by the layer before it (`finish`)
        rule = rule_of(self.layers, node)
        if rule is None:
            body = _primitives(self.layers, node)
            raise unsupported(node, f"no quantization rule for it (its primitives: "
                                    f"{', '.join(body)}); see docs/quantize.md")
        if rule.checks_weights:
            bad = [w for w in self.layers.weights_of(node)
                   if not np.isfinite(self.g.constants[w]).all()]
            if bad:
                raise unsupported(node, f"weight '{bad[0]}' holds a value that is not finite")
        try:
            rule.rewrite(self, node)
        except FixedPointError as e:  # named, and still a FixedPointError (quantize_graph)
            named = unsupported(node, e.message)
            raise FixedPointError(named.message, named.span) from None

    def run(self) -> tuple[Graph, dict[str, float], dict[str, tuple[float, int]],
                           dict[str, float]]:
        """The integer graph, each float value's scale (an output's per slice an array,
        `sliced_scale`), the inputs' (scale, precision), and the offset of each float value
        at a nonzero one (`QTensor`)."""
        g, bits = self.g, self.opt.bits
        inputs = {}
        for name in g.inputs:
            if g.types[name].dtype != "float32":
                raise CvmcError(f"input '{name}' is {g.types[name].dtype}: cvmc quantize "
                                f"takes float models")
            var = self.b.input(name, g.types[name].shape, "int8", precision=bits)
            self.values[name] = QTensor(var, self.scale(name, bits))
            inputs[name] = (self.values[name].scale, bits)
        for node in g.nodes:
            self.layer(node)
        outs = []
        for name in g.outputs:
            t = self.values[name]
            per_slice = name in self.sliced and sum(n > 1 for n in np.shape(t.scale)) == 1
            if t.precision > self.opt.output_bits or (np.ndim(t.scale) and not per_slice):
                t = self.requant(t, self.scale(name, self.opt.output_bits), self.opt.output_bits)
                self.values[name] = t
            outs.append(t.var)
        graph = self.b.build(outputs=outs)
        names = {t.var.name: f for f, t in self.values.items()}
        return (rename(graph, names), {f: t.scale for f, t in self.values.items()
                                       if np.ndim(t.scale) == 0 or f in g.outputs}, inputs,
                {f: t.offset for f, t in self.values.items() if t.offset})


RESHAPES = ("nnef.reshape", "nnef.squeeze", "unsqueeze", "nnef.transpose")


def moved_scale(scale: np.ndarray, before: tuple[int, ...], after: tuple[int, ...],
                axes: list[int] | None) -> np.ndarray:
    """A per-element scale of a tensor of shape `before` after its transpose by `axes`
    (None: a reshape to `after`), each axis along which it does not vary collapsed to 1."""
    full = np.broadcast_to(scale, before)
    if axes is None:
        full = full.reshape(after)
    else:
        full = full.transpose(axes + list(range(len(axes), len(before))))
    for a in range(full.ndim):
        first = full.take([0], axis=a)
        if (full == first).all():
            full = first
    return np.ascontiguousarray(full)


def rename(graph: Graph, names: dict[str, str]) -> Graph:
    """Give built values the float names they stand for (the first name each, where free)."""
    taken = set(graph.values())
    mapping = {}
    for old, new in names.items():
        if old != new and new not in taken and new not in mapping.values():
            mapping[old] = new
            taken.add(new)
    if not mapping:
        return graph

    def m(name: str) -> str:
        return mapping.get(name, name)
    nodes = [Node(n.op, tuple(map(m, n.inputs)), tuple(map(m, n.outputs)), n.attrs, n.span)
             for n in graph.nodes]
    return graph.replace(inputs=[m(i) for i in graph.inputs],
                         outputs=[m(o) for o in graph.outputs], nodes=nodes,
                         types={m(k): v for k, v in graph.types.items()})


@dataclass(frozen=True)
class LayerRule:
    """One entry of the quantizer's table (`LAYER_RULES`): where `match(layers, node)`
    holds, `rewrite(rewriter, node)` builds the layer's integer ops. `checks_weights`:
    the layer's weights must be finite first (a table of a function computes it, and
    checks it, on the grid itself)."""

    match: Callable[[Layers, Node], bool]
    rewrite: Callable[[Rewriter, Node], None]
    checks_weights: bool = True


def _primitives(layers: Layers, node: Node) -> tuple[str, ...]:
    """The ops a layer is made of, in order (a primitive layer: its own op)."""
    return tuple(n.op for n in layers.bodies.get(node.name, [node]))


def _made_of(*ops: str) -> Callable[[Layers, Node], bool]:
    """A layer made of `ops`, in order."""
    return lambda layers, node: _primitives(layers, node) == ops


def _softmax(layers: Layers, node: Node) -> bool:
    """NNEF's softmax fragment, expanded: the fuse-transformer pass's `SOFTMAX` pattern."""
    body = layers.bodies.get(node.name)
    if body is None:
        return False
    m = match(layers.graph.replace(nodes=body, outputs=list(node.outputs)), SOFTMAX,
              body[-1])
    return m is not None and len(m.nodes) == len(body) and softmax_axes(m) is not None


def _binary(layers: Layers, node: Node) -> bool:
    """add / sub / mul with an activation operand."""
    return _primitives(layers, node) in (("add",), ("sub",), ("mul",)) and \
        bool(layers.activations_of(node))


LAYER_RULES = [
    LayerRule(_made_of("conv"), Rewriter.conv),
    LayerRule(_made_of("matmul"), Rewriter.matmul),
    LayerRule(_made_of("matmul", "add"), Rewriter.linear),
    LayerRule(_made_of("concat"), Rewriter.concat),
    LayerRule(_made_of("deconv"), Rewriter.deconv),
    LayerRule(_made_of("box"), Rewriter.avg_pool),
    LayerRule(_made_of("sum_reduce"), Rewriter.sum_reduce),
    LayerRule(_made_of("argmax_pool", "sample"), Rewriter.max_pool),
    *(LayerRule(_made_of(op), Rewriter.movement) for op in (
        "nnef.reshape", "nnef.squeeze", "unsqueeze", "nnef.transpose", "nnef.slice", "debox")),
    LayerRule(_made_of("split"), Rewriter.split),
    LayerRule(lambda layers, node: _primitives(layers, node) == ("gather",)
              and node.inputs[1] in layers.graph.constants, Rewriter.gather),
    LayerRule(_made_of("multilinear_upsample"), Rewriter.upsample),
    LayerRule(_softmax, Rewriter.softmax),
    LayerRule(is_elementwise, Rewriter.elementwise, checks_weights=False),
    LayerRule(_binary, Rewriter.binary),
]


def _product_inner(layers: Layers, node: Node) -> int | None:
    """The length of the sum after a product of two activations (matmul: its inner axis;
    mul: 0, no sum), or None for any other layer."""
    g = layers.graph
    if _primitives(layers, node) == ("matmul",) and not layers.weights_of(node):
        shape = g.types[node.inputs[0]].shape
        return shape[-2] if node.attrs.get("transposeA") else shape[-1]
    if _primitives(layers, node) == ("mul",) and len(layers.activations_of(node)) == 2:
        return 0
    return None


# Layers whose output is their input's integers rearranged: a product's wide operand is
# made wide by the layer before them.
PASS_THROUGH = (Rewriter.movement, Rewriter.split, Rewriter.gather, Rewriter.max_pool)


def product_operands(layers: Layers, options: Options) -> tuple[dict[str, int], dict[str, int]]:
    """The operand bits of each product of two activations, and the bits each layer that
    feeds one (through reshapes, transposes, slices, splits, gathers, max pools and clamps
    to [0, hi]) gives its result.

    The rule: a product's operands take b = min(product_bits, (31 - bitlen(K)) // 2) bits
    each (at least the activation bits), K the length of the sum that follows the product
    (matmul's inner axis; 0 for an element-wise mul: bitlen(0) = 0), so that the product's
    precision 2b + bitlen(K) is at most 31 (int32 holds it, and the requantization after it
    keeps a multiplier bit, `plan_requant`): 15 x 15 for a mul (SiLU's x * sigmoid(x), a
    squeeze-excite gate times its feature map), 13 x 13 for attention's matmuls with K of
    8 to 31, 12 x 12 for K of 32 to 127. The layer that makes an operand (a conv, a lookup
    table, softmax, an add) requantizes its result to those bits; conv2d, dense, average
    pools and a lookup table's index read any input at the activation bits (`at_bits`), as
    CVM's conv2d and dense take at most 8-bit data and a table has one entry per index."""
    operand: dict[str, int] = {}
    wide: dict[str, int] = {}
    for node in layers.graph.nodes:
        k = _product_inner(layers, node)
        if k is not None:
            bits = max(options.bits, min(options.product_bits, (31 - bitlen(k)) // 2))
            operand[node.name] = bits
            for a in layers.activations_of(node):
                wide[a] = max(wide.get(a, 0), bits)
    for node in reversed(layers.graph.nodes):
        bits = max((wide.get(o, 0) for o in node.outputs), default=0)
        rule = rule_of(layers, node)
        if bits and rule is not None and (rule.rewrite in PASS_THROUGH or (
                rule.rewrite is Rewriter.elementwise and _clamps_at_zero(layers, node))):
            x = layers.activations_of(node)[0]
            wide[x] = max(wide.get(x, 0), bits)
    return operand, {n: b for n, b in wide.items() if b > options.bits}


def _clamps_at_zero(layers: Layers, node: Node) -> bool:
    """An element-wise layer that computes clamp(x, 0, hi) for some hi > 0 (relu, relu6)."""
    if not is_elementwise(layers, node):
        return False
    x = np.concatenate([np.linspace(-8, 8, 257), [-1e6, 1e6]])
    f = apply_elementwise(layers, node, x)
    return bool(f.max() > 0) and np.array_equal(f, np.clip(x, 0, f.max()))


def _reads_linearly(layers: Layers, node: Node, x: str) -> bool:
    """`node` is a conv, a matmul by a weight or a linear layer whose data input is x (the
    one input it reads): a sum of x's elements times weights."""
    body = layers.bodies.get(node.name, [node])
    rule = rule_of(layers, node)
    return rule is not None and rule.rewrite in (Rewriter.conv, Rewriter.matmul,
                                                 Rewriter.linear) \
        and bool(layers.weights_of(body[0])) and body[0].inputs[0] == x \
        and layers.activations_of(node) == [x]


def shifted_clamps(layers: Layers) -> dict[str, str]:
    """Clamps to [0, hi] (relu, relu6) stored on the whole grid, {layer before: clamp}.

    A clamp whose input is a conv's, deconv's or dense's result that nothing else reads,
    and whose result only convs and denses read (`_read_linearly`), stores [0, threshold]
    as q = round((x - c) s) in [-top, top], c = threshold / 2: twice the resolution of
    [0, threshold] in [0, top]. The layer before computes it: its bias less c in
    accumulator units, then its requantization to s, whose saturation at -top (real 0) is
    the clamp. Each reader adds c s sum(w_q) per output channel to its bias (exact
    integers), and a conv pads with -top (its real 0) instead of conv2d's zeros."""
    g = layers.graph
    consumers, producer = g.consumers(), {o: n for n in g.nodes for o in n.outputs}
    linear = (Rewriter.conv, Rewriter.deconv, Rewriter.matmul, Rewriter.linear)
    shifted = {}
    for node in g.nodes:
        acts = layers.activations_of(node)
        before = producer.get(acts[0]) if len(acts) == 1 else None
        if before is None or before.name in g.outputs \
                or len(consumers.get(before.name, [])) != 1 \
                or not layers.weights_of(layers.bodies.get(before.name, [before])[0]) \
                or not _clamps_at_zero(layers, node):
            continue
        rule = rule_of(layers, before)
        if rule is not None and rule.rewrite in linear and _read_linearly(layers, node.name):
            shifted[before.name] = node.name
    return shifted


def _read_linearly(layers: Layers, name: str) -> bool:
    """Only convs and denses read `name` (through reshapes, transposes, slices and max
    pools, which keep an offset), and it is no model output."""
    g = layers.graph
    readers = g.consumers().get(name, [])
    if not readers or name in g.outputs:
        return False
    for r in readers:
        rule = rule_of(layers, r)
        through = rule is not None and rule.rewrite in (Rewriter.movement, Rewriter.max_pool)
        if not (_reads_linearly(layers, r, name) or through and _read_linearly(layers, r.name)):
            return False
    return True


def rule_of(layers: Layers, node: Node) -> LayerRule | None:
    """The first rule of `LAYER_RULES` that matches a layer, or None."""
    return next((r for r in LAYER_RULES if r.match(layers, node)), None)


def split_unruled(layers: Layers) -> Layers:
    """A compound layer that no rule covers (a user's own fragment: conv then relu) goes
    back to its primitives, each then a layer of its own."""
    nodes, bodies = [], dict(layers.bodies)
    for node in layers.graph.nodes:
        if node.name in bodies and rule_of(layers, node) is None:
            nodes.extend(bodies.pop(node.name))
        else:
            nodes.append(node)
    if len(nodes) == len(layers.graph.nodes):
        return layers
    return Layers(layers.graph.replace(nodes=nodes), bodies)


"""The layout pass: give conv2d and dense the packed weight layout their CPU kernels want.

`y = conv2d(x, w, b)` with a constant weight becomes

    wp   = layout_transform(w, src_layout = "OIHW", dst_layout = "OIHW16o4i")
    ws   = sum(w, axes = [1, 2, 3])
    comp = cvm_left_shift(ws, shift_bit = 7, precision = P)      # 128 * sum(w[o])
    y    = conv2d_packed(x, wp, comp, b, ...)

and constant folding then turns `wp` and `comp` into weights: nothing is repacked per call
(see `cvmc/ops/layout.py` for why the compensation makes the u8 x s8 form exact). Only
the llvm target runs this pass; every CPU gets the packed form, and the schedule table
picks VNNI, or a plain vector loop, for it.

A dense (M, K) x (N, K) becomes that conv on (M, K, 1, 1) data, between two reshapes.
Left as they are (their kernels keep the default schedule): grouped and depthwise convs,
a weight that is not a constant, and reductions longer than `MAX_PACKED_REDUCTION`.
"""
from __future__ import annotations

import numpy as np

from cvmc.ir import Graph, Node, TensorType
from cvmc.ops import lookup
from cvmc.ops.layout import MAX_PACKED_REDUCTION, WEIGHT_LAYOUT
from cvmc.ops.registry import Attrs
from cvmc.passes.precision import infer_precision


def _packable(graph: Graph, node: Node) -> bool:
    if node.op not in ("conv2d", "dense") or node.inputs[1] not in graph.constants:
        return False
    w = graph.types[node.inputs[1]].shape
    return node.attrs.get("groups", 1) == 1 and \
        int(np.prod(w[1:], dtype=np.int64)) <= MAX_PACKED_REDUCTION


def pack_conv_weights(graph: Graph, target: str | None = None) -> Graph:
    """Rewrite every packable conv2d into conv2d_packed on a packed weight; a dense
    (M, K) x (N, K) is the 1x1 conv of (M, K, 1, 1) data, between two reshapes. (The
    pipeline runs it for llvm only; `target` is that.)"""
    types, nodes = dict(graph.types), []
    taken = set(graph.values())

    def add(op: str, inputs: tuple[str, ...], attrs: dict, output: str, span=None) -> str:
        """Append `output = op(inputs, attrs)` (attributes normalized, shape inferred)."""
        d = lookup(op)
        attrs = dict(d.normalize_attrs(attrs))
        shape = d.infer_shapes([types[i] for i in inputs], Attrs(attrs))[0]
        types[output] = TensorType(shape, "int32")
        nodes.append(Node(op, inputs, (output,), attrs, span=span))
        return output

    def fresh(stem: str) -> str:
        name, k = stem, 0
        while name in taken:
            k += 1
            name = f"{stem}_{k}"
        taken.add(name)
        return name

    def packed_conv(x: str, w: str, bias: list[str], attrs: dict, out: str, span) -> None:
        oc = types[w].shape[0]
        packed = add("layout_transform", (w,), {"src_layout": "OIHW",
                                                 "dst_layout": WEIGHT_LAYOUT}, fresh(f"{w}_packed"))
        sums = add("sum", (w,), {"axes": [1, 2, 3]}, fresh(f"{w}_sum"))
        # |128 * sum(w[o])| <= 128 * 127 * C*KH*KW < 2^31 (C*KH*KW <= MAX_PACKED_REDUCTION).
        comp = add("cvm_left_shift", (sums,), {"shift_bit": 7, "precision": 32},
                   fresh(f"{w}_compensation"))
        add("conv2d_packed", (x, packed, comp, *bias), {**attrs, "channels": oc}, out, span)

    for node in graph.nodes:
        if not _packable(graph, node):
            nodes.append(node)
            continue
        (x, w, *bias), a, out = node.inputs, Attrs(node.attrs), node.outputs[0]
        if node.op == "conv2d":
            packed_conv(x, w, bias, {"padding": a.padding, "stride": a.stride,
                                     "dilation": a.dilation}, out, node.span)
            continue
        (m, k), n = types[x].shape, types[w].shape[0]
        x4 = add("reshape", (x,), {"target_shape": [m, k, 1, 1]}, fresh(f"{x}_nchw"))
        w4 = add("reshape", (w,), {"target_shape": [n, k, 1, 1]}, fresh(f"{w}_oihw"))
        y4 = fresh(f"{out}_nchw")
        packed_conv(x4, w4, bias, {}, y4, node.span)
        add("reshape", (y4,), {"target_shape": [m, n]}, out, node.span)
    return infer_precision(graph.replace(nodes=nodes, types=types))

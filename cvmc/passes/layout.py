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

`block_activations` then keeps the activations between two such convs in the kernels'
own layout, NCHW16c: a conv2d_packed whose result (after its unary element-wise epilogue:
shift, clip, relu) feeds another conv2d_packed's data writes it blocked and that conv
reads it blocked; a `layout_transform` back to NCHW serves any other consumer and a graph
output.
"""
from __future__ import annotations

import numpy as np

from cvmc.ir import Graph, Node, TensorType
from cvmc.ops import lookup
from cvmc.ops.layout import BLOCKED_LAYOUT, MAX_PACKED_REDUCTION, OC_BLOCK, WEIGHT_LAYOUT
from cvmc.ops.registry import Attrs, Fusion
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
        return _fresh(stem, taken)

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


def _blocked_chain(node: Node, consumers, outputs) -> list[Node]:
    """`node` (a conv2d_packed writing NCHW) and its unary element-wise epilogue: the nodes
    whose values can be blocked, up to a value that is a graph output or that several
    nodes (or a non-element-wise one) read."""
    chain = [node]
    while True:
        value = chain[-1].outputs[0]
        users = consumers.get(value, [])
        if value in outputs or len(users) != 1 or len(users[0].inputs) != 1 or \
                lookup(users[0].op).fusion is not Fusion.ELEMWISE:
            return chain
        chain.append(users[0])


def _reads_blocked(node: Node, value: str) -> bool:
    """True if `node` can read `value` in NCHW16c: a conv2d_packed taking it as its data."""
    return node.op == "conv2d_packed" and node.inputs[0] == value and \
        node.attrs["data_layout"] == "NCHW"


def block_activations(graph: Graph, target: str | None = None) -> Graph:
    """Keep conv2d_packed -> [unary element-wise ops] -> conv2d_packed activations in
    NCHW16c (the pipeline runs it for llvm only). Only a conv with a multiple of 16
    output channels is blocked: a blocked tensor then holds no padding channel, so every
    op in between computes exactly the values it computed on NCHW."""
    consumers, outputs = graph.consumers(), set(graph.outputs)
    taken = set(graph.values())
    attrs = {id(n): dict(n.attrs) for n in graph.nodes}
    renamed: dict[str, str] = {}  # chain end -> its blocked value's name
    unblock: dict[int, Node] = {}  # id(last node of a chain) -> the layout_transform after it
    for node in graph.nodes:
        if node.op != "conv2d_packed" or node.attrs["out_layout"] != "NCHW" or \
                node.attrs["channels"] % OC_BLOCK:
            continue
        chain = _blocked_chain(node, consumers, outputs)
        end = chain[-1].outputs[0]
        readers = [c for c in consumers.get(end, []) if _reads_blocked(c, end)]
        if not readers:
            continue
        attrs[id(node)]["out_layout"] = BLOCKED_LAYOUT
        for reader in readers:
            attrs[id(reader)]["data_layout"] = BLOCKED_LAYOUT
        if end in outputs or len(readers) < len(consumers[end]):
            # The others (and the graph output) keep the NCHW value under its name.
            blocked = _fresh(f"{end}_{BLOCKED_LAYOUT.lower()}", taken)
            renamed[end] = blocked
            unblock[id(chain[-1])] = Node(
                "layout_transform", (blocked,), (end,),
                {"src_layout": BLOCKED_LAYOUT, "dst_layout": "NCHW"}, span=chain[-1].span)
    nodes = []
    for n in graph.nodes:
        reads_blocked = n.op == "conv2d_packed" and attrs[id(n)]["data_layout"] != "NCHW"
        inputs = (renamed.get(n.inputs[0], n.inputs[0]), *n.inputs[1:]) if reads_blocked \
            else n.inputs
        nodes.append(Node(n.op, inputs, tuple(renamed.get(o, o) for o in n.outputs),
                          attrs[id(n)], span=n.span))
        if id(n) in unblock:
            nodes.append(unblock[id(n)])
    return infer_precision(graph.replace(nodes=nodes,
                                         types=_infer_shapes(graph, nodes, renamed)))


def _fresh(stem: str, taken: set[str]) -> str:
    """A value name not yet in `taken` (added to it)."""
    name, k = stem, 0
    while name in taken:
        k += 1
        name = f"{stem}_{k}"
    taken.add(name)
    return name


def _infer_shapes(graph: Graph, nodes: list[Node], renamed: dict[str, str]
                  ) -> dict[str, TensorType]:
    """Value types with every node output's shape inferred again, in order; a renamed
    value's new name takes its dtype (precisions are inferred afterwards)."""
    known = set(graph.inputs) | set(graph.weights())
    types = {k: v for k, v in graph.types.items() if k in known}
    dtypes = {o: graph.types[o].dtype for n in graph.nodes for o in n.outputs}
    dtypes.update({new: dtypes[old] for old, new in renamed.items()})
    for n in nodes:
        shapes = lookup(n.op).infer_shapes([types[i] for i in n.inputs], Attrs(n.attrs))
        types.update({o: TensorType(shape, dtypes[o]) for o, shape in zip(n.outputs, shapes)})
    return types

"""The layout pass: give conv2d and dense the packed weight layout their kernels want.

`y = conv2d(x, w, b)` with a constant weight becomes

    wp   = layout_transform(w, src_layout = "OIHW", dst_layout = "OIHW16o4i")
    ws   = sum(w, axes = [1, 2, 3])
    comp = cvm_left_shift(ws, shift_bit = 7, precision = P)      # 128 * sum(w[o])
    y    = conv2d_packed(x, wp, comp, b, ...)

and constant folding then turns `wp` and `comp` into weights: nothing is repacked per call
(see `cvmc/ops/packed.py` for why the compensation makes the u8 x s8 form exact). The
llvm and cuda targets run this pass; the schedule table then picks, per CPU, VNNI or a
plain vector loop for it, and on CUDA `dp4a` (`cvmc/lowering/rules.py`).

A dense (M, K) x (N, K) becomes that conv on (M, K, 1, 1) data, between two reshapes (on
the CPU; on CUDA dense stays as it is: `Target.packs`). A grouped conv is packed where each
group has whole 16-channel output blocks (its data stays NCHW). Left as they are (their
kernels keep the default schedule): depthwise convs (their own rule) and other grouped
ones, a weight that is not a constant, and reductions longer than `MAX_PACKED_REDUCTION`.

`block_activations` then keeps the activations between such convs in the kernels' own
layout, NCHW16c: a conv2d_packed result that feeds another conv2d_packed's data, through
element-wise epilogues (shift, clip, relu), residual joins (elemwise_add) and, on llvm,
depthwise convs and max pools (MobileNet's blocks, ResNet's stem: they become
depthwise_conv2d_blocked on a folded OIHW16o weight and max_pool2d_blocked), is written
blocked and read blocked; a `layout_transform` to NCHW16c brings a join's other operand
in, one back to NCHW serves any other reader and a graph output. Without them each 1x1
conv after a depthwise one repacked NCHW bytes into 4-channel words and wrote NCHW.
"""
from __future__ import annotations

import numpy as np

from cvmc.ir import Graph, Node
from cvmc.ops import lookup
from cvmc.ops.infer import retype
from cvmc.ops.packed import (
    BLOCKED_LAYOUT,
    DEPTHWISE_WEIGHT_LAYOUT,
    MAX_PACKED_REDUCTION,
    OC_BLOCK,
    WEIGHT_LAYOUT,
)
from cvmc.ops.registry import Attrs, Fusion
from cvmc.passes.simplify import eliminate_dead_code, fold_constants
from cvmc.passes.target import Target


def _packable(graph: Graph, node: Node, target: Target) -> bool:
    if not target.packs(node.op) or node.inputs[1] not in graph.constants:
        return False
    w = graph.types[node.inputs[1]].shape
    groups = node.attrs.get("groups", 1)
    # grouped: whole 16-channel output blocks per group (depthwise convs are not)
    return (groups == 1 or w[0] % (groups * OC_BLOCK) == 0) and \
        int(np.prod(w[1:], dtype=np.int64)) <= MAX_PACKED_REDUCTION


def pack_conv_weights(graph: Graph, target: Target) -> Graph:
    """Rewrite every packable conv2d into conv2d_packed on a packed weight; a dense
    (M, K) x (N, K) is the 1x1 conv of (M, K, 1, 1) data, between two reshapes (where
    `target` packs dense: llvm). The pipeline runs it for llvm and cuda."""
    types, nodes = graph.types, []
    taken = set(graph.values())

    def add(op: str, inputs: tuple[str, ...], attrs: dict, output: str, span=None) -> str:
        """Append `output = op(inputs, attrs)` (attributes normalized; typed by `retype`)."""
        attrs = dict(lookup(op).normalize_attrs(attrs))
        nodes.append(Node(op, inputs, (output,), attrs, span=span))
        return output

    def fresh(stem: str) -> str:
        return fresh_name(stem, taken)

    def packed_conv(x: str, w: str, oc: int, bias: list[str], attrs: dict, out: str,
                    span) -> None:
        packed = add("layout_transform", (w,), {"src_layout": "OIHW",
                                                 "dst_layout": WEIGHT_LAYOUT}, fresh(f"{w}_packed"))
        sums = add("sum", (w,), {"axes": [1, 2, 3]}, fresh(f"{w}_sum"))
        # |128 * sum(w[o])| <= 128 * 127 * C*KH*KW < 2^31 (C*KH*KW <= MAX_PACKED_REDUCTION).
        comp = add("cvm_left_shift", (sums,), {"shift_bit": 7, "precision": 32},
                   fresh(f"{w}_compensation"))
        add("conv2d_packed", (x, packed, comp, *bias), {**attrs, "channels": oc}, out, span)

    for node in graph.nodes:
        if not _packable(graph, node, target):
            nodes.append(node)
            continue
        (x, w, *bias), a, out = node.inputs, Attrs(node.attrs), node.outputs[0]
        if node.op == "conv2d":
            packed_conv(x, w, types[w].shape[0], bias, {"padding": a.padding, "stride": a.stride,
                                     "dilation": a.dilation, "groups": a.groups}, out,
                        node.span)
            continue
        (m, k), n = types[x].shape, types[w].shape[0]
        x4 = add("reshape", (x,), {"target_shape": [m, k, 1, 1]}, fresh(f"{x}_nchw"))
        w4 = add("reshape", (w,), {"target_shape": [n, k, 1, 1]}, fresh(f"{w}_oihw"))
        y4 = fresh(f"{out}_nchw")
        packed_conv(x4, w4, n, bias, {}, y4, node.span)
        add("reshape", (y4,), {"target_shape": [m, n]}, out, node.span)
    return retype(graph.replace(nodes=nodes))


def _elementwise(node: Node, types) -> bool:
    """An element-wise node whose inputs all have its output's shape (no broadcasting):
    it computes the same values on any layout of them."""
    out = types[node.outputs[0]].shape
    return lookup(node.op).fusion is Fusion.ELEMWISE and len(node.outputs) == 1 and \
        all(types[i].shape == out for i in node.inputs)


def _whole_blocks(shape: tuple[int, ...]) -> bool:
    """An NCHW shape whose channels fill NCHW16c blocks exactly."""
    return len(shape) == 4 and shape[1] % OC_BLOCK == 0


def _through(graph: Graph, node: Node, target: Target | None) -> bool:
    """A node with a blocked form on `target` (llvm): a depthwise conv2d on a constant
    weight (-> depthwise_conv2d_blocked) or a max_pool2d (-> max_pool2d_blocked). CUDA
    keeps them as they are (its depthwise rule and dlight schedule the NCHW ops)."""
    if target is None or target.kind != "llvm":
        return False
    if node.op == "max_pool2d":
        return True
    if node.op != "conv2d" or node.inputs[1] not in graph.constants:
        return False
    oc, ic = graph.types[node.inputs[1]].shape[:2]
    return ic == 1 and node.attrs["groups"] == oc == graph.types[node.inputs[0]].shape[1]


def _blockable(graph: Graph, target: Target | None) -> tuple[set[str], set[str]]:
    """(values that can be computed blocked, seeds). A conv2d_packed result can, so can a
    depthwise conv's or a max pool's whose data can (`_through`), and an element-wise
    node's when one of its inputs can: its other inputs (a ResNet join's shortcut) are the
    seeds, blocked by a layout_transform. Only whole blocks: a blocked tensor then holds
    no padding channel, so every op computes exactly the values it computed on NCHW."""
    types, blockable, seeds = graph.types, set(), set()
    for node in graph.nodes:
        out = node.outputs[0]
        if not _whole_blocks(types[out].shape):
            continue
        if node.op == "conv2d_packed" and node.attrs["out_layout"] == "NCHW" or \
                _through(graph, node, target) and node.inputs[0] in blockable:
            blockable.add(out)
        elif _elementwise(node, types) and any(i in blockable for i in node.inputs):
            others = [i for i in node.inputs if i not in blockable]
            if not any(i in graph.constants for i in others):
                seeds.update(others)
                blockable.add(out)
    return blockable, seeds


def block_activations(graph: Graph, target: Target | None = None) -> Graph:
    """Keep activations between conv2d_packed kernels in NCHW16c (llvm and cuda): a value
    is blocked when it can be (`_blockable`) and a layout-aware node reads it: a
    conv2d_packed as its data, or an element-wise node, depthwise conv or max pool
    computing blocked (those two then become their blocked ops, on llvm). Any other
    reader, and a graph output, reads an NCHW copy under the value's name."""
    blockable, seeds = _blockable(graph, target)
    consumers, outputs = graph.consumers(), set(graph.outputs)
    blocked: set[str] = set()

    def aware(node: Node, value: str) -> bool:
        """True if `node` reads `value` blocked once it is."""
        if node.op == "conv2d_packed":  # a grouped one reads NCHW data only
            return node.inputs[0] == value and node.attrs["data_layout"] == "NCHW" and \
                node.attrs["groups"] == 1
        return node.outputs[0] in blocked and (
            _elementwise(node, graph.types) or _through(graph, node, target) and
            node.inputs[0] == value)

    for value in reversed(list(graph.values())):  # readers are decided before their inputs
        readers = [c for c in consumers.get(value, []) if aware(c, value)]
        # A seed costs a transform: worth it for a blocked join only (a conv reads NCHW
        # data as fast as blocked).
        if readers and (value in blockable or value in seeds and any(
                c.op != "conv2d_packed" for c in readers)):
            blocked.add(value)
    taken = set(graph.values())
    # The blocked version's name: a new one where the NCHW value stays too (seeds, values
    # with other readers or that are graph outputs).
    name = {v: fresh_name(f"{v}_{BLOCKED_LAYOUT.lower()}", taken)
                if v in seeds or v in outputs or not all(aware(c, v) for c in consumers[v]) else v
                for v in sorted(blocked)}

    def transform(value: str, to_blocked: bool, span=None) -> Node:
        src, dst = (value, name[value]) if to_blocked else (name[value], value)
        layouts = ("NCHW", BLOCKED_LAYOUT) if to_blocked else (BLOCKED_LAYOUT, "NCHW")
        return Node("layout_transform", (src,), (dst,),
                    {"src_layout": layouts[0], "dst_layout": layouts[1]}, span=span)
    nodes = [transform(v, True) for v in graph.inputs if v in blocked]
    weights = len(nodes)  # where the depthwise weights' transforms go
    rewritten = False
    for node in graph.nodes:
        n = node  # what it becomes; `aware` asks about the node as it was
        if _through(graph, node, target) and node.outputs[0] in blocked:
            n, weight = _blocked_form(node, taken)
            nodes[weights:weights] = weight
            rewritten = True
        attrs = dict(n.attrs)
        if n.op == "conv2d_packed" and n.outputs[0] in blocked:
            attrs["out_layout"] = BLOCKED_LAYOUT
        if n.op == "conv2d_packed" and n.inputs[0] in blocked:
            attrs["data_layout"] = BLOCKED_LAYOUT
        inputs = tuple(name[i] if i in blocked and aware(node, i) else i for i in n.inputs)
        outs = tuple(name[o] if o in blocked and o not in seeds else o for o in n.outputs)
        nodes.append(Node(n.op, inputs, outs, attrs, span=n.span))
        nodes += [transform(o, o in seeds, n.span) for o in n.outputs
                  if o in blocked and name[o] != o]
    # a renamed value's new name declares its element type; `retype` gives its shape
    types = {**graph.types, **{name[v]: graph.types[v] for v in blocked}}
    graph = retype(graph.replace(nodes=nodes, types=types))
    # the depthwise weights' transforms become weights, as `pack_conv_weights`'s do
    return eliminate_dead_code(fold_constants(graph)) if rewritten else graph


def _blocked_form(node: Node, taken: set[str]) -> tuple[Node, list[Node]]:
    """(the blocked op of a `_through` node, the transform of its weight into
    OIHW16o: none for a pool). The caller renames its data and output."""
    if node.op == "max_pool2d":
        attrs = {k: v for k, v in node.attrs.items() if k != "layout"}
        return Node("max_pool2d_blocked", node.inputs, node.outputs, attrs, span=node.span), []
    x, w, *bias = node.inputs
    packed = fresh_name(f"{w}_{DEPTHWISE_WEIGHT_LAYOUT.lower()}", taken)
    transform = Node("layout_transform", (w,), (packed,),
                     {"src_layout": "OIHW", "dst_layout": DEPTHWISE_WEIGHT_LAYOUT},
                     span=node.span)
    a = node.attrs
    attrs = {"padding": a["padding"], "stride": a["stride"], "dilation": a["dilation"]}
    return Node("depthwise_conv2d_blocked", (x, packed, *bias), node.outputs, attrs,
                span=node.span), [transform]


def fresh_name(stem: str, taken: set[str]) -> str:
    """A value name not yet in `taken` (added to it)."""
    name, k = stem, 0
    while name in taken:
        k += 1
        name = f"{stem}_{k}"
    taken.add(name)
    return name

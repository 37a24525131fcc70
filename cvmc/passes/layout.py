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
from cvmc.ir.rewrite import Editor, Match, P, Rule, apply_rules
from cvmc.ops import lookup
from cvmc.ops.infer import infer_node
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


def op_node(op: str, inputs: tuple[str, ...], output: str, attrs: dict, span=None) -> Node:
    """`output = op(inputs, attrs)`, its attributes normalized (defaults filled in)."""
    return Node(op, inputs, (output,), dict(lookup(op).normalize_attrs(attrs)), span=span)


def _packable(target: Target):
    """The test of a conv2d / dense the layout pass packs on `target`."""
    def packable(e: Editor, node: Node) -> bool:
        if not target.packs(node.op) or node.inputs[1] not in e.graph.constants:
            return False
        w = e.types[node.inputs[1]].shape
        groups = node.attrs.get("groups", 1)
        # grouped: whole 16-channel output blocks per group (depthwise convs are not)
        return (groups == 1 or w[0] % (groups * OC_BLOCK) == 0) and \
            int(np.prod(w[1:], dtype=np.int64)) <= MAX_PACKED_REDUCTION
    return packable


def _packed_conv(e: Editor, x: str, w: str, oc: int, bias: list[str], attrs: dict,
                 out: str, span) -> Node:
    """conv2d_packed computing `out` on `w` packed, with its compensation (inserted)."""
    def add(op: str, inputs: tuple[str, ...], attrs: dict, stem: str) -> str:
        return e.add(op_node(op, inputs, e.fresh(stem), attrs, span)).name
    packed = add("layout_transform", (w,), {"src_layout": "OIHW", "dst_layout": WEIGHT_LAYOUT},
                 f"{w}_packed")
    sums = add("sum", (w,), {"axes": [1, 2, 3]}, f"{w}_sum")
    # |128 * sum(w[o])| <= 128 * 127 * C*KH*KW < 2^31 (C*KH*KW <= MAX_PACKED_REDUCTION).
    comp = add("cvm_left_shift", (sums,), {"shift_bit": 7, "precision": 32},
               f"{w}_compensation")
    return op_node("conv2d_packed", (x, packed, comp, *bias), out, {**attrs, "channels": oc},
                   span)


def _pack_conv(m: Match, e: Editor) -> Node:
    node = m.root
    (x, w, *bias), a = node.inputs, Attrs(node.attrs)
    return _packed_conv(e, x, w, e.types[w].shape[0], bias,
                        {"padding": a.padding, "stride": a.stride, "dilation": a.dilation,
                         "groups": a.groups}, node.outputs[0], node.span)


def _pack_dense(m: Match, e: Editor) -> Node:
    """dense (M, K) x (N, K): the 1x1 conv of (M, K, 1, 1) data, between two reshapes."""
    node = m.root
    (x, w, *bias), out = node.inputs, node.outputs[0]
    (rows, k), n = e.types[x].shape, e.types[w].shape[0]
    x4 = e.add(op_node("reshape", (x,), e.fresh(f"{x}_nchw"), {"target_shape": [rows, k, 1, 1]},
                       node.span)).name
    w4 = e.add(op_node("reshape", (w,), e.fresh(f"{w}_oihw"), {"target_shape": [n, k, 1, 1]},
                       node.span)).name
    y4 = e.add(_packed_conv(e, x4, w4, n, bias, {}, e.fresh(f"{out}_nchw"), node.span)).name
    return op_node("reshape", (y4,), out, {"target_shape": [rows, n]}, node.span)


def pack_conv_weights(graph: Graph, target: Target) -> Graph:
    """Rewrite every packable conv2d into conv2d_packed on a packed weight; a dense
    (M, K) x (N, K) is the 1x1 conv of (M, K, 1, 1) data, between two reshapes (where
    `target` packs dense: llvm). The pipeline runs it for llvm and cuda."""
    packable = _packable(target)
    return apply_rules(graph, [Rule(P("conv2d", where=packable), _pack_conv),
                               Rule(P("dense", where=packable), _pack_dense)], infer_node)


def _elementwise(node: Node, types) -> bool:
    """An element-wise node whose inputs all have its output's shape (no broadcasting):
    it computes the same values on any layout of them."""
    out = types[node.outputs[0]].shape
    return lookup(node.op).fusion is Fusion.ELEMWISE and len(node.outputs) == 1 and \
        all(types[i].shape == out for i in node.inputs)


def _whole_blocks(shape: tuple[int, ...]) -> bool:
    """An NCHW shape whose channels fill NCHW16c blocks exactly."""
    return len(shape) == 4 and shape[1] % OC_BLOCK == 0


def _depthwise(e: Editor, node: Node) -> bool:
    """A depth-wise conv2d (one input channel per group) on a constant weight (of the
    graph as it was: the pass renames values as it blocks them)."""
    graph = e.graph
    if node.inputs[1] not in graph.constants:
        return False
    oc, ic = graph.types[node.inputs[1]].shape[:2]
    return ic == 1 and node.attrs["groups"] == oc == graph.types[node.inputs[0]].shape[1]


def _blocked_pool(e: Editor, node: Node) -> tuple[Node, list[Node]]:
    attrs = {k: v for k, v in node.attrs.items() if k != "layout"}
    return Node("max_pool2d_blocked", node.inputs, node.outputs, attrs, span=node.span), []


def _blocked_depthwise(e: Editor, node: Node) -> tuple[Node, list[Node]]:
    x, w, *bias = node.inputs
    packed = e.fresh(f"{w}_{DEPTHWISE_WEIGHT_LAYOUT.lower()}")
    transform = Node("layout_transform", (w,), (packed,),
                     {"src_layout": "OIHW", "dst_layout": DEPTHWISE_WEIGHT_LAYOUT},
                     span=node.span)
    a = node.attrs
    attrs = {"padding": a["padding"], "stride": a["stride"], "dilation": a["dilation"]}
    return Node("depthwise_conv2d_blocked", (x, packed, *bias), node.outputs, attrs,
                span=node.span), [transform]


# The nodes with a blocked form on llvm, and what makes it: (the blocked op, the transform
# of its weight into OIHW16o: none for a pool); the caller renames its data and output.
_BLOCKED_FORMS = ((P("max_pool2d"), _blocked_pool),
                  (P("conv2d", where=_depthwise), _blocked_depthwise))


def _through(e: Editor, node: Node, target: Target | None) -> bool:
    """A node with a blocked form on `target` (llvm): a depthwise conv2d on a constant
    weight (-> depthwise_conv2d_blocked) or a max_pool2d (-> max_pool2d_blocked). CUDA
    keeps them as they are (its depthwise rule and dlight schedule the NCHW ops)."""
    return target is not None and target.kind == "llvm" and \
        any(e.match(p, node) for p, _ in _BLOCKED_FORMS)


def _blockable(e: Editor, target: Target | None) -> tuple[set[str], set[str]]:
    """(values that can be computed blocked, seeds). A conv2d_packed result can, so can a
    depthwise conv's or a max pool's whose data can (`_through`), and an element-wise
    node's when one of its inputs can: its other inputs (a ResNet join's shortcut) are the
    seeds, blocked by a layout_transform. Only whole blocks: a blocked tensor then holds
    no padding channel, so every op computes exactly the values it computed on NCHW."""
    graph = e.graph
    types, blockable, seeds = graph.types, set(), set()
    for node in graph.nodes:
        out = node.outputs[0]
        if not _whole_blocks(types[out].shape):
            continue
        if node.op == "conv2d_packed" and node.attrs["out_layout"] == "NCHW" or \
                _through(e, node, target) and node.inputs[0] in blockable:
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
    e = Editor(graph, infer_node)
    blockable, seeds = _blockable(e, target)
    consumers, outputs = graph.consumers(), set(graph.outputs)
    blocked: set[str] = set()

    def aware(node: Node, value: str) -> bool:
        """True if `node` reads `value` blocked once it is."""
        if node.op == "conv2d_packed":  # a grouped one reads NCHW data only
            return node.inputs[0] == value and node.attrs["data_layout"] == "NCHW" and \
                node.attrs["groups"] == 1
        return node.outputs[0] in blocked and (
            _elementwise(node, graph.types) or _through(e, node, target) and
            node.inputs[0] == value)

    for value in reversed(list(graph.values())):  # readers are decided before their inputs
        readers = [c for c in consumers.get(value, []) if aware(c, value)]
        # A seed costs a transform: worth it for a blocked join only (a conv reads NCHW
        # data as fast as blocked).
        if readers and (value in blockable or value in seeds and any(
                c.op != "conv2d_packed" for c in readers)):
            blocked.add(value)
    # The blocked version's name: a new one where the NCHW value stays too (seeds, values
    # with other readers or that are graph outputs).
    name = {v: e.fresh(f"{v}_{BLOCKED_LAYOUT.lower()}")
            if v in seeds or v in outputs or not all(aware(c, v) for c in consumers[v]) else v
            for v in sorted(blocked)}

    def transform(value: str, to_blocked: bool, span=None) -> Node:
        src, dst = (value, name[value]) if to_blocked else (name[value], value)
        layouts = ("NCHW", BLOCKED_LAYOUT) if to_blocked else (BLOCKED_LAYOUT, "NCHW")
        return Node("layout_transform", (src,), (dst,),
                    {"src_layout": layouts[0], "dst_layout": layouts[1]}, span=span)

    def add(node: Node, original: tuple[str, ...]) -> None:
        """Insert `node`; a renamed output declares the element type of the value it
        stands for (`original`)."""
        e.add(node, [graph.types[o] for o in original])
    for v in graph.inputs:
        if v in blocked:
            add(transform(v, True), (v,))
    weights = len(e.nodes)  # where the depthwise weights' transforms go
    rewritten = False
    for node in graph.nodes:
        n = node  # what it becomes; `aware` asks about the node as it was
        if _through(e, node, target) and node.outputs[0] in blocked:
            n, weight = next(f for p, f in _BLOCKED_FORMS if e.match(p, node))(e, node)
            for t in weight:
                e.add(t, at=weights)
            rewritten = True
        attrs = dict(n.attrs)
        if n.op == "conv2d_packed" and n.outputs[0] in blocked:
            attrs["out_layout"] = BLOCKED_LAYOUT
        if n.op == "conv2d_packed" and n.inputs[0] in blocked:
            attrs["data_layout"] = BLOCKED_LAYOUT
        inputs = tuple(name[i] if i in blocked and aware(node, i) else i for i in n.inputs)
        outs = tuple(name[o] if o in blocked and o not in seeds else o for o in n.outputs)
        add(Node(n.op, inputs, outs, attrs, span=n.span), n.outputs)
        for o in n.outputs:
            if o in blocked and name[o] != o:
                add(transform(o, o in seeds, n.span), (o,))
    graph = e.result()
    # the depthwise weights' transforms become weights, as `pack_conv_weights`'s do
    return eliminate_dead_code(fold_constants(graph)) if rewritten else graph


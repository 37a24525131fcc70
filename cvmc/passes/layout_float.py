"""The float layout pass: NNEF's float `conv` on a weight packed at compile time.

`y = conv(x, w, b)` (2-D, 'constant' border, a constant filter) becomes

    wz = pad(w, padding = [(0, -OC % 8), (0, 0), (0, 0), (0, 0)])    # where OC % 8 != 0
    wr = nnef.reshape(wz, shape = [OC / 8, 8, C / G, KH, KW])
    wp = nnef.transpose(wr, axes = [0, 2, 3, 4, 1])                  # OIHW8o
    y  = conv_packed(x, wp, b, ...)

and constant folding then packs the filter: B = 8 output channels (one AVX2 ymm of
float32; 16, one zmm, where the CPU has AVX-512) in the vector lanes, so the kernel's
register tile (`cvmc/lowering/x86_float.py`) loads a block's weights as one vector and
broadcasts each input value into FMAs. The pipeline runs it for llvm only (CUDA keeps
`conv` and dlight). Left as they are: depthwise convs and grouped ones without whole
blocks per group (OC / G not a multiple of B), other borders, other ranks, a filter that is
not a constant. `conv_packed` is an out-elementwise anchor: its bias add, relu, min/max
clip and residual add run in its kernel (`cvmc/passes/fusion.py`).
"""
from __future__ import annotations

import dataclasses
import math

from cvmc.ir import Graph, Node
from cvmc.ops import lookup
from cvmc.ops.infer import retype
from cvmc.ops.registry import Fusion
from cvmc.passes.layout import fresh_name
from cvmc.passes.simplify import eliminate_dead_code, fold_constants
from cvmc.passes.target import Target

# Output channels per vector: float32 lanes of a ymm (AVX2) or a zmm (AVX-512) register.
_LANES, _LANES_AVX512 = 8, 16


def float_conv_block(target: Target) -> int:
    """The output channels per packed block on `target`'s CPU."""
    return _LANES_AVX512 if target.has(("avx512f",)) else _LANES


def _packable(graph: Graph, node: Node, block: int) -> bool:
    if node.op != "conv" or node.inputs[1] not in graph.constants or \
            node.attrs["border"] != "constant":
        return False
    x, w = graph.types[node.inputs[0]].shape, graph.types[node.inputs[1]].shape
    if len(x) != 4 or x[1] % w[1]:
        return False
    groups = x[1] // w[1]
    return groups == 1 or (w[0] // groups) % block == 0


def pack_float_convs(graph: Graph, target: Target) -> Graph:
    """Rewrite every packable float conv into conv_packed on a packed filter (llvm)."""
    block = float_conv_block(target)
    taken, nodes = set(graph.values()), []
    for node in graph.nodes:
        if not _packable(graph, node, block):
            nodes.append(node)
            continue
        (x, w, *bias), a = node.inputs, node.attrs
        oc = graph.types[w].shape[0]
        value = _pack_filter(graph, w, block, taken, nodes, node.span)
        nodes.append(normalized_node("conv_packed", (x, value, *bias), node.outputs[0],
                                     {**_window(a), "channels": oc}, node.span))
    return retype(graph.replace(nodes=nodes)) if len(nodes) > len(graph.nodes) else graph


def _pack_filter(graph: Graph, w: str, block: int, taken: set[str], nodes: list[Node],
                 span) -> str:
    """Append the nodes packing OIHW filter `w` as OIHW{block}o; the packed value's name."""
    oc, *rest = graph.types[w].shape
    steps = ([("pad", {"padding": [(0, -oc % block), (0, 0), (0, 0), (0, 0)]})]
             if oc % block else []) + \
        [("nnef.reshape", {"shape": [-(-oc // block), block, *rest]}),
         ("nnef.transpose", {"axes": [0, 2, 3, 4, 1]})]
    return append_chain(w, steps, taken, nodes, span)


def append_chain(value: str, steps: list[tuple[str, dict]], taken: set[str],
                 nodes: list[Node], span) -> str:
    """Append one node per (op, attrs) of `steps`, each applied to the one before, starting
    from `value` (a compile-time packing that constant folding evaluates); the last name."""
    source = value
    for op, attrs in steps:
        out = fresh_name(f"{source}_packed", taken)
        nodes.append(normalized_node(op, (value,), out, attrs, span))
        value = out
    return value


def _window(a) -> dict:
    """A conv's window attributes (border, padding, stride, dilation), for the op it
    becomes."""
    return {k: a[k] for k in ("border", "padding", "stride", "dilation")}


def normalized_node(op: str, inputs: tuple[str, ...], output: str, attrs: dict, span) -> Node:
    """`output = op(inputs, attrs)`, its attributes normalized."""
    return Node(op, inputs, (output,), dict(lookup(op).normalize_attrs(attrs)), span=span)


# ---- block-float-activations ----------------------------------------------------------
# Ops that compute the same values on NCHW{B}c as on NCHW, besides the convs: element-wise
# ones (NNEF broadcasting: a per-channel operand is blocked too), a sum over H and W (the
# global average pool; each channel's sum in the same order), pools. Not concat: DenseNet
# with its concats (and the batch norms after them) blocked ran 0.6-0.7x as fast as with
# them NCHW (the default schedule's concat of NCHW8c tensors; 1 and 2 threads, loaded).
_ELEMENTWISE = (Fusion.ELEMWISE, Fusion.BROADCAST)
# Pools (NNEF's max_pool after the simplify pass, avg_pool's box) whose window covers
# rows and columns only: on NCHW{B}c the window gains a lane axis of size 1 (an attribute
# left empty, the default, means the same on any rank).
_POOLS = ("nnef.max_window", "box")
_PLANE_WINDOW = {"size": (1, 1), "padding": ((0, 0), (0, 0)), "stride": (1, 1),
                 "dilation": (1, 1)}
_LANE_WINDOW = {"size": 1, "padding": (0, 0), "stride": 1, "dilation": 1}


def _depthwise(graph: Graph, node: Node) -> bool:
    """NNEF's depth-wise conv (multiplier 1) on a constant filter, 'constant' border."""
    if node.op != "conv" or node.inputs[1] not in graph.constants or \
            node.attrs["border"] != "constant":
        return False
    x, w = graph.types[node.inputs[0]].shape, graph.types[node.inputs[1]].shape
    return len(x) == 4 and w[1] == 1 and w[0] == x[1]


def _computes_blocked(graph: Graph, node: Node, blocked: set[str], block: int) -> bool:
    """Whether `node` can compute its result blocked, given the values already blocked."""
    types, out = graph.types, node.outputs[0]
    shape = types[out].shape
    # float32 only: float_layout_transform moves float32 (a comparison's bool result, if
    # the simplify pass left one, stays NCHW and so does its select)
    if len(node.outputs) != 1 or len(shape) != 4 or shape[1] % block or \
            types[out].dtype != "float32":
        return False
    if node.op == "conv_packed":
        # A 1x1 map (squeeze-excite) stays NCHW: its epilogue (a sigmoid) then runs once
        # per channel in the conv's kernel; blocked, the fused broadcast scale after it
        # ran it once per pixel of the scaled map, unvectorised (EfficientNet-B0's first
        # squeeze-excite kernel: 0.19 -> 2.8 ms).
        return shape[2] * shape[3] > 1
    if _depthwise(graph, node) or node.op == "sum_reduce" and \
            list(node.attrs["axes"]) == [2, 3]:
        return node.inputs[0] in blocked
    if node.op in _POOLS:
        return node.inputs[0] in blocked and all(
            node.attrs[k] == () or len(node.attrs[k]) == 4 and tuple(node.attrs[k][:2]) == one
            for k, one in _PLANE_WINDOW.items())
    if lookup(node.op).fusion not in _ELEMENTWISE:
        return False
    # An operand of the result's shape is blocked; every other one broadcasts per channel
    # and, if it is computed at run time NCHW, is smaller: a transform of a whole
    # activation (and then one back) would cost more than the conv's NCHW stores.
    return any(i in blocked and types[i].shape == shape for i in node.inputs) and all(
        _per_channel(types[i].shape, shape) and (i in blocked or types[i].dtype == "float32"
                                                 and (i in graph.constants or
                                                      types[i].shape != shape))
        for i in node.inputs)


def _per_channel(operand: tuple[int, ...], shape: tuple[int, ...]) -> bool:
    """An NNEF operand (left-aligned) that broadcasts against NCHW `shape` channel-wise."""
    padded = (*operand, *(1,) * (4 - len(operand)))
    return len(operand) <= 4 and all(d in (1, s) for d, s in zip(padded, shape))


def _reads_blocked(graph: Graph, node: Node, value: str, blocked: set[str]) -> bool:
    """Whether `node` reads `value` blocked (once `blocked` is decided)."""
    if node.op == "conv_packed":  # a grouped conv reads NCHW data only
        # Only 1x1 convs read blocked data: a KxK conv's tile on blocked data was no faster
        # (ResNet-18 1.0x) or slower (DenseNet-121's 3x3 convs: the network 0.87-0.91x).
        w = graph.types[node.inputs[1]].shape
        return node.inputs[0] == value and value in blocked and \
            graph.types[value].shape[1] == w[1] and w[2] * w[3] == 1
    return node.outputs[0] in blocked


def _decide(graph: Graph, block: int) -> set[str]:
    """The values computed blocked: each that can be (`_computes_blocked`) and that some
    reader reads blocked, or a graph output that a conv does not compute (a pool's result:
    one transform of it, smaller than its input). Walked backwards, so a chain whose last
    reader reads NCHW (a KxK conv, a concat) computes NCHW back to the conv that starts
    it, which writes NCHW: its stores are cheaper than blocked ones and a transform back."""
    blocked: set[str] = set()
    for node in graph.nodes:
        if _computes_blocked(graph, node, blocked, block):
            blocked.add(node.outputs[0])
    consumers, outputs, kept = graph.consumers(), set(graph.outputs), set()
    for node in reversed(graph.nodes):
        v = node.outputs[0]
        if v in blocked and (v in outputs and node.op != "conv_packed" or any(
                _reads_blocked(graph, c, v, kept | {v}) for c in consumers.get(v, []))):
            kept.add(v)
    return kept


def block_float_activations(graph: Graph, target: Target) -> Graph:
    """Keep float activations NCHW{B}c (B = `float_conv_block`) between packed convs and
    through the ops between them (`_computes_blocked`; llvm): conv_packed becomes
    conv_packed_blocked reading and/or writing them, a depth-wise conv
    depthwise_conv_blocked on a filter packed at compile time. A float_layout_transform to
    NCHW{B}c brings in an operand computed NCHW (a per-channel constant: folded), one back
    to NCHW, under the value's name, serves any other reader and a graph output."""
    block = float_conv_block(target)
    blocked = _decide(graph, block)
    if not blocked:
        return graph
    consumers, outputs, types = graph.consumers(), set(graph.outputs), graph.types
    taken, nodes = set(graph.values()), []
    layout = f"NCHW{block}c"
    name = {v: v if v not in outputs and all(_reads_blocked(graph, c, v, blocked)
                                             for c in consumers.get(v, []))
            else fresh_name(f"{v}_{layout.lower()}", taken) for v in sorted(blocked)}
    brought: dict[str, str] = {}  # an NCHW operand -> its blocked copy

    def bring(value: str, shape: tuple[int, ...], span) -> str:
        """`value` (NCHW, or broadcasting per channel against `shape`) blocked."""
        if value in blocked:
            return name[value]
        operand = types[value].shape
        if math.prod(operand) == 1:  # one value broadcasts on any layout
            return value
        if value not in brought:
            padded = [*operand, *(1,) * (4 - len(operand))]
            if padded[1] == 1:  # the same for every channel: lanes of 1
                out = fresh_name(f"{value}_{layout.lower()}", taken)
                nodes.append(normalized_node("nnef.reshape", (value,), out,
                                             {"shape": [*padded, 1]}, span))
            else:
                source = value
                if len(operand) < 4:
                    source = fresh_name(f"{value}_nchw", taken)
                    nodes.append(normalized_node("nnef.reshape", (value,), source,
                                                 {"shape": padded}, span))
                out = fresh_name(f"{value}_{layout.lower()}", taken)
                nodes.append(normalized_node("float_layout_transform", (source,), out,
                                             {"src_layout": "NCHW", "dst_layout": layout}, span))
            brought[value] = out
        return brought[value]

    for node in graph.nodes:
        out = node.outputs[0]
        computes = out in blocked
        if node.op == "conv_packed":
            x, *rest = node.inputs
            data = _reads_blocked(graph, node, x, blocked)
            if data or computes:
                attrs = {**node.attrs, "data_layout": layout if data else "NCHW",
                         "out_layout": layout if computes else "NCHW"}
                node = normalized_node("conv_packed_blocked", (name[x] if data else x, *rest), out,
                                       attrs, node.span)
        elif computes and node.op == "conv":
            (x, w, *bias), a = node.inputs, node.attrs
            packed = _pack_filter(graph, w, block, taken, nodes, node.span)
            node = normalized_node("depthwise_conv_blocked", (name[x], packed, *bias), out,
                                   _window(a), node.span)
        elif computes and node.op in _POOLS:
            # () (the defaults: 1s, NNEF's automatic padding) means the same on any rank
            attrs = {**node.attrs, **{k: (*node.attrs[k], v) for k, v in _LANE_WINDOW.items()
                                      if node.attrs[k] != ()}}
            node = normalized_node(node.op, (name[node.inputs[0]],), out, attrs, node.span)
        elif computes:
            shape = types[out].shape
            node = dataclasses.replace(node, inputs=tuple(bring(i, shape, node.span)
                                                          for i in node.inputs))
        if computes:
            node = dataclasses.replace(node, outputs=(name[out],))
        nodes.append(node)
        if computes and name[out] != out:
            nodes.append(normalized_node("float_layout_transform", (name[out],), out,
                                         {"src_layout": layout, "dst_layout": "NCHW"}, node.span))
    # a new name declares its element type; `retype` gives its shape
    types = {**types, **{name[v]: types[v] for v in blocked},
             **{v: types[k] for k, v in brought.items()}}
    graph = retype(graph.replace(nodes=nodes, types=types))
    return eliminate_dead_code(fold_constants(graph))

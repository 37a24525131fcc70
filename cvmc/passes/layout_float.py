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

from cvmc.ir import Graph, Node
from cvmc.ops import lookup
from cvmc.ops.infer import retype
from cvmc.passes.layout import _fresh
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
        oc, *rest = graph.types[w].shape
        steps = ([("pad", {"padding": [(0, -oc % block), (0, 0), (0, 0), (0, 0)]})]
                 if oc % block else []) + \
            [("nnef.reshape", {"shape": [-(-oc // block), block, *rest]}),
             ("nnef.transpose", {"axes": [0, 2, 3, 4, 1]})]
        value = w
        for op, attrs in steps:
            out = _fresh(f"{w}_packed", taken)
            nodes.append(_node(op, (value,), out, attrs, node.span))
            value = out
        attrs = {k: a[k] for k in ("border", "padding", "stride", "dilation")}
        nodes.append(_node("conv_packed", (x, value, *bias), node.outputs[0],
                           {**attrs, "channels": oc}, node.span))
    return retype(graph.replace(nodes=nodes)) if len(nodes) > len(graph.nodes) else graph


def _node(op: str, inputs: tuple[str, ...], output: str, attrs: dict, span) -> Node:
    """`output = op(inputs, attrs)`, its attributes normalized."""
    return Node(op, inputs, (output,), dict(lookup(op).normalize_attrs(attrs)), span=span)

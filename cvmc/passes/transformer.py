"""Transformer patterns as single ops (`cvmc/ops/transformer.py`): the chains an exporter
writes for a layer normalization become one `layer_norm` node, so the compiled model runs
one kernel (with the scale and shift fused under it) instead of seven.

Matched (NNEF-Tools on PyTorch's decomposed layer_norm, and `moments`-style text):

    m = sum_reduce(x, axes, normalize = true)   # mean_reduce
    d = sub(x, m)
    p = pow(d, 2.0)                              # sqr
    v = sum_reduce(p, axes, normalize = true)
    a = add(v, eps)                              # eps: a constant of one element
    s = pow(a, 0.5)                              # sqrt
    y = div(d, s)

and NNEF's softmax fragment, expanded, becomes one `fused_softmax` node:

    m = max_reduce(x, axes);  e = exp(sub(x, m));  y = div(e, sum_reduce(e, axes))

where every intermediate has no reader outside the chain and is no graph output. Each op's
reference rule is its chain, so the reference interpreter's result is unchanged.
"""
from __future__ import annotations

import numpy as np

from cvmc.ir import Graph, Node
from cvmc.ops.infer import retype
from cvmc.passes.target import Target


def fuse_transformer(graph: Graph, target: Target | None = None) -> Graph:
    """Rewrite every matched layer-normalization chain into one `layer_norm` node and every
    expanded softmax into one `fused_softmax`; the pipeline runs it for llvm."""
    consumers, outputs = graph.consumers(), set(graph.outputs)
    replaced: dict[int, Node] = {}  # id of the chain's last node -> the new node
    dropped: set[int] = set()
    for node in graph.nodes:
        found = _layer_norm_chain(graph, node, consumers, outputs)
        if found is not None:
            attrs = {"epsilon": _constant(graph, found[4].inputs[1])}
            op = "layer_norm"
        else:
            found = _softmax_chain(graph, node, consumers, outputs)
            attrs, op = {}, "fused_softmax"
        if found is None or any(id(n) in dropped for n in found):
            continue
        last = found[-1]
        replaced[id(last)] = Node(op, (node.inputs[0],), last.outputs,
                                  {"axes": tuple(node.attrs["axes"]), **attrs}, span=last.span)
        dropped.update(id(n) for n in found)
    if not replaced:
        return graph
    nodes = [replaced.get(id(n), n) for n in graph.nodes
             if id(n) in replaced or id(n) not in dropped]
    return retype(graph.replace(nodes=nodes))


def _layer_norm_chain(graph: Graph, mean: Node, consumers, outputs) -> list[Node] | None:
    """[mean, sub, pow, var, add, pow, div] of a layer normalization starting at `mean`,
    else None."""
    if mean.op != "sum_reduce" or not mean.attrs["normalize"]:
        return None
    x = mean.inputs[0]

    sole = _sole_reader(consumers, outputs)
    sub = sole(mean, "sub")
    if sub is None or sub.inputs != (x, mean.outputs[0]) or \
            graph.types[sub.outputs[0]].shape != graph.types[x].shape:
        return None
    d = sub.outputs[0]
    readers = consumers.get(d, [])
    if d in outputs or len(readers) != 2:
        return None
    square = next((r for r in readers if r.op == "pow" and r.inputs[0] == d
                   and _constant(graph, r.inputs[1]) == 2.0), None)
    var = square and sole(square, "sum_reduce")
    if var is None or not var.attrs["normalize"] or var.attrs["axes"] != mean.attrs["axes"]:
        return None
    add = sole(var, "add")
    if add is None or add.inputs[0] != var.outputs[0] or _constant(graph, add.inputs[1]) is None:
        return None
    root = sole(add, "pow")
    if root is None or _constant(graph, root.inputs[1]) != 0.5:
        return None
    div = sole(root, "div")
    if div is None or div.inputs != (d, root.outputs[0]) or div not in readers:
        return None
    return [mean, sub, square, var, add, root, div]


def _softmax_chain(graph: Graph, peak: Node, consumers, outputs) -> list[Node] | None:
    """[max_reduce, sub, exp, sum_reduce, div] of an expanded softmax starting at `peak`,
    else None."""
    if peak.op != "max_reduce":
        return None
    x = peak.inputs[0]
    sole = _sole_reader(consumers, outputs)
    sub = sole(peak, "sub")
    if sub is None or sub.inputs != (x, peak.outputs[0]) or \
            graph.types[sub.outputs[0]].shape != graph.types[x].shape:
        return None
    exp = sole(sub, "exp")
    e = exp and exp.outputs[0]
    readers = consumers.get(e, []) if e else []
    if exp is None or e in outputs or len(readers) != 2:
        return None
    total = next((r for r in readers if r.op == "sum_reduce"), None)
    if total is None or total.attrs["normalize"] or total.attrs["axes"] != peak.attrs["axes"]:
        return None
    div = sole(total, "div")
    if div is None or div.inputs != (e, total.outputs[0]) or div not in readers:
        return None
    return [peak, sub, exp, total, div]


def _sole_reader(consumers, outputs):
    """`sole(node, op)`: the one reader of `node`'s result, if it is an `op` node and the
    result is no graph output, else None."""
    def sole(node: Node, op: str) -> Node | None:
        readers = consumers.get(node.outputs[0], [])
        if node.outputs[0] in outputs or len(readers) != 1 or readers[0].op != op:
            return None
        return readers[0]
    return sole


def _constant(graph: Graph, name: str) -> float | None:
    """The value of a one-element float constant `name`, else None."""
    value = graph.constants.get(name)
    if value is None or value.size != 1 or value.dtype != np.float32:
        return None
    return float(value.reshape(()))

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

where every intermediate has no reader outside the chain and is no graph output. The op's
reference rule is this chain, so the reference interpreter's result is unchanged.
"""
from __future__ import annotations

import numpy as np

from cvmc.ir import Graph, Node
from cvmc.ops.infer import retype
from cvmc.passes.target import Target


def fuse_transformer(graph: Graph, target: Target | None = None) -> Graph:
    """Rewrite every matched layer-normalization chain into one `layer_norm` node; the
    pipeline runs it for llvm."""
    consumers, outputs = graph.consumers(), set(graph.outputs)
    replaced: dict[int, Node] = {}  # id of the chain's last node -> the new node
    dropped: set[int] = set()
    for node in graph.nodes:
        chain = _layer_norm_chain(graph, node, consumers, outputs)
        if chain is None or any(id(n) in dropped for n in chain):
            continue
        x, axes, eps = node.inputs[0], node.attrs["axes"], chain[4].inputs[1]
        last = chain[-1]
        replaced[id(last)] = Node("layer_norm", (x,), last.outputs,
                                  {"axes": tuple(axes),
                                   "epsilon": float(graph.constants[eps].reshape(()))},
                                  span=last.span)
        dropped.update(id(n) for n in chain)
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

    def sole(node: Node, op: str) -> Node | None:
        """The one reader of `node`'s result, if it is an `op` node and the result is no
        graph output."""
        readers = consumers.get(node.outputs[0], [])
        if node.outputs[0] in outputs or len(readers) != 1 or readers[0].op != op:
            return None
        return readers[0]

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


def _constant(graph: Graph, name: str) -> float | None:
    """The value of a one-element float constant `name`, else None."""
    value = graph.constants.get(name)
    if value is None or value.size != 1 or value.dtype != np.float32:
        return None
    return float(value.reshape(()))

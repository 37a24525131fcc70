"""Constant matmul weights in the layout the CPU's matmul schedule reads.

`y = matmul(x, w, transposeB = true)` with a constant `w` (NNEF's `linear`, ONNX's `Gemm`
with `transB`) becomes

    wt = transpose(w, axes = [..., r - 1, r - 2])
    y  = matmul(x, wt, transposeB = false)

and constant folding turns `wt` into a weight: the transpose is paid once, at compile time.
The kernel then reads a row of the weight along the vector of output columns
(`cvmc.lowering.x86_matmul`); with the transposed weight each output column walks its own
row, which no vector load can gather (the transformer's linear layers ran at 2 GOPS).
The sums are the same in the same order: the result is the same bits.
"""
from __future__ import annotations

from cvmc.ir import Graph, Node
from cvmc.ops import lookup
from cvmc.ops.infer import retype
from cvmc.passes.layout import _fresh
from cvmc.passes.target import Target


def untranspose_matmul_weights(graph: Graph, target: Target | None = None) -> Graph:
    """Rewrite every matmul with a constant transposed B into one on B's transpose (a new
    node that constant folding evaluates); the pipeline runs it for llvm."""
    nodes: list[Node] = []
    taken = set(graph.values())
    changed = False
    for node in graph.nodes:
        b = node.inputs[1] if node.op == "matmul" else None
        if b is None or not node.attrs["transposeB"] or b not in graph.constants:
            nodes.append(node)
            continue
        rank = graph.types[b].ndim
        axes = [*range(rank - 2), rank - 1, rank - 2]
        wt = _fresh(f"{b}_t", taken)
        nodes.append(Node("nnef.transpose", (b,), (wt,),
                          dict(lookup("nnef.transpose").normalize_attrs({"axes": axes})),
                          span=node.span))
        nodes.append(Node("matmul", (node.inputs[0], wt), node.outputs,
                          {**node.attrs, "transposeB": False}, span=node.span))
        changed = True
    return retype(graph.replace(nodes=nodes)) if changed else graph

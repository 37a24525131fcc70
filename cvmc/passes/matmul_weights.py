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

`pack_matmul_weights` then packs such a weight (*batch, K, N) into column panels
(*batch, P, K, C), P = ceil(N / C), C the kernel tile's columns (two vectors of float32):

    wz = pad(w, padding = [..., (0, 0), (0, -N % C)])              # where N % C != 0
    wr = nnef.reshape(wz, shape = [*batch, K, P, C])
    wp = nnef.transpose(wr, axes = [..., r - 1, r - 2, r])           # (*batch, P, K, C)
    y  = matmul_packed(x, wp, columns = N)

folded at compile time too: each panel is one contiguous K x C block that the kernel reads
row after row and keeps a K block of in L1 (`cvmc/ops/packed_llvm.py`). The sums are the same
in the same order.
"""
from __future__ import annotations

from cvmc.ir import Graph, Node
from cvmc.ops import lookup
from cvmc.ops.infer import retype
from cvmc.passes.layout import fresh_name
from cvmc.passes.layout_float import append_chain, float_conv_block, normalized_node
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
        wt = fresh_name(f"{b}_t", taken)
        nodes.append(Node("nnef.transpose", (b,), (wt,),
                          dict(lookup("nnef.transpose").normalize_attrs({"axes": axes})),
                          span=node.span))
        nodes.append(Node("matmul", (node.inputs[0], wt), node.outputs,
                          {**node.attrs, "transposeB": False}, span=node.span))
        changed = True
    return retype(graph.replace(nodes=nodes)) if changed else graph


def matmul_panel_columns(target: Target) -> int:
    """The columns of a packed panel on `target`'s CPU: two vectors of float32."""
    return 2 * float_conv_block(target)


def pack_matmul_weights(graph: Graph, target: Target) -> Graph:
    """Rewrite every matmul of a constant B (a weight, or computed from weights only:
    folded below), neither operand transposed, into matmul_packed on B packed into column
    panels (llvm)."""
    cols = matmul_panel_columns(target)
    taken, nodes = set(graph.values()), []
    constant = set(graph.constants)
    for node in graph.nodes:
        if all(i in constant for i in node.inputs):
            constant.update(node.outputs)
        if node.op != "matmul" or node.attrs["transposeA"] or node.attrs["transposeB"] or \
                node.inputs[1] not in constant:
            nodes.append(node)
            continue
        a, w = node.inputs
        *batch, k, n = graph.types[w].shape
        rank = len(batch) + 2
        steps = ([("pad", {"padding": [(0, 0)] * (rank - 1) + [(0, -n % cols)]})]
                 if n % cols else []) + \
            [("nnef.reshape", {"shape": [*batch, k, -(-n // cols), cols]}),
             ("nnef.transpose", {"axes": [*range(rank - 2), rank - 1, rank - 2, rank]})]
        value = append_chain(w, steps, taken, nodes, node.span)
        nodes.append(normalized_node("matmul_packed", (a, value), node.outputs[0], {"columns": n},
                                     node.span))
    return retype(graph.replace(nodes=nodes)) if len(nodes) > len(graph.nodes) else graph

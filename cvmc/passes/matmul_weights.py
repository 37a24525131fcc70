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
from cvmc.ir.rewrite import Editor, Match, P, Rule, V, apply_rules
from cvmc.ops.infer import infer_node
from cvmc.passes.layout import op_node
from cvmc.passes.layout_float import append_chain, float_conv_block
from cvmc.passes.target import Target


def _untranspose(m: Match, e: Editor) -> Node:
    b = m["b"]
    rank = e.types[b].ndim
    wt = e.add(op_node("nnef.transpose", (b,), e.fresh(f"{b}_t"),
                       {"axes": [*range(rank - 2), rank - 1, rank - 2]}, m.root.span)).name
    return Node("matmul", (m["a"], wt), m.root.outputs,
                {**m.root.attrs, "transposeB": False}, span=m.root.span)


UNTRANSPOSE_RULES = [Rule(P("matmul", V("a"), V("b", where=lambda e, v: v in e.graph.constants),
                            where=lambda e, n: n.attrs["transposeB"]), _untranspose)]


def untranspose_matmul_weights(graph: Graph, target: Target | None = None) -> Graph:
    """Rewrite every matmul with a constant transposed B into one on B's transpose (a new
    node that constant folding evaluates); the pipeline runs it for llvm."""
    return apply_rules(graph, UNTRANSPOSE_RULES, infer_node)


def matmul_panel_columns(target: Target) -> int:
    """The columns of a packed panel on `target`'s CPU: two vectors of float32."""
    return 2 * float_conv_block(target)


def _computed_from_weights(e: Editor, value: str) -> bool:
    """A weight, or a value computed from weights only (folded at compile time)."""
    if value in e.graph.constants:
        return True
    node = e.producers.get(value)
    return node is not None and all(_computed_from_weights(e, i) for i in node.inputs)


def pack_matmul_weights(graph: Graph, target: Target) -> Graph:
    """Rewrite every matmul of a constant B (a weight, or computed from weights only:
    folded below), neither operand transposed, into matmul_packed on B packed into column
    panels (llvm)."""
    cols = matmul_panel_columns(target)

    def pack(m: Match, e: Editor) -> Node:
        w = m["w"]
        *batch, k, n = e.types[w].shape
        rank = len(batch) + 2
        steps = ([("pad", {"padding": [(0, 0)] * (rank - 1) + [(0, -n % cols)]})]
                 if n % cols else []) + \
            [("nnef.reshape", {"shape": [*batch, k, -(-n // cols), cols]}),
             ("nnef.transpose", {"axes": [*range(rank - 2), rank - 1, rank - 2, rank]})]
        value = append_chain(e, w, steps, m.root.span)
        return op_node("matmul_packed", (m["a"], value), m.root.outputs[0], {"columns": n},
                       m.root.span)
    pattern = P("matmul", V("a"), V("w", where=_computed_from_weights),
                where=lambda e, n: not n.attrs["transposeA"] and not n.attrs["transposeB"])
    return apply_rules(graph, [Rule(pattern, pack)], infer_node)

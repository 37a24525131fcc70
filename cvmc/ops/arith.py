"""GOPS counts of graph nodes: each op's `arith` rule (its entry's, or the fusion-kind
default `OpDef.arith_ops` gives), and the multiply-adds of the ops whose entries say
`multiply_add` (convolutions and matrix products), which `cvmc check` totals."""
from __future__ import annotations

from collections.abc import Mapping

from cvmc.ir import Node, TensorType
from cvmc.ops.registry import Attrs, lookup


def node_ops(node: Node, types: Mapping[str, TensorType]) -> int:
    """Arithmetic operations of a node in a typed graph (its op's `arith` rule)."""
    return lookup(node.op).arith_ops([types[i] for i in node.inputs],
                                     [types[o] for o in node.outputs], Attrs(node.attrs))


def multiply_adds(node: Node, types: Mapping[str, TensorType]) -> int:
    """A convolution's or matrix product's multiply-adds (MACs); 0 for any other op."""
    return node_ops(node, types) // 2 if lookup(node.op).multiply_add else 0

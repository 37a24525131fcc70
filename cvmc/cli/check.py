"""`cvmc check`: parse, type and shape-check a model; print its tensor table."""
from __future__ import annotations

import argparse

from cvmc.cli.common import (
    console,
    fmt_shape,
)


def cmd_check(args: argparse.Namespace) -> int:
    """Parse, type and shape-check a model; print its signature and tensor table."""
    from cvmc.frontend import load_checked
    from cvmc.ops import lookup
    from cvmc.ops.arith import multiply_adds

    graph = load_checked(args.model, args.quant, args.params, need_data=False)
    producers = graph.producers()
    kinds = {**{n: "input" for n in graph.inputs}, **{n: "weight" for n in graph.weights()}}

    def sig(names):
        return ", ".join(f"{n}: {fmt_shape(graph.types[n].shape)}" for n in names)

    console.print(f"graph {graph.name}")
    console.print(f"  inputs:  {sig(graph.inputs)}")
    console.print(f"  outputs: {sig(graph.outputs)}")
    # a layer's parameters: the elements of the weights it reads; its MACs: the
    # multiply-adds of a convolution or matrix product (cvmc.ops.arith)
    weights = set(graph.weights())
    layer = {}
    for node in graph.nodes:
        params = sum(graph.types[i].size for i in dict.fromkeys(node.inputs) if i in weights)
        layer[node.outputs[0]] = (params, multiply_adds(node, graph.types))
    rows = [("tensor", "op", "shape", "dtype", "precision", "params", "MACs")]
    for name in graph.values():
        t = graph.types[name]
        op = producers[name].op if name in producers else kinds[name]
        params, macs = (str(v) if v else "-" for v in layer.get(name, (0, 0)))
        rows.append((name, op, fmt_shape(t.shape), t.dtype,
                     "-" if t.precision is None else str(t.precision), params, macs))
    _print_table(rows)
    total_params = sum(graph.types[w].size for w in weights)
    total_bytes = sum(graph.types[w].size * _itemsize(graph.types[w].dtype) for w in weights)
    console.print(f"parameters: {total_params:,} in {len(weights)} weight tensors "
                  f"({total_bytes:,} bytes); MACs: "
                  f"{sum(macs for _, macs in layer.values()):,} (convolutions and matrix "
                  f"products)")
    if all({"cvm", "cvm-runtime"} & set(lookup(n.op).seeds) for n in graph.nodes):
        from cvmc.passes.gas import gas
        cost = gas(graph)
        console.print(f"gas: {cost.total} (operations {cost.operations} + memory "
                      f"{cost.memory}, as CVM-Runtime prices the model)")
    return 0


def _itemsize(dtype: str) -> int:
    """Bytes per element; a logical is stored as one byte."""
    import numpy as np

    return np.dtype(dtype).itemsize


def _print_table(rows: list[tuple[str, ...]]) -> None:
    """Rows as aligned columns, written as plain text: names stay whole at any width, and
    the cost is linear in the rows (a rich Table measures and wraps every cell: minutes
    for a graph of 100,000 tensors)."""
    widths = [max(map(len, column)) for column in zip(*rows)]
    lines = (" " + "  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip()
             for row in rows)
    console.file.write("\n".join(lines) + "\n")

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

    graph = load_checked(args.model, args.quant, args.params, need_data=False)
    producers = graph.producers()
    kinds = {**{n: "input" for n in graph.inputs}, **{n: "weight" for n in graph.weights()}}

    def sig(names):
        return ", ".join(f"{n}: {fmt_shape(graph.types[n].shape)}" for n in names)

    console.print(f"graph {graph.name}")
    console.print(f"  inputs:  {sig(graph.inputs)}")
    console.print(f"  outputs: {sig(graph.outputs)}")
    rows = [("tensor", "op", "shape", "dtype", "precision")]
    for name in graph.values():
        t = graph.types[name]
        op = producers[name].op if name in producers else kinds[name]
        rows.append((name, op, fmt_shape(t.shape), t.dtype,
                     "-" if t.precision is None else str(t.precision)))
    _print_table(rows)
    if all({"cvm", "cvm-runtime"} & set(lookup(n.op).seeds) for n in graph.nodes):
        from cvmc.passes.gas import gas
        cost = gas(graph)
        console.print(f"gas: {cost.total} (operations {cost.operations} + memory "
                      f"{cost.memory}, as CVM-Runtime prices the model)")
    return 0


def _print_table(rows: list[tuple[str, ...]]) -> None:
    """Rows as aligned columns, written as plain text: names stay whole at any width, and
    the cost is linear in the rows (a rich Table measures and wraps every cell: minutes
    for a graph of 100,000 tensors)."""
    widths = [max(map(len, column)) for column in zip(*rows)]
    lines = (" " + "  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip()
             for row in rows)
    console.file.write("\n".join(lines) + "\n")

"""Print a Graph as a flat NNEF document that the frontend parses back to an equal Graph.

Inputs print as `external<T>(shape, precision)`, variables as `variable<T>(shape, label,
precision)` (their data lives in .dat files, see `cvmc.frontend.tensorfile`), other
weights as `constant<T>(shape, value)`, and every node as one assignment with its
attributes by name. Registry names print bare (`nnef.max` -> `max`): the frontend's
resolution rule maps them back to the same op.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from cvmc.errors import check_argument
from cvmc.ir.graph import Graph, Node, TensorType
from cvmc.ops import lookup
from cvmc.ops.registry import Attrs

_ELEM = {"int8": "integer", "int32": "integer", "float32": "scalar", "bool": "logical"}


def print_graph(graph: Graph) -> str:
    """The graph as NNEF text (flat syntax plus cvmc's `precision` arguments)."""
    check_argument("print_graph", "graph", graph, isinstance(graph, Graph),
                   "a Graph (cvmc.load_graph, GraphBuilder)")
    header = f"graph {graph.name}( {', '.join(graph.inputs)} ) -> ( {', '.join(graph.outputs)} )"
    lines = ["version 1.0;", "", header, "{"]
    for name in graph.inputs:
        lines.append(f"    {name} = external<{_elem(graph.types[name])}>"
                     f"({_decl_args(graph.types[name])});")
    for name in graph.weights():
        lines.append(f"    {name} = {_weight(graph, name)};")
    first = {k[0]: (i, k) for i, k in enumerate(graph.kernels)}
    ops = {n.name: n.op for n in graph.nodes}
    for n in graph.nodes:
        if n.name in first:  # the fusion pass's partition, as a comment
            index, names = first[n.name]
            lines.append(f"    # kernel {index}: {', '.join(ops[m] for m in names)}")
        lines.append(f"    {_node(n, graph.types)};")
    lines.append("}")
    return "\n".join(lines) + "\n"


def _elem(t: TensorType) -> str:
    return _ELEM[t.dtype]


def _decl_args(t: TensorType, *extra: str) -> str:
    args = [f"shape = {_value(list(t.shape))}", *extra]
    if t.precision is not None:
        args.append(f"precision = {t.precision}")
    return ", ".join(args)


def _weight(graph: Graph, name: str) -> str:
    t = graph.types[name]
    if name in graph.labels:
        return f"variable<{_elem(t)}>({_decl_args(t, f'label = {_value(graph.labels[name])}')})"
    data = np.asarray(graph.constants[name]).reshape(-1).tolist()
    value = f"value = {_value(data)}"
    return f"constant<{_elem(t)}>({_decl_args(t, value)})"


def _node(node: Node, types: dict[str, TensorType]) -> str:
    opdef = lookup(node.op)
    outs = list(node.outputs)
    if opdef is not None and opdef.variadic_outputs:
        lhs = "[" + ", ".join(outs) + "]"
    else:
        lhs = ", ".join(outs)
    ins = list(node.inputs)
    args = ["[" + ", ".join(ins) + "]"] if opdef is not None and opdef.variadic else ins
    for key, v in node.attrs.items():
        if v is not None:
            kind = opdef.attr(key).kind if opdef is not None and opdef.attr(key) else ""
            args.append(f"{key} = {_value(v, kind == 'int_pairs')}")
    return f"{lhs} = {node.op.removeprefix('nnef.')}{_generic(node, types)}({', '.join(args)})"


def _generic(node: Node, types: dict[str, TensorType]) -> str:
    """`<T>` where a typed op's result type does not follow from its inputs and attributes
    (cast<integer>): the frontend would otherwise infer another type for the result."""
    opdef, out = lookup(node.op), _ELEM[types[node.outputs[0]].dtype]
    if opdef is None or opdef.integer_op or opdef.result_kind(
            [_ELEM[types[i].dtype] for i in node.inputs], Attrs(node.attrs)) == out:
        return ""
    return f"<{out}>"


def _value(v: Any, pairs: bool = False) -> str:
    """An attribute / argument value as NNEF text (pairs: a list of (p, q) tuples)."""
    if isinstance(v, (bool, np.bool_)):
        return "true" if v else "false"
    if isinstance(v, str):
        return "'" + v + "'" if "'" not in v else '"' + v + '"'
    if isinstance(v, (list, tuple)):
        if pairs:
            return "[" + ", ".join(f"({_value(p)}, {_value(q)})" for p, q in v) + "]"
        return "[" + ", ".join(_value(x) for x in v) + "]"
    if isinstance(v, (float, np.floating)):
        text = repr(float(v))
        return text if any(c in text for c in ".e") else text + ".0"
    return str(int(v))


def graph_dumper(folder: str | Path):
    """`after_pass` for `run_passes` that writes the graph after each pass to
    `folder/NN-<pass>.nnef` (`cvmc compile --dump-ir`)."""
    out = Path(folder)

    def dump(index: int, name: str, graph: Graph) -> None:
        out.mkdir(parents=True, exist_ok=True)
        (out / f"{index:02d}-{name}.nnef").write_text(print_graph(graph))
    return dump

"""Constant folding and dead-code elimination."""
from __future__ import annotations

from cvmc.ir import Graph
from cvmc.reference import evaluate, stored


def fold_constants(graph: Graph) -> Graph:
    """Evaluate every node whose inputs are all weights (or that has none, as
    `cinn.const_scalar`); its outputs become weights."""
    constants = dict(graph.constants)
    kept = []
    for node in graph.nodes:
        if all(i in constants for i in node.inputs):
            # the reference interpreter's evaluation: the bits a kernel would compute
            # (integers in int64, float formulas in float64 rounded once to float32)
            values = [stored(constants[i], graph.types[i]) for i in node.inputs]
            for name, value in zip(node.outputs, evaluate(node, values, graph.types)):
                constants[name] = value.astype(graph.types[name].dtype)
        else:
            kept.append(node)
    return graph.replace(nodes=kept, constants=constants)


def eliminate_dead_code(graph: Graph) -> Graph:
    """Drop nodes and weights that no graph output depends on (inputs always stay)."""
    live = set(graph.outputs)
    kept = []
    for node in reversed(graph.nodes):
        if live.intersection(node.outputs):
            kept.append(node)
            live.update(node.inputs)
    constants = {k: v for k, v in graph.constants.items() if k in live}
    kept_ids = {id(n) for n in kept}
    dead = set(graph.weights()) - live | {
        o for n in graph.nodes if id(n) not in kept_ids for o in n.outputs}
    types = {k: v for k, v in graph.types.items() if k not in dead}
    labels = {k: v for k, v in graph.labels.items() if k in live}
    return graph.replace(nodes=kept[::-1], constants=constants, types=types, labels=labels)

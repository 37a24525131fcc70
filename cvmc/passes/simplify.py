"""Constant folding and dead-code elimination."""
from __future__ import annotations

import numpy as np

from cvmc.ir import Graph
from cvmc.ops import lookup
from cvmc.ops.common import convert_np
from cvmc.ops.registry import Attrs


def fold_constants(graph: Graph) -> Graph:
    """Evaluate every node whose inputs are all weights; its outputs become weights."""
    constants = dict(graph.constants)
    kept = []
    for node in graph.nodes:
        if node.inputs and all(i in constants for i in node.inputs):
            # the values as the reference interpreter sees them: integers as int64, float32
            # as float64 (each result rounded once), bool as it is
            ins = [np.asarray(constants[i], dtype=np.int64) if graph.types[i].is_integer else
                   np.asarray(constants[i], dtype=np.float64) if graph.types[i].dtype ==
                   "float32" else np.asarray(constants[i]) for i in node.inputs]
            with np.errstate(all="ignore"):  # IEEE results (inf, NaN) are the semantics
                outs = lookup(node.op).run_reference(ins, Attrs(node.attrs))
            for name, value in zip(node.outputs, outs):
                t = graph.types[name]
                stored = convert_np(value, "int64" if t.is_integer else t.dtype)
                constants[name] = stored.astype(t.dtype)
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

"""Constant folding and dead-code elimination."""
from __future__ import annotations

import numpy as np

from cvmc.ir import Graph
from cvmc.ops import lookup
from cvmc.ops.common import convert_np
from cvmc.ops.registry import Attrs


def fold_constants(graph: Graph) -> Graph:
    """Evaluate every node whose inputs are all weights (or that has none, as
    `cinn.const_scalar`); its outputs become weights."""
    constants = dict(graph.constants)
    kept = []
    for node in graph.nodes:
        if all(i in constants for i in node.inputs):
            # The reference rules' operands: integers as int64, float32 as float64 (see
            # cvmc.reference); results are stored by the one conversion rule.
            xs = [np.asarray(constants[i], dtype=_OPERAND[np.asarray(constants[i]).dtype.kind])
                  for i in node.inputs]
            with np.errstate(all="ignore"):  # IEEE results (inf, NaN) are the semantics
                outs = lookup(node.op).run_reference(xs, Attrs(node.attrs))
            for name, value in zip(node.outputs, outs):
                dtype = graph.types[name].dtype
                constants[name] = np.asarray(convert_np(value, dtype)).astype(dtype)
        else:
            kept.append(node)
    return graph.replace(nodes=kept, constants=constants)


_OPERAND = {"i": np.int64, "u": np.int64, "f": np.float64, "b": np.bool_}


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

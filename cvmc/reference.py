"""The reference interpreter: runs a graph with each op's NumPy `reference` rule.

This is the FORMAL backend, the oracle for every compiled kernel. Values flow as int64;
after each op the interpreter checks that every result lies inside its inferred
precision (a failure there is a bug in a precision rule, never user error) and stores
it in the tensor's storage dtype.
"""
from __future__ import annotations

from collections.abc import Mapping

import numpy as np
from cvmc_runtime.signature import TensorSpec, check_inputs

from cvmc.ir import Graph
from cvmc.ops import lookup
from cvmc.ops.common import prec_max
from cvmc.ops.registry import Attrs
from cvmc.passes.precision import check_weight_data, infer_precision


def input_specs(graph: Graph) -> list[TensorSpec]:
    """The graph's input signature."""
    return [TensorSpec(n, graph.types[n].shape, graph.types[n].dtype, graph.types[n].precision)
            for n in graph.inputs]


def output_specs(graph: Graph) -> list[TensorSpec]:
    """The graph's output signature."""
    return [TensorSpec(n, graph.types[n].shape, graph.types[n].dtype, graph.types[n].precision)
            for n in graph.outputs]


def reference_run(graph: Graph, inputs: Mapping[str, np.ndarray],
                  saturate: bool = False) -> dict[str, np.ndarray]:
    """Run `graph` on `inputs` (checked against the signature); returns outputs by name."""
    if any(graph.types[v].precision is None for v in graph.values()):
        graph = infer_precision(graph)
    env: dict[str, np.ndarray] = {k: v.astype(np.int64)
                                  for k, v in check_inputs(input_specs(graph), inputs,
                                                           saturate).items()}
    for name, value in graph.constants.items():
        # A graph whose precisions are all set skips inference: check before the int64 cast
        # (uint64 2^64-1 would become -1).
        check_weight_data(name, value, graph.types[name].precision)
    env.update({k: np.asarray(v, dtype=np.int64) for k, v in graph.constants.items()})
    for node in graph.nodes:
        opdef = lookup(node.op)
        outs = opdef.run_reference([env[i] for i in node.inputs], Attrs(node.attrs))
        for name, value in zip(node.outputs, outs):
            t = graph.types[name]
            value = np.asarray(value, dtype=np.int64)
            assert value.shape == t.shape, \
                f"{node.op} '{node.name}': reference gave shape {value.shape}, rule {t.shape}"
            bound = prec_max(t.precision)
            assert np.abs(value).max(initial=0) <= bound, \
                f"{node.op} '{node.name}': value outside inferred precision {t.precision}"
            env[name] = value
    return {name: env[name].astype(graph.types[name].dtype) for name in graph.outputs}

"""The reference interpreter: runs a graph with each op's NumPy `reference` rule.

This is the FORMAL backend, the oracle for every compiled kernel. Integer values flow as
int64; after each op the interpreter checks that every result lies inside its inferred
precision (a failure there is a bug in a precision rule, never user error). Float32
values are rounded to float32 after every op (the rules compute in float64); logical
values are bool.
"""
from __future__ import annotations

from collections.abc import Mapping

import numpy as np
from cvmc_runtime import TensorSpec, check_inputs

from cvmc.errors import CvmcError, check_argument
from cvmc.ir import Graph
from cvmc.ops import lookup
from cvmc.ops.common import convert_np, prec_max
from cvmc.ops.infer import require_typed
from cvmc.ops.registry import Attrs

# The most element operations one node may cost the interpreter (NumPy materialises
# windows: 2^30 int64 is 8 GiB). ResNet-50's largest conv needs 1.2e8.
MAX_WORK = 1 << 30


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
    check_argument("reference_run", "graph", graph, isinstance(graph, Graph),
                   "a Graph (cvmc.load_graph, GraphBuilder)")
    check_argument("reference_run", "saturate", saturate,
                   isinstance(saturate, (bool, np.bool_)), "True or False")
    # Graphs are typed (`retype`: element kinds and weight data checked as every loader
    # does); one without weight data or with an op it cannot run is refused here, before
    # any op runs.
    require_typed(graph)
    env = {k: stored(v, graph.types[k]) for k, v in
           [*check_inputs(input_specs(graph), inputs, saturate).items(),
            *graph.constants.items()]}
    for node in graph.nodes:
        env.update(zip(node.outputs, evaluate(node, [env[i] for i in node.inputs],
                                              graph.types)))
    return {name: env[name].astype(graph.types[name].dtype) for name in graph.outputs}


def evaluate(node, values: list[np.ndarray], types) -> list[np.ndarray]:
    """The outputs of `node` on input `values` (as the interpreter holds them: `stored`),
    by its op's reference rule; also constant folding's evaluator."""
    opdef = lookup(node.op)
    _check_work(node, opdef, types)
    # IEEE results (inf, NaN) are the semantics; widening a signalling NaN quiets it.
    with np.errstate(all="ignore"):
        # Typed ops see float32 as float64: their rules compute the spec formula in float64
        # and the result is rounded to float32 once, as a compiled kernel stores it.
        xs = [v.astype(np.float64) if v.dtype == np.float32 else v for v in values]
        outs = opdef.run_reference(xs, Attrs(node.attrs))
    result = []
    for name, value in zip(node.outputs, outs):
        t = types[name]
        value = stored(value, t)
        assert value.shape == t.shape, \
            f"{node.op} '{node.name}': reference gave shape {value.shape}, rule {t.shape}"
        assert not t.is_integer or np.abs(value).max(initial=0) <= prec_max(t.precision), \
            f"{node.op} '{node.name}': value outside inferred precision {t.precision}"
        result.append(value)
    return result


def _check_work(node, opdef, types) -> None:
    """Refuse a node whose reference rule would compute (or materialise) more than
    MAX_WORK element operations: its output elements times its op's operations per
    element (`cost`: a window's taps, a conv's C/G x taps), before anything is computed."""
    ins, outs = [types[i] for i in node.inputs], [types[o] for o in node.outputs]
    elements = sum(t.size for t in outs)
    work = elements * opdef.cost_of(ins, outs, Attrs(node.attrs))
    if work > MAX_WORK:
        raise CvmcError(f"{node.op} '{node.name}': {elements} output elements x "
                        f"{work // elements} operations each is {work}, more than the "
                        f"reference interpreter's bound {MAX_WORK}", node.span)


def stored(value, t) -> np.ndarray:
    """A value as the interpreter holds it: integers as int64, others in their dtype
    (converted by the rule every compiled kernel follows, `convert_np`)."""
    with np.errstate(all="ignore"):  # float64 -> float32 overflows to inf, as it should
        return convert_np(value, "int64" if t.is_integer else t.dtype)

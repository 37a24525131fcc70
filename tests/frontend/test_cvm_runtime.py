"""Every CVM-Runtime op's export record (tests/codegen/op_cases.py, `export=`) run on
CVM-Runtime itself, CPU and FORMAL, against the reference and llvm (tests/cvm_runtime.py)."""
from __future__ import annotations

import numpy as np
import pytest

from cvmc.ir import Graph
from tests.codegen.op_cases import X_SHAPE
from tests.cvm_runtime import assert_cvm_runtime_agrees, needs_cvm_runtime
from tests.frontend.test_cvm_json import _all_ops_graph

ALL_OPS = _all_ops_graph()
# cvm-semantics.md, "Where CVM-Runtime departs from the spec", item 5.
DEVIATIONS = {"cvm_left_shift": {"cpu": "every cvm_left_shift fails at run time (its CPU "
                                        "kernel reads an attribute of the wrong type)"}}


def _only(graph: Graph, output: str) -> Graph:
    """The graph cut down to the nodes `output` needs, with it as the one output."""
    need, nodes = {output}, []
    for node in reversed(graph.nodes):
        if need & set(node.outputs):
            need.update(node.inputs)
            nodes.insert(0, node)
    kept = need | set(graph.inputs) | {v for n in nodes for v in n.outputs}
    return graph.replace(outputs=[output], nodes=nodes,
                         types={k: t for k, t in graph.types.items() if k in kept},
                         constants={k: v for k, v in graph.constants.items() if k in kept})


@needs_cvm_runtime
@pytest.mark.parametrize("output", ALL_OPS.outputs)
def test_export_record_runs_on_cvm_runtime(output: str) -> None:
    x = np.random.default_rng(5).integers(-127, 128, X_SHAPE).astype(np.int32)
    op = next(n.op for n in ALL_OPS.nodes if output in n.outputs)
    assert_cvm_runtime_agrees(_only(ALL_OPS, output), x, DEVIATIONS.get(op))

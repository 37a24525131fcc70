"""A model's gas: the price CVM-Runtime puts on running it (`CvmRuntime::GetOps`).

gas = operations + memory, with
- operations: for every op node, its base operations per output element (the op's `cost`
  rule: conv2d 3*IC*KH*KW (+1 with a bias), dense 3*K (+1), max_pool2d the pool area, sum
  input size / output size, non_max_suppression 20*B, get_valid_count counted on its data
  output, every other op 1) times the size of its first output;
- memory: 5 per element of every graph input and weight, and of every op output.
Checked by hand in tests/passes/test_gas.py.
"""
from __future__ import annotations

from dataclasses import dataclass

from cvmc.ir import Graph
from cvmc.ops import lookup
from cvmc.ops.registry import Attrs

MEMORY_WEIGHT = 5  # CVM-Runtime's "scale 5" per stored element


@dataclass(frozen=True)
class Gas:
    """A graph's gas, split as CVM-Runtime computes it."""

    operations: int
    memory: int

    @property
    def total(self) -> int:
        """What CVM-Runtime reports (CVMAPIGetGasFromModel)."""
        return self.operations + self.memory


def gas(graph: Graph) -> Gas:
    """The gas of `graph` (every op must be one CVM-Runtime runs)."""
    types = graph.types
    memory = sum(types[v].size for v in [*graph.inputs, *graph.weights()])
    operations = 0
    for node in graph.nodes:
        ins = [types[i] for i in node.inputs]
        outs = [types[o] for o in node.outputs]
        operations += lookup(node.op).cost_of(ins, outs, Attrs(node.attrs)) * outs[0].size
        memory += sum(t.size for t in outs)
    return Gas(operations, MEMORY_WEIGHT * memory)

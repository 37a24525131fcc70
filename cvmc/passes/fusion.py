"""Fusion: partition a graph's nodes into kernels (one PrimFunc per group).

`fuse_kernels` is the pipeline's last pass (Graph -> Graph): it records the partition in
`Graph.kernels`, which `--dump-ir` prints (a `# kernel N: ...` line before each group)
and lowering compiles, one kernel per group.

Rule (simple and safe): a node whose op is elementwise or broadcast (or injective,
onto an injective-or-lighter group) joins the group that produced one of its inputs
when that value has exactly this one consumer, is not a graph output, and that group
is the most recent one, so every other input is already computed when the group runs.
(A float conv / conv_packed group also takes a node reading a value its other readers, all
element-wise, read too: NNEF's relu is select(x > 0, x, 0).)
conv2d / dense (out-elementwise-fusable) anchor a group that absorbs such epilogues (on
the CPU; on CUDA only the anchors that a CUDA schedule of cvmc's own takes with its
epilogue: `Target.epilogue_anchors`; dlight schedules the others without one);
reductions and opaque ops stand alone (their consumers start a new group).
"""
from __future__ import annotations

from collections.abc import Container
from dataclasses import dataclass, field

from cvmc.ir import Graph, Node
from cvmc.ops import lookup
from cvmc.ops.registry import Fusion
from cvmc.passes.target import Target

_LIGHT = (Fusion.ELEMWISE, Fusion.BROADCAST)
# Nodes per group: TVM's simplifier takes time exponential in the depth of an inlined
# chain (a kernel of 16 fused relus built 8x slower than one of 12, 20 never finished in
# minutes), so a longer chain is split into kernels of at most this many nodes.
MAX_GROUP_NODES = 8
# Which node kinds may join a group, by the group's anchor kind.
_ABSORBS = {
    Fusion.ELEMWISE: (*_LIGHT, Fusion.INJECTIVE),
    Fusion.BROADCAST: (*_LIGHT, Fusion.INJECTIVE),
    Fusion.INJECTIVE: (*_LIGHT, Fusion.INJECTIVE),
    Fusion.OUT_ELEMWISE: _LIGHT,
    Fusion.REDUCTION: (),
    Fusion.OPAQUE: (),
}
# Anchors whose groups also take an epilogue node through a value that other element-wise
# nodes read too: NNEF's max(x, 0) (relu) is select(x > 0, x, 0), which reads x twice. A
# reader left outside the group reads the value the kernel then writes out.
_SHARED_VALUE_ANCHORS = frozenset({"conv_packed", "conv", "conv_packed_blocked",
                                   "depthwise_conv_blocked"})


@dataclass
class Group:
    """Nodes computed by one kernel, the values it reads and the values it writes."""

    nodes: list[Node]
    anchor: Fusion
    inputs: list[str] = field(default_factory=list)
    outputs: list[str] = field(default_factory=list)

    @property
    def ops(self) -> list[str]:
        """Op names of the member nodes, in order."""
        return [n.op for n in self.nodes]


def fuse_kernels(graph: Graph, target: Target) -> Graph:
    """The graph with its kernel partition for `target` recorded in `Graph.kernels`."""
    groups = fuse_groups(graph, target.epilogue_anchors)
    return graph.replace(kernels=[[n.name for n in g.nodes] for g in groups])


def kernel_groups(graph: Graph) -> list[Group]:
    """The groups of a graph the fusion pass has partitioned, with their interfaces."""
    by_name = {n.name: n for n in graph.nodes}
    groups = [Group([by_name[name] for name in names], lookup(by_name[names[0]].op).fusion)
              for names in graph.kernels]
    consumers, outputs = graph.consumers(), set(graph.outputs)
    for g in groups:
        _set_interface(g, consumers, outputs)
    return groups


def fuse_groups(graph: Graph, epilogue_anchors: Container[str] | None = None) -> list[Group]:
    """Partition `graph.nodes` into kernel groups, in execution order; an out-elementwise
    op anchors a group with its epilogue if it is in `epilogue_anchors` (None: any)."""
    consumers = graph.consumers()
    outputs = set(graph.outputs)
    owner: dict[str, int] = {}  # value -> index of the group that produced it
    groups: list[Group] = []
    for node in graph.nodes:
        kind = lookup(node.op).fusion
        target = _fusion_target(node, kind, groups, owner, consumers, outputs, epilogue_anchors)
        if target is None:
            groups.append(Group([node], kind))
            target = len(groups) - 1
        else:
            groups[target].nodes.append(node)
        for out in node.outputs:
            owner[out] = target
    for g in groups:
        _set_interface(g, consumers, outputs)
    return groups


def _fusion_target(node, kind, groups, owner, consumers, outputs, epilogue_anchors):
    """Index of the group `node` may join, or None."""
    if not groups:
        return None
    last = len(groups) - 1
    allowed = _ABSORBS[groups[last].anchor]
    if groups[last].anchor is Fusion.OUT_ELEMWISE and epilogue_anchors is not None and \
            groups[last].nodes[0].op not in epilogue_anchors:
        allowed = ()
    if kind not in allowed or len(groups[last].nodes) >= MAX_GROUP_NODES:
        return None
    shared = groups[last].nodes[0].op in _SHARED_VALUE_ANCHORS
    for value in node.inputs:
        readers = consumers.get(value, ())
        if owner.get(value) == last and value not in outputs and (len(readers) == 1 or shared
                and all(lookup(c.op).fusion in _LIGHT for c in readers)):
            return last
    return None


def _set_interface(group: Group, consumers, outputs) -> None:
    """Fill the group's external inputs and the values it must write out."""
    members = {id(n) for n in group.nodes}
    produced = [o for n in group.nodes for o in n.outputs]
    inside = set(produced)
    group.inputs = list(dict.fromkeys(i for n in group.nodes for i in n.inputs
                                      if i not in inside))
    group.outputs = [v for v in produced if v in outputs or any(
        id(c) not in members for c in consumers.get(v, ()))]

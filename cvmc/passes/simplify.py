"""Constant folding, the float rewrites before lowering, and dead-code elimination."""
from __future__ import annotations

from collections import Counter

from cvmc.ir import Graph, Node
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


# select(x > y, x, y) and select(x < y, x, y): the stdlib's max and min (relu is max(x, 0))
_SELECTS = {"gt": "nnef.select_max", "lt": "nnef.select_min"}


def simplify_float(graph: Graph, _target: object = None) -> Graph:
    """Rewrite the stdlib's float compounds into single ops of the same bits, where their
    intermediate values have no other use (a compile pass; `_target` is unused): max / min (a comparison and a select, which
    read x twice and so never fused into x's producer) -> select_max / select_min,
    clamp (min then max) -> select_clamp, max_pool (argmax_pool, then sample at its index)
    -> max_window. The replaced nodes are left for dead-code elimination."""
    producer = {o: n for n in graph.nodes for o in n.outputs}
    readers = Counter(v for n in graph.nodes for v in set(n.inputs))
    outputs = set(graph.outputs)

    def private(value: str) -> Node | None:
        """The node computing `value` when only one node reads it and it is no output."""
        return producer.get(value) if readers[value] == 1 and value not in outputs else None

    nodes = []
    for node in graph.nodes:
        # a rewritten node may match again (select -> select_max -> select_clamp)
        while (found := _rewrite(node, graph, private)) is not None:
            new, replaced = found
            for old in (node, replaced):  # `replaced` is dead now: it fed only `node`
                readers.subtract(set(old.inputs))
            readers.update(set(new.inputs))
            node = producer[new.name] = new
        nodes.append(node)
    return graph.replace(nodes=nodes)


def _rewrite(node: Node, graph: Graph, private) -> tuple[Node, Node] | None:
    """(The single op computing `node`'s value, the private producer it replaces), or None."""
    if graph.types[node.outputs[0]].dtype != "float32":
        return None
    if node.op == "select":
        cond, x, y = node.inputs
        test = private(cond)
        if test is not None and test.op in _SELECTS and test.inputs[0] == x and \
                _same_value(graph, test.inputs[1], y):
            return Node(_SELECTS[test.op], (x, y), node.outputs, {}, node.span), test
    if node.op == "nnef.select_max":
        low = private(node.inputs[0])
        if low is not None and low.op == "nnef.select_min":
            return Node("nnef.select_clamp", (low.inputs[0], node.inputs[1], low.inputs[1]),
                        node.outputs, {}, node.span), low
    if node.op == "sample":
        x, index = node.inputs
        pool = private(index)
        if pool is not None and pool.op == "argmax_pool" and pool.inputs == (x,) and \
                dict(pool.attrs) == dict(node.attrs):
            return Node("nnef.max_window", (x,), node.outputs, node.attrs, node.span), pool
    return None


def _same_value(graph: Graph, a: str, b: str) -> bool:
    """Whether values `a` and `b` are one value, or constants of the same bits."""
    if a == b:
        return True
    if a not in graph.constants or b not in graph.constants:
        return False
    va, vb = graph.constants[a], graph.constants[b]
    return va.dtype == vb.dtype and va.shape == vb.shape and va.tobytes() == vb.tobytes()

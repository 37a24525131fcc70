"""Constant folding, the float rewrites before lowering, and dead-code elimination."""
from __future__ import annotations

from cvmc.ir import Graph, Node
from cvmc.ir.rewrite import Editor, Match, P, Rule, V, apply_rules
from cvmc.ops.infer import infer_node
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


def _float(e: Editor, node: Node) -> bool:
    """A node whose (first) result is float32."""
    return e.types[node.outputs[0]].dtype == "float32"


def _minmax(m: Match, e: Editor) -> Node | None:
    """select(x > y, x, y) -> select_max(x, y); with `lt`, select_min: the stdlib's max and
    min (relu is max(x, 0))."""
    if not _same_value(e.graph, m["y0"], m["y"]):
        return None
    op = {"gt": "nnef.select_max", "lt": "nnef.select_min"}[m["test"].op]
    return Node(op, (m["x"], m["y"]), m.root.outputs, {}, m.root.span)


def _clamp(m: Match, e: Editor) -> Node:
    """select_max(select_min(x, hi), lo) -> select_clamp(x, lo, hi): the stdlib's clamp."""
    return Node("nnef.select_clamp", (m["x"], m["lo"], m["hi"]), m.root.outputs, {},
                m.root.span)


def _max_window(m: Match, e: Editor) -> Node | None:
    """sample(x, argmax_pool(x)) of one window -> max_window(x): the stdlib's max_pool."""
    if dict(m["pool"].attrs) != dict(m.root.attrs):
        return None
    return Node("nnef.max_window", (m["x"],), m.root.outputs, m.root.attrs, m.root.span)


SIMPLIFY_RULES = [
    Rule(P("select", P(("gt", "lt"), V("x"), V("y0"), name="test"), V("x"), V("y"),
           where=_float), _minmax),
    Rule(P("nnef.select_max", P("nnef.select_min", V("x"), V("hi")), V("lo"), where=_float),
         _clamp),
    Rule(P("sample", V("x"), P("argmax_pool", V("x"), name="pool"), where=_float),
         _max_window),
]


def simplify_float(graph: Graph, _target: object = None) -> Graph:
    """Rewrite the stdlib's float compounds into single ops of the same bits, where their
    intermediate values have no other use (`SIMPLIFY_RULES`; a compile pass, `_target` is
    unused): max / min (a comparison and a select, which read x twice and so never fused
    into x's producer) -> select_max / select_min, clamp (min then max) -> select_clamp,
    max_pool (argmax_pool, then sample at its index) -> max_window."""
    return apply_rules(graph, SIMPLIFY_RULES, infer_node)


def _same_value(graph: Graph, a: str, b: str) -> bool:
    """Whether values `a` and `b` are one value, or constants of the same bits."""
    if a == b:
        return True
    if a not in graph.constants or b not in graph.constants:
        return False
    va, vb = graph.constants[a], graph.constants[b]
    return va.dtype == vb.dtype and va.shape == vb.shape and va.tobytes() == vb.tobytes()

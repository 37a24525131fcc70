"""Precision inference: the static proof that int32 arithmetic never overflows.

Every integer tensor gets a precision in 1..32 from its op's rule
(cvm-semantics.md); a result outside that range rejects the graph with the chain of ops
that grew it. Storage dtypes follow from precisions (int8 for <= 8 bits).
"""
from __future__ import annotations

from cvmc.errors import CvmcError, OpRuleError
from cvmc.ir import Graph, TensorType
from cvmc.ops import lookup
from cvmc.ops.common import data_precision, integer_data_error
from cvmc.ops.registry import Attrs

# NNEF arithmetic (`add(x, y)`, `x + y`, ...) and the CVM integer ops that compute it.
INTEGER_COUNTERPARTS = {
    "add": "elemwise_add (equal shapes) or broadcast_add",
    "sub": "elemwise_sub (equal shapes) or broadcast_sub",
    "mul": "broadcast_mul", "div": "broadcast_div (truncating)", "max": "broadcast_max",
    "neg": "negative", "clamp": "clip or cvm_clip", "gt": "broadcast_greater",
}


def check_weight_data(name: str, data, precision: int | None) -> None:
    """Raise a CvmcError unless every value of weight `name` fits int32 and `precision`."""
    problem = integer_data_error(data, precision)
    if problem:
        raise CvmcError(f"weight '{name}': {problem}")


def infer_precision(graph: Graph) -> Graph:
    """Return the graph with every tensor's precision (and storage dtype) inferred."""
    types = dict(graph.types)
    for name in graph.inputs:
        t = types[name]
        if not t.is_integer or t.precision is None:
            raise CvmcError(f"graph input '{name}' must be an integer tensor with a declared "
                            f"precision (external<integer>(..., precision = P))")
        types[name] = t.with_precision(t.precision)
    for name in graph.weights():
        if name not in graph.constants:
            raise CvmcError(f"weight '{name}': its data file '{graph.labels[name]}.dat' was "
                            f"not found beside the graph; integer inference needs the values",
                            graph.spans.get(name))
        data, t = graph.constants[name], types[name]
        if not t.is_integer:
            raise CvmcError(f"weight '{name}' has type {t.dtype}; cvmc computes on integers only")
        # The frontends check values as they read them (with file positions); graphs built
        # in Python reach this check only.
        check_weight_data(name, data, t.precision)
        types[name] = t.with_precision(t.precision or data_precision(data))
    producers = graph.producers()
    for node in graph.nodes:
        opdef = lookup(node.op)
        if not opdef.compute:
            hint = INTEGER_COUNTERPARTS.get(node.op.removeprefix("nnef."))
            hint = f"; on integer tensors use {hint}" if hint else ""
            raise CvmcError(f"{node.op} '{node.name}': NNEF standard op with floating-point "
                            f"semantics; cvmc can check it but not compile or run it{hint}",
                            node.span)
        ins = [types[i] for i in node.inputs]
        for i, t in zip(node.inputs, ins):
            if not t.is_integer:
                raise CvmcError(f"{node.op} '{node.name}': input '{i}' is {t.dtype}, "
                                f"not an integer tensor", node.span)
        try:
            precs = opdef.infer_precisions(ins, Attrs(node.attrs))
        except OpRuleError as e:
            raise CvmcError(f"{node.op} '{node.name}': {e.message.removeprefix(node.op + ': ')}",
                            node.span) from None
        for out, p in zip(node.outputs, precs):
            if not 1 <= p <= 32:
                chain = _growth_chain(node, types, producers, p)
                raise CvmcError(f"{node.op} '{node.name}': precision of '{out}' would be {p} "
                                f"bits, outside 1..32 (int32 could overflow); grown by {chain}",
                                node.span)
            types[out] = TensorType(types[out].shape, "int32", p).with_precision(p)
    return graph.replace(types=types)


def _growth_chain(node, types, producers, p) -> str:
    """'a (8) -> conv2d 'c1' (20) -> ...': follow the widest input back to a source."""
    steps = [f"{node.op} '{node.name}' ({p})"]
    cur = node
    while cur.inputs:
        widest = max(cur.inputs, key=lambda i: types[i].precision or 0)
        src = producers.get(widest)
        if src is None:
            steps.append(f"'{widest}' ({types[widest].precision})")
            break
        steps.append(f"{src.op} '{src.name}' ({types[widest].precision})")
        cur = src
    return " <- ".join(steps)

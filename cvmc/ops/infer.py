"""Type and precision inference: the static proof that int32 arithmetic never overflows.

It applies each op's rules over a whole graph: the pass pipeline's first pass, the check
every command makes (`check_graph`), and what the reference interpreter relies on (so it
sits here, below them, with the rules it applies).

Every integer tensor gets a precision in 1..32 from its op's rule
(cvm-semantics.md); a result outside that range rejects the graph with the chain of ops
that grew it. Storage dtypes follow from precisions (int8 for <= 8 bits). Typed (NNEF)
ops check their inputs' element kinds and give their results the declared kind; float32
and bool tensors carry no precision.
"""
from __future__ import annotations

from cvmc.errors import CvmcError, OpRuleError
from cvmc.ir import Graph, TensorType
from cvmc.ops import lookup
from cvmc.ops.common import data_precision, integer_data_error
from cvmc.ops.registry import GENERIC, KINDS, Attrs

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


def infer_precision(graph: Graph, need_data: bool = True) -> Graph:
    """Return the graph with every tensor's precision (and storage dtype) inferred:
    integer tensors get a precision, scalar (float32) and logical (bool) tensors none.
    Without `need_data`, a weight without data keeps its declared type (see `missing_data`)."""
    types = dict(graph.types)
    for name in graph.inputs:
        t = types[name]
        # An integer input without a declared precision (a standard NNEF document's
        # `external<integer>`, e.g. gather indices) may hold any int32: precision 32.
        types[name] = t.with_precision(t.precision or 32) if t.is_integer else t
    for name in graph.weights():
        if name not in graph.constants:
            if not need_data:
                continue
            raise CvmcError(f"weight '{name}': its data file '{graph.labels[name]}.dat' was "
                            f"not found beside the graph; compiling needs the values",
                            graph.spans.get(name))
        data, t = graph.constants[name], types[name]
        if t.is_integer:
            # The frontends check values as they read them (with file positions); graphs
            # built in Python reach this check only.
            check_weight_data(name, data, t.precision)
            types[name] = t.with_precision(t.precision or data_precision(data))
    producers = graph.producers()
    for node in graph.nodes:
        infer_node(node, types, producers)
    return graph.replace(types=types)


def check_graph(graph: Graph, need_data: bool = True) -> Graph:
    """The graph as every command and the interpreter accept it: precisions inferred, which
    checks every op's element kinds and int32 bounds.
    Without `need_data` (`cvmc check`: NNEF makes weight data optional, spec 5.1) weights
    whose data is absent keep their declared types; precisions are left uninferred where
    an integer one among them declares none (`missing_data`)."""
    if need_data:
        return infer_precision(graph)
    return infer_precision(graph, need_data=False) if missing_data(graph)[1] else graph


def missing_data(graph: Graph) -> tuple[list[str], bool]:
    """The weights whose data the model lacks, and whether precisions can be inferred
    without it (every integer one among them declares its precision)."""
    missing = [w for w in graph.weights() if w not in graph.constants]
    return missing, all(not graph.types[w].is_integer or graph.types[w].precision is not None
                        for w in missing)


def infer_node(node, types: dict[str, TensorType], producers: dict) -> None:
    """Add the types of `node`'s outputs to `types`, which holds its inputs' (inferred)
    types; `producers` (value -> node) names the ops that grew a precision too far.
    `cvmc.GraphBuilder` calls it per node, to reject a bad call where it is made."""
    opdef = lookup(node.op)
    try:
        ins = [types[i] for i in node.inputs]
        if opdef.integer_op:
            _check_integer_inputs(node, ins)
            precs = opdef.infer_precisions(ins, Attrs(node.attrs))
            outs = [TensorType(types[o].shape, "int32", p) for o, p in
                    zip(node.outputs, precs)]
        else:
            outs = _typed_results(opdef, node, ins, [types[o] for o in node.outputs])
    except OpRuleError as e:
        raise CvmcError(f"{node.op} '{node.name}': {e.message.removeprefix(node.op + ': ')}",
                        node.span) from None
    for out, t in zip(node.outputs, outs):
        if t.is_integer and not 1 <= t.precision <= 32:
            chain = _growth_chain(node, types, producers, t.precision)
            rule = f" by its rule {opdef.precision_rule}" if opdef.precision_rule else ""
            raise CvmcError(f"{node.op} '{node.name}': precision of '{out}' would be "
                            f"{t.precision} bits{rule}, outside 1..32 (int32 could "
                            f"overflow); grown by {chain}", node.span)
        types[out] = t.with_precision(t.precision) if t.is_integer else t


def _check_integer_inputs(node, ins: list[TensorType]) -> None:
    """A CVM op computes on integer tensors only."""
    for i, t in zip(node.inputs, ins):
        if not t.is_integer:
            hint = INTEGER_COUNTERPARTS.get(node.op.removeprefix("nnef."))
            raise OpRuleError(f"input '{i}' is {t.dtype}, not an integer tensor (CVM integer "
                              f"op){f'; for scalars use {hint}' if hint else ''}")


def _typed_results(opdef, node, ins: list[TensorType], outs: list[TensorType]
                   ) -> list[TensorType]:
    """Result types of a typed (NNEF, CINN) op: inputs must have their declared kinds;
    generic (`?`, `numeric`) inputs share one kind, which a generic result takes (cast:
    the recorded result dtype)."""
    generic = []
    for k, (name, t) in enumerate(zip(node.inputs, ins)):
        kind = opdef.in_kind(k)
        if kind == "numeric" and _kind(t) == "logical":
            raise OpRuleError(f"input '{name}' must be a tensor<scalar> or tensor<integer>, "
                              f"got a tensor<logical>")
        if kind in GENERIC:
            generic.append(t)
        elif kind != "any" and _kind(t) != kind:
            hint = INTEGER_COUNTERPARTS.get(node.op) if t.is_integer else None
            raise OpRuleError(f"input '{name}' must be a tensor<{kind}>, got a "
                              f"tensor<{_kind(t)}>{f'; on integer tensors use {hint}' if hint else ''}")
    if len({_kind(t) for t in generic}) > 1:
        found = ", ".join(f"'{n}' {_kind(t)}" for n, t in zip(node.inputs, ins))
        raise OpRuleError(f"generic inputs must all have one element type, found {found}")
    kind = opdef.result_kind([_kind(t) for t in ins], Attrs(node.attrs)) or _kind(outs[0])
    if kind != "integer":
        return [TensorType(t.shape, KINDS[kind]) for t in outs]
    if "precision" in opdef.rules:
        precs = opdef.infer_precisions(ins, Attrs(node.attrs))
    elif generic:  # an op that only moves (selects, copies) integer values
        precs = [max(t.precision for t in generic)] * len(outs)
    else:  # cast to integer: any int32 value
        precs = [32] * len(outs)
    return [TensorType(t.shape, "int32", p) for t, p in zip(outs, precs)]


def _kind(t: TensorType) -> str:
    """The NNEF element kind of a tensor type."""
    return "integer" if t.is_integer else "scalar" if t.dtype == "float32" else "logical"


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

"""Type and precision inference: the static proof that int32 arithmetic never overflows.

It applies each op's rules over a whole graph (`retype`): every loader types its graph
with it and every pass that changes nodes retypes with it, so that a Graph is always
typed; the pass pipeline and the reference interpreter rely on that (`require_typed`), and
`verify` checks it. It sits here, below them, with the rules it applies.

Every integer tensor gets a precision in 1..32 from its op's rule
(cvm-semantics.md); a result outside that range rejects the graph with the chain of ops
that grew it. Storage dtypes follow from precisions (int8 for <= 8 bits). Typed (NNEF)
ops check their inputs' element kinds and give their results the declared kind; float32
and bool tensors carry no precision.

Beside precisions, `intervals` proves a value interval [lo, hi] for every integer tensor of
a typed graph (each op's optional `interval` rule, inside its precision's interval): the
instruction choices that need tighter bounds than a precision's read it.
"""
from __future__ import annotations

from cvmc.errors import CvmcError, OpRuleError
from cvmc.ir import Graph, InvalidGraph, TensorType
from cvmc.ops import lookup
from cvmc.ops.common import Interval, data_precision, integer_data_error, precision_interval
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


def retype(graph: Graph, need_data: bool = True) -> Graph:
    """The graph typed by the op rules: every node output's shape, element type and
    (integer) precision, from its inputs' types; inputs and weights keep their declared
    types, with a precision where an integer one declares none (an input: 32, a weight:
    its data's). The one place the rules type a graph: every loader and every pass that
    adds or changes nodes returns its graph through it. Without `need_data` a weight
    without data keeps its declared type, and where its precision is unknown the graph is
    not `typed` (see `Graph.typed`): it keeps its declared types, node shapes inferred."""
    for name in graph.weights():
        if name not in graph.constants and need_data:
            raise _missing_data_error(graph, name)
    typed = missing_data(graph)[1]
    types = {v: _source(graph, v) if typed else graph.types[v]
             for v in [*graph.inputs, *graph.weights()]}
    producers = graph.producers()
    for node in graph.nodes:
        types.update((o, graph.types.get(o)) for o in node.outputs)  # declared result kinds
        if typed:
            infer_node(node, types, producers)
        else:
            types.update(zip(node.outputs, _node_types(node, types, None)))
    return graph.replace(types=types, typed=typed)


def intervals(graph: Graph) -> dict[str, Interval]:
    """The proven interval of every integer value of the typed `graph`: an input's
    precision's, a weight's data's min and max, a node output's by its op's interval rule
    (`OpDef.infer_intervals`) from its inputs'."""
    require_typed(graph)
    found: dict[str, Interval] = {}
    for name in [*graph.inputs, *graph.weights()]:
        t = graph.types[name]
        if t.is_integer:
            data = graph.constants.get(name)
            found[name] = precision_interval(t.precision) if data is None or data.size == 0 \
                else (int(data.min()), int(data.max()))
    for node in graph.nodes:
        outs = [o for o in node.outputs if graph.types[o].is_integer]
        if not outs:
            continue
        ivs = [found.get(i) for i in node.inputs]
        precisions = [graph.types[o].precision for o in outs]
        opdef = lookup(node.op)
        result = opdef.infer_intervals(ivs, precisions, Attrs(node.attrs)) \
            if len(outs) == len(node.outputs) and None not in ivs \
            else [precision_interval(p) for p in precisions]
        found.update(zip(outs, result))
    return found


def _source(graph: Graph, name: str) -> TensorType:
    """The type of input or weight `name`; a weight's data is checked against it."""
    t = graph.types[name]
    if name in graph.inputs:
        return source_type(t, None)
    if name not in graph.constants:  # its declared precision (`missing_data` found one)
        return t.with_precision(t.precision) if t.is_integer else t
    if t.is_integer:
        # The frontends check values as they read them (with file positions); graphs
        # built in Python reach this check only.
        check_weight_data(name, graph.constants[name], t.precision)
    return source_type(t, graph.constants[name])


def source_type(t: TensorType, data) -> TensorType:
    """An input's (`data` None) or weight's type: an integer one without a declared
    precision takes its data's, or 32 for an input (a standard NNEF document's
    `external<integer>`, e.g. gather indices, may hold any int32)."""
    if not t.is_integer:
        return t
    return t.with_precision(t.precision or (32 if data is None else data_precision(data)))


def require_typed(graph: Graph) -> Graph:
    """`graph`, if it can be compiled and run; else the CvmcError that says why not: a
    weight without its data."""
    for name in graph.weights():
        if name not in graph.constants:
            raise _missing_data_error(graph, name)
    if not graph.typed:
        raise InvalidGraph(f"graph {graph.name!r} was not typed (cvmc.ops.infer.retype)")
    return graph


def verify(graph: Graph) -> None:
    """`Graph.verify`, and that its types are the ones the op rules give (an
    `InvalidGraph` names the values where they differ: a pass typed a node wrong)."""
    graph.verify()
    again = retype(graph, need_data=False)
    wrong = [v for v in graph.types if graph.types[v] != again.types[v]]
    if graph.typed != again.typed or wrong:
        raise InvalidGraph(f"graph {graph.name!r}: types differ from the op rules' at "
                           f"{wrong[:4]}: {[(graph.types[v], again.types[v]) for v in wrong[:4]]}")


def missing_data(graph: Graph) -> tuple[list[str], bool]:
    """The weights whose data the model lacks, and whether precisions can be inferred
    without it (every integer one among them declares its precision)."""
    missing = [w for w in graph.weights() if w not in graph.constants]
    return missing, all(not graph.types[w].is_integer or graph.types[w].precision is not None
                        for w in missing)


def _missing_data_error(graph: Graph, name: str) -> CvmcError:
    return CvmcError(f"weight '{name}': its data file '{graph.labels[name]}.dat' was not "
                     f"found beside the graph; compiling needs the values",
                     graph.spans.get(name))


def infer_node(node, types: dict[str, TensorType], producers: dict) -> None:
    """Add the types of `node`'s outputs to `types`, which holds its inputs' types and its
    outputs' declared ones (the element kind a cast converts to; None: not declared);
    `producers` (value -> node) names the ops that grew a precision too far.
    `cvmc.GraphBuilder` calls it per node, to reject a bad call where it is made."""
    opdef = lookup(node.op)
    outs = _node_types(node, types, opdef)
    for out, t in zip(node.outputs, outs):
        if t.is_integer and not 1 <= t.precision <= 32:
            chain = _growth_chain(node, types, producers, t.precision)
            rule = f" by its rule {opdef.precision_rule}" if opdef.precision_rule else ""
            raise CvmcError(f"{node.op} '{node.name}': precision of '{out}' would be "
                            f"{t.precision} bits{rule}, outside 1..32 (int32 could "
                            f"overflow); grown by {chain}", node.span)
        types[out] = t.with_precision(t.precision) if t.is_integer else t


def _node_types(node, types: dict[str, TensorType], opdef) -> list[TensorType]:
    """The result types of `node` by its op's rules (`opdef`; None: shapes only, each with
    its declared dtype). An OpRuleError becomes a CvmcError located at the node."""
    try:
        ins = [types[i] for i in node.inputs]
        if opdef is not None and opdef.integer_op:
            _check_integer_inputs(node, ins)
        shapes = lookup(node.op).infer_shapes(ins, Attrs(node.attrs))
        declared = [TensorType(s, t.dtype if t else "int32")
                    for s, t in zip(shapes, (types.get(o) for o in node.outputs))]
        if opdef is None:
            return declared
        if not opdef.integer_op:
            return _typed_results(opdef, node, ins, declared)
        precs = opdef.infer_precisions(ins, Attrs(node.attrs))
        return [TensorType(t.shape, "int32", p) for t, p in zip(declared, precs)]
    except OpRuleError as e:
        raise CvmcError(f"{node.op} '{node.name}': {e.message.removeprefix(node.op + ': ')}",
                        node.span) from None


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

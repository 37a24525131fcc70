"""NNEF semantics (spec 3.3, chapter 6): evaluate a parsed document into a `Graph`.

Assignments are evaluated in order. Compile-time values are Python ints, floats, bools,
strings, lists (arrays) and tuples; tensors are `Tensor` handles naming IR values.
Calls resolve as follows (see `GraphBuilder.call`): a user fragment with a body is
expanded; otherwise for `f(...)` the registry entries `f` then `nnef.f` are tried and the
first whose signature accepts the call (tensor arity, attribute names) and whose shape rule
accepts the operands becomes one atomic node; otherwise a standard-library compound fragment is expanded into the ops it calls;
otherwise the error of the first registry candidate (or "unknown operation") is reported.
The name an assignment gives (its "destination") is passed down, so the op that computes
a named tensor gets that name; intermediate values get fresh names `<lhs>__<n>`.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import lark

from cvmc.errors import CvmcError, OpRuleError
from cvmc.frontend.constexpr import TooLarge, bounded, compile_time, is_int
from cvmc.frontend.fragments import (
    DTYPE_OF,
    NO_DEFAULT,
    Fragment,
    Tensor,
    check_value,
    show_value,
    stdlib,
)
from cvmc.frontend.literals import TensorFactory, float32_rounding
from cvmc.frontend.syntax import Source, literal_value
from cvmc.ir import Node, TensorType
from cvmc.ops import lookup
from cvmc.ops.registry import GENERIC, Attrs, OpDef, suggest

__all__ = ["GraphBuilder", "Scope"]

# Tensor operator expressions map to these NNEF operations (spec 3.2.3 table).
BINARY_OPS = {"+": "add", "-": "sub", "*": "mul", "/": "div", "^": "pow", "<": "lt",
              "<=": "le", ">": "gt", ">=": "ge", "==": "eq", "!=": "ne", "&&": "and",
              "||": "or"}
UNARY_OPS = {"-": "neg", "!": "not"}
BUILTINS = ("length_of", "range_of", "shape_of", "integer", "scalar", "logical", "string")
INTRODUCERS = ("external", "variable", "constant")
# Work bounds, so that no document (recursive fragments, nested comprehensions, repeated
# doubling of arrays or integers) can hang or exhaust memory: far above real models.
MAX_STEPS = 1_000_000  # expression evaluations per document (Khronos resnet: 2,302)
MAX_EXPANSION_DEPTH = 100  # nested fragment expansions (add_n recurses once per tensor)


@dataclass
class Arg:
    """An evaluated call argument and where it was written."""

    value: Any
    meta: Any


@dataclass
class Scope:
    """Names visible in a graph body or one fragment expansion."""

    names: dict[str, Any] = field(default_factory=dict)
    fragment: Fragment | None = None
    dests: dict[str, Any] = field(default_factory=dict)  # fragment result -> destination
    site: Any = None  # call site in the user's document while expanding the stdlib
    label: str = ""  # "softmax 'y'": the user-visible op being expanded
    origin: str | None = None  # the stdlib fragment the document calls (Node.origin)

    def where(self, meta: Any) -> Any:
        """The location to report for `meta` (the call site inside stdlib expansions)."""
        return self.site if self.site is not None else meta


class GraphBuilder(TensorFactory):
    """Evaluates assignments and collects nodes, types and weights."""

    def __init__(self, source: Source, fragments: dict[str, Fragment], weights: Any):
        super().__init__(source, weights)
        self.fragments = fragments
        self.nodes: list[Node] = []
        self.steps = 0
        self.depth = 0

    # ---- statements ---------------------------------------------------------------------
    def assign(self, tree: lark.Tree, scope: Scope) -> None:
        """Evaluate one `lvalue = expr;` and bind its names."""
        lvalue, expr = tree.children
        for tok in _lvalue_names(lvalue):
            if tok in scope.names:
                raise self.err(f"identifier '{tok}' is already assigned (NNEF assigns each "
                               f"identifier once)", scope.where(tok))
        dest = self.dest_of(lvalue, scope)
        self.bind(lvalue, self.eval(expr, scope, dest), scope, tree.meta)

    def dest_of(self, lvalue: Any, scope: Scope) -> Any:
        """The destination names an lvalue asks for (None: generate)."""
        if lvalue.data == "lv_ident":
            name = str(lvalue.children[0])
            return scope.dests.get(name) if scope.fragment else name
        parts = [self.dest_of(c, scope) for c in lvalue.children]
        return parts if lvalue.data == "lv_array" else tuple(parts)

    def bind(self, lvalue: Any, value: Any, scope: Scope, meta: Any) -> None:
        """Destructure `value` along `lvalue` into scope."""
        if lvalue.data == "lv_ident":
            tok = lvalue.children[0]
            name = str(tok)
            if scope.fragment is None:
                if not isinstance(value, Tensor):
                    raise self.err(f"'{name}' must be assigned a tensor, got "
                                   f"{show_value(value)}", tok)
                value = self.named(value, name, scope, tok)
            elif name in scope.dests and isinstance(value, Tensor):
                value = self.named(value, scope.dests[name], scope, tok)
            scope.names[name] = value
            return
        kind, want = (list, "an array") if lvalue.data == "lv_array" else (tuple, "a tuple")
        if not isinstance(value, kind) or len(value) != len(lvalue.children):
            raise self.err(f"the left-hand side expects {want} of {len(lvalue.children)} "
                           f"items, got {show_value(value)}", scope.where(meta))
        for child, item in zip(lvalue.children, value):
            self.bind(child, item, scope, meta)

    def named(self, value: Tensor, dest: Any, scope: Scope, meta: Any) -> Tensor:
        """`value` under the name `dest`: a `copy` node when it already has another name."""
        if not isinstance(dest, str) or value.name == dest:
            return value
        return self.call("copy", None, [Arg(value, meta)], {}, scope, dest, meta)

    # ---- expressions --------------------------------------------------------------------
    def eval(self, tree: Any, scope: Scope, dest: Any = None) -> Any:
        """Evaluate an expression; `dest` names the tensor(s) it produces."""
        self.steps += 1
        if self.steps > MAX_STEPS:
            raise self.err(f"evaluating the document takes more than {MAX_STEPS} steps "
                           f"(a runaway comprehension or recursive fragment?)",
                           scope.where(tree.meta))
        kind = tree.data
        if kind in ("number", "string", "true", "false"):
            return literal_value(tree)
        if kind == "ident":
            name = str(tree.children[0])
            if name not in scope.names:
                raise self.err(f"undeclared identifier '{name}'", scope.where(tree.meta))
            return scope.names[name]
        if kind == "invocation":
            return self.invoke(tree, scope, dest)
        if kind == "if_else":
            cond = self.eval(tree.children[1], scope)
            if not isinstance(cond, bool):
                raise self.err(f"if-else condition must be a logical value, got "
                               f"{show_value(cond)}", scope.where(tree.children[1].meta))
            return self.eval(tree.children[0 if cond else 2], scope, dest)
        if kind in ("array", "tuple"):
            pieces = dest if isinstance(dest, (list, tuple)) and \
                len(dest) == len(tree.children) else [None] * len(tree.children)
            items = [self.eval(c, scope, d) for c, d in zip(tree.children, pieces)]
            return items if kind == "array" else tuple(items)
        if kind == "binary":
            return self.binary(tree, scope, dest)
        if kind == "unary":
            return self.unary(tree, scope, dest)
        if kind in ("index", "range_index"):
            return self.subscript(tree, scope)
        assert kind == "comprehension", kind
        return self.comprehension(tree, scope)

    def binary(self, tree: lark.Tree, scope: Scope, dest: Any) -> Any:
        """A binary operator: an NNEF op on tensors, else compile-time arithmetic."""
        if len(tree.children) == 2:  # `a in b`: the grammar keeps no token for `in`
            (left, right), op = tree.children, "in"
        else:
            left, op_tok, right = tree.children
            op = str(op_tok)
        a, b = self.eval(left, scope), self.eval(right, scope)
        if isinstance(a, Tensor) or isinstance(b, Tensor):
            if op not in BINARY_OPS:
                raise self.err(f"operator '{op}' does not apply to tensors",
                               scope.where(tree.meta))
            args = [Arg(a, left.meta), Arg(b, right.meta)]
            return self.call(BINARY_OPS[op], None, args, {}, scope, dest, tree.meta)
        try:
            return bounded(compile_time(op, a, b))
        except (TypeError, ZeroDivisionError, ValueError, OverflowError):
            raise self.err(f"operator '{op}' cannot apply to {show_value(a)} and {show_value(b)}",
                           scope.where(tree.meta)) from None
        except TooLarge as e:
            raise self.err(f"operator '{op}' on {show_value(a)} and {show_value(b)}: {e}",
                           scope.where(tree.meta)) from None

    def unary(self, tree: lark.Tree, scope: Scope, dest: Any) -> Any:
        """Unary -, + or ! on a tensor (neg / not) or a compile-time value."""
        op, operand = str(tree.children[0]), tree.children[1]
        v = self.eval(operand, scope)
        if isinstance(v, Tensor):
            if op == "+":
                return v
            return self.call(UNARY_OPS[op], None, [Arg(v, operand.meta)], {}, scope, dest,
                             tree.meta)
        if op == "!" and isinstance(v, bool):
            return not v
        if op in "+-" and isinstance(v, (int, float)) and not isinstance(v, bool):
            return -v if op == "-" else v
        raise self.err(f"operator '{op}' cannot apply to {show_value(v)}", scope.where(tree.meta))

    def subscript(self, tree: lark.Tree, scope: Scope) -> Any:
        """`a[i]` or `a[i:j]` on an array or string."""
        seq = self.eval(tree.children[0], scope)
        where = scope.where(tree.meta)
        if not isinstance(seq, (list, str)):
            raise self.err(f"only arrays and strings can be subscripted, got {show_value(seq)}",
                           where)
        if tree.data == "index":
            i = self.eval(tree.children[1], scope)
            if not is_int(i) or not 0 <= i < len(seq):
                raise self.err(f"index {show_value(i)} is out of range for an array of length "
                               f"{len(seq)}", where)
            return seq[i]
        bounds, seen_colon = [None, None], False
        for c in tree.children[1:]:
            if isinstance(c, lark.Token) and c.type == "COLON":
                seen_colon = True
            else:
                bounds[int(seen_colon)] = self.eval(c, scope)
        if not all(b is None or is_int(b) for b in bounds):
            raise self.err(f"range bounds must be integers, got {show_value(bounds)}", where)
        return seq[bounds[0]:bounds[1]]

    def comprehension(self, tree: lark.Tree, scope: Scope) -> list[Any]:
        """`[for i in a, j in b if cond yield expr]` (iterators advance together)."""
        iters = [c for c in tree.children if isinstance(c, lark.Tree) and c.data == "loop_iter"]
        cond = tree.children[-2] if len(tree.children) - len(iters) == 2 else None
        seqs = []
        for it in iters:
            seq = self.eval(it.children[1], scope)
            if not isinstance(seq, list):
                raise self.err(f"'{it.children[0]}' must iterate over an array, got "
                               f"{show_value(seq)}", scope.where(it.meta))
            seqs.append(seq)
        if len({len(s) for s in seqs}) > 1:
            raise self.err("loop iterators must have equal lengths", scope.where(tree.meta))
        out = []
        for items in zip(*seqs):
            inner = Scope(dict(scope.names), scope.fragment, scope.dests, scope.site,
                          scope.label, scope.origin)
            inner.names.update({str(it.children[0]): v for it, v in zip(iters, items)})
            if cond is not None and self.eval(cond, inner) is not True:
                continue
            out.append(self.eval(tree.children[-1], inner))
        return out

    # ---- invocations --------------------------------------------------------------------
    def invoke(self, tree: lark.Tree, scope: Scope, dest: Any) -> Any:
        """An invocation: builtin, tensor introduction, op or fragment."""
        head, *arg_trees = tree.children
        name, _, generic = str(head).replace(" ", "").rstrip(">").partition("<")
        pos, named = [], {}
        for a in arg_trees:
            if isinstance(a, lark.Tree) and a.data == "named_arg":
                key = str(a.children[0])
                if key in named:
                    raise self.err(f"{name}: argument '{key}' given twice",
                                   scope.where(a.children[0]))
                named[key] = Arg(self.eval(a.children[1], scope), a.children[1].meta)
            elif named:
                raise self.err(f"{name}: positional argument after named arguments",
                               scope.where(a.meta))
            else:
                pos.append(Arg(self.eval(a, scope), a.meta))
        if name in BUILTINS:
            return self.builtin(name, pos, named, scope, tree.meta)
        if name in INTRODUCERS:
            if scope.fragment is not None and name != "constant":
                raise self.err(f"operation '{name}' is not allowed inside fragments",
                               scope.where(tree.meta))
            return self.introduce(name, generic or None, pos, named, scope.where(tree.meta),
                                  dest if isinstance(dest, str) else self.fresh())
        if name.startswith("nnef."):
            # `nnef.max` is the registry's internal spelling; documents (and print_graph)
            # call NNEF operations by their standard names.
            raise self.err(f"unknown operation '{name}'; call NNEF standard operations by "
                           f"their names ('{name.removeprefix('nnef.')}')",
                           scope.where(tree.meta))
        if name == "update" and pos and not (isinstance(pos[0].value, Tensor)
                                             and pos[0].value.name in self.labels):
            raise self.err("the first argument of 'update' must be a variable",
                           scope.where(pos[0].meta))
        return self.call(name, generic or None, pos, named, scope, dest, tree.meta)

    def builtin(self, name: str, pos: list[Arg], named: dict, scope: Scope, meta: Any) -> Any:
        """length_of, range_of, and the integer/scalar/logical/string conversions."""
        where = scope.where(meta)
        if name == "shape_of":
            raise self.err("'shape_of' is deprecated since NNEF 1.0.1 and not supported; "
                           "write the shape explicitly", where)
        if len(pos) != 1 or named:
            raise self.err(f"'{name}' takes exactly one argument", where)
        v = pos[0].value
        if name in ("length_of", "range_of"):
            if not isinstance(v, (list, str)):
                raise self.err(f"'{name}' expects an array, got {show_value(v)}", where)
            return len(v) if name == "length_of" else list(range(len(v)))
        if isinstance(v, (Tensor, list, tuple)):
            raise self.err(f"'{name}' converts a single value, got {show_value(v)}", where)
        try:
            return bounded({"integer": int, "scalar": float, "logical": bool,
                             "string": str}[name](v))
        except (ValueError, OverflowError, TooLarge):
            raise self.err(f"cannot convert {show_value(v)} to {name}", where) from None

    def call(self, name: str, generic: str | None, pos: list[Arg], named: dict[str, Arg],
             scope: Scope, dest: Any, meta: Any) -> Any:
        """Resolve and apply an operation (the rule is in this module's docstring)."""
        user = self.fragments.get(name)
        if user is not None and user.body is not None:
            return self.expand(user, generic, pos, named, scope, dest, meta)
        first_error, seen, accepted = None, [], []
        for opdef in (lookup(name), lookup("nnef." + name)):
            if opdef is None or opdef in seen:
                continue
            seen.append(opdef)
            try:
                bound = self.bind_op(opdef, pos, named, user or stdlib().get(name))
                attrs = opdef.normalize_attrs({k: a.value for k, a in bound[1].items()})
            except OpRuleError as e:
                first_error = first_error or e
                continue
            wrong = [k for k, arg in enumerate(bound[0]) if not _integer_arg(arg)]
            if opdef.integer_op and wrong:
                # A CVM op computes on integers only: a scalar or logical operand selects
                # the NNEF reading (`nnef.abs`, or the stdlib fragment of `relu`, `max`).
                v = bound[0][wrong[0]].value
                kind = _ELEM_OF[v.dtype] if isinstance(v, Tensor) else \
                    "logical" if isinstance(v, bool) else "scalar"
                slot = opdef.input_names[min(wrong[0], len(opdef.input_names) - 1)]
                first_error = first_error or OpRuleError(
                    f"{opdef.name}: input '{slot}' must be a tensor<integer>, got a "
                    f"tensor<{kind}> (a CVM integer op)")
                continue
            accepted.append((opdef, bound[0], attrs))
        shape_error = None
        for opdef, inputs, attrs in accepted:
            # A call both readings accept (NNEF `transpose(x, axes = [1, 0])` on a rank-4
            # tensor) takes the second when the first's shape rule rejects the operands.
            try:
                return self.apply(opdef, inputs, attrs, generic, user or stdlib().get(name),
                                  scope, dest, meta)
            except CvmcError as e:
                shape_error = shape_error or e
        if shape_error is not None:
            raise shape_error
        decl = user or stdlib().get(name)
        if decl is not None and decl.body is not None:
            return self.expand(decl, generic, pos, named, scope, dest, meta)
        where = scope.where(meta)
        if first_error is not None:
            raise self.err(self.prefix(scope, name, dest, first_error.message), where)
        if decl is not None:
            raise self.err(f"operation '{name}' is declared without a body and cvmc has no "
                           f"operator '{name}' (no shape rule; register one in cvmc.ops)",
                           where)
        raise self.err(f"unknown operation '{name}'{suggest(name)}", where)

    def prefix(self, scope: Scope, op: str, dest: Any, message: str) -> str:
        """Prefix an op rule's message with the user-visible op and instance name."""
        if scope.label:
            return f"{scope.label}: {message}"
        inst = dest if isinstance(dest, str) else _first_name(dest)
        body = message.removeprefix(op + ": ")
        return f"{op} '{inst}': {body}" if inst else f"{op}: {body}"

    def bind_op(self, opdef: OpDef, pos: list[Arg], named: dict[str, Arg],
                decl: Fragment | None) -> tuple[list[Arg], dict[str, Arg]]:
        """Split arguments into tensor inputs and attributes, or raise OpRuleError when
        the op's signature does not accept them."""
        inputs: list[Arg | None] = []
        i = 0
        if opdef.variadic:
            if pos and isinstance(pos[0].value, list):
                inputs, i = [Arg(v, pos[0].meta) for v in pos[0].value], 1
            else:
                while i < len(pos) and isinstance(pos[i].value, Tensor):
                    inputs.append(pos[i])
                    i += 1
        else:
            for slot in opdef.inputs:
                if i >= len(pos) or (slot.endswith("?") and not _tensorish(pos[i].value)):
                    break
                inputs.append(pos[i])
                i += 1
        if len(pos) > i:
            # NNEF 3.2: only tensor arguments may be positional; attributes are named.
            hint = f" (e.g. {opdef.attrs[0].name} = ...)" if opdef.attrs else ""
            raise OpRuleError(f"{opdef.name}: {len(pos) - i} positional argument(s) after its "
                              f"tensor inputs; attribute values must be named arguments{hint}")
        attrs: dict[str, Arg] = {}
        for key, arg in named.items():
            if key in opdef.input_names and not opdef.variadic:
                slot = opdef.input_names.index(key)
                inputs.extend([None] * (slot + 1 - len(inputs)))
                if inputs[slot] is not None:
                    raise OpRuleError(f"{opdef.name}: input '{key}' given twice")
                inputs[slot] = arg
            elif opdef.attr(key) is None:
                opdef.normalize_attrs({key: arg.value})  # raises: unknown, did you mean
            else:
                attrs[key] = arg
        for key, a in attrs.items():
            if _has_tensor(a.value):
                raise OpRuleError(f"{opdef.name}: attribute '{key}' must be a compile-time "
                                  f"value, got {show_value(a.value)}")
        inputs = self.fill_defaults(opdef, inputs, decl)
        opdef.check_arity(len(inputs))
        return inputs, attrs

    def fill_defaults(self, opdef: OpDef, inputs: list[Arg | None],
                      decl: Fragment | None) -> list[Arg]:
        """Omitted optional inputs take their NNEF declaration default (e.g. conv's
        `bias = 0.0`); an input left out in the middle must have one."""
        names = opdef.input_names
        params = {p.name: p for p in decl.params} if decl else {}
        if not opdef.variadic:
            for k in range(len(inputs), len(names)):
                p = params.get(names[k])
                if p is not None and p.default is not NO_DEFAULT:
                    inputs.append(None)
        out = []
        for k, arg in enumerate(inputs):
            if arg is None:
                p = params.get(names[k]) if k < len(names) else None
                if p is None or p.default is NO_DEFAULT:
                    raise OpRuleError(f"{opdef.name}: input '{names[k]}' is missing")
                arg = Arg(p.default, None)
            out.append(arg)
        return out

    def apply(self, opdef: OpDef, inputs: list[Arg], attrs: Attrs, generic: str | None,
              decl: Fragment | None, scope: Scope, dest: Any, meta: Any) -> Any:
        """Create the node for a resolved registry op; returns its output tensor(s)."""
        where = scope.where(meta)
        try:
            names = [self.tensor_input(opdef, k, a, where, inputs)
                     for k, a in enumerate(inputs)]
            self.check_input_types(opdef, decl, generic, names)
            shapes = opdef.infer_shapes([self.types[n] for n in names], attrs)
        except OpRuleError as e:
            raise self.err(self.prefix(scope, _bare(opdef.name), dest, e.message),
                           where) from None
        outs = self.output_names(opdef, len(shapes), dest, where)
        dtype = self.result_dtype(opdef, decl, generic, names, attrs)
        for out, shape in zip(outs, shapes):
            self.check_shape(out, shape, where)
            self.types[out] = TensorType(shape, dtype)
        self.nodes.append(Node(opdef.name, tuple(names), tuple(outs), dict(attrs),
                               self.span(where), scope.origin))
        tensors = [Tensor(o, dtype) for o in outs]
        if opdef.variadic_outputs:
            return tensors
        return tensors[0] if len(tensors) == 1 else tuple(tensors)

    def check_input_types(self, opdef: OpDef, decl: Fragment | None, generic: str | None,
                          names: list[str]) -> None:
        """Tensor inputs must fit the declared types: the NNEF declaration's where there is
        one (the dialect lets integer tensors stand for `scalar` ones, never logical ones
        for numeric ones or back), and integer tensors for a CVM op."""
        slots = []  # (parameter name, tensor type) per input; an array takes the rest
        for p in decl.params if decl else []:
            if p.type[0] == "array" and p.type[1][0] == "tensor":
                slots += [(p.name, p.type[1])] * (len(names) - len(slots))
            elif p.type[0] == "tensor":
                slots.append((p.name, p.type))
        for k, name in enumerate(names):
            value = Tensor(name, self.types[name].dtype)
            if k < len(slots):
                bad = check_value(value, slots[k][1], generic)
                if bad:
                    raise OpRuleError(f"{opdef.name}: input '{slots[k][0]}' must be "
                                      f"{bad}, got a tensor<{_ELEM_OF[value.dtype]}>")
            elif decl is None and opdef.integer_op and not self.types[name].is_integer:
                slot = opdef.input_names[min(k, len(opdef.input_names) - 1)]
                raise OpRuleError(f"{opdef.name}: input '{slot}' must be a tensor<integer>, "
                                  f"got a tensor<{_ELEM_OF[value.dtype]}>")

    def tensor_input(self, opdef: OpDef, k: int, arg: Arg, where: Any,
                     args: list[Arg]) -> str:
        """The value name of one tensor input; a literal number becomes a constant (an
        integer literal that the op takes as a scalar, a float32 one: `cinn.mul(x, 2)`)."""
        v = arg.value
        if isinstance(v, Tensor):
            return v.name
        slot = opdef.input_names[min(k, len(opdef.input_names) - 1)]
        if _tensorish(v):
            scalar = _scalar_slot(opdef, k, args)
            if isinstance(v, CallerInt) and scalar:
                rounding = float32_rounding(v)
                if rounding:
                    raise OpRuleError(f"{opdef.name}: input '{slot}': {rounding}; pass "
                                      f"np.float32({v!r}) to accept that")
            if is_int(v) and scalar:
                v = float(v)
            return self.literal_tensor(v, where).name
        raise OpRuleError(f"{opdef.name}: input '{slot}' must be a tensor, got {show_value(v)}")

    def output_names(self, opdef: OpDef, count: int, dest: Any, where: Any) -> list[str]:
        """Names for an op's outputs, from the destination or freshly generated."""
        if count == 1 and not opdef.variadic_outputs:
            return [dest if isinstance(dest, str) else self.fresh()]
        if dest is None:
            return [self.fresh() for _ in range(count)]
        if not isinstance(dest, (list, tuple)) or len(dest) != count:
            raise self.err(f"{_bare(opdef.name)} returns {count} tensors but the left-hand "
                           f"side names {len(dest) if isinstance(dest, (list, tuple)) else 1}",
                           where)
        return [d if isinstance(d, str) else self.fresh() for d in dest]

    def result_dtype(self, opdef: OpDef, decl: Fragment | None, generic: str | None,
                     inputs: list[str], attrs: Attrs) -> str:
        """int32 for CVM ops on integer tensors; an NNEF op's declared result type otherwise
        (so NNEF `relu` on a scalar tensor stays scalar even though CVM's relu computes it);
        for a typed op without an NNEF declaration (CINN's), the registry's result kind."""
        first = self.types[inputs[0]].dtype if inputs else "float32"
        if opdef.integer_op:
            return "int32"
        if decl is None:
            kind = opdef.result_kind([_ELEM_OF[self.types[n].dtype] for n in inputs], attrs)
            return DTYPE_OF[kind] if kind else DTYPE_OF[generic] if generic else first
        elem = _tensor_elem(decl.results[0][1])
        if elem != "?":
            return DTYPE_OF.get(elem or "", first)
        if generic:
            return DTYPE_OF[generic]
        # `tensor<?>` results have the type of the inputs declared `tensor<?>` (select's
        # branches, not its condition): pair the declaration's tensor params with inputs.
        tensor_params = [p.type for p in decl.params if _tensor_elem(p.type) is not None]
        for t, name in zip(tensor_params, inputs):
            if _tensor_elem(t) == "?":
                return self.types[name].dtype
        return first

    def expand(self, frag: Fragment, generic: str | None, pos: list[Arg],
               named: dict[str, Arg], scope: Scope, dest: Any, meta: Any) -> Any:
        """Evaluate a compound fragment's body with its parameters bound."""
        where = scope.where(meta)
        if self.depth >= MAX_EXPANSION_DEPTH:
            raise self.err(f"fragment '{frag.name}' is expanded more than "
                           f"{MAX_EXPANSION_DEPTH} levels deep (a recursive fragment without "
                           f"a reachable base case?)", where)
        values = self.bind_fragment(frag, generic, pos, named, where)
        if len(frag.results) == 1:
            dests = {frag.results[0][0]: dest}
        elif isinstance(dest, (list, tuple)) and len(dest) == len(frag.results):
            dests = {r[0]: d for r, d in zip(frag.results, dest)}
        elif dest is None:
            dests = {}
        else:
            raise self.err(f"{frag.name} returns {len(frag.results)} results but the "
                           f"left-hand side names {_count(dest)}", where)
        is_std = frag.source is not self.source
        label = scope.label or (f"{frag.name} '{_first_name(dest) or self.hint}'"
                                if is_std else "")
        inner = Scope(values, frag, dests, where if is_std else scope.site, label,
                      scope.origin or (frag.name if is_std else None))
        self.depth += 1
        try:
            for stmt in frag.body.children[:-1]:
                self.assign(stmt, inner)
        finally:
            self.depth -= 1
        out = []
        for rname, _ in frag.results:
            if rname not in inner.names:
                raise self.err(f"result '{rname}' of fragment '{frag.name}' is not assigned",
                               where)
            out.append(inner.names[rname])
        return out[0] if len(out) == 1 else tuple(out)



# ---- helpers ------------------------------------------------------------------------------
def _lvalue_names(lvalue: Any) -> list[lark.Token]:
    if lvalue.data == "lv_ident":
        return [lvalue.children[0]]
    return [t for c in lvalue.children for t in _lvalue_names(c)]


_ELEM_OF = {"int32": "integer", "int8": "integer", "float32": "scalar", "bool": "logical"}


def _tensor_elem(t: tuple) -> str | None:
    """The element type name of a tensor or tensor-array type ("" for `tensor<>`)."""
    while t[0] == "array":
        t = t[1]
    return (t[1] or "") if t[0] == "tensor" else None


def _integer_arg(arg: Arg) -> bool:
    """An integer tensor or integer literal (what a CVM integer op accepts)."""
    v = arg.value
    if isinstance(v, Tensor):
        return v.dtype in ("int8", "int32")
    return isinstance(v, int) and not isinstance(v, bool)


class CallerInt(int):
    """An int that a Python caller (`cvmc.GraphBuilder`) passed as a tensor: where it
    becomes a float32 constant, float32 must hold it exactly (an integer is exact by
    nature; a float, like a decimal literal in text, rounds to the nearest float32)."""


def caller_number(v: float) -> float:
    """`v` marked as passed by a Python caller where it is an int (not a logical)."""
    return CallerInt(v) if type(v) is int else v


def _scalar_slot(opdef: OpDef, k: int, args: list[Arg]) -> bool:
    """True if typed op input k is a scalar: declared so, or generic (`?`, `numeric`) with a
    float32 tensor among the generic operands."""
    if opdef.integer_op:
        return False
    kind = opdef.in_kind(k)
    return kind == "scalar" or kind in GENERIC and any(
        isinstance(a.value, Tensor) and a.value.dtype == "float32" and opdef.in_kind(j) in GENERIC
        for j, a in enumerate(args))


def _tensorish(v: Any) -> bool:
    """A tensor or a number/logical literal usable as a shape-[] tensor."""
    return isinstance(v, (Tensor, int, float, bool))


def _has_tensor(v: Any) -> bool:
    if isinstance(v, (list, tuple)):
        return any(_has_tensor(x) for x in v)
    return isinstance(v, Tensor)


def _bare(name: str) -> str:
    return name.removeprefix("nnef.")


def _first_name(dest: Any) -> str | None:
    if isinstance(dest, str):
        return dest
    if isinstance(dest, (list, tuple)):
        return next((n for d in dest if (n := _first_name(d))), None)
    return None


def _count(dest: Any) -> int:
    return len(dest) if isinstance(dest, (list, tuple)) else 1

"""NNEF fragment declarations: parameter/result types, defaults, and argument type checks.

Types are tuples: ("prim", name) for integer/scalar/logical/string/?, ("tensor", name or
None), ("array", item type) and ("tuple", (item types...)). The standard library is
parsed once and shared by every document: the primitives as the op records declare them
(`cvmc.ops.describe`), the rest as Khronos' `stdlib.nnef` (NNEF-Tools 1.0.5) writes it.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from importlib import resources
from typing import Any

import lark

from cvmc.frontend.syntax import Source, literal_value, parse_text
from cvmc.ops.describe import nnef_declarations

Type = tuple
NO_DEFAULT: Any = object()
DTYPE_OF = {"integer": "int32", "scalar": "float32", "logical": "bool"}


@dataclass(frozen=True)
class Tensor:
    """A tensor value during evaluation: the IR value name and its dtype."""

    name: str
    dtype: str


@dataclass
class Param:
    """A fragment parameter: name, type, default value (NO_DEFAULT when required)."""

    name: str
    type: Type
    default: Any


@dataclass
class Fragment:
    """A fragment declaration, with its body when it is compound."""

    name: str
    generic: bool
    generic_default: str | None
    params: list[Param]
    results: list[tuple[str, Type]]
    body: lark.Tree | None
    meta: Any
    source: Source

    def param(self, name: str) -> Param | None:
        """The parameter called `name`, if any."""
        return next((p for p in self.params if p.name == name), None)


def type_of(tree: Any) -> Type:
    """Convert a type_spec parse tree to a Type tuple."""
    if tree.data == "type_name":
        return ("prim", str(tree.children[0]))
    if tree.data == "tensor_type":
        return ("tensor", str(tree.children[0].children[0]) if tree.children else None)
    if tree.data == "array_type":
        return ("array", type_of(tree.children[0]))
    assert tree.data == "tuple_type", tree.data
    return ("tuple", tuple(type_of(c) for c in tree.children))


def type_str(t: Type) -> str:
    """NNEF spelling of a type, for messages."""
    if t[0] == "prim":
        return t[1]
    if t[0] == "tensor":
        return f"tensor<{t[1] or ''}>"
    if t[0] == "array":
        return type_str(t[1]) + "[]"
    return "(" + ", ".join(type_str(x) for x in t[1]) + ")"


def declare(tree: lark.Tree, source: Source, literal: Any) -> Fragment:
    """Build a Fragment from a `fragment` parse tree; `literal` evaluates default values."""
    name_tok, *rest = tree.children
    generic, generic_default = False, None
    if rest and isinstance(rest[0], lark.Tree) and rest[0].data == "generic":
        generic = True
        if rest[0].children:
            generic_default = str(rest[0].children[0].children[0])
        rest = rest[1:]
    params_tree, results_tree, *body = rest
    params = []
    for p in params_tree.children:
        default = _default(p, source, literal) if len(p.children) > 2 else NO_DEFAULT
        params.append(Param(str(p.children[0]), type_of(p.children[1]), default))
    results = [(str(r.children[0]), type_of(r.children[1])) for r in results_tree.children]
    has_body = body and isinstance(body[0], lark.Tree)
    frag = Fragment(str(name_tok), generic, generic_default, params, results,
                    body[0] if has_body else None, tree.meta, source)
    _check_declaration(frag, [*params_tree.children, *results_tree.children])
    return frag


def _check_declaration(frag: Fragment, nodes: list[lark.Tree]) -> None:
    """The rules of a valid fragment declaration (NNEF 3.2, "Fragment declarations");
    `nodes` are the parse trees of its parameters then results, for locating errors."""
    seen: set[str] = set()
    attribute_seen = False
    for k, node in enumerate(nodes):
        param = frag.params[k] if k < len(frag.params) else None
        name, t = (param.name, param.type) if param else frag.results[k - len(frag.params)]
        problem = _entry_problem(frag, name, t, param, seen, attribute_seen)
        if problem:
            raise frag.source.error(f"fragment '{frag.name}': {problem}", node.meta)
        seen.add(name)
        attribute_seen = attribute_seen or (param is not None and not is_tensor_type(t))
    uses_generic = any(_mentions_generic(p.type) for p in frag.params) or \
        any(_mentions_generic(t) for _, t in frag.results)
    if uses_generic != frag.generic:
        problem = ("uses the generic type '?' but is not declared generic ('fragment "
                   f"{frag.name}<?>')" if uses_generic else
                   "is declared generic but no parameter or result has the type '?'")
        raise frag.source.error(f"fragment '{frag.name}' {problem}", frag.meta)


def _entry_problem(frag: Fragment, name: str, t: Type, param: Param | None, seen: set[str],
                   attribute_seen: bool) -> str | None:
    """What breaks a rule in one parameter (`param`) or result (None) of a declaration."""
    if name in seen:
        return f"'{name}' names two parameters or results"
    if _mixes_tensors(t):
        return f"type {type_str(t)} of '{name}' mixes tensors and attributes in a tuple"
    if param is None:
        return None if is_tensor_type(t) else \
            f"result '{name}' must be a tensor, not {type_str(t)}"
    if attribute_seen and is_tensor_type(t):
        return f"tensor parameter '{name}' follows an attribute: tensor parameters come first"
    if param.default is not NO_DEFAULT and param.default is not None:
        bad = check_value(param.default, t, frag.generic_default)
        if bad:
            return f"the default value of '{name}' must be {bad}, got {show_value(param.default)}"
    return None


def _mixes_tensors(t: Type) -> bool:
    """Whether a tuple type inside `t` holds both tensor and attribute items (NNEF 3.2)."""
    if t[0] == "array":
        return _mixes_tensors(t[1])
    if t[0] != "tuple":
        return False
    return len({is_tensor_type(item) for item in t[1]}) > 1 or any(map(_mixes_tensors, t[1]))


def _mentions_generic(t: Type) -> bool:
    """Whether type `t` contains the generic type '?'."""
    if t[0] == "array":
        return _mentions_generic(t[1])
    if t[0] == "tuple":
        return any(map(_mentions_generic, t[1]))
    return t[1] == "?"


def _default(param: lark.Tree, source: Source, literal: Any) -> Any:
    """A parameter's default value, which NNEF requires to be a literal."""
    try:
        return literal(param.children[2])
    except ValueError:
        raise source.error(f"the default value of parameter '{param.children[0]}' must be a "
                           f"literal (number, string, logical, array or tuple of those)",
                           param.children[2].meta) from None


def parse_fragments(text: str, name: str) -> dict[str, Fragment]:
    """The fragments `text` (declarations and definitions, no graph) declares, by name;
    `name` labels the text in messages."""
    header = "version 1.0;\nextension KHR_enable_fragment_definitions;\n"
    placeholder = "\ngraph G( x ) -> ( x ) { x = external(shape = []); }\n"
    source = Source(header + text + placeholder, name)
    tree = parse_text(source)
    return {f.children[0].value: declare(f, source, literal_value)
            for f in tree.find_data("fragment")}


@functools.cache
def khronos_stdlib() -> dict[str, Fragment]:
    """Khronos' standard library (`stdlib.nnef`, verbatim): the spec's fragments by name."""
    text = resources.files("cvmc.frontend").joinpath("stdlib.nnef").read_text()
    return parse_fragments(text, "<stdlib.nnef>")


@functools.cache
def stdlib() -> dict[str, Fragment]:
    """The standard library cvmc reads documents with, by name: each NNEF op's
    declaration from its record (`nnef_declarations`), and Khronos' fragments for the
    rest (the compound fragments; external, variable and constant)."""
    records = parse_fragments(nnef_declarations(), "<op records>")
    return {**{n: f for n, f in khronos_stdlib().items() if n not in records}, **records}


def is_tensor_type(t: Type) -> bool:
    """Whether a parameter of type `t` takes tensors (a tensor, or an array/tuple of them)."""
    if t[0] == "array":
        return is_tensor_type(t[1])
    if t[0] == "tuple":
        return any(is_tensor_type(item) for item in t[1])
    return t[0] == "tensor"


def check_value(value: Any, t: Type, generic: str | None) -> str | None:
    """None if `value` fits type `t` (cvmc dialect: integer and scalar tensors mix),
    else a description of what was expected."""
    kind = t[0]
    if kind == "tensor":
        want = generic if t[1] == "?" else t[1]
        if isinstance(value, Tensor):
            ok = want in (None, "?") or (want == "logical") == (value.dtype == "bool")
            return None if ok else f"a tensor<{want}>"
        return None if _is_prim(value, want) else f"a tensor<{want or ''}> or a literal"
    if kind == "prim":
        want = generic if t[1] == "?" else t[1]
        return None if _is_prim(value, want) else f"a value of type {want}"
    if kind == "array":
        if not isinstance(value, list):
            return f"an array ({type_str(t)})"
        bad = [check_value(v, t[1], generic) for v in value]
        return next((f"an array of {b}" for b in bad if b), None)
    if not isinstance(value, tuple) or len(value) != len(t[1]):
        return f"a tuple {type_str(t)}"
    return next((b for v, it in zip(value, t[1]) if (b := check_value(v, it, generic))), None)


def _is_prim(value: Any, want: str | None) -> bool:
    if isinstance(value, Tensor):
        return False
    if want in (None, "?"):
        return isinstance(value, (int, float, bool, str))
    if want == "logical":
        return isinstance(value, bool)
    if want == "string":
        return isinstance(value, str)
    if want == "integer":
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, (int, float)) and not isinstance(value, bool)  # scalar


def show_value(v: Any, limit: int = 80) -> str:
    """A value as NNEF text for messages, cut to about `limit` characters."""
    text = _show(v)
    return text if len(text) <= limit else text[:limit] + "..."


def _show(v: Any) -> str:
    if isinstance(v, Tensor):
        kind = {"float32": "scalar", "bool": "logical"}.get(v.dtype, "integer")
        return f"tensor '{v.name}' (a tensor<{kind}>)"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return repr(v)
    if isinstance(v, list):
        return "[" + ", ".join(show_value(x) for x in v[:20]) + (", ...]" if v[20:] else "]")
    if isinstance(v, tuple):
        return "(" + ", ".join(show_value(x) for x in v) + ")"
    return str(v)

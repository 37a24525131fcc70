"""The NNEF text frontend: document checks (spec 3.3, chapter 6) and entry points.

`load_nnef` reads a model (a .nnef file, a folder holding graph.nnef, or a tar / tar.gz),
`parse_nnef` a document's text. Both return a typed, shape-checked `Graph`; every user
mistake is a `CvmcError` located at its line and column.
"""
from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import lark

from cvmc.errors import CvmcError
from cvmc.frontend.container import ModelSource, open_model
from cvmc.frontend.fragments import Fragment, declare, stdlib
from cvmc.frontend.semantics import GraphBuilder, Scope
from cvmc.frontend.syntax import Source, literal_value, parse_text
from cvmc.ir import Graph, TensorType
from cvmc.ops.infer import retype

FRAGMENTS_EXT = "KHR_enable_fragment_definitions"
EXPRESSIONS_EXT = "KHR_enable_operator_expressions"
PRECISION_SPEC = "cvm_precision_spec"


def load_nnef(path: Path, quant: Path | None, need_data: bool = False) -> Graph:
    """Read an NNEF model: a .nnef file, a folder with graph.nnef, or a .tar/.tar.gz/.tgz
    (`need_data`: a variable whose .dat file is absent is an error)."""
    with open_model(Path(path), Path(quant) if quant is not None else None) as model:
        return parse_nnef(model.graph_text, model.graph_name, model, model.quant_text,
                          model.quant_name, need_data)


def parse_nnef(text: str, filename: str = "<string>", weights: ModelSource | None = None,
               quant_text: str | None = None, quant_name: str | None = None,
               need_data: bool = False) -> Graph:
    """Parse, check and type an NNEF document; `weights` supplies variable data (none: no
    data)."""
    source = Source(text, filename)
    with _collector_paused():
        tree = parse_text(source)
        graph = _Document(source, tree).build(weights)
    if quant_text is not None:
        graph = _apply_quant(graph, quant_text, quant_name or "graph.quant")
    # typed last: graph.quant's cvm_precision_spec declares input and weight precisions
    return retype(graph, need_data)


@contextlib.contextmanager
def _collector_paused() -> Iterator[None]:
    """Pause Python's cyclic garbage collector: parsing allocates objects that all stay
    alive (the tree, the graph), and each full collection walks every one of them again
    (a quarter of `check`'s time at 16,000 nodes); nothing is left to collect meanwhile."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


class _Document:
    """One parsed document: its extensions, fragments and graph definition."""

    def __init__(self, source: Source, tree: lark.Tree):
        self.source = source
        self.tree = tree
        version, *rest = tree.children
        self.check_version(version)
        self.extensions = self.read_extensions([t for t in rest if t.data == "extension"])
        self.fragments = self.read_fragments([t for t in rest if t.data == "fragment"])
        self.graph = rest[-1]

    def err(self, message: str, where: Any) -> CvmcError:
        """A located error."""
        return self.source.error(message, where)

    def check_version(self, tree: lark.Tree) -> None:
        """NNEF 1.x only."""
        tok = tree.children[0]
        if str(tok).split(".")[0] != "1":
            raise self.err(f"unsupported NNEF version {tok}; cvmc reads version 1.x", tok)

    def read_extensions(self, trees: list[lark.Tree]) -> set[str]:
        """The enabled extensions; an unknown one is an error."""
        names = set()
        for t in trees:
            for tok in t.children:
                if tok not in (FRAGMENTS_EXT, EXPRESSIONS_EXT):
                    raise self.err(f"unknown extension '{tok}' (cvmc knows {FRAGMENTS_EXT} "
                                   f"and {EXPRESSIONS_EXT})", tok)
                names.add(str(tok))
        return names

    def read_fragments(self, trees: list[lark.Tree]) -> dict[str, Fragment]:
        """User fragment definitions, checked statically."""
        for inv in _in_order(self.tree.find_data("invocation")):
            if _op_name(inv) == "shape_of":
                raise self.err("'shape_of' is deprecated since NNEF 1.0.1 and not supported; "
                               "write the shape explicitly", inv.meta)
        if trees and FRAGMENTS_EXT not in self.extensions:
            raise self.err(f"fragment definitions need 'extension {FRAGMENTS_EXT};'",
                           trees[0].meta)
        out: dict[str, Fragment] = {}
        for t in trees:
            frag = declare(t, self.source, literal_value)
            if frag.name in out or frag.name in stdlib():
                where = "in the NNEF standard library" if frag.name in stdlib() else "above"
                raise self.err(f"fragment '{frag.name}' is already defined {where}",
                               t.children[0])
            for inv in _in_order(t.find_data("invocation") if frag.body else ()):
                if _op_name(inv) in ("variable", "external"):  # spec 3.3.2
                    raise self.err(f"operation '{_op_name(inv)}' is not allowed inside "
                                   f"fragments", inv.meta)
            if frag.body is not None:
                self.check_flat(frag.body)
            out[frag.name] = frag
        return out

    def check_flat(self, body: lark.Tree) -> None:
        """Without KHR_enable_operator_expressions, a body is flat (spec A.1)."""
        if EXPRESSIONS_EXT in self.extensions:
            return
        for stmt in body.children[:-1]:
            rhs = stmt.children[1]
            if rhs.data != "invocation":
                raise self.err(self.need_expressions(), rhs.meta)
            for arg in rhs.children[1:]:
                value = arg.children[1] if arg.data == "named_arg" else arg
                self.check_flat_value(value)

    def check_flat_value(self, tree: lark.Tree) -> None:
        """A flat argument: identifier, literal, or array/tuple of those."""
        if tree.data in ("array", "tuple"):
            for c in tree.children:
                self.check_flat_value(c)
        elif tree.data == "unary" and tree.children[1].data == "number" and \
                str(tree.children[0]) == "-":
            return
        elif tree.data not in ("ident", "number", "string", "true", "false"):
            raise self.err(self.need_expressions(), tree.meta)

    @staticmethod
    def need_expressions() -> str:
        """The message for an expression in a flat document."""
        return f"operator expressions need 'extension {EXPRESSIONS_EXT};'"

    def build(self, weights: ModelSource | None) -> Graph:
        """Evaluate the graph body into a Graph."""
        name_tok, ins_tree, outs_tree, body = self.graph.children
        inputs, outputs = self.names(ins_tree), self.names(outs_tree)
        self.check_flat(body)
        builder = GraphBuilder(self.source, self.fragments, weights)
        builder.reserved = {str(t) for t in ins_tree.children + outs_tree.children}
        for lv in body.find_data("lv_ident"):
            builder.reserved.add(str(lv.children[0]))
        scope = Scope()
        for stmt in body.children[:-1]:
            self.check_external(stmt, inputs)
            builder.hint = str(next(stmt.children[0].scan_values(lambda v: True), "t"))
            builder.assign(stmt, scope)
        for tok in ins_tree.children:
            if str(tok) not in scope.names:
                raise self.err(f"graph input '{tok}' is not assigned (declare it with "
                               f"'{tok} = external(...)')", tok)
        for tok in outs_tree.children:
            if str(tok) not in scope.names:
                raise self.err(f"graph output '{tok}' is not assigned", tok)
        builder.load_weights()
        graph = Graph(str(name_tok), inputs, outputs, builder.nodes, builder.types,
                      builder.constants, builder.labels, spans=builder.spans)
        graph.verify()
        return graph

    def names(self, tree: lark.Tree) -> list[str]:
        """An identifier list of the graph header, without duplicates."""
        seen: list[str] = []
        for tok in tree.children:
            if str(tok) in seen:
                raise self.err(f"'{tok}' is listed twice in the graph header", tok)
            seen.append(str(tok))
        return seen

    def check_external(self, stmt: lark.Tree, inputs: list[str]) -> None:
        """Graph inputs are exactly the tensors `external` declares."""
        lvalue, rhs = stmt.children
        is_external = rhs.data == "invocation" and _op_name(rhs) == "external"
        if is_external:
            if lvalue.data != "lv_ident" or str(lvalue.children[0]) not in inputs:
                raise self.err("tensors declared by 'external' must be graph inputs (listed "
                               "in the graph header)", lvalue.meta)
            return
        for lv in lvalue.iter_subtrees():
            if lv.data == "lv_ident" and str(lv.children[0]) in inputs:
                raise self.err(f"graph input '{lv.children[0]}' can only be assigned by "
                               f"'external'", lv.children[0])


def _op_name(invocation: lark.Tree) -> str:
    """The operation an invocation calls, without its generic argument ('cast<integer>')."""
    return str(invocation.children[0]).split("<")[0].strip()


def _in_order(trees: Any) -> list[lark.Tree]:
    """Parse trees in source order (lark's find_data does not promise it)."""
    return sorted(trees, key=lambda t: (t.meta.line, t.meta.column))


def _apply_quant(graph: Graph, text: str, name: str) -> Graph:
    """`graph` with its graph.quant entries; `cvm_precision_spec` sets an input/weight
    precision. Every mistake is located at its entry in the quantization file."""
    from cvmc.frontend.quant import parse_quant_located
    entries, error = parse_quant_located(text, name)
    quant, types = dict(graph.quant), dict(graph.types)
    for tensor, (fragment, attrs) in entries.items():
        if tensor not in types:
            raise error(tensor, f"entry for '{tensor}', but the graph has no such tensor")
        quant[tensor] = {"fragment": fragment, "attrs": dict(attrs)}
        if fragment != PRECISION_SPEC:
            continue
        t, p = types[tensor], attrs.get("precision")
        if set(attrs) != {"precision"} or not isinstance(p, int) or isinstance(p, bool) \
                or not 1 <= p <= 32:
            raise error(tensor, f"'{tensor}': {PRECISION_SPEC} takes one argument "
                                f"'precision' in 1..32, got {attrs}")
        if tensor not in graph.inputs and tensor not in graph.weights() or not t.is_integer:
            raise error(tensor, f"'{tensor}': {PRECISION_SPEC} applies to integer graph "
                                f"inputs and weights")
        if t.precision is not None and t.precision != p:
            raise error(tensor, f"'{tensor}': precision {p} disagrees with the precision "
                                f"{t.precision} declared in the graph")
        types[tensor] = TensorType(t.shape, t.dtype, p)
    return graph.replace(quant=quant, types=types)

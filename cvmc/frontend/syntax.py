"""NNEF text -> lark parse tree, with syntax errors as located `CvmcError`s.

The grammar (`nnef.lark`) is generic: it names no operations. This module only parses
and turns lark's exceptions into `file:line:col: error: ...` messages.
"""
from __future__ import annotations

import functools
import math
import re
from importlib import resources
from typing import Any

import lark

from cvmc.errors import CvmcError, SourceSpan

MAX_NESTING = 64  # the Khronos and tract corpus nests at most 10 levels
MAX_LITERAL = (1 << 63) - 1

# Token names as users should read them in "expected ..." messages.
_TOKEN_WORDS = {
    "SEMICOLON": "';'", "LPAR": "'('", "RPAR": "')'", "LSQB": "'['", "RSQB": "']'",
    "COMMA": "','", "EQUAL": "'='", "IDENT": "an identifier", "NUMBER": "a number",
    "STRING": "a string", "RBRACE": "'}'", "LBRACE": "'{'", "COLON": "':'",
    "GENERIC_NAME": "an invocation", "QUALIFIED_NAME": "an invocation", "__ANON_0": "'->'", "MORETHAN": "'>'",
    "LESSTHAN": "'<'", "$END": "end of file",
}


@functools.cache
def _parser() -> lark.Lark:
    grammar = resources.files("cvmc.frontend").joinpath("nnef.lark").read_text()
    return lark.Lark(grammar, parser="lalr", propagate_positions=True)


def span_of(filename: str, meta: Any) -> SourceSpan:
    """The source position of a tree node or token."""
    return SourceSpan(filename, meta.line, meta.column)


def normalize_text(text: str) -> str:
    """A text file's content with a leading UTF-8 BOM dropped and CR LF or a lone CR read
    as a line break, so line numbers count lines as every editor shows them."""
    return text.removeprefix("\ufeff").replace("\r\n", "\n").replace("\r", "\n")


class Source:
    """A document's text and name, for locating errors."""

    def __init__(self, text: str, filename: str):
        text = normalize_text(text)
        self.text = text
        self.filename = filename
        self.lines = text.splitlines()

    def line(self, n: int) -> str | None:
        """Line `n` (1-based) of the text, if it exists."""
        return self.lines[n - 1] if 0 < n <= len(self.lines) else None

    def error(self, message: str, where: Any) -> CvmcError:
        """A CvmcError located at a tree node or token (or unlocated if `where` is None)."""
        if where is None or getattr(where, "line", None) is None:
            return CvmcError(message)
        return CvmcError(message, span_of(self.filename, where), self.line(where.line))


# A document begins with its version (spec 3.3, after layout and comments). A file that does
# not is no NNEF document: its content (any file a user or a folder named, e.g. a key) is
# never echoed in the error.
_VERSION_FIRST = re.compile(r"(?:[ \t\f\r\n]+|#[^\n]*)*version\b")


def parse_text(source: Source) -> lark.Tree:
    """Parse a whole NNEF document; raise a located CvmcError on a syntax error."""
    if _VERSION_FIRST.match(source.text) is None:
        raise CvmcError("not an NNEF document: it must begin with 'version 1.0;' (NNEF 3.3); "
                        "its content is not shown", SourceSpan(source.filename, 1, 1))
    try:
        tree = _parser().parse(source.text)
    except lark.UnexpectedCharacters as e:
        char = source.text[e.pos_in_stream] if e.pos_in_stream < len(source.text) else ""
        msg = "unterminated string literal" if char in "'\"" else \
            f"unexpected character {char!r}"
        raise _at(source, msg, e.line, e.column) from None
    except lark.UnexpectedToken as e:
        tok = e.token
        if tok.type == "$END":
            line = max(len(source.lines), 1)
            col = len(source.line(line) or "") + 1
            raise _at(source, f"unexpected end of file; expected {_expected(e)}",
                      line, col) from None
        prev = (getattr(e, "token_history", None) or [None])[-1]
        if "SEMICOLON" in e.expected and prev is not None and prev.end_line < tok.line:
            # a missing ';' at a line end: point after the last token, not at the next line
            raise _at(source, f"missing ';' after '{prev}'", prev.end_line,
                      prev.end_column) from None
        raise _at(source, f"unexpected {_describe(tok)}; expected {_expected(e)}",
                  tok.line, tok.column) from None
    except lark.UnexpectedInput as e:  # any other lark input error, still located
        raise _at(source, "syntax error", e.line, e.column) from None
    _check_limits(source, tree)
    return tree


def _check_limits(source: Source, tree: lark.Tree) -> None:
    """Reject nesting deeper than MAX_NESTING and numbers outside MAX_LITERAL, so that
    evaluation (recursive over the tree) cannot exhaust the stack and literals convert."""
    stack = [(tree, 1)]
    keywords = []  # reported in source order, after the walk
    while stack:  # iterative: the tree itself may be deeper than Python's recursion limit
        node, depth = stack.pop()
        if depth > MAX_NESTING:
            raise source.error(f"expression nested more than {MAX_NESTING} levels deep",
                               node.meta)
        for k, c in enumerate(node.children):
            if isinstance(c, lark.Tree):
                stack.append((c, depth + 1))
            elif isinstance(c, lark.Token) and c.type == "NUMBER" and not _number_ok(c):
                raise source.error(f"number {c[:20]}{'...' if len(c) > 20 else ''} is "
                                   f"outside the range of 64-bit numbers", c)
            elif isinstance(c, lark.Token) and c.type == "IDENT" and c in KEYWORDS and not (
                    node.data == "invocation" and k == 0 and c in BUILTIN_FUNCTIONS):
                keywords.append(c)
    if keywords:
        first = min(keywords, key=lambda t: (t.line, t.column))
        raise source.error(f"'{first}' is a keyword and cannot be used as an identifier "
                           f"(NNEF 3.1)", first)


# NNEF 1.0 keywords (spec 3.1, "Lexical Elements"). The type names and the three shape
# functions are called like operations, and only there may they appear.
KEYWORDS = frozenset({"version", "extension", "fragment", "graph", "tensor", "integer",
                      "scalar", "logical", "string", "for", "in", "if",
                      "else", "yield", "length_of", "shape_of", "range_of"})
BUILTIN_FUNCTIONS = frozenset({"integer", "scalar", "logical", "string", "length_of",
                               "shape_of", "range_of"})


def _number_ok(text: str) -> bool:
    """An integer literal below 2^63, or a float literal that is finite."""
    if any(ch in text for ch in ".eE"):
        return len(text) < 1000 and math.isfinite(float(text))
    return len(text) <= 19 and int(text) <= MAX_LITERAL


def _at(source: Source, message: str, line: int, col: int) -> CvmcError:
    return CvmcError(message, SourceSpan(source.filename, line, col), source.line(line))


def _describe(tok: lark.Token) -> str:
    return f"'{tok}'" if tok.type != "$END" else "end of file"


def _expected(e: lark.UnexpectedToken) -> str:
    names = sorted({_TOKEN_WORDS.get(t, _anon_word(t)) for t in e.expected})
    if len(names) > 6:
        names = names[:6] + ["..."]
    return " or ".join(names)


def _anon_word(name: str) -> str:
    """Readable form of lark's names for anonymous tokens ("VERSION" -> 'version')."""
    return f"'{name.lower()}'" if name.isalpha() else name


def literal_value(tree: Any) -> Any:
    """The value of a literal expression (numbers, strings, logicals, arrays, tuples)."""
    kind = tree.data
    if kind == "number":
        text = str(tree.children[0])
        return float(text) if any(c in text for c in ".eE") else int(text)
    if kind == "string":
        return str(tree.children[0])[1:-1]
    if kind in ("true", "false"):
        return kind == "true"
    if kind == "unary" and str(tree.children[0]) in "+-":
        v = literal_value(tree.children[1])
        return -v if str(tree.children[0]) == "-" else v
    if kind in ("array", "tuple"):
        items = [literal_value(c) for c in tree.children]
        return items if kind == "array" else tuple(items)
    raise ValueError(kind)

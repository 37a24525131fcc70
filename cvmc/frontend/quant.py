"""graph.quant (NNEF spec 5.3): one `"tensor": fragment(attr = value, ...);` entry per line.

Values are literals: numbers (a leading '-' allowed), strings in '' or "", `true` /
`false`, arrays `[...]` and tuples `(a, b)`. The spec's "compile-time expressions" are
read as literals: arithmetic in a quantization file has no known use. Comments run from
'#' to the end of the line. cvmc's own fragment is `cvm_precision_spec(precision = P)`;
any other fragment (e.g. Khronos `linear_quantize`) is kept as given.
"""
from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any, NoReturn

from cvmc.errors import CvmcError, SourceSpan
from cvmc.frontend.syntax import normalize_text

_TOKEN = re.compile(r"""
    (?P<ws>[ \t\r\n]+|\#[^\n]*)
  | (?P<string>"[^"\n]*"|'[^'\n]*')
  | (?P<number>[0-9]+(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?)
  | (?P<ident>[A-Za-z_][A-Za-z0-9_]*)
  | (?P<punct>[:()=,;\[\]-])
""", re.VERBOSE)

Token = tuple[str, str, int]  # kind, text, offset
# An entry begins with a quoted tensor name: a file whose first entry does not (after layout
# and comments) is no quantization file, and its content is never echoed in the error.
_QUOTE_FIRST = re.compile(r"""(?:[ \t\r\n]+|\#[^\n]*)*(?:["']|$)""")
MAX_NESTING = 64  # arrays/tuples in a value: bounds the recursion of `value`
MAX_DIGITS = 19  # integers below 10^19 (int() refuses beyond 4300 digits anyway)


class _Parser:
    """Recursive descent over the token list; errors carry the token's line and column."""

    def __init__(self, text: str, filename: str):
        self.text, self.filename = normalize_text(text), filename
        if _QUOTE_FIRST.match(self.text) is None:
            raise CvmcError("not a quantization file: entries are '\"tensor\": fragment(...);' "
                            "(NNEF 5.3); its content is not shown", SourceSpan(filename, 1, 1))
        self.tokens = self._tokenize()
        self.pos = 0
        self.offsets: dict[str, int] = {}  # tensor name -> where its entry starts

    def _tokenize(self) -> list[Token]:
        tokens, offset = [], 0
        while offset < len(self.text):
            m = _TOKEN.match(self.text, offset)
            if m is None:
                self.fail(offset, f"unexpected character {self.text[offset]!r}")
            if m.lastgroup != "ws":
                tokens.append((m.lastgroup or "", m.group(), offset))
            offset = m.end()
        tokens.append(("eof", "end of file", len(self.text)))
        return tokens

    def fail(self, offset: int, message: str) -> NoReturn:
        """Raise a CvmcError located at a character offset."""
        raise self.error(offset, message)

    def error(self, offset: int, message: str) -> CvmcError:
        """A CvmcError located at a character offset (with its source line)."""
        line = self.text.count("\n", 0, offset) + 1
        start = self.text.rfind("\n", 0, offset) + 1
        end = self.text.find("\n", offset)
        source = self.text[start:end if end >= 0 else len(self.text)]
        return CvmcError(message, SourceSpan(self.filename, line, offset - start + 1), source)

    def peek(self) -> Token:
        return self.tokens[self.pos]

    def take(self, kind: str, text: str | None = None) -> Token:
        """Consume the next token, which must be of `kind` (and spelled `text`)."""
        tok = self.peek()
        if tok[0] != kind or (text is not None and tok[1] != text):
            want = f"'{text}'" if text else {"string": "a quoted tensor name",
                                              "ident": "an identifier"}.get(kind, kind)
            self.fail(tok[2], f"expected {want}, found '{tok[1]}'")
        self.pos += 1
        return tok

    def at(self, text: str) -> bool:
        return self.peek()[0] == "punct" and self.peek()[1] == text

    def document(self) -> dict[str, tuple[str, dict[str, Any]]]:
        entries: dict[str, tuple[str, dict[str, Any]]] = {}
        while self.peek()[0] != "eof":
            _, text, offset = self.take("string")
            if text[1:-1] in entries:
                self.fail(offset, f"tensor {text} has a second quantization entry")
            self.take("punct", ":")
            entries[text[1:-1]] = self.invocation()
            self.offsets[text[1:-1]] = offset
            self.take("punct", ";")
        return entries

    def invocation(self) -> tuple[str, dict[str, Any]]:
        fragment = self.take("ident")[1]
        self.take("punct", "(")
        attrs: dict[str, Any] = {}
        while not self.at(")"):
            if attrs:
                self.take("punct", ",")
            _, name, offset = self.take("ident")
            if name in attrs:
                self.fail(offset, f"attribute '{name}' of {fragment} given twice")
            self.take("punct", "=")
            attrs[name] = self.value()
        self.take("punct", ")")
        return fragment, attrs

    def value(self, depth: int = 0) -> Any:
        kind, text, offset = self.peek()
        if self.at("[") or self.at("("):
            if depth >= MAX_NESTING:
                self.fail(offset, f"value nested more than {MAX_NESTING} levels deep")
            return self.sequence(depth + 1)
        self.pos += 1
        if kind == "string":
            return text[1:-1]
        if kind == "ident" and text in ("true", "false"):
            return text == "true"
        if kind == "number":
            if any(c in text for c in ".eE"):
                return float(text)
            if len(text) > MAX_DIGITS:
                self.fail(offset, f"integer {text[:20]}... has more than {MAX_DIGITS} digits")
            return int(text)
        if text == "-" and self.peek()[0] == "number":
            return -self.value()
        self.fail(offset, f"expected a literal value (number, string, true/false, array or "
                          f"tuple), found '{text}'")

    def sequence(self, depth: int) -> list[Any] | tuple[Any, ...]:
        opener = self.take("punct")[1]
        closer = "]" if opener == "[" else ")"
        items: list[Any] = []
        while not self.at(closer):
            if items:
                self.take("punct", ",")
            items.append(self.value(depth))
        self.take("punct", closer)
        return items if opener == "[" else tuple(items)


def parse_quant(text: str, filename: str) -> dict[str, tuple[str, dict[str, Any]]]:
    """Parse a graph.quant file: tensor name -> (fragment name, attributes)."""
    return _Parser(text, filename).document()


def parse_quant_located(text: str, filename: str) -> tuple[
        dict[str, tuple[str, dict[str, Any]]], Callable[[str, str], CvmcError]]:
    """(entries, error): `error(tensor, message)` is a CvmcError located at the tensor's
    entry, for mistakes found when the entries meet the graph."""
    parser = _Parser(text, filename)
    entries = parser.document()
    return entries, lambda tensor, message: parser.error(parser.offsets[tensor], message)

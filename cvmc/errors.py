"""User-facing errors: one exception type carrying an optional source location.

Every mistake in user input (syntax, types, shapes, precision, data files, run-time
inputs) raises `CvmcError`; the CLI prints `render()` and exits 1. Internal invariants
use `assert` and are bugs when they fire.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SourceSpan:
    """A position in a source file (1-based line and column)."""

    file: str
    line: int
    col: int

    def __str__(self) -> str:
        return f"{self.file}:{self.line}:{self.col}"


class CvmcError(Exception):
    """An error in user input, optionally located in a source file."""

    def __init__(self, message: str, span: SourceSpan | None = None, source_line: str | None = None):
        super().__init__(message)
        self.message = message
        self.span = span
        self.source_line = source_line

    def __str__(self) -> str:
        return f"{self.span}: error: {self.message}" if self.span else f"error: {self.message}"

    def render(self) -> str:
        """The message, plus the offending source line and a caret when known."""
        text = str(self)
        if self.span and self.source_line is not None:
            line = self.source_line.rstrip("\n").expandtabs(1)
            text += f"\n  {line}\n  {' ' * (self.span.col - 1)}^"
        return text

    def located(self, span: SourceSpan | None, source_line: str | None = None) -> CvmcError:
        """Attach a location if this error has none yet; returns self."""
        if self.span is None and span is not None:
            self.span = span
            self.source_line = source_line
        return self


class OpRuleError(CvmcError):
    """Raised by an op's shape/precision/attribute rule; the caller adds the op instance."""


class ForeignCpuWarning(UserWarning):
    """Code built for a CPU other than this machine's (`--mcpu`): it may not run here.
    Its own class, so that a caller who compiles for other machines on purpose (a test
    suite, a build farm) can filter exactly this warning."""


def check_argument(function: str, name: str, value: object, ok: bool, want: str) -> None:
    """An argument of a public function that is not `want` is a CvmcError naming it,
    raised before any work (not a TypeError from deep inside)."""
    if not ok:
        raise CvmcError(f"{function}: {name} must be {want}, got {value!r:.60}")

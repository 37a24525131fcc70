"""Per-stage, per-kernel progress for `cvmc compile` on a terminal (rich)."""
from __future__ import annotations

from contextlib import contextmanager

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn


class RichProgress:
    """One progress bar per stage; each built kernel advances the build stage's bar."""

    def __init__(self, console):
        self._progress = Progress(TextColumn("{task.description}"), BarColumn(),
                                  MofNCompleteColumn(), TimeElapsedColumn(), console=console)
        self._task = None
        self._name = ""

    @contextmanager
    def stage(self, name: str, total: int = 0):
        """Show `name` with a bar of `total` steps while the block runs."""
        with self._progress:
            self._name = name
            self._task = self._progress.add_task(name, total=total or 1)
            yield self
            self._progress.update(self._task, completed=total or 1, description=name)

    def advance(self, label: str = "") -> None:
        """One step (kernel) of the current stage done."""
        self._progress.update(self._task, advance=1,
                              description=f"{self._name}: {label}" if label else self._name)

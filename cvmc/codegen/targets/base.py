"""A backend: what compiling for one kind of target takes. As data, its pass list
(`cvmc.passes.pipeline.Pass` entries) and its schedule table (`ScheduleRule` rows); as
steps, which `compile_model` runs in order: `check` (before any work), `start` (while the
passes run), `run_passes`, `lower`, `build` (schedule and compile), and `schedule` alone
(`--emit tir`, the tests)."""
from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass

from cvmc.codegen.build import Built
from cvmc.ir import Graph
from cvmc.lowering.lower import lower_graph
from cvmc.lowering.rules import ScheduleRule
from cvmc.passes.pipeline import Pass, run_passes
from cvmc.passes.target import Target


@dataclass(frozen=True)
class Backend(ABC):
    """`name`; the targets it compiles for: their `kind` and, for llvm, the LLVM `triples`
    (prefixes); the `passes` a graph takes, in order, and the `schedules` table. A
    subclass builds (`schedule`, `build`)."""

    name: str
    kind: str
    triples: tuple[str, ...]
    passes: tuple[Pass, ...]
    schedules: tuple[ScheduleRule, ...]

    def compiles(self, target: Target) -> bool:
        """True if this backend compiles for `target`."""
        return target.kind == self.kind and target.triple.startswith(self.triples)

    def check(self, target: Target) -> None:
        """Raise a CvmcError now if this machine cannot build for `target`."""

    def start(self, kernels: int, jobs: int | None) -> None:
        """Start what building about `kernels` kernels in `jobs` processes needs, while
        the passes and the lowering run."""

    def run_passes(self, graph: Graph, target: Target, stop_after: str | None = None,
                   after_pass: Callable[[int, str, Graph], None] | None = None) -> Graph:
        """`graph` through the passes (`cvmc.passes.pipeline.run_passes`)."""
        return run_passes(graph, self.passes, stop_after, after_pass, target)

    def lower(self, graph: Graph, target: Target, prefix: str = "k"):
        """(IRModule, groups, execution plan) of the graph the passes made
        (`cvmc.lowering.lower.lower_graph`)."""
        return lower_graph(graph, target, prefix, self.schedules)

    @abstractmethod
    def schedule(self, mod, target: Target):
        """(scheduled module, {kernel symbol: rule name})."""

    @abstractmethod
    def build(self, mod, target: Target, plan: dict,
              on_kernel: Callable[[str], None] | None = None, jobs: int | None = None,
              cache: bool = True) -> Built:
        """The kernels of `mod` scheduled and compiled into a library holding the signature
        of `plan`'s kernels, `on_kernel(symbol)` after each; in `jobs` processes and with
        the per-user kernel cache (`cache`) where the backend builds kernel by kernel."""

"""Codegen: a checked graph -> its backend's passes (fused kernels last) -> one compiled
library -> a .cvmx artifact. The backends, one module each, are cvmc/codegen/targets."""
from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from cvmc.errors import CvmcError, check_argument
from cvmc.ir import Graph
from cvmc.passes.target import Target

if TYPE_CHECKING:
    from cvmc.codegen.build import Built


@dataclass
class CompileResult:
    """What compile_model produced: the plan, the build, the wall time and the weights by
    name (as the plan declares them)."""

    plan: dict
    built: Built
    seconds: float
    weights: dict

    @property
    def tir(self) -> str:
        """The scheduled TIR of every kernel (made when first asked for)."""
        return self.built.tir

    @property
    def source(self) -> str:
        """The generated LLVM IR or CUDA source (made when first asked for)."""
        return self.built.source

    @property
    def source_suffix(self) -> str:
        """The file suffix of `source`: ll or cu."""
        return self.built.source_suffix


class Quiet:
    """The progress interface compile_model reports to; this one prints nothing."""

    @contextmanager
    def stage(self, name: str, total: int = 0):
        """A named stage with `total` steps (advance() once per step)."""
        yield self

    def advance(self, label: str = "") -> None:
        """One step of the current stage done."""


def compile_model(graph: Graph, output: str | Path | None, target: str | Target = "llvm",
                  mcpu: str | None = None, arch: str | None = None, progress=None,
                  quantization: Mapping | str | os.PathLike | None = None,
                  jobs: int | None = None, cache: bool = True,
                  after_pass: Callable[[int, str, Graph], None] | None = None) -> CompileResult:
    """Run the passes of `target`'s backend (`cvmc.codegen.targets`), then lower, schedule
    and build `graph` into a .cvmx file (none when `output` is None: the result alone, as
    for a C library). `target` is a Target, or a kind that `Target.make` builds one of with
    `mcpu` (default: the host CPU) or `arch` (default: sm_80). `after_pass(index, name,
    graph)` is called after each pass (`--dump-ir`). `quantization`: the scales of a
    quantized model (a quantization.json path or its object), recorded in the plan. CPU
    kernels are built in `jobs` processes (default: `CVMC_JOBS`, else one per CPU) and kept
    in the per-user kernel cache (`cvmc.codegen.cache`) unless `cache` is False; the
    artifact is the same either way."""
    from cvmc_runtime import write_artifact

    from cvmc.codegen.quantization import check_quantization, record_scales
    from cvmc.codegen.targets import backend

    path = (str, os.PathLike)
    for name, value, ok, want in (
            ("graph", graph, isinstance(graph, Graph), "a Graph (cvmc.load_graph, GraphBuilder)"),
            ("output", output, output is None or isinstance(output, path), "a path, or None for the result alone"),
            ("mcpu", mcpu, mcpu is None or isinstance(mcpu, str), "a CPU name"),
            ("arch", arch, arch is None or isinstance(arch, str), "a CUDA arch such as 'sm_80'"),
            ("quantization", quantization,
             quantization is None or isinstance(quantization, (Mapping, *path)),
             "a quantization.json path or its parsed object"),
            ("jobs", jobs, jobs is None or (type(jobs) is int and jobs >= 1), "an integer >= 1"),
            ("cache", cache, isinstance(cache, bool), "True or False")):
        check_argument("compile", name, value, ok, want)
    if isinstance(target, Target):
        if mcpu is not None or arch is not None:
            raise CvmcError("compile: give mcpu and arch to Target.make, not beside a Target")
    else:
        target = Target.make(target, mcpu, arch)
    steps = backend(target)
    steps.check(target)
    if target.mtriple and output is not None:
        raise CvmcError(f"--mtriple {target.mtriple}: the Python runtime runs host code only; "
                        f"build a C library (--emit c-library)")
    if output is not None:
        writable_file(output, "artifact")  # before the work, not after it
    progress = progress or Quiet()
    start = time.perf_counter()
    steps.start(len(graph.nodes), jobs)  # kernels: as many as nodes at most
    with progress.stage("passes"):
        graph = steps.run_passes(graph, target, after_pass=after_pass)
    scales = None if quantization is None else check_quantization(quantization, graph)
    with progress.stage("lower", len(graph.nodes)):
        mod, _, plan = steps.lower(graph, target)
    if scales:
        record_scales(plan, scales)
    with progress.stage(f"schedule + build ({target.kind})", len(mod.functions)) as stage:
        built = steps.build(mod, target, plan, stage.advance, jobs, cache)
    plan.update(target=built.target, device="cpu" if target.kind == "llvm" else "cuda")
    for kernel in plan["kernels"]:
        kernel["schedule"] = built.schedules[kernel["symbol"]]
    weights = {w["name"]: graph.constants[w["name"]].astype(w["dtype"])
               for w in plan["weights"]}
    if output is not None:
        with progress.stage("write artifact"):
            write_artifact(writable_file(output, "artifact"), plan, built.library, weights)
    return CompileResult(plan, built, time.perf_counter() - start, weights)


def writable_file(path: str | Path, what: str) -> Path:
    """`path` if a file can be created or replaced there: its folder exists and it is not
    itself a folder (checked before any work, so a mistake costs nothing)."""
    path = Path(path)
    if path.is_dir():
        raise CvmcError(f"{what} {path}: is a folder, expected a file path")
    if not path.parent.is_dir():
        raise CvmcError(f"{what} {path}: folder '{path.parent}' does not exist")
    return path



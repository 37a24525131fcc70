"""Codegen: a checked graph -> fused kernels -> one compiled library -> a .cvmx artifact."""
from __future__ import annotations

import os
import time
from collections.abc import Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from cvmc.errors import CvmcError
from cvmc.ir import Graph

TARGETS = ("llvm", "cuda")


@dataclass
class CompileResult:
    """What compile_model produced: the plan, the build and the wall time."""

    plan: dict
    tir: str
    source: str
    source_suffix: str
    seconds: float


class Quiet:
    """The progress interface compile_model reports to; this one prints nothing."""

    @contextmanager
    def stage(self, name: str, total: int = 0):
        """A named stage with `total` steps (advance() once per step)."""
        yield self

    def advance(self, label: str = "") -> None:
        """One step of the current stage done."""


def compile_model(graph: Graph, output: str | Path, target: str = "llvm",
                  mcpu: str | None = None, arch: str = "sm_80", progress=None,
                  quantization: Mapping | str | os.PathLike | None = None) -> CompileResult:
    """Run the pass pipeline for `target`, then lower, schedule and build `graph` into a
    .cvmx file. (The pipeline is idempotent: a graph that has been through it already,
    as `cvmc compile` does to dump it, is unchanged.) `quantization`: the scales of a
    quantized model (a quantization.json path or its object), recorded in the plan."""
    from cvmc_runtime import write_artifact

    from cvmc.codegen.build import build_cuda, build_llvm
    from cvmc.codegen.quantization import check_quantization, record_scales
    from cvmc.lowering.lower import lower_graph
    from cvmc.passes.pipeline import run_pipeline

    if target not in TARGETS:
        raise CvmcError(f"unknown target '{target}'; expected one of {', '.join(TARGETS)}")
    if target == "cuda":
        from cvmc.codegen.build import check_cuda_arch
        check_cuda_arch(arch)
    writable_file(output, "artifact")  # before the work, not after it
    progress = progress or Quiet()
    start = time.perf_counter()
    with progress.stage("passes"):
        graph = run_pipeline(graph, target=target)
    scales = None if quantization is None else check_quantization(quantization, graph)
    with progress.stage("lower", len(graph.nodes)):
        mod, _, plan = lower_graph(graph, target)
    if scales:
        record_scales(plan, scales)
    with progress.stage(f"schedule + build ({target})", len(mod.functions)) as stage:
        built = build_llvm(mod, mcpu, stage.advance, plan) if target == "llvm" \
            else build_cuda(mod, arch, stage.advance, plan)
    plan.update(target=built.target, device="cpu" if target == "llvm" else "cuda")
    for kernel in plan["kernels"]:
        kernel["schedule"] = built.schedules[kernel["symbol"]]
    with progress.stage("write artifact"):
        weights = {w["name"]: graph.constants[w["name"]].astype(w["dtype"])
                   for w in plan["weights"]}
        write_artifact(writable_file(output, "artifact"), plan, built.library, weights)
    return CompileResult(plan, built.tir, built.source, built.source_suffix,
                         time.perf_counter() - start)


def writable_file(path: str | Path, what: str) -> Path:
    """`path` if a file can be created or replaced there: its folder exists and it is not
    itself a folder (checked before any work, so a mistake costs nothing)."""
    path = Path(path)
    if path.is_dir():
        raise CvmcError(f"{what} {path}: is a folder, expected a file path")
    if not path.parent.is_dir():
        raise CvmcError(f"{what} {path}: folder '{path.parent}' does not exist")
    return path



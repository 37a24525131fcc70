"""Codegen: a checked graph -> fused kernels -> one compiled library -> a .cvmx artifact."""
from __future__ import annotations

import json
import time
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


class _Quiet:
    """The progress interface compile_model reports to; this one prints nothing."""

    @contextmanager
    def stage(self, name: str, total: int = 0):
        """A named stage with `total` steps (advance() once per step)."""
        yield self

    def advance(self, label: str = "") -> None:
        """One step of the current stage done."""


def compile_model(graph: Graph, output: str | Path, target: str = "llvm",
                  mcpu: str | None = None, arch: str = "sm_80", progress=None) -> CompileResult:
    """Run the pass pipeline for `target`, then lower, schedule and build `graph` into a
    .cvmx file. (The pipeline is idempotent: a graph that has been through it already,
    as `cvmc compile` does to dump it, is unchanged.)"""
    from cvmc_runtime.artifact import write_artifact

    from cvmc.codegen.build import build_cuda, build_llvm
    from cvmc.lowering.lower import lower_graph
    from cvmc.passes.pipeline import run_pipeline

    if target not in TARGETS:
        raise CvmcError(f"unknown target '{target}'; expected one of {', '.join(TARGETS)}")
    progress = progress or _Quiet()
    start = time.perf_counter()
    with progress.stage("passes"):
        graph = run_pipeline(graph, target=target)
    with progress.stage("lower", len(graph.nodes)):
        mod, groups, plan = lower_graph(graph, target)
    with progress.stage(f"schedule + build ({target})", len(groups)) as stage:
        built = build_llvm(mod, mcpu, stage.advance) if target == "llvm" \
            else build_cuda(mod, arch, stage.advance)
    plan.update(target=built.target, device="cpu" if target == "llvm" else "cuda")
    for kernel in plan["kernels"]:
        kernel["schedule"] = built.schedules[kernel["symbol"]]
    with progress.stage("write artifact"):
        weights = {w["name"]: graph.constants[w["name"]].astype(w["dtype"])
                   for w in plan["weights"]}
        write_artifact(output, plan, built.library, weights)
    return CompileResult(plan, built.tir, built.source, built.source_suffix,
                         time.perf_counter() - start)


def compile_cli(args, console) -> int:
    """`cvmc compile`: load, run the passes, compile, write extras, print a summary."""
    from cvmc.codegen.progress import RichProgress
    from cvmc.frontend import load_graph
    from cvmc.passes.pipeline import run_pipeline

    output = Path(args.output)
    progress = RichProgress(console) if console.is_terminal else _Quiet()
    with progress.stage("load"):
        graph = load_graph(args.model, quant=args.quant, params=args.params)
    if args.stop_after or args.dump_ir:
        with progress.stage("passes"):
            graph = run_pipeline(graph, stop_after=args.stop_after, dump_dir=args.dump_ir,
                                 target=args.target)
    if args.stop_after:
        console.print(f"stopped after pass '{args.stop_after}'")
        return 0
    result = compile_model(graph, output, args.target, args.mcpu, args.arch, progress)
    extras = {"tir": (".tir", result.tir),
              "plan": (".plan.json", json.dumps(result.plan, indent=1)),
              "source": (f".{result.source_suffix}", result.source)}
    for kind in dict.fromkeys(args.emit):
        suffix, text = extras[kind]
        path = output.with_suffix(suffix)
        path.write_text(text)
        console.print(f"wrote {path}")
    _print_summary(console, output, result)
    return 0


def _print_summary(console, output: Path, result: CompileResult) -> None:
    plan = result.plan
    target = ", ".join(f"{k}={v}" for k, v in plan["target"].items())
    console.print(f"compiled {output} ({target})")
    ops = sum(len(k["ops"]) for k in plan["kernels"])
    console.print(f"  kernels: {len(plan['kernels'])} for {ops} ops")
    console.print(f"  weights: {plan['weight_bytes']} bytes in {len(plan['weights'])} tensors")
    console.print(f"  peak activation memory: {plan['peak_activation_bytes']} bytes")
    console.print(f"  compile time: {result.seconds:.2f} s")

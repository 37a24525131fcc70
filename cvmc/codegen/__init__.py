"""Codegen: a checked graph -> fused kernels -> one compiled library -> a .cvmx artifact."""
from __future__ import annotations

import json
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np

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
    from cvmc_runtime import write_artifact

    from cvmc.codegen.build import build_cuda, build_llvm
    from cvmc.lowering.lower import lower_graph
    from cvmc.passes.pipeline import run_pipeline

    if target not in TARGETS:
        raise CvmcError(f"unknown target '{target}'; expected one of {', '.join(TARGETS)}")
    if target == "cuda":
        from cvmc.codegen.build import check_cuda_arch
        check_cuda_arch(arch)
    writable_file(output, "artifact")  # before the work, not after it
    progress = progress or _Quiet()
    start = time.perf_counter()
    with progress.stage("passes"):
        graph = run_pipeline(graph, target=target)
    with progress.stage("lower", len(graph.nodes)):
        mod, _, plan = lower_graph(graph, target)
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


def _emit_paths(output: Path, kinds: list[str], target: str) -> dict[str, Path]:
    """Where each `--emit` kind goes, beside the artifact; none may overwrite another."""
    suffixes = {"tir": ".tir", "plan": ".plan.json", "source": ".ll" if target == "llvm"
                else ".cu"}
    paths = {kind: writable_file(output.with_suffix(suffixes[kind]), f"--emit {kind}")
             for kind in dict.fromkeys(kinds)}
    taken = {output.resolve(): "the artifact"}
    for kind, path in paths.items():
        if path.resolve() in taken:
            raise CvmcError(f"--emit {kind} would write {path}, which is also "
                            f"{taken[path.resolve()]}; choose an -o path with another suffix")
        taken[path.resolve()] = f"--emit {kind}"
    return paths


def compile_cli(args, console) -> int:
    """`cvmc compile`: load, run the passes, compile, write extras, print a summary."""
    from cvmc_runtime import atomic_write_bytes

    from cvmc.codegen.progress import RichProgress
    from cvmc.frontend import load_checked
    from cvmc.frontend.printer import graph_dumper
    from cvmc.passes.pipeline import run_pipeline

    output = writable_file(args.output, "-o")
    emits = _emit_paths(output, args.emit, args.target)
    if args.dump_ir and Path(args.dump_ir).exists() and not Path(args.dump_ir).is_dir():
        raise CvmcError(f"--dump-ir {args.dump_ir}: exists and is not a folder")
    progress = RichProgress(console) if console.is_terminal else _Quiet()
    with progress.stage("load"):
        graph = load_checked(args.model, quant=args.quant, params=args.params)
    if args.stop_after or args.dump_ir:
        with progress.stage("passes"):
            dump = graph_dumper(args.dump_ir) if args.dump_ir else None
            graph = run_pipeline(graph, stop_after=args.stop_after, after_pass=dump,
                                 target=args.target)
    if args.stop_after:
        console.print(f"stopped after pass '{args.stop_after}'")
        return 0
    result = compile_model(graph, output, args.target, args.mcpu, args.arch, progress)
    extras = {"tir": result.tir, "plan": json.dumps(result.plan, indent=1),
              "source": result.source}
    for kind, path in emits.items():
        atomic_write_bytes(path, extras[kind].encode())
        console.print(f"wrote {path}")
    _print_summary(console, output, result)
    return 0


def _print_summary(console, output: Path, result: CompileResult) -> None:
    plan = result.plan
    target = ", ".join(f"{k}={v}" for k, v in plan["target"].items() if k != "features")
    console.print(f"compiled {output} ({target})")
    ops = sum(len(k["ops"]) for k in plan["kernels"])
    console.print(f"  kernels: {len(plan['kernels'])} for {ops} ops")
    console.print(f"  weights: {plan['weight_bytes']} bytes in {len(plan['weights'])} tensors")
    console.print(f"  peak activation memory: {plan['peak_activation_bytes']} bytes")
    total = sum(int(np.prod(b["shape"])) * np.dtype(b["dtype"]).itemsize
                for b in plan["buffers"])
    console.print(f"  arena: {plan['arena']['bytes']} bytes for {total} bytes of "
                  f"intermediate tensors ({len(plan['buffers'])}, reused by liveness)")
    console.print(f"  compile time: {result.seconds:.2f} s")

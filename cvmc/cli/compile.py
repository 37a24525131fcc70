"""`cvmc compile`: a model (an ONNX one converted first) to a .cvmx artifact."""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from cvmc.cli.common import (
    console,
    input_shapes,
    is_onnx,
)
from cvmc.codegen import CompileResult, Quiet, compile_model, writable_file
from cvmc.errors import CvmcError


def cmd_compile(args: argparse.Namespace) -> int:
    """Compile a model (an ONNX one converted into a temporary NNEF folder first)."""
    output = Path(args.output)
    if output.exists() and Path(args.model).exists() and output.samefile(args.model):
        raise CvmcError(f"-o {args.output}: is the model {args.model}, which the artifact "
                        f"would replace; write it elsewhere")
    if not is_onnx(args.model):
        if args.input_shape:
            raise CvmcError("--input-shape applies to ONNX models (MODEL.onnx)")
        return compile_checked_model(args)
    if args.quant or args.params:
        raise CvmcError("--quant/--params do not apply to ONNX models")
    import tempfile

    from cvmc.frontend.onnx_convert import convert_onnx
    onnx_model = args.model
    with tempfile.TemporaryDirectory(prefix="cvmc-onnx-") as tmp:
        args.model = str(convert_onnx(onnx_model, Path(tmp) / "nnef",
                                      input_shapes=input_shapes(args)))
        try:
            return compile_checked_model(args)
        except CvmcError as e:
            if e.span is not None and Path(e.span.file).is_relative_to(tmp):
                e.message += (f" (in the NNEF that NNEF-Tools made of {onnx_model}; "
                              f"`cvmc convert {onnx_model} -o DIR` keeps it)")
            raise


def compile_checked_model(args) -> int:
    """`cvmc compile`: load, run the passes, compile, write extras, print a summary."""
    from cvmc_runtime import atomic_write_bytes

    from cvmc.codegen.progress import RichProgress
    from cvmc.codegen.targets import backend
    from cvmc.frontend import load_checked
    from cvmc.frontend.container import quantization_file
    from cvmc.frontend.printer import graph_dumper
    from cvmc.passes.target import Target

    if "c-library" in args.emit:
        return compile_c_library(args)
    output = writable_file(args.output, "-o")
    emits = _emit_paths(output, args.emit, args.target)
    if args.dump_ir and Path(args.dump_ir).exists() and not Path(args.dump_ir).is_dir():
        raise CvmcError(f"--dump-ir {args.dump_ir}: exists and is not a folder")
    progress = RichProgress(console) if console.is_terminal else Quiet()
    with progress.stage("load"):
        graph = load_checked(args.model, quant=args.quant, params=args.params)
    # once, for passes and build
    target = Target.make(args.target, args.mcpu, args.arch, args.mtriple)
    dump = graph_dumper(args.dump_ir) if args.dump_ir else None
    if args.stop_after:
        with progress.stage("passes"):
            backend(target).run_passes(graph, target, args.stop_after, dump)
        console.print(f"stopped after pass '{args.stop_after}'")
        return 0
    result = compile_model(graph, output, target, progress=progress,
                           quantization=quantization_file(args.model), cache=not args.no_cache,
                           after_pass=dump)
    # Only what is asked for is made: the TIR and source of a CPU build are made again
    # for --emit (the kernels were compiled apart, perhaps in an earlier run).
    extras = {"tir": lambda: result.tir,
              "plan": lambda: json.dumps(result.plan, indent=1, allow_nan=False),
              "source": lambda: result.source}
    for kind, path in emits.items():
        atomic_write_bytes(path, extras[kind]().encode())
        console.print(f"wrote {path}")
    _print_summary(output, result)
    return 0


def compile_c_library(args) -> int:
    """`cvmc compile --emit c-library -o DIR`: the model as a C library in DIR
    (`cvmc.codegen.clib`)."""
    from cvmc.codegen.clib import check_destination, write_c_library
    from cvmc.codegen.progress import RichProgress
    from cvmc.frontend import load_checked
    from cvmc.frontend.container import quantization_file
    from cvmc.passes.target import Target

    others = [kind for kind in args.emit if kind != "c-library"]
    if others:
        raise CvmcError(f"--emit c-library writes a folder; it does not combine with "
                        f"--emit {others[0]}")
    if args.target != "llvm":
        raise CvmcError("--emit c-library: only --target llvm builds a C library")
    if args.stop_after or args.dump_ir:
        raise CvmcError("--emit c-library does not combine with --stop-after or --dump-ir")
    output = Path(args.output)
    check_destination(output)
    target = Target.make(args.target, args.mcpu, mtriple=args.mtriple)
    progress = RichProgress(console) if console.is_terminal else Quiet()
    with progress.stage("load"):
        graph = load_checked(args.model, quant=args.quant, params=args.params)
    result = compile_model(graph, None, target, progress=progress,
                           quantization=quantization_file(args.model), cache=not args.no_cache)
    with progress.stage("write C library"):
        library = write_c_library(result.plan, result.built.objects, result.weights, output)
    _print_summary(output, result)
    console.print(f"  C library: {library.name} ({library.stat().st_size} bytes), "
                  f"{library.with_suffix('.so').name}, {library.stem[3:]}.h, main.c")
    return 0


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


def _print_summary(output: Path, result: CompileResult) -> None:
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
    scaled = [s["name"] for key in ("inputs", "outputs") for s in plan[key] if "scale" in s]
    if scaled:
        console.print(f"  scales (quantization.json): {', '.join(scaled)}")
    console.print(f"  compile time: {result.seconds:.2f} s")

"""The `cvmc` command line. Argument parsing only: the work happens in the library.

Every user mistake surfaces as a CvmcError (or the runtime's ModelError) and is printed
as one clear message with exit code 1, never as a traceback.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import sys
import warnings
from pathlib import Path

import numpy as np
from cvmc_runtime import ModelError, atomic_write
from rich.console import Console
from rich.table import Table

from cvmc.errors import CvmcError

console = Console(highlight=False, soft_wrap=True)


def _fmt_shape(shape) -> str:
    return "[" + ", ".join(str(d) for d in shape) + "]"


# ---- check ----------------------------------------------------------------------------
def cmd_check(args: argparse.Namespace) -> int:
    """Parse, type and shape-check a model; print its signature and tensor table."""
    from cvmc.frontend import load_checked
    from cvmc.ops import lookup

    graph = load_checked(args.model, args.quant, args.params, need_data=False)
    producers = graph.producers()
    kinds = {**{n: "input" for n in graph.inputs}, **{n: "weight" for n in graph.weights()}}

    def sig(names):
        return ", ".join(f"{n}: {_fmt_shape(graph.types[n].shape)}" for n in names)

    console.print(f"graph {graph.name}")
    console.print(f"  inputs:  {sig(graph.inputs)}")
    console.print(f"  outputs: {sig(graph.outputs)}")
    rows = [("tensor", "op", "shape", "dtype", "precision")]
    for name in graph.values():
        t = graph.types[name]
        op = producers[name].op if name in producers else kinds[name]
        rows.append((name, op, _fmt_shape(t.shape), t.dtype,
                     "-" if t.precision is None else str(t.precision)))
    _print_table(rows)
    if all({"cvm", "cvm-runtime"} & set(lookup(n.op).seeds) for n in graph.nodes):
        from cvmc.passes.gas import gas
        cost = gas(graph)
        console.print(f"gas: {cost.total} (operations {cost.operations} + memory "
                      f"{cost.memory}, as CVM-Runtime prices the model)")
    return 0


def _print_table(rows: list[tuple[str, ...]]) -> None:
    """Rows as aligned columns, written as plain text: names stay whole at any width, and
    the cost is linear in the rows (a rich Table measures and wraps every cell: minutes
    for a graph of 100,000 tensors)."""
    widths = [max(map(len, column)) for column in zip(*rows)]
    lines = (" " + "  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip()
             for row in rows)
    console.file.write("\n".join(lines) + "\n")


# ---- ops ------------------------------------------------------------------------------
def cmd_ops(args: argparse.Namespace) -> int:
    """Print the operator table: one block per op (readable at any terminal width)."""
    from cvmc.ops import all_ops

    for d in all_ops():
        if not (d.compute or args.all):
            continue
        aliases = f" (also: {', '.join(d.aliases)})" if d.aliases else ""
        console.print(f"[bold]{d.name}[/bold]{aliases}  op set {', '.join(d.seeds)}, "
                      f"family {d.family}, fusion {d.fusion.value}")
        console.print(f"    inputs:     {', '.join(d.inputs)}")
        if d.attrs:
            console.print(f"    attributes: {'; '.join(a.describe() for a in d.attrs)}")
        if not d.integer_op:
            console.print(f"    types:      {d.types}"
                          f"{'' if d.compute else '  (check only: cannot compile yet)'}")
        if d.precision_rule:  # CVM ops, and typed ops with integer results
            console.print(f"    precision:  {d.precision_rule}")
    return 0


# ---- run ------------------------------------------------------------------------------
MAX_INPUT_ELEMENTS = 1 << 30  # the compiler's tensor limit (CVM-Runtime's)


def _load_npy(name: str, file: str) -> np.ndarray:
    """An integer .npy array, its header checked before anything is allocated."""
    try:
        with open(file, "rb") as f:
            read_header = {(1, 0): np.lib.format.read_array_header_1_0,
                           (2, 0): np.lib.format.read_array_header_2_0}.get(
                np.lib.format.read_magic(f))
            if read_header is None:
                raise ValueError("unsupported .npy format version")
            shape = read_header(f)[0]
            count = int(np.prod(shape, dtype=object))
            if count > MAX_INPUT_ELEMENTS:
                raise CvmcError(f"--input {name}: '{file}' declares shape {list(shape)} "
                                f"({count} elements, more than {MAX_INPUT_ELEMENTS})")
            f.seek(0)
            return np.load(f, allow_pickle=False)
    except (OSError, ValueError, EOFError) as e:  # missing, empty, truncated, not .npy
        raise CvmcError(f"--input {name}: cannot read '{file}' as a .npy array "
                        f"({str(e) or type(e).__name__})") from None


def _read_inputs(pairs: list[str]) -> dict[str, np.ndarray]:
    feeds = {}
    for pair in pairs:
        name, sep, file = pair.partition("=")
        if not sep or not name or not file:
            raise CvmcError(f"--input expects NAME=FILE.npy, got '{pair}'")
        if name in feeds:
            raise CvmcError(f"--input {name} is given twice")
        feeds[name] = _load_npy(name, file)
    return feeds


def output_file_name(name: str) -> str:
    """`<name>.npy` when `name` is a plain file name; names from a model must never become
    paths outside the folder the user chose (no separators, no '..', no NUL)."""
    plain = name not in ("", ".", "..") and not any(c in name for c in "/\\\0") \
        and len(name.encode("utf-8", "surrogatepass")) <= 200
    if not plain:
        raise CvmcError(f"output {name!r:.80} cannot be written as a file: an output name "
                        f"must be a plain file name (no '/', '\\', NUL or '..', at most "
                        f"200 bytes)")
    return f"{name}.npy"


def _value_range(value: np.ndarray) -> str:
    """' min A max B' of an output: integers as integers, floats as float32 prints them,
    NaN counted apart (a NaN has no order) and inf shown as inf."""
    if not value.size:
        return ""
    if value.dtype.kind != "f":
        return f" min {int(value.min())} max {int(value.max())}"
    nan = np.isnan(value)
    count = int(nan.sum())
    ordered = value[~nan]
    low, high = (ordered.min(), ordered.max()) if ordered.size else (np.nan, np.nan)
    # !s: NumPy float32 prints its shortest round-trip form; format() would widen it.
    return f" min {low!s} max {high!s}" + (f" ({count} NaN)" if count else "")


def _write_outputs(outputs: dict[str, np.ndarray], out_dir: str | None) -> None:
    """Write every output to OUT_DIR/<name>.npy (all of them first), then print a summary
    line per output."""
    paths = {}
    if out_dir:
        files = {name: output_file_name(name) for name in outputs}
        folder = Path(out_dir)
        if folder.exists() and not folder.is_dir():
            raise CvmcError(f"--output-dir {out_dir}: exists and is not a folder")
        folder.mkdir(parents=True, exist_ok=True)
        for name, value in outputs.items():
            paths[name] = folder / files[name]
            atomic_write(paths[name], lambda f, v=value: np.save(f, v, allow_pickle=False))
    for name, value in outputs.items():
        where = f" -> {paths[name]}" if name in paths else ""
        console.print(f"{name}: shape {_fmt_shape(value.shape)} {value.dtype}"
                      f"{_value_range(value)}{where}")


def cmd_run(args: argparse.Namespace) -> int:
    """Run a compiled artifact (or, with --reference, a graph on the interpreter)."""
    feeds = _read_inputs(args.input)
    if args.reference:
        from cvmc.frontend import load_checked
        from cvmc.reference import reference_run
        graph = load_checked(args.model, quant=args.quant, params=args.params)
        outputs = reference_run(graph, feeds, saturate=args.saturate)
    else:
        if args.quant or args.params:
            raise CvmcError("--quant/--params apply with --reference (to a model, not an artifact)")
        model = _load_artifact(args)
        outputs = model.run(feeds, saturate=args.saturate)
    _write_outputs(outputs, args.output_dir)
    return 0


def _load_artifact(args: argparse.Namespace):
    """The artifact of `args.model`, with `--threads` applied."""
    import cvmc_runtime
    if args.threads is not None:
        cvmc_runtime.set_num_threads(args.threads)
    return cvmc_runtime.load(args.model)


# ---- bench ----------------------------------------------------------------------------
def _random_inputs(model) -> dict[str, np.ndarray]:
    """Random values filling each integer input's precision, standard normal floats and
    fair coin logicals (fixed seed)."""
    rng = np.random.default_rng(0)

    def draw(s) -> np.ndarray:
        if s.dtype == "float32":
            return rng.standard_normal(s.shape).astype(np.float32)
        if s.dtype == "bool":
            return rng.integers(0, 2, s.shape).astype(bool)
        bound = (1 << (s.precision - 1)) - 1
        return rng.integers(-bound, bound + 1, s.shape).astype(s.dtype)

    return {s.name: draw(s) for s in model.inputs}


def cmd_bench(args: argparse.Namespace) -> int:
    """Time an artifact: every kernel alone, then whole runs (see README, Speed)."""
    model = _load_artifact(args)
    feeds = {**_random_inputs(model), **_read_inputs(args.input)}
    per_kernel, runs = model.profile(feeds, repeat=args.repeat, warmup=args.warmup)
    total = sum(statistics.median(t) for t in per_kernel) or 1.0
    table = Table("kernel", "schedule", "median ms", "min ms", "max ms", "GOPS", "share",
                  box=None)
    table.columns[0].overflow = "fold"  # kernel names stay whole on narrow terminals
    rows = []
    for spec, times in zip(model.plan["kernels"], per_kernel):
        med = statistics.median(times)
        gops = spec.get("arith_ops", 0) / med / 1e9 if med else 0.0
        rows.append({"kernel": spec["symbol"], "schedule": spec.get("schedule", "-"),
                     "median_ms": med * 1e3, "min_ms": min(times) * 1e3,
                     "max_ms": max(times) * 1e3, "gops": gops, "share": med / total})
        table.add_row(spec["symbol"], rows[-1]["schedule"], f"{med * 1e3:.3f}",
                      f"{min(times) * 1e3:.3f}", f"{max(times) * 1e3:.3f}", f"{gops:.0f}",
                      f"{med / total:.1%}")
    console.print(table)
    run = {"median_ms": statistics.median(runs) * 1e3, "min_ms": min(runs) * 1e3,
           "max_ms": max(runs) * 1e3}
    console.print(f"end to end ({len(runs)} runs, {os.environ.get('TVM_NUM_THREADS', 'all')} "
                  f"threads): median {run['median_ms']:.3f} ms, min {run['min_ms']:.3f} ms, "
                  f"max {run['max_ms']:.3f} ms")
    if args.json:
        report = {"artifact": str(args.model), "threads": os.environ.get("TVM_NUM_THREADS"),
                  "repeat": args.repeat, "kernels": rows, "run": run}
        atomic_write(args.json, lambda f: f.write(json.dumps(report, indent=1).encode()))
    return 0


# ---- convert --------------------------------------------------------------------------
def _is_onnx(model: str) -> bool:
    """ONNX models are recognised by their `.onnx` suffix (protobuf has no magic bytes)."""
    return Path(model).suffix.lower() == ".onnx"


def _shape_arg(text: str) -> tuple[str, list[int]]:
    """An argparse type: NAME=D1,D2,... (dimensions >= 1)."""
    name, sep, dims = text.rpartition("=")
    parts = dims.split(",")
    if not sep or not name or not all(p.strip().isdigit() and int(p) >= 1 for p in parts):
        raise argparse.ArgumentTypeError(f"expected NAME=D1,D2,... with dimensions >= 1, "
                                         f"got '{text}'")
    return name, [int(p) for p in parts]


def _input_shapes(args: argparse.Namespace) -> dict[str, list[int]]:
    shapes = dict(args.input_shape)
    if len(shapes) < len(args.input_shape):
        raise CvmcError("--input-shape names one input twice")
    return shapes


def cmd_convert(args: argparse.Namespace) -> int:
    """Convert an ONNX model to an NNEF folder with NNEF-Tools, then check it."""
    from cvmc.frontend import load_checked
    from cvmc.frontend.onnx_convert import convert_onnx

    out = convert_onnx(args.model, args.output, input_shapes=_input_shapes(args),
                       force=args.force)
    try:
        graph = load_checked(out)
    except CvmcError:
        print(f"wrote {out}, but cvmc refuses what NNEF-Tools made of {args.model}:",
              file=sys.stderr)
        raise

    def sig(names):
        return ", ".join(f"{n} {_fmt_shape(graph.types[n].shape)}" for n in names)
    console.print(f"converted {args.model} -> {out}: inputs {sig(graph.inputs)}; outputs "
                  f"{sig(graph.outputs)}; {len(graph.nodes)} ops, {len(graph.weights())} "
                  f"weights; checked")
    return 0


# ---- compile --------------------------------------------------------------------------
def cmd_compile(args: argparse.Namespace) -> int:
    """Compile a model (an ONNX one converted into a temporary NNEF folder first)."""
    from cvmc.codegen import compile_cli
    output = Path(args.output)
    if output.exists() and Path(args.model).exists() and output.samefile(args.model):
        raise CvmcError(f"-o {args.output}: is the model {args.model}, which the artifact "
                        f"would replace; write it elsewhere")
    if not _is_onnx(args.model):
        if args.input_shape:
            raise CvmcError("--input-shape applies to ONNX models (MODEL.onnx)")
        return compile_cli(args, console)
    if args.quant or args.params:
        raise CvmcError("--quant/--params do not apply to ONNX models")
    import tempfile

    from cvmc.frontend.onnx_convert import convert_onnx
    onnx_model = args.model
    with tempfile.TemporaryDirectory(prefix="cvmc-onnx-") as tmp:
        args.model = str(convert_onnx(onnx_model, Path(tmp) / "nnef",
                                      input_shapes=_input_shapes(args)))
        try:
            return compile_cli(args, console)
        except CvmcError as e:
            if e.span is not None and Path(e.span.file).is_relative_to(tmp):
                e.message += (f" (in the NNEF that NNEF-Tools made of {onnx_model}; "
                              f"`cvmc convert {onnx_model} -o DIR` keeps it)")
            raise


# ---- export ---------------------------------------------------------------------------
def cmd_export(args: argparse.Namespace) -> int:
    """Write a model in another format (CVM-Runtime JSON + params)."""
    from cvmc.frontend import load_checked
    from cvmc.frontend.cvm_json import export_cvm
    graph = load_checked(args.model, quant=args.quant, params=args.params)
    for path in export_cvm(graph, args.output):
        console.print(f"wrote {path}")
    return 0


def _positive(text: str) -> int:
    """An argparse type: an integer >= 1."""
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got '{text}'")
    return int(text)


def _cuda_arch(text: str) -> str:
    """An argparse type: a CUDA arch cvmc compiles for (sm_61 or newer)."""
    from cvmc.codegen.build import cuda_arch_problem
    problem = cuda_arch_problem(text)
    if problem:
        raise argparse.ArgumentTypeError(problem)
    return text


def build_parser() -> argparse.ArgumentParser:
    """The argument parser for every subcommand."""
    p = argparse.ArgumentParser(prog="cvmc", description="Compiler for integer (CVM) "
                                "neural networks. See README.md.")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def model_args(sp, what="model: NNEF file, folder or tar(.gz), or CVM-Runtime JSON"):
        sp.add_argument("model", help=what)
        sp.add_argument("--quant", help="graph.quant file (default: the one beside the graph)")
        sp.add_argument("--params", help="params file of a CVM-Runtime JSON model")

    sp = sub.add_parser("check", help="parse and check a model; print every tensor's type")
    model_args(sp)
    sp.set_defaults(fn=cmd_check)

    sp = sub.add_parser("ops", help="print the operator table")
    sp.add_argument("--all", action="store_true",
                    help="include NNEF standard ops that cvmc only shape-checks")
    sp.set_defaults(fn=cmd_ops)

    sp = sub.add_parser("run", help="run a .cvmx artifact, or a model with --reference")
    model_args(sp, "a .cvmx artifact, or a model with --reference")
    sp.add_argument("--reference", action="store_true",
                    help="run the model on the NumPy reference interpreter")
    sp.add_argument("--input", action="append", default=[], metavar="NAME=FILE.npy")
    sp.add_argument("--output-dir", help="write each output to DIR/<name>.npy")
    sp.add_argument("--saturate", action="store_true",
                    help="clip inputs into their declared precision instead of rejecting them")
    sp.add_argument("--threads", type=_positive, help="CPU threads (default: all cores)")
    sp.set_defaults(fn=cmd_run)

    sp = sub.add_parser("bench", help="time a .cvmx artifact, kernel by kernel and whole")
    sp.add_argument("model", metavar="ARTIFACT", help="a .cvmx artifact")
    sp.add_argument("--input", action="append", default=[], metavar="NAME=FILE.npy",
                    help="input data (default: random values inside each input's precision)")
    sp.add_argument("--threads", type=_positive, help="CPU threads (default: all cores)")
    sp.add_argument("--repeat", type=_positive, default=50, help="timed rounds (default 50)")
    sp.add_argument("--warmup", type=_positive, default=5, help="untimed runs first (default 5)")
    sp.add_argument("--json", metavar="FILE", help="also write the numbers as JSON")
    sp.set_defaults(fn=cmd_bench)

    input_shape = {"action": "append", "default": [], "type": _shape_arg,
                   "metavar": "NAME=D1,D2,...",
                   "help": "static shape of an ONNX input with symbolic dimensions"}
    sp = sub.add_parser("convert", help="convert an ONNX model to NNEF (Khronos NNEF-Tools), "
                        "then check it")
    sp.add_argument("model", metavar="MODEL.onnx", help="an ONNX model")
    sp.add_argument("-o", "--output", required=True, metavar="DIR",
                    help="the NNEF folder to write (graph.nnef + .dat files); must not exist "
                         "or be empty")
    sp.add_argument("--force", action="store_true",
                    help="replace DIR if it holds a previous model (a graph.nnef)")
    sp.add_argument("--input-shape", **input_shape)
    sp.set_defaults(fn=cmd_convert)

    sp = sub.add_parser("compile", help="compile a model to a .cvmx artifact (a MODEL.onnx "
                        "is converted to NNEF first, as by `cvmc convert`)")
    model_args(sp, "model: NNEF file, folder or tar(.gz), CVM-Runtime JSON, or MODEL.onnx")
    sp.add_argument("--input-shape", **input_shape)
    sp.add_argument("--target", choices=["llvm", "cuda"], default="llvm")
    sp.add_argument("--mcpu", help="LLVM CPU name (default: the host CPU)")
    sp.add_argument("--arch", default="sm_80", type=_cuda_arch,
                    help="CUDA arch, sm_61 or newer, e.g. sm_80, sm_90 (default sm_80)")
    sp.add_argument("-o", "--output", required=True, help="artifact path (.cvmx)")
    sp.add_argument("--emit", action="append", default=[], choices=["tir", "source", "plan"],
                    help="also write OUTPUT.<kind> for inspection (repeatable)")
    sp.add_argument("--dump-ir", metavar="DIR", help="write the graph after every pass to DIR")
    sp.add_argument("--stop-after", metavar="PASS", help="stop the pass pipeline after PASS")
    sp.set_defaults(fn=cmd_compile)

    sp = sub.add_parser("export", help="export a model for CVM-Runtime")
    model_args(sp)
    sp.add_argument("--format", choices=["cvm"], default="cvm")
    sp.add_argument("-o", "--output", required=True, help="output folder")
    sp.set_defaults(fn=cmd_export)
    return p


def _show_warning(message, category, filename, lineno, file=None, line=None) -> None:
    """Warnings from the library (e.g. a CVM JSON without params): one line on stderr."""
    print(f"warning: {message}", file=sys.stderr)


def _terminate(signum, frame) -> None:
    """SIGTERM: unwind like Ctrl-C, so temporary files are removed."""
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `cvmc` console script. Exit codes: 0 success, 1 error (one
    message, never a traceback), 2 usage (argparse), 130 interrupted (SIGINT / SIGTERM)."""
    args = build_parser().parse_args(argv)
    warnings.showwarning = _show_warning
    previous = signal.signal(signal.SIGTERM, _terminate)
    try:
        return args.fn(args)
    except CvmcError as e:
        print(e.render(), file=sys.stderr)
    except ModelError as e:
        print(f"error: {e}", file=sys.stderr)
    except KeyboardInterrupt:
        print("cvmc: interrupted", file=sys.stderr)
        return 130
    except OSError as e:  # a path the user named: missing folder, a folder for a file, ...
        where = f"{e.filename}: " if e.filename else ""
        print(f"error: {where}{e.strerror or e}", file=sys.stderr)
    except UnicodeError as e:
        print(f"error: cannot decode text ({e})", file=sys.stderr)
    finally:
        signal.signal(signal.SIGTERM, previous)
    return 1


def entry() -> None:
    """The `cvmc` command: exit with main's code. An interrupt exits with 130 at once (its
    temporary files are already removed): at interpreter shutdown TVM's FFI may re-raise
    the interrupt as SIGINT, which turned 130 into death by signal (-2)."""
    code = main()
    if code == 130:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(130)
    sys.exit(code)


if __name__ == "__main__":
    entry()

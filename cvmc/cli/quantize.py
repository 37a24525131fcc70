"""`cvmc quantize`: a float model (ONNX or NNEF) to a CVM integer NNEF folder plus
quantization.json, calibrated on sample inputs (docs/quantize.md)."""
from __future__ import annotations

import argparse
import json
import math
import re
import tempfile
from functools import partial
from pathlib import Path

import numpy as np
from cvmc_runtime import atomic_write_bytes, scale_entry
from rich.table import Table

from cvmc.cli.common import console, input_shapes, is_onnx, read_inputs
from cvmc.errors import CvmcError


def cmd_quantize(args: argparse.Namespace) -> int:
    """Quantize a float model: calibrate, rewrite, write DIR and quantization.json."""
    from cvmc.codegen import Quiet
    from cvmc.codegen.progress import RichProgress
    from cvmc.frontend.folder import check_destination
    from cvmc.quantize.report import layer_report
    from cvmc.quantize.writer import write_model

    if not 2 <= args.weight_bits <= 8:
        raise CvmcError(f"--weight-bits must be in 2..8, got {args.weight_bits}")
    if not 2 <= args.bits <= 8:
        raise CvmcError(f"--bits must be in 2..8 (conv2d and dense take at most 8-bit data), "
                        f"got {args.bits}")
    if not 0 < args.percentile <= 100:
        raise CvmcError(f"--percentile must be in (0, 100], got {args.percentile}")
    if args.dump_ir and Path(args.dump_ir).exists() and not Path(args.dump_ir).is_dir():
        raise CvmcError(f"--dump-ir {args.dump_ir}: exists and is not a folder")
    check_destination(Path(args.output), args.force, Path(args.model))  # before the work
    if args.report_json and not Path(args.report_json).absolute().parent.is_dir():
        raise CvmcError(f"--report-json {args.report_json}: no such folder")
    samples = read_inputs(args.calib, "--calib")
    progress = RichProgress(console) if console.is_terminal else Quiet()
    origins: dict[str, str] = {}  # NNEF value -> ONNX node (an ONNX model's)
    with tempfile.TemporaryDirectory(prefix="cvmc-quantize-") as tmp:
        try:
            q, samples, qdq = _quantize(args, samples, progress, Path(tmp), origins)
        except CvmcError as e:
            raise _onnx_located(e, Path(tmp), origins, args.model) from e.__cause__
    out = write_model(q, args.output, args.model, args.force, origins)
    ops = len(q.graph.nodes)
    console.print(f"quantized {args.model} -> {out}: {ops} CVM ops, inputs "
                  + ", ".join(f"{n} (scale {s:.6g}, {p} bits)" for n, (s, p) in q.inputs.items())
                  + "; outputs " + ", ".join(
                      f"{n} (scale " + " | ".join(
                          f"{s:.6g}" for s in np.atleast_1d(scale_entry(q.scales[n])["scale"]))
                      + ")" for n in q.graph.outputs))
    if qdq is not None:
        console.print(f"ONNX scales kept; fixed point: every multiplier within "
                      f"{qdq.worst_relative:.2g} of its scale ratio (relative), at most "
                      f"{qdq.worst_units:.3g} output units; CVM's shifts round halves up where "
                      f"ONNX rounds them to even (1 unit on exact ties)")
    if args.report or args.report_json:
        with progress.stage("report", _count(samples, args)) as bar:
            rows = layer_report(q, samples, _count(samples, args), bar.advance,
                                args.sensitivity_samples)
        if origins:  # an ONNX model's: each layer's node
            rows = [{**r, "onnx_node": origins.get(r["layer"])} for r in rows]
        _report(rows, _count(samples, args), args)
    return 0


def _quantize(args: argparse.Namespace, samples: dict, progress, tmp: Path,
              origins: dict[str, str]):
    """(the Quantized model, its samples as [N, *input shape] (None for a QDQ model), the
    QDQ model's rewriter (its fixed-point error) or None) of args.model, an ONNX one
    converted in `tmp` (each NNEF value's ONNX node recorded in `origins`)."""
    from cvmc.frontend import load_checked
    from cvmc.frontend.onnx_convert import convert_onnx
    from cvmc.frontend.onnx_qdq import load_qdq
    from cvmc.frontend.printer import graph_dumper
    from cvmc.quantize import Options, quantize_graph
    from cvmc.quantize.calibrate import check_shape
    from cvmc.quantize.qdq import QdqRewriter
    from cvmc.quantize.rewrite import Rewriter

    model = args.model
    bits, range_bits = args.output_bits
    options = Options(args.bits, bits, args.per_channel, range_bits,
                      weight_bits=args.weight_bits)
    qdq = load_qdq(Path(model), tmp, input_shapes(args), origins) if is_onnx(model) else None
    if qdq is not None:
        if samples or args.report or args.report_json or range_bits:
            raise CvmcError(f"{model} is already quantized (QDQ / QLinear ops): its own "
                            f"scales are used, so --calib, --report and the +R of "
                            f"--output-bits do not apply")
        graph, samples = qdq[0], None
    elif is_onnx(model):
        _check_calib_shapes(model, samples, input_shapes(args))
        with progress.stage("convert"):
            graph = load_checked(convert_onnx(model, tmp / "nnef",
                                              input_shapes=input_shapes(args),
                                              origins=origins))
    elif args.input_shape:
        raise CvmcError("--input-shape applies to ONNX models (MODEL.onnx)")
    else:
        graph = load_checked(model)
    if samples is not None:  # each [N, *input shape], whichever form the file holds
        samples = {n: check_shape(n, d, graph.types[n].shape) if n in graph.inputs
                   else d for n, d in samples.items()}
    made = []  # the rewriter, for the fixed-point error it records

    def build(layers, thresholds, opts):
        made.append(QdqRewriter(layers, *qdq[1:], opts) if qdq
                    else Rewriter(layers, thresholds, opts))
        return made[-1]
    calibrator = partial(compiled_calibration, batch=args.calib_batch, progress=progress,
                         folder=tmp) if args.calib_on == "llvm" else \
        partial(reference_calibration, progress=progress)
    q = quantize_graph(graph, samples, options, args.calib_method, args.percentile, args.lam,
                       args.samples, graph_dumper(args.dump_ir) if args.dump_ir else None,
                       build, calibrator)
    return q, samples, made[0] if qdq is not None else None


def _check_calib_shapes(model: str, samples: dict, shapes: dict) -> None:
    """--calib against the ONNX model's declared input shapes (or --input-shape's), before
    the model is converted (seconds for a real model): `check_shape`'s two forms."""
    import onnx
    from google.protobuf.message import DecodeError

    from cvmc.quantize.calibrate import check_shape
    try:
        graph = onnx.load_model(model, load_external_data=False).graph
    except (DecodeError, ValueError, RuntimeError, OSError):
        return  # convert_onnx reports what is wrong with the file
    weights = {t.name for t in graph.initializer}
    for vi in graph.input:
        if vi.name in samples and vi.name not in weights:
            dims = [d.dim_value if d.HasField("dim_value") else d.dim_param or "?"
                    for d in vi.type.tensor_type.shape.dim]
            check_shape(vi.name, samples[vi.name], shapes.get(vi.name, dims))


def reference_calibration(layers, samples: dict, count: int, progress) -> dict:
    """`calibrate` on the reference interpreter, one sample at a time, with a bar."""
    from cvmc.quantize.calibrate import calibrate
    with progress.stage("calibrate (reference interpreter)", count) as bar:
        return calibrate(layers, samples, count, bar.advance)


def compiled_calibration(layers, samples: dict, count: int, progress, batch: int,
                        folder: Path) -> dict:
    """`calibrate`'s statistics, the float layers compiled for this CPU (llvm) with every
    layer output exposed (`calibration_graph`) and run by cvmc_runtime, `batch` samples a
    run where the graph takes that batch, else one."""
    import cvmc_runtime

    from cvmc.codegen import compile_model
    from cvmc.quantize.calibrate import Stats, add_batch, add_sample, calibration_graph

    graph = calibration_graph(layers, batch) if batch > 1 else None
    rows = batch if graph is not None else 0  # 0: one sample a run, its own shape
    if graph is None:
        graph = calibration_graph(layers, None)
    try:
        compile_model(graph, folder / "calibrate.cvmx", "llvm", progress=progress)
    except CvmcError as e:
        e.message += " (compiling the float model to calibrate it; `--calib-on reference` " \
            "runs it on the reference interpreter instead)"
        raise
    model = cvmc_runtime.load(folder / "calibrate.cvmx")
    inputs = layers.graph.inputs
    dtypes = {n: layers.graph.types[n].dtype for n in inputs}
    stats = Stats.of([*inputs, *graph.outputs], count)
    with progress.stage("calibrate (compiled)", count) as bar:
        for start in range(0, count, rows or 1):
            if rows:
                feeds = {n: _batch_of(samples[n], start, min(count, start + rows), rows,
                                      dtypes[n]) for n in inputs}
                env = {**model.run(feeds), **feeds}
                add_batch(layers, stats, env, start, min(rows, count - start))
            else:
                feeds = {n: np.asarray(samples[n][start], dtypes[n]) for n in inputs}
                add_sample(layers, stats, {**model.run(feeds), **feeds}, start)
            for _ in range(min(rows or 1, count - start)):
                bar.advance()
    return stats


def _batch_of(data: np.ndarray, start: int, stop: int, rows: int, dtype: str) -> np.ndarray:
    """Samples start..stop-1 of `data` ([N, 1, *rest]) as one batch [rows, *rest] of
    `dtype`, zeros after them."""
    batch = np.zeros((rows, *data.shape[2:]), dtype)
    batch[:stop - start] = data[start:stop, 0]
    return batch


def _onnx_located(e: CvmcError, tmp: Path, origins: dict[str, str], model: str) -> CvmcError:
    """An error located in the temporary NNEF folder (gone once the command ends) names the
    ONNX node of the values its line defines instead; where none is known, it says how to
    keep that NNEF."""
    if e.span is None or not Path(e.span.file).is_relative_to(tmp):
        return e
    try:
        line = Path(e.span.file).read_text().splitlines()[e.span.line - 1]
    except (OSError, IndexError, UnicodeDecodeError):
        line = ""
    defined = re.findall(r"[A-Za-z_]\w*", line.partition("=")[0]) if "=" in line else []
    nodes = list(dict.fromkeys(origins[n] for n in defined if n in origins))
    where = f"ONNX node '{nodes[0]}'" if nodes else \
        f"in the NNEF that NNEF-Tools made of {model}; `cvmc convert {model} -o DIR` keeps it"
    return CvmcError(f"{e.message} ({where})")


def _count(samples: dict | None, args: argparse.Namespace) -> int:
    """The number of samples calibration and the report run (`--samples` bounds it)."""
    if not samples:
        return 0
    return min(next(iter(samples.values())).shape[0], args.samples or 1 << 62)


def _report(rows: list[dict], count: int, args: argparse.Namespace) -> None:
    """Print and write each layer's precision, SQNR, max error and sensitivity."""
    sensitivity = min(count, args.sensitivity_samples)
    if args.report_json:
        # Strict JSON (no Infinity): an SQNR that is not finite is null, and max_abs_error
        # tells which it was (0: the integer layer is exact, +inf dB; else the float layer
        # is all zero, -inf dB); a sensitivity likewise (+inf dB: the layer's quantization
        # changes no output; -inf dB: the float outputs are all zero).
        finite = [{k: None if isinstance(v, float) and not math.isfinite(v) else v
                   for k, v in r.items()} for r in rows]
        atomic_write_bytes(args.report_json, (json.dumps(
            {"samples": count, "sensitivity_samples": sensitivity, "layers": finite},
            indent=1, allow_nan=False) + "\n").encode())
    if args.report:
        from cvmc.quantize.report import MOST_SENSITIVE
        table = Table(title=f"integer vs float, {count} calibration samples",
                      caption=f"sensitivity: the outputs' SQNR with only that layer quantized "
                              f"({sensitivity} samples); ◀ N: the {MOST_SENSITIVE} most "
                              f"sensitive layers, most first")
        node = "onnx_node" in rows[0] if rows else False
        for col in ("layer", *(("ONNX node",) if node else ()), "op", "bits", "SQNR dB",
                    "max |error|", "sensitivity dB", ""):
            table.add_column(col, justify="left" if col in ("layer", "ONNX node", "op", "")
                             else "right")
        for r in rows:
            bits = str(r["precision"]) if r["dtype"] == f"int{r['precision']}" else \
                f"{r['precision']} ({r['dtype']})"
            table.add_row(r["layer"], *((r["onnx_node"] or "",) if node else ()), r["op"], bits,
                          f"{r['sqnr_db']:.1f}", f"{r['max_abs_error']:.4g}",
                          f"{r['sensitivity_db']:.1f}",
                          f"◀ {r['sensitivity_rank']}"
                          if r["sensitivity_rank"] <= MOST_SENSITIVE else "")
        console.print(table)

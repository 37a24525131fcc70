"""`cvmc quantize`: a float model (ONNX or NNEF) to a CVM integer NNEF folder plus
quantization.json, calibrated on sample inputs (docs/quantize.md)."""
from __future__ import annotations

import argparse
import json
import math
import tempfile
from functools import partial
from pathlib import Path

from cvmc_runtime import atomic_write_bytes
from rich.table import Table

from cvmc.cli.common import console, input_shapes, is_onnx, read_inputs
from cvmc.errors import CvmcError


def cmd_quantize(args: argparse.Namespace) -> int:
    """Quantize a float model: calibrate, rewrite, write DIR and quantization.json."""
    from cvmc.codegen import Quiet
    from cvmc.codegen.progress import RichProgress
    from cvmc.frontend import load_checked
    from cvmc.frontend.onnx_convert import check_destination, convert_onnx
    from cvmc.frontend.printer import graph_dumper
    from cvmc.quantize import Options, quantize_graph
    from cvmc.quantize.calibrate import calibrate, check_shape
    from cvmc.quantize.qdq import QdqRewriter, load_qdq
    from cvmc.quantize.report import layer_report
    from cvmc.quantize.rewrite import Rewriter

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
    bits, range_bits = args.output_bits
    options = Options(args.bits, bits, args.per_channel, range_bits)
    with tempfile.TemporaryDirectory(prefix="cvmc-quantize-") as tmp:
        model = args.model
        qdq = load_qdq(Path(model), Path(tmp), input_shapes(args)) if is_onnx(model) else None
        if qdq is not None:
            if samples or args.report or args.report_json or range_bits:
                raise CvmcError(f"{model} is already quantized (QDQ / QLinear ops): its own "
                                f"scales are used, so --calib, --report and the +R of "
                                f"--output-bits do not apply")
            graph, samples = qdq[0], None
        elif is_onnx(model):
            _check_calib_shapes(model, samples, input_shapes(args))
            with progress.stage("convert"):
                graph = load_checked(convert_onnx(model, Path(tmp) / "nnef",
                                                  input_shapes=input_shapes(args)))
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
        # Layers are read back from the source text, so quantize while the folder exists.
        # The bar counts calibration samples (none for a QDQ model).
        with progress.stage("quantize", _count(samples, args)) as bar:
            q = quantize_graph(graph, samples, options, args.calib_method, args.percentile,
                               args.lam, args.samples,
                               graph_dumper(args.dump_ir) if args.dump_ir else None, build,
                               partial(calibrate, advance=bar.advance))
    from cvmc.quantize.writer import write_model
    out = write_model(q, args.output, args.model, args.force)
    ops = len(q.graph.nodes)
    console.print(f"quantized {args.model} -> {out}: {ops} CVM ops, inputs "
                  + ", ".join(f"{n} (scale {s:.6g}, {p} bits)" for n, (s, p) in q.inputs.items())
                  + "; outputs " + ", ".join(f"{n} (scale {q.scales[n]:.6g})"
                                             for n in q.graph.outputs))
    if qdq is not None:
        rw = made[0]
        console.print(f"ONNX scales kept; fixed point: every multiplier within "
                      f"{rw.worst_relative:.2g} of its scale ratio (relative), at most "
                      f"{rw.worst_units:.3g} output units; CVM's shifts round halves up where "
                      f"ONNX rounds them to even (1 unit on exact ties)")
    if args.report or args.report_json:
        with progress.stage("report", _count(samples, args)) as bar:
            rows = layer_report(q, samples, _count(samples, args), bar.advance)
        _report(rows, _count(samples, args), args)
    return 0


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


def _count(samples: dict | None, args: argparse.Namespace) -> int:
    """The number of samples calibration and the report run (`--samples` bounds it)."""
    if not samples:
        return 0
    return min(next(iter(samples.values())).shape[0], args.samples or 1 << 62)


def _report(rows: list[dict], count: int, args: argparse.Namespace) -> None:
    """Print and write the per-layer SQNR and max error of the integer model."""
    if args.report_json:
        # Strict JSON (no Infinity): an SQNR that is not finite is null, and max_abs_error
        # tells which it was (0: the integer layer is exact, +inf dB; else the float layer
        # is all zero, -inf dB).
        finite = [{k: None if isinstance(v, float) and not math.isfinite(v) else v
                   for k, v in r.items()} for r in rows]
        atomic_write_bytes(args.report_json, (json.dumps(
            {"samples": count, "layers": finite}, indent=1, allow_nan=False) + "\n").encode())
    if args.report:
        table = Table(title=f"integer vs float, {count} calibration samples")
        for col in ("layer", "op", "SQNR dB", "max |error|"):
            table.add_column(col, justify="left" if col in ("layer", "op") else "right")
        for r in rows:
            table.add_row(r["layer"], r["op"], f"{r['sqnr_db']:.1f}", f"{r['max_abs_error']:.4g}")
        console.print(table)


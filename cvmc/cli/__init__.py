"""The `cvmc` command line. Argument parsing only: the work happens in the library.

Every user mistake surfaces as a CvmcError (or the runtime's ModelError) and is printed
as one clear message with exit code 1, never as a traceback.

One module per command (`check`, `ops`, `run`, `bench`, `eval`, `convert`, `compile`,
`export`, `quantize`); `common` holds what they share.
"""
from __future__ import annotations

import argparse
import os
import signal
import sys
import warnings

from cvmc_runtime import ModelError

from cvmc.cli.bench import cmd_bench
from cvmc.cli.check import cmd_check
from cvmc.cli.common import cuda_arch, output_bits, positive, shape_arg
from cvmc.cli.compile import cmd_compile
from cvmc.cli.convert import cmd_convert
from cvmc.cli.eval import cmd_eval
from cvmc.cli.export import cmd_export
from cvmc.cli.ops import cmd_ops
from cvmc.cli.quantize import cmd_quantize
from cvmc.cli.run import cmd_run
from cvmc.errors import CvmcError
from cvmc.passes.target import DEFAULT_ARCH


def _versions() -> str:
    """cvmc's version and the versions it runs with, read from the installed packages'
    metadata (importing TVM to ask would take seconds)."""
    from importlib.metadata import PackageNotFoundError, version

    def of(package: str) -> str:
        try:
            return version(package)
        except PackageNotFoundError:
            return "not installed"

    return (f"cvmc {of('cvmc')} (cvmc-runtime {of('cvmc-runtime')}, apache-tvm "
            f"{of('apache-tvm')}, apache-tvm-ffi {of('apache-tvm-ffi')})")


class _PrintVersions(argparse.Action):
    """`--version`, printed on one line (argparse's own action wraps it to the terminal)."""

    def __call__(self, parser, namespace, values, option_string=None):
        print(_versions())
        parser.exit()


def build_parser() -> argparse.ArgumentParser:
    """The argument parser for every subcommand."""
    p = argparse.ArgumentParser(prog="cvmc", description="Compiler for integer (CVM) "
                                "neural networks. See README.md.")
    p.add_argument("--version", action=_PrintVersions, nargs=0,
                   help="print the versions of cvmc and what it runs with, and exit")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def model_args(sp, what="model: NNEF file, folder or tar(.gz), or CVM-Runtime JSON"):
        sp.add_argument("model", help=what)
        sp.add_argument("--quant", help="graph.quant file (default: the one beside the graph)")
        sp.add_argument("--params", help="params file of a CVM-Runtime JSON model")

    sp = sub.add_parser("check", help="parse and check a model; print every tensor's type")
    model_args(sp)
    sp.set_defaults(fn=cmd_check)

    sp = sub.add_parser("ops", help="print the operator table")
    sp.add_argument("--markdown", action="store_true",
                    help="print it as the Markdown table docs/ops.md holds")
    sp.set_defaults(fn=cmd_ops)

    sp = sub.add_parser("run", help="run a .cvmx artifact, or a model with --reference")
    model_args(sp, "a .cvmx artifact, or a model with --reference")
    sp.add_argument("--reference", action="store_true",
                    help="run the model on the NumPy reference interpreter")
    sp.add_argument("--input", action="append", default=[], metavar="NAME=FILE.npy")
    sp.add_argument("--output-dir", help="write each output to DIR/<name>.npy")
    sp.add_argument("--saturate", action="store_true",
                    help="clip inputs into their declared precision instead of rejecting them")
    sp.add_argument("--dequantize", action="store_true",
                    help="return the outputs of a quantized artifact as float32 reals "
                         "(integer / scale)")
    sp.add_argument("--threads", type=positive, help="CPU threads (default: all cores)")
    sp.set_defaults(fn=cmd_run)

    sp = sub.add_parser("bench", help="time a .cvmx artifact, kernel by kernel and whole")
    sp.add_argument("model", metavar="ARTIFACT", help="a .cvmx artifact")
    sp.add_argument("--input", action="append", default=[], metavar="NAME=FILE.npy",
                    help="input data (default: random values inside each input's precision)")
    sp.add_argument("--threads", type=positive, help="CPU threads (default: all cores)")
    sp.add_argument("--repeat", type=positive, default=50, help="timed rounds (default 50)")
    sp.add_argument("--warmup", type=positive, default=5, help="untimed runs first (default 5)")
    sp.add_argument("--json", metavar="FILE", help="also write the numbers as JSON")
    sp.set_defaults(fn=cmd_bench)

    sp = sub.add_parser("eval", help="top-1 accuracy of a .cvmx artifact over a dataset, and "
                        "agreement with another artifact")
    sp.add_argument("model", metavar="ARTIFACT", help="a .cvmx artifact with one input")
    sp.add_argument("--data", required=True, metavar="X.npy",
                    help="N samples of the input without the batch dimension: [N, ...]; "
                         "floats for a quantized artifact are quantized by its scale")
    sp.add_argument("--labels", metavar="Y.npy", help="N integer class indices")
    sp.add_argument("--compare", metavar="OTHER.cvmx",
                    help="a second artifact: the share of samples with the same top-1")
    sp.add_argument("--workers", type=positive, metavar="N",
                    help="processes (with --ray: actors), one model and one thread each "
                         "(default: one per CPU)")
    sp.add_argument("--ray", nargs="?", const="", metavar="ADDRESS",
                    help="run on Ray Data (the cluster at ADDRESS, else a local one); "
                         "needs the extra cvmc[ray]")
    sp.set_defaults(fn=cmd_eval)

    input_shape = {"action": "append", "default": [], "type": shape_arg,
                   "metavar": "NAME=D1,D2,...",
                   "help": "static shape of an ONNX input with symbolic dimensions, or a "
                           "new batch (dimension 0) where the graph carries it"}
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
    sp.add_argument("--mtriple", help="cross-compile for aarch64-linux-gnu (with --emit "
                    "c-library; --mcpu default generic)")
    sp.add_argument("--arch", type=cuda_arch,
                    help=f"CUDA arch, sm_61 or newer, e.g. sm_80, sm_90 (default {DEFAULT_ARCH})")
    sp.add_argument("-o", "--output", required=True,
                    help="artifact path (.cvmx); with --emit c-library, a folder")
    sp.add_argument("--emit", action="append", default=[],
                    choices=["tir", "source", "plan", "c-library"],
                    help="also write OUTPUT.<kind> for inspection (repeatable); c-library: "
                         "write a C library into the folder OUTPUT instead of an artifact")
    sp.add_argument("--dump-ir", metavar="DIR", help="write the graph after every pass to DIR")
    sp.add_argument("--stop-after", metavar="PASS", help="stop the pass pipeline after PASS")
    sp.add_argument("--no-cache", action="store_true",
                    help="neither read nor write the kernel cache (~/.cache/cvmc/kernels, "
                         "or $CVMC_CACHE_DIR)")
    sp.set_defaults(fn=cmd_compile)

    sp = sub.add_parser("export", help="export a model for CVM-Runtime")
    model_args(sp)
    sp.add_argument("--format", choices=["cvm"], default="cvm")
    sp.add_argument("-o", "--output", required=True, help="output folder")
    sp.set_defaults(fn=cmd_export)


    sp = sub.add_parser("quantize", help="quantize a float model (ONNX or NNEF) to a CVM "
                        "integer NNEF folder, calibrated on sample inputs")
    sp.add_argument("model", help="a float model: MODEL.onnx, or an NNEF file, folder or "
                    "tar; or an ONNX model already quantized (QDQ, QLinearConv)")
    sp.add_argument("-o", "--output", required=True, metavar="DIR",
                    help="the NNEF folder to write (graph.nnef, .dat files, quantization.json);"
                         " must not exist or be empty")
    sp.add_argument("--calib", action="append", default=[],
                    metavar="NAME=FILE.npy",
                    help="calibration samples of input NAME, shape [N, *input shape] "
                         "(repeat per input; not for a QDQ / QLinear ONNX model, which "
                         "brings its own scales)")
    sp.add_argument("--calib-method", choices=("absmax", "percentile", "lambda", "mse"),
                    default="absmax", help="threshold of each tensor: its largest |value| "
                    "(default), a percentile of |value|, MRT's |mean| + lambda * std, or the "
                    "least quantization error (mse)")
    sp.add_argument("--percentile", type=float, default=99.99, metavar="P",
                    help="percentile of --calib-method percentile (default 99.99)")
    sp.add_argument("--lambda", dest="lam", type=float, default=10.0, metavar="L",
                    help="lambda of --calib-method lambda (default 10, MRT's)")
    chan = sp.add_mutually_exclusive_group()
    chan.add_argument("--per-channel", dest="per_channel", action="store_true",
                      help="one weight scale per output channel of conv and dense")
    chan.add_argument("--per-tensor", dest="per_channel", action="store_false",
                      help="one weight scale per weight tensor (default)")
    sp.add_argument("--bits", type=int, default=8, metavar="B", help="activation bits, 2..8 (default 8)")
    sp.add_argument("--weight-bits", type=int, default=8, metavar="B",
                    help="conv and dense weight bits, 2..8 (default 8); 7: ONNX Runtime's "
                         "reduce_range, |w| <= 63")
    sp.add_argument("--output-bits", type=output_bits, default=(8, 0), metavar="B[+R]",
                    help="bits of the model's outputs, 2..16 (default 8); +R: R of them "
                         "add range (2^R times the calibrated), the rest resolution")
    sp.add_argument("--samples", type=positive, metavar="N",
                    help="use at most the first N calibration samples (default: all)")
    sp.add_argument("--calib-on", choices=("llvm", "reference"), default="llvm",
                    help="run calibration on the float model compiled for this CPU "
                         "(default) or on the reference interpreter")
    sp.add_argument("--calib-batch", type=positive, default=4, metavar="B",
                    help="samples per compiled calibration run (default 4)")
    sp.add_argument("--report", action="store_true",
                    help="print each layer's precision, SQNR and max error against the "
                         "float model, and its sensitivity (docs/quantize.md)")
    sp.add_argument("--report-json", metavar="FILE", help="write that report as JSON too")
    sp.add_argument("--sensitivity-samples", type=positive, default=8, metavar="N",
                    help="samples the report's sensitivities run on, one float run per "
                         "layer each (default 8)")
    sp.add_argument("--dump-ir", metavar="DIR",
                    help="write the graph after every quantizer pass to DIR")
    sp.add_argument("--force", action="store_true",
                    help="replace DIR if it holds a previous model (a graph.nnef)")
    sp.add_argument("--input-shape", **input_shape)
    sp.set_defaults(fn=cmd_quantize)
    return p


def _show_warning(message, category, filename, lineno, file=None, line=None) -> None:
    """Warnings from the library (e.g. a CVM JSON without params): one line on stderr."""
    print(f"warning: {message}", file=sys.stderr)


def _terminate(signum, frame) -> None:
    """SIGTERM: unwind like Ctrl-C, so temporary files are removed."""
    raise KeyboardInterrupt


OUT_OF_MEMORY = ("out of memory (an allocation failed; if an address-space limit is set, "
                 "`ulimit -v`, raise it)")


_OUT_OF_MEMORY_LINE = f"error: {OUT_OF_MEMORY}\n".encode()


def _out_of_memory(error: BaseException | None) -> bool:
    """Whether `error`, or an error it was raised while handling, is a MemoryError."""
    while error is not None:
        if isinstance(error, MemoryError):
            return True
        error = error.__context__
    return False


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
    except MemoryError:
        print(f"error: {OUT_OF_MEMORY}", file=sys.stderr)
    except RuntimeError as e:  # TVM's C++ raises a failed allocation as its InternalError
        if "std::bad_alloc" not in str(e):
            raise
        print(f"error: {OUT_OF_MEMORY}", file=sys.stderr)
    finally:
        signal.signal(signal.SIGTERM, previous)
    return 1


def entry() -> None:
    """The `cvmc` command: exit with main's code. An interrupt exits with 130 at once (its
    temporary files are already removed): at interpreter shutdown TVM's FFI may re-raise
    the interrupt as SIGINT, which turned 130 into death by signal (-2). Memory so short
    that reporting an error fails too ends with the one out-of-memory line, written
    without allocating, and no interpreter shutdown (which would fail the same way)."""
    try:
        code = main()
    except BaseException as e:
        if not _out_of_memory(e):
            raise
        os.write(2, _OUT_OF_MEMORY_LINE)
        os._exit(1)
    if code == 130:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(130)
    sys.exit(code)

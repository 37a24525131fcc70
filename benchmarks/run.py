"""cvmc benchmarks: compiled artifacts timed against baselines run in the same process.

    python benchmarks/run.py [--threads N] [--repeat R] [--filter NAME] [--json OUT]

Each workload is an NNEF graph with random int8 weights, compiled for the host CPU with
`cvmc.compile` and run with `cvmc_runtime`. Baselines: cvmc's NumPy reference
interpreter (always) and ONNX Runtime's integer kernels (when `onnxruntime` and `onnx` are
importable). Every implementation's output is compared bit-exactly before it is timed, so
a wrong result is never timed. Ratio = baseline ms / cvmc ms: above 1 means cvmc is faster.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

# OpenBLAS (NumPy's matmul in the reference interpreter) keeps its worker threads spinning
# long after a call and slows whatever runs next on the same 2 cores: one thread, set
# before NumPy loads it. The reference is only a baseline here.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))  # benchmarks/models.py
SEED = 2024
WARMUP = 2
PAUSE_S = 0.05  # thread pools (TVM/OpenMP, ONNX Runtime, OpenBLAS) spin: let them park


class VerificationError(Exception):
    """An implementation's output differs from the expected one: nothing is timed."""


@dataclass
class Workload:
    """An NNEF model (text + weights by label, or an existing folder) and its inputs."""

    name: str
    text: str
    weights: dict[str, np.ndarray]
    inputs: dict[str, np.ndarray]
    folder: Path | None = None
    # The same graph with intermediate outputs, run on the reference only: the values the
    # ONNX baselines are checked against (the timed cvmc graph stays as it is).
    check_text: str = ""
    # ONNX Runtime baselines: (workload, reference graph outputs, threads) -> implementations
    onnx: Callable[[Workload, dict[str, np.ndarray], int], list[Impl]] | None = None
    # Whether the NumPy reference is also timed as a baseline (not for whole networks:
    # seconds per run; it still checks cvmc's outputs).
    time_reference: bool = True


@dataclass
class Impl:
    """One baseline: a zero-argument call, timed, and what its output was checked against."""

    name: str
    call: Callable[[], object]
    verified: str


@dataclass
class Row:
    """One line of the report: a workload against one baseline."""

    workload: str
    baseline: str
    cvmc_ms: float
    baseline_ms: float
    ratio: float
    threads: int
    cpu: str
    verified: str  # what was compared, bit-exactly, before anything was timed


# ---------------------------------------------------------------- workloads

def _graph(name: str, inputs: list[str], decls: list[str], body: list[str],
           outputs: list[str]) -> str:
    """An NNEF document: a graph `name` with declarations, then op lines."""
    lines = [*decls, *body]
    return (f"version 1.0;\n\ngraph {name}( {', '.join(inputs)} ) -> ( {', '.join(outputs)} )"
            "\n{\n" + "".join(f"    {line};\n" for line in lines) + "}\n")


def _int8(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    """Random 8-bit-precision values (|v| <= 127) stored as int8."""
    return rng.integers(-127, 128, shape).astype(np.int8)


def _external(name: str, shape: tuple[int, ...]) -> str:
    return f"{name} = external<integer>(shape = {list(shape)}, precision = 8)"


def _variable(name: str, shape: tuple[int, ...], precision: int) -> str:
    return (f"{name} = variable<integer>(shape = {list(shape)}, label = \"{name}\", "
            f"precision = {precision})")


def small_cnn() -> Workload:
    """The bundled examples/small_cnn model on its bundled input."""
    folder = ROOT / "examples" / "small_cnn"
    data = np.load(folder / "data.npy")
    return Workload("small_cnn", "", {}, {"data": data}, folder=folder)


def conv_shift_clip(tag: str, ic: int, hw: int, oc: int, k: int, pad: int) -> Workload:
    """conv2d (int8, bias) -> cvm_right_shift -> cvm_clip: one quantized ResNet layer."""
    rng = np.random.default_rng(SEED)
    x_shape, w_shape = (1, ic, hw, hw), (oc, ic, k, k)
    # Uniform |v| <= 127 has std ~73; shift the accumulator's std to ~50 (as small_cnn) so
    # the 8-bit clip keeps most values rather than saturating.
    shift = max(1, round(np.log2(np.sqrt(ic * k * k) * 73.3 ** 2 / 50)))
    decls = [_external("data", x_shape), _variable("w", w_shape, 8), _variable("b", (oc,), 16)]
    body = [(f"acc = conv2d(data, w, b, padding = [{pad}, {pad}], stride = [1, 1], "
            "dilation = [1, 1], groups = 1)"),
            f"s = cvm_right_shift(acc, precision = 16, shift_bit = {shift})",
            "y = cvm_clip(s, precision = 8)"]
    weights = {"w": _int8(rng, w_shape),
               "b": rng.integers(-32767, 32768, (oc,)).astype(np.int32)}
    return Workload(f"conv {ic}x{hw}x{hw} {k}x{k} ->{oc} +shift+clip ({tag})",
                    _graph("conv", ["data"], decls, body, ["y"]), weights,
                    {"data": _int8(rng, x_shape)},
                    check_text=_graph("conv", ["data"], decls, body, ["y", "acc"]),
                    onnx=_conv_onnx(pad, shift))


def dense_bias() -> Workload:
    """dense 1x2048 by 1000x2048 int8 with an int32 bias (a ResNet-50 classifier)."""
    rng = np.random.default_rng(SEED)
    text = _graph("dense", ["data"],
                  [_external("data", (1, 2048)), _variable("w", (1000, 2048), 8),
                   _variable("b", (1000,), 16)], ["y = dense(data, w, b)"], ["y"])
    weights = {"w": _int8(rng, (1000, 2048)),
               "b": rng.integers(-32767, 32768, (1000,)).astype(np.int32)}
    return Workload("dense 1x2048 by 1000x2048 +bias", text, weights,
                    {"data": _int8(rng, (1, 2048))}, onnx=_dense_onnx)


def residual_add() -> Workload:
    """elemwise_add of two 1x256x56x56 int8 tensors, clipped back to 8 bits."""
    rng = np.random.default_rng(SEED)
    shape = (1, 256, 56, 56)
    text = _graph("residual_add", ["a", "b"], [_external("a", shape), _external("b", shape)],
                  ["s = elemwise_add(a, b)", "y = cvm_clip(s, precision = 8)"], ["y"])
    return Workload("elemwise_add+clip 1x256x56x56", text, {},
                    {"a": _int8(rng, shape), "b": _int8(rng, shape)})


def max_pool() -> Workload:
    """max_pool2d 3x3 stride 2 pad 1 on 1x64x112x112 (the ResNet stem pool)."""
    rng = np.random.default_rng(SEED)
    shape = (1, 64, 112, 112)
    text = _graph("max_pool", ["data"], [_external("data", shape)],
                  [("y = max_pool2d(data, pool_size = [3, 3], padding = [1, 1], "
                   "strides = [2, 2], ceil_mode = false)")], ["y"])
    return Workload("max_pool2d 3x3/2 1x64x112x112", text, {},
                    {"data": _int8(rng, shape)}, onnx=_max_pool_onnx)


def global_sum() -> Workload:
    """sum over H, W of 1x2048x7x7 then a right shift (ResNet's global pooling)."""
    rng = np.random.default_rng(SEED)
    shape = (1, 2048, 7, 7)
    text = _graph("global_sum", ["data"], [_external("data", shape)],
                  ["s = sum(data, axes = [2, 3], keepdims = true)",
                   "y = cvm_right_shift(s, precision = 8, shift_bit = 6)"], ["y"])
    return Workload("sum(H,W)+shift 1x2048x7x7", text, {}, {"data": _int8(rng, shape)})


def network(name: str, size: int = 224) -> Workload:
    """A whole network of benchmarks/models.py at `size` x `size`, batch 1."""
    from models import MODELS

    net = MODELS[name](size)
    x = np.random.default_rng(SEED).integers(-127, 128, net.input_shape).astype(np.int8)
    return Workload(f"{name} {size}x{size}", net.nnef(), net.weights, {"data": x},
                    onnx=_network_onnx(net), time_reference=False)


# ResNet-50 layers from benchdnn's shapes_resnet_50 (batch 1): res2a_branch2b,
# res3a_branch2b (3x3, the bulk of the network's work) and res2b_branch2a (1x1).
WORKLOADS: list[Callable[[], Workload]] = [
    small_cnn,
    lambda: conv_shift_clip("res2a_branch2b", 64, 56, 64, 3, 1),
    lambda: conv_shift_clip("res3a_branch2b", 128, 28, 128, 3, 1),
    lambda: conv_shift_clip("res2b_branch2a", 256, 56, 64, 1, 0),
    dense_bias,
    residual_add,
    max_pool,
    global_sum,
    lambda: network("resnet18"),
    lambda: network("mobilenet_v1"),
]


# ---------------------------------------------------------------- ONNX Runtime baselines

def _onnx_session(nodes, inputs: dict[str, np.ndarray], initializers: dict[str, np.ndarray],
                  out: np.dtype, threads: int):
    """An ORT session for one ONNX graph (inputs fed at run time, initializers constant)."""
    import onnxruntime as ort
    from onnx import helper, numpy_helper

    def info(name: str, value: np.ndarray):
        elem = helper.np_dtype_to_tensor_dtype(value.dtype)
        return helper.make_tensor_value_info(name, elem, list(value.shape))

    graph = helper.make_graph(nodes, "bench", [info(k, v) for k, v in inputs.items()],
                              [helper.make_tensor_value_info(
                                  "out", helper.np_dtype_to_tensor_dtype(np.dtype(out)), None)],
                              [numpy_helper.from_array(v, k) for k, v in initializers.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    return ort.InferenceSession(model.SerializeToString(), opts,
                                providers=["CPUExecutionProvider"])


def _onnx_impl(name: str, session, feeds: dict[str, np.ndarray], expected: np.ndarray,
               verified: str) -> Impl:
    """Run `session` once, demand a bit-exact `expected`, and wrap it as a baseline."""
    _check_equal(f"onnxruntime {name}", {"out": session.run(None, feeds)[0]},
                 {"out": expected})
    return Impl(f"onnxruntime {name}", lambda: session.run(None, feeds), verified)


def _as_u8(x: np.ndarray) -> np.ndarray:
    """x + 128 as uint8: the unsigned form ORT's fast kernels want (zero point 128)."""
    return (x.astype(np.int16) + 128).astype(np.uint8)


def _conv_onnx(pad: int, shift: int):
    """ConvInteger (s8 x s8 -> s32, + bias) and QLinearConv (u8 x s8 -> u8) baselines."""
    def build(w: Workload, ref: dict[str, np.ndarray], threads: int) -> list[Impl]:
        from onnx import helper

        x, acc = w.inputs["data"], ref["acc"]
        bias = w.weights["b"].reshape(1, -1, 1, 1)
        pads = [pad] * 4
        s8 = _onnx_session([helper.make_node("ConvInteger", ["data", "w"], ["c"], pads=pads),
                            helper.make_node("Add", ["c", "b"], ["out"])],
                           {"data": x}, {"w": w.weights["w"], "b": bias}, np.int32, threads)
        # QLinearConv requantizes acc / 2^shift with round-half-to-even and saturates to
        # u8 around zero point 128: an independent NumPy model of that is the expectation.
        q = np.clip(np.round(acc.astype(np.float64) / 2.0 ** shift) + 128, 0, 255)
        consts = {"w": w.weights["w"], "b": w.weights["b"], "one": np.array(1, np.float32),
                  "x_zp": np.array(128, np.uint8), "w_zp": np.array(0, np.int8),
                  "y_scale": np.array(2.0 ** shift, np.float32),
                  "y_zp": np.array(128, np.uint8)}
        u8 = _onnx_session([helper.make_node(
            "QLinearConv", ["data", "one", "x_zp", "w", "one", "w_zp", "y_scale", "y_zp", "b"],
            ["out"], pads=pads)], {"data": _as_u8(x)}, consts, np.uint8, threads)
        return [_onnx_impl("ConvInteger s8", s8, {"data": x}, acc,
                           "int32 accumulator == reference"),
                _onnx_impl("QLinearConv u8", u8, {"data": _as_u8(x)}, q.astype(np.uint8),
                           "u8 == half-even requant of reference accumulator")]
    return build


def _dense_onnx(w: Workload, ref: dict[str, np.ndarray], threads: int) -> list[Impl]:
    """MatMulInteger s8 x s8 and u8 x s8 (zero point 128), each + bias: exact int32."""
    from onnx import helper

    x = w.inputs["data"]
    consts = {"wt": np.ascontiguousarray(w.weights["w"].T), "b": w.weights["b"]}
    add = helper.make_node("Add", ["m", "b"], ["out"])
    s8 = _onnx_session([helper.make_node("MatMulInteger", ["data", "wt"], ["m"]), add],
                       {"data": x}, consts, np.int32, threads)
    u8 = _onnx_session([helper.make_node("MatMulInteger", ["data", "wt", "x_zp"], ["m"]), add],
                       {"data": _as_u8(x)}, {**consts, "x_zp": np.array(128, np.uint8)},
                       np.int32, threads)
    return [_onnx_impl("MatMulInteger s8", s8, {"data": x}, ref["y"], "int32 == reference"),
            _onnx_impl("MatMulInteger u8", u8, {"data": _as_u8(x)}, ref["y"],
                       "int32 == reference")]


def _max_pool_onnx(w: Workload, ref: dict[str, np.ndarray], threads: int) -> list[Impl]:
    """ONNX MaxPool on int8 (opset 12+), which pads with the type's minimum like CVM."""
    from onnx import helper

    x = w.inputs["data"]
    node = helper.make_node("MaxPool", ["data"], ["out"], kernel_shape=[3, 3],
                            pads=[1, 1, 1, 1], strides=[2, 2])
    session = _onnx_session([node], {"data": x}, {}, np.int8, threads)
    return [_onnx_impl("MaxPool s8", session, {"data": x}, ref["y"], "int8 == reference")]


def _network_onnx(net):
    """The network's ONNX Runtime twin (QLinearConv u8 and friends: benchmarks/models.py).
    Its rounding differs from CVM's, so only its output shape is checked."""
    def build(w: Workload, ref: dict[str, np.ndarray], threads: int) -> list[Impl]:
        import onnxruntime as ort

        opts = ort.SessionOptions()
        opts.intra_op_num_threads = threads
        opts.inter_op_num_threads = 1
        opts.log_severity_level = 3
        session = ort.InferenceSession(net.onnx_model().SerializeToString(), opts,
                                       providers=["CPUExecutionProvider"])
        feeds = {"data": _as_u8(w.inputs["data"])}
        (out,) = session.run(None, feeds)
        if out.shape != ref["logits"].shape:
            raise VerificationError(f"onnxruntime {w.name}: output shape {out.shape}, "
                                    f"expected {ref['logits'].shape}")
        return [Impl("onnxruntime QLinearConv u8 network", lambda: session.run(None, feeds),
                     "same shapes and layers; output shape checked (ONNX rounds otherwise)")]
    return build


def onnx_available() -> bool:
    """True when both onnxruntime and onnx import (they are not cvmc dependencies)."""
    try:
        import onnx  # noqa: F401
        import onnxruntime  # noqa: F401
    except ImportError:
        return False
    return True


# ---------------------------------------------------------------- measuring

@contextmanager
def tvm_threads(threads: int) -> Iterator[None]:
    """Set TVM_NUM_THREADS (read by the CPU shim at every parallel launch), then restore."""
    old = os.environ.get("TVM_NUM_THREADS")
    os.environ["TVM_NUM_THREADS"] = str(threads)
    try:
        yield
    finally:
        if old is None:
            del os.environ["TVM_NUM_THREADS"]
        else:
            os.environ["TVM_NUM_THREADS"] = old


def median_ms(call: Callable[[], object], repeat: int) -> float:
    """Median wall time of `repeat` calls after a pause and WARMUP untimed calls."""
    time.sleep(PAUSE_S)
    for _ in range(WARMUP):
        call()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def _model_folder(w: Workload, tmp: Path) -> Path:
    """The workload's model folder: the bundled one, or graph.nnef + .dat files in `tmp`."""
    from cvmc.frontend.tensorfile import write_tensor

    if w.folder is not None:
        return w.folder
    (tmp / "graph.nnef").write_text(w.text)
    for label, array in w.weights.items():
        write_tensor(tmp / f"{label}.dat", array)
    return tmp


def _check_equal(what: str, got: dict[str, np.ndarray], expected: dict[str, np.ndarray]):
    """Raise VerificationError unless every output is bit-exact."""
    for name, value in expected.items():
        if got[name].shape != value.shape:
            raise VerificationError(f"{what}: output '{name}' has shape {got[name].shape}, "
                                    f"expected {value.shape}")
        if not np.array_equal(got[name], value):
            bad = np.count_nonzero(got[name] != value)
            raise VerificationError(f"{what}: output '{name}' differs from the expected in "
                                    f"{bad} of {value.size} elements")


def measure(w: Workload, threads: int, repeat: int, tmp: Path) -> list[Row]:
    """Compile, verify and time one workload against each of its baselines."""
    import cvmc_runtime

    import cvmc

    graph = cvmc.load_graph(_model_folder(w, tmp))
    cvmc.compile(graph, tmp / "model.cvmx")
    model = cvmc_runtime.load(tmp / "model.cvmx")
    ref = cvmc.reference_run(graph, w.inputs)
    _check_equal(f"cvmc {w.name}", model.run(w.inputs), ref)
    if w.check_text:
        (tmp / "check.nnef").write_text(w.check_text)
        ref = cvmc.reference_run(cvmc.load_graph(tmp / "check.nnef"), w.inputs)
    impls = [Impl("reference (NumPy)", lambda: cvmc.reference_run(graph, w.inputs), "")] \
        if w.time_reference else []
    if w.onnx is not None and onnx_available():
        impls += w.onnx(w, ref, threads)
    cpu = model.plan["target"].get("mcpu", "?")
    rows = []
    for impl in impls:
        # cvmc is timed again next to each baseline: both numbers of a ratio come from the
        # same few seconds, so a burst of load elsewhere on the machine hits both alike.
        cvmc_ms = median_ms(lambda: model.run(w.inputs), repeat)
        ms = median_ms(impl.call, repeat)
        checks = "; ".join(c for c in ("cvmc == reference", impl.verified) if c)
        rows.append(Row(w.name, impl.name, cvmc_ms, ms, ms / cvmc_ms, threads, cpu, checks))
    return rows


def run_benchmarks(threads: int = 2, repeat: int = 20, name_filter: str = "") -> list[Row]:
    """Build, verify and time every workload whose name contains `name_filter`."""
    rows: list[Row] = []
    with tvm_threads(threads):
        for make in WORKLOADS:
            w = make()
            if name_filter.lower() not in w.name.lower():
                continue
            with tempfile.TemporaryDirectory(prefix="cvmc-bench-") as tmp:
                rows += measure(w, threads, repeat, Path(tmp))
    return rows


# ---------------------------------------------------------------- report

def machine() -> str:
    """The host CPU's model name and core count."""
    name = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                name = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{name}, {os.cpu_count()} cores"


def table(rows: list[Row]) -> str:
    """The rows as a Markdown table."""
    head = ("| workload | baseline | cvmc ms | baseline ms | ratio | threads | CPU |\n"
            "|---|---|---:|---:|---:|---:|---|\n")
    return head + "".join(
        f"| {r.workload} | {r.baseline} | {r.cvmc_ms:.3f} | {r.baseline_ms:.3f} | "
        f"{r.ratio:.2f} | {r.threads} | {r.cpu} |\n" for r in rows)


def _parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1,
                   help="TVM_NUM_THREADS and ONNX Runtime intra-op threads (default: all)")
    p.add_argument("--repeat", type=int, default=20, help="timed runs per implementation")
    p.add_argument("--filter", default="", help="only workloads whose name contains this")
    p.add_argument("--json", type=Path, help="also write the rows and the setup as JSON")
    args = p.parse_args(argv)
    if args.threads < 1 or args.repeat < 1:
        p.error("--threads and --repeat must be at least 1")
    return args


def main(argv: list[str] | None = None) -> int:
    """Command line: run the benchmarks, print the table, optionally write JSON."""
    from cvmc.errors import CvmcError

    args = _parse(argv)
    setup = {"date": datetime.date.today().isoformat(), "machine": machine(),
             "threads": args.threads, "repeat": args.repeat,
             "OPENBLAS_NUM_THREADS": os.environ.get("OPENBLAS_NUM_THREADS", "unset"),
             "OPENBLAS_CORETYPE": os.environ.get("OPENBLAS_CORETYPE", "unset")}
    print(" ".join(f"{k}={v}" for k, v in setup.items()))
    if not onnx_available():
        print("onnxruntime not installed: skipped")
    try:
        rows = run_benchmarks(args.threads, args.repeat, args.filter)
    except (CvmcError, VerificationError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    if not rows:
        print(f"no workload matches --filter {args.filter!r}", file=sys.stderr)
        return 1
    print(table(rows), end="")
    print("checked bit-exactly before timing:")
    for baseline, checks in dict.fromkeys((r.baseline, r.verified) for r in rows):
        print(f"  {baseline}: {checks}")
    if args.json:
        args.json.write_text(json.dumps({**setup, "rows": [asdict(r) for r in rows]}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

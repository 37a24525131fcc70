"""cvmc benchmarks: compiled artifacts timed against baselines run in the same process.

    python benchmarks/run.py [--threads N[,N...]] [--repeat R] [--filter NAME]
                             [--shapes SET[,SET...]] [--contention] [--json OUT]

Each workload is an NNEF graph with random int8 weights, compiled for the host CPU with
`cvmc.compile` and run with `cvmc_runtime`. Baselines: cvmc's NumPy reference
interpreter (always), ONNX Runtime's integer kernels (when `onnxruntime` and `onnx` are
importable) and OpenVINO's int8 kernels on the whole networks (when `openvino` and `onnx`
are). Every cvmc output and every exact baseline is compared bit-exactly before it is
timed, so a wrong result is never timed. Ratio = baseline ms / cvmc ms: above 1 means cvmc
is faster. `--shapes` adds the conv layers of benchdnn shape sets, `--contention` times
the networks again beside 1, then 2 busy processes (median and p99).
"""
from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path

# OpenBLAS (NumPy's matmul in the reference interpreter) keeps its worker threads spinning
# long after a call and slows whatever runs next on the same 2 cores: one thread, set
# before NumPy loads it. The reference is only a baseline here.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))  # benchmarks/models.py
from benchdnn import FOLDER as SHAPES_FOLDER
from benchdnn import ConvShape, ShapeError, parse_descriptor, read_shapes, shape_file

SEED = 2024
WARMUP = 2
BURST = 5  # timed calls per turn (runtimes take turns, see median_ms)
PAUSE_S = 0.05  # thread pools (TVM/OpenMP, ONNX Runtime, OpenBLAS) spin: let them park
BUSY_LIMIT_S = 300  # the competing processes of --contention stop themselves after this
COMPETITORS = (1, 2)  # --contention: busy processes beside the timed runtimes, in turn
CONTENTION_REPEAT = 100  # at least this many timed runs per runtime there, for a p99
MEMORY_PY = Path(__file__).resolve().parent / "memory.py"
# OpenVINO's settings for one request at a time on `threads` cores, as a latency user sets.
OPENVINO_HINT = "LATENCY"


class BenchmarkError(Exception):
    """The benchmark cannot go on (a wrong output, a failed measurement)."""


class VerificationError(BenchmarkError):
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
    # ONNX Runtime / OpenVINO baselines: (workload, reference graph outputs, threads) ->
    # implementations
    onnx: Callable[[Workload, dict[str, np.ndarray], int], list[Impl]] | None = None
    openvino: Callable[[Workload, dict[str, np.ndarray], int], list[Impl]] | None = None
    # Whether the NumPy reference is also timed as a baseline (not for whole networks:
    # seconds per run; it still checks cvmc's outputs).
    time_reference: bool = True
    # A whole network of models.py: its memory is compared, and --contention times it.
    network: object = None
    suite: str = ""  # the benchdnn shape set of a --shapes workload


@dataclass
class Impl:
    """One baseline: a zero-argument call, timed, and what its output was checked against;
    `wrong` says how its output differs where it is not exact on this CPU (then it is
    reported, never timed)."""

    name: str
    call: Callable[[], object]
    verified: str
    wrong: str = ""


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
    suite: str = ""


@dataclass
class Slowdown:
    """A runtime on a network timed quiet, then beside `competitors` busy processes (each
    pinned to one of `busy_cores`): medians and 99th percentiles of the same runs."""

    workload: str
    runtime: str
    threads: int
    competitors: int
    quiet_ms: float
    quiet_p99_ms: float
    contended_ms: float
    contended_p99_ms: float
    slowdown: float  # contended / quiet, medians
    busy_cores: list[int]
    load_average: float  # 1-minute, when the contended runs ended


@dataclass
class Memory:
    """What a loaded network costs a runtime (benchmarks/memory.py, a fresh process)."""

    workload: str
    runtime: str
    threads: int
    first_bytes: int  # RSS growth: runtime set-up + first instance loaded and run once
    further_bytes: int  # RSS growth of one more instance of the same model
    plan_bytes: int | None = None  # cvmc: arena + weights + inputs + outputs of the plan


@dataclass
class CompileTime:
    """`cvmc.compile` of a network (TVM already imported): with an empty kernel cache of its
    own (cold), then once more with the cache that compile filled (warm: a recompile)."""

    workload: str
    kernels: int
    cold_s: float
    warm_s: float


@dataclass
class Results:
    """Everything one run measured."""

    rows: list[Row] = field(default_factory=list)
    slowdowns: list[Slowdown] = field(default_factory=list)
    memory: list[Memory] = field(default_factory=list)
    compiles: list[CompileTime] = field(default_factory=list)
    untimed: list[str] = field(default_factory=list)  # baselines whose output was wrong

    def extend(self, other: Results) -> None:
        self.rows += other.rows
        self.slowdowns += other.slowdowns
        self.memory += other.memory
        self.compiles += other.compiles
        self.untimed += other.untimed


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


def _pair(prefix: str, pair: tuple[int, int]) -> str:
    """' /2', ' /2x1' or '' (for 1): a stride or dilation in a workload name."""
    return "" if pair == (1, 1) else f"{prefix}{pair[0]}" + \
        ("" if pair[0] == pair[1] else f"x{pair[1]}")


def conv_name(s: ConvShape) -> str:
    """'conv 64x56x56 3x3 ->64 +shift+clip (res2a_branch2b)', with /stride, gGROUPS and
    dDILATION where they are not 1."""
    geometry = f"{s.kh}x{s.kw}{_pair('/', s.stride)}" + \
        (f" g{s.groups}" if s.groups > 1 else "") + _pair(" d", s.dilation)
    return f"conv {s.ic}x{s.ih}x{s.iw} {geometry} ->{s.oc} +shift+clip ({s.name})"


def conv_shift_clip(s: ConvShape, suite: str = "") -> Workload:
    """conv2d (int8, bias) -> cvm_right_shift -> cvm_clip: one quantized layer of shape
    `s`. Baselines: ORT QLinearConv u8, and ConvInteger s8 outside a --shapes sweep."""
    rng = np.random.default_rng(SEED)
    x_shape, w_shape = (1, s.ic, s.ih, s.iw), (s.oc, s.ic // s.groups, s.kh, s.kw)
    # Uniform |v| <= 127 has std ~73; shift the accumulator's std to ~50 (as small_cnn) so
    # the 8-bit clip keeps most values rather than saturating.
    shift = max(1, round(np.log2(np.sqrt(w_shape[1] * s.kh * s.kw) * 73.3 ** 2 / 50)))
    decls = [_external("data", x_shape), _variable("w", w_shape, 8),
             _variable("b", (s.oc,), 16)]
    body = [(f"acc = conv2d(data, w, b, padding = {list(s.pad)}, stride = {list(s.stride)}, "
            f"dilation = {list(s.dilation)}, groups = {s.groups})"),
            f"s = cvm_right_shift(acc, precision = 16, shift_bit = {shift})",
            "y = cvm_clip(s, precision = 8)"]
    weights = {"w": _int8(rng, w_shape),
               "b": rng.integers(-32767, 32768, (s.oc,)).astype(np.int32)}
    return Workload(conv_name(s), _graph("conv", ["data"], decls, body, ["y"]), weights,
                    {"data": _int8(rng, x_shape)},
                    check_text=_graph("conv", ["data"], decls, body, ["y", "acc"]),
                    onnx=_conv_onnx(s, shift, conv_integer=not suite),
                    time_reference=not suite, suite=suite)


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
                    onnx=_network_onnx(net), openvino=_network_openvino(net),
                    time_reference=False, network=net)


def shape_workloads(sets: list[str]) -> tuple[list[Callable[[], Workload]], list[str]]:
    """(a workload per conv of each benchdnn shape set, notes on what was skipped). No
    shape folder (a checkout without ../shared): no workloads and one note."""
    if not sets:
        return [], []
    if not SHAPES_FOLDER.is_dir():
        return [], [f"benchdnn shapes not found at {SHAPES_FOLDER}: --shapes skipped"]
    makers, notes = [], []
    for name in sets:
        shapes, skipped = read_shapes(shape_file(name))
        notes += [f"{name}: skipped {why}" for why in skipped]
        makers += [lambda s=s, name=name: conv_shift_clip(s, suite=f"benchdnn {name}")
                   for s in shapes]
    return makers, notes


# ResNet-50 layers from benchdnn's shapes_resnet_50 (batch 1): res2a_branch2b,
# res3a_branch2b (3x3, the bulk of the network's work) and res2b_branch2a (1x1).
WORKLOADS: list[Callable[[], Workload]] = [
    small_cnn,
    lambda: conv_shift_clip(parse_descriptor('ic64ih56oc64kh3ph1n"res2a_branch2b"')),
    lambda: conv_shift_clip(parse_descriptor('ic128ih28oc128kh3ph1n"res3a_branch2b"')),
    lambda: conv_shift_clip(parse_descriptor('ic256ih56oc64kh1ph0n"res2b_branch2a"')),
    dense_bias,
    residual_add,
    max_pool,
    global_sum,
    lambda: network("resnet18"),
    lambda: network("mobilenet_v1"),
]


# ---------------------------------------------------------------- ONNX Runtime, OpenVINO

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
    """Run `session` once, compare with the bit-exact `expected`, and wrap it as a baseline
    (marked wrong where it differs: ORT's u8 x s8 kernels on AVX2 CPUs without VNNI sum
    pairs of products with the saturating `vpmaddubsw`, so full-range int8 weights can give
    other results there)."""
    impl = Impl(f"onnxruntime {name}", lambda: session.run(None, feeds), verified)
    try:
        _check_equal(impl.name, {"out": session.run(None, feeds)[0]}, {"out": expected})
    except VerificationError as e:
        impl.wrong = str(e)
    return impl


def _as_u8(x: np.ndarray) -> np.ndarray:
    """x + 128 as uint8: the unsigned form ORT's fast kernels want (zero point 128)."""
    return (x.astype(np.int16) + 128).astype(np.uint8)


def _conv_onnx(s: ConvShape, shift: int, conv_integer: bool):
    """QLinearConv (u8 x s8 -> u8) and, if `conv_integer`, ConvInteger (s8 x s8 -> s32,
    + bias) baselines."""
    def build(w: Workload, ref: dict[str, np.ndarray], threads: int) -> list[Impl]:
        from onnx import helper

        x, acc = w.inputs["data"], ref["acc"]
        attrs = {"pads": [*s.pad, *s.pad], "strides": list(s.stride),
                 "dilations": list(s.dilation), "group": s.groups}
        # QLinearConv requantizes acc / 2^shift with round-half-to-even and saturates to
        # u8 around zero point 128: an independent NumPy model of that is the expectation.
        q = np.clip(np.round(acc.astype(np.float64) / 2.0 ** shift) + 128, 0, 255)
        consts = {"w": w.weights["w"], "b": w.weights["b"], "one": np.array(1, np.float32),
                  "x_zp": np.array(128, np.uint8), "w_zp": np.array(0, np.int8),
                  "y_scale": np.array(2.0 ** shift, np.float32),
                  "y_zp": np.array(128, np.uint8)}
        u8 = _onnx_session([helper.make_node(
            "QLinearConv", ["data", "one", "x_zp", "w", "one", "w_zp", "y_scale", "y_zp", "b"],
            ["out"], **attrs)], {"data": _as_u8(x)}, consts, np.uint8, threads)
        impls = [_onnx_impl("QLinearConv u8", u8, {"data": _as_u8(x)}, q.astype(np.uint8),
                            "u8 == half-even requant of reference accumulator")]
        if conv_integer:
            bias = w.weights["b"].reshape(1, -1, 1, 1)
            s8 = _onnx_session([helper.make_node("ConvInteger", ["data", "w"], ["c"], **attrs),
                                helper.make_node("Add", ["c", "b"], ["out"])],
                               {"data": x}, {"w": w.weights["w"], "b": bias}, np.int32, threads)
            impls.insert(0, _onnx_impl("ConvInteger s8", s8, {"data": x}, acc,
                                       "int32 accumulator == reference"))
        return impls
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
        _check_shape(f"onnxruntime {w.name}", out.shape, ref["logits"].shape)
        return [Impl("onnxruntime QLinearConv u8 network", lambda: session.run(None, feeds),
                     "same shapes and layers; output shape checked (ONNX rounds otherwise)")]
    return build


def _check_shape(what: str, shape: tuple[int, ...], expected: tuple[int, ...]) -> None:
    """Raise VerificationError unless a twin's output has the expected shape."""
    if tuple(shape) != tuple(expected):
        raise VerificationError(f"{what}: output shape {tuple(shape)}, expected "
                                f"{tuple(expected)}")


def openvino_int8_layers(compiled) -> tuple[list[str], list[str], set[str]]:
    """(conv/dense layers of a compiled OpenVINO model, those not run in u8/i8, their
    kernels): the runtime model's layers carry the precision and the oneDNN primitive
    each runs with (rt_info 'runtimePrecision', 'primitiveType')."""
    layers, not_int8, kernels = [], [], set()
    for op in compiled.get_runtime_model().get_ordered_ops():
        info = op.get_rt_info()
        if info["layerType"].astype(str) not in ("Convolution", "FullyConnected"):
            continue
        layers.append(op.get_friendly_name())
        kernels.add(info["primitiveType"].astype(str))
        if info["runtimePrecision"].astype(str) not in ("u8", "i8"):
            not_int8.append(f"{op.get_friendly_name()} "
                            f"({info['runtimePrecision'].astype(str)})")
    return layers, not_int8, kernels


def _network_openvino(net):
    """The network's QDQ twin compiled by OpenVINO for the CPU (benchmarks/models.py),
    refused unless every conv and dense layer runs an int8 kernel. Output shape checked."""
    def build(w: Workload, ref: dict[str, np.ndarray], threads: int) -> list[Impl]:
        import openvino as ov

        core = ov.Core()
        compiled = core.compile_model(
            core.read_model(net.qdq_model().SerializeToString()), "CPU",
            {"INFERENCE_NUM_THREADS": threads, "PERFORMANCE_HINT": OPENVINO_HINT})
        layers, not_int8, kernels = openvino_int8_layers(compiled)
        if not layers or not_int8:
            raise VerificationError(f"openvino {w.name}: {len(not_int8)} of {len(layers)} "
                                    f"conv/dense layers do not run in int8: "
                                    f"{', '.join(not_int8[:5])}")
        request = compiled.create_infer_request()
        feeds = {"data": _as_u8(w.inputs["data"])}
        request.infer(feeds)
        _check_shape(f"openvino {w.name}", request.get_output_tensor(0).data.shape,
                     ref["logits"].shape)
        return [Impl("openvino QDQ int8 network", lambda: request.infer(feeds),
                     f"output shape checked; all {len(layers)} conv/dense layers run u8/i8 "
                     f"({', '.join(sorted(kernels))})")]
    return build


def _importable(*modules: str) -> bool:
    """True when every module imports (the baselines are not cvmc dependencies)."""
    try:
        for module in modules:
            __import__(module)
    except ImportError:
        return False
    return True


def onnx_available() -> bool:
    """True when both onnxruntime and onnx import."""
    return _importable("onnx", "onnxruntime")


def openvino_available() -> bool:
    """True when both openvino and onnx (which builds its QDQ models) import."""
    return _importable("onnx", "openvino")


# ---------------------------------------------------------------- measuring

@contextmanager
def tvm_threads(threads: int) -> Iterator[None]:
    """cvmc's thread count: the process's native pool (`cvmc_runtime.set_num_threads`),
    and TVM_NUM_THREADS for processes started meanwhile (their pool's default), restored
    after."""
    import cvmc_runtime

    cvmc_runtime.set_num_threads(threads)
    old = os.environ.get("TVM_NUM_THREADS")
    os.environ["TVM_NUM_THREADS"] = str(threads)
    try:
        yield
    finally:
        if old is None:
            del os.environ["TVM_NUM_THREADS"]
        else:
            os.environ["TVM_NUM_THREADS"] = old


def median_ms(calls: list[Callable[[], object]], repeat: int) -> list[float]:
    """Median wall time (ms) of `repeat` calls of each of `calls`, timed in turns
    (samples_ms)."""
    return [statistics.median(samples) for samples in samples_ms(calls, repeat)]


def samples_ms(calls: list[Callable[[], object]], repeat: int) -> list[list[float]]:
    """Wall times (ms) of `repeat` calls of each of `calls`, timed in turns: each turn is
    a pause, WARMUP untimed calls and up to BURST timed calls of one of them. A change of
    load on the machine during the minute hits every implementation alike."""
    times: list[list[float]] = [[] for _ in calls]
    while len(times[0]) < repeat:
        for call, samples in zip(calls, times):
            time.sleep(PAUSE_S)
            for _ in range(WARMUP):
                call()
            for _ in range(min(BURST, repeat - len(samples))):
                start = time.perf_counter()
                call()
                samples.append((time.perf_counter() - start) * 1e3)
    return times


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


def compile_times(name: str, graph, artifact: Path) -> CompileTime:
    """Compile `graph` into `artifact` twice, the first time with an empty kernel cache of
    its own (`CVMC_CACHE_DIR`), and time both."""
    import cvmc

    saved = os.environ.get("CVMC_CACHE_DIR")
    seconds = []
    with tempfile.TemporaryDirectory(prefix="cvmc-bench-cache-") as cache:
        os.environ["CVMC_CACHE_DIR"] = cache
        try:
            for _ in range(2):
                start = time.perf_counter()
                result = cvmc.compile(graph, artifact)
                seconds.append(time.perf_counter() - start)
        finally:
            if saved is None:
                os.environ.pop("CVMC_CACHE_DIR")
            else:
                os.environ["CVMC_CACHE_DIR"] = saved
    return CompileTime(name, len(result.plan["kernels"]), *seconds)


def _prepare(w: Workload, threads: int, tmp: Path):
    """(loaded cvmc model, its Impl, the baselines, its compile times for a network):
    compiled, every output verified."""
    import cvmc_runtime

    import cvmc

    graph = cvmc.load_graph(_model_folder(w, tmp))
    if w.network is not None:
        compiled = compile_times(w.name, graph, tmp / "model.cvmx")
    else:
        compiled = None
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
    if w.openvino is not None and openvino_available():
        impls += w.openvino(w, ref, threads)
    return model, Impl("cvmc", lambda: model.run(w.inputs), "cvmc == reference"), impls, \
        compiled


def measure(w: Workload, threads: int, repeat: int, tmp: Path,
            contention: bool = False) -> Results:
    """Compile, verify and time one workload against each of its baselines; for a whole
    network also its memory, and with `contention` its slowdowns beside busy processes."""
    model, cvmc_impl, impls, compiled = _prepare(w, threads, tmp)
    cpu = model.plan["target"].get("mcpu", "?")
    results = Results(compiles=[compiled] if compiled else [])
    results.untimed = [f"{w.name}: {impl.wrong}" for impl in impls if impl.wrong]
    impls = [impl for impl in impls if not impl.wrong]
    for impl in impls:
        # cvmc is timed again, in turns with each baseline: both numbers of a ratio come
        # from the same few seconds, so load elsewhere on the machine hits both alike.
        cvmc_ms, ms = median_ms([cvmc_impl.call, impl.call], repeat)
        checks = "; ".join(c for c in (cvmc_impl.verified, impl.verified) if c)
        results.rows.append(Row(w.name, impl.name, cvmc_ms, ms, ms / cvmc_ms, threads, cpu,
                                checks, w.suite))
    if w.network is not None:
        results.memory = memory_use(w, model.plan, threads, tmp)
        if contention:
            results.slowdowns = slowdowns(w.name, [cvmc_impl, *impls], threads, repeat)
    return results


@contextmanager
def busy_processes(count: int, limit_s: float = BUSY_LIMIT_S) \
        -> Iterator[tuple[list[int], list[subprocess.Popen]]]:
    """(cores, processes): `count` competing processes spinning while the block runs, the
    i-th pinned to the i-th last core this process may use (so 2 on a 2-core machine take
    both cores); killed at the end, each stops itself after `limit_s`."""
    mine = sorted(os.sched_getaffinity(0), reverse=True)
    cores = [mine[i % len(mine)] for i in range(count)]
    procs = []
    try:
        code = (f"import time\nend = time.monotonic() + {limit_s}\n"
                "while time.monotonic() < end:\n    pass\n")
        for core in cores:
            procs.append(subprocess.Popen([sys.executable, "-c", code]))
            os.sched_setaffinity(procs[-1].pid, {core})  # pinned before this returns
        time.sleep(0.2)  # started and spinning before anything is timed
        yield cores, procs
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


def slowdowns(workload: str, impls: list[Impl], threads: int, repeat: int) -> list[Slowdown]:
    """Each implementation timed quiet, then all of them again beside 1, then 2 busy
    processes (COMPETITORS), in turns; at least CONTENTION_REPEAT runs each time."""
    calls, repeat = [impl.call for impl in impls], max(repeat, CONTENTION_REPEAT)
    quiet = samples_ms(calls, repeat)
    rows = []
    for count in COMPETITORS:
        with busy_processes(count) as (cores, _):
            busy = samples_ms(calls, repeat)
        load = os.getloadavg()[0]
        rows += [Slowdown(workload, impl.name, threads, count, statistics.median(q),
                          p99(q), statistics.median(b), p99(b),
                          statistics.median(b) / statistics.median(q), cores, load)
                 for impl, q, b in zip(impls, quiet, busy)]
    return rows


def p99(samples: list[float]) -> float:
    """The 99th percentile (linear interpolation between the nearest runs)."""
    return float(np.percentile(samples, 99))


def plan_bytes(plan: dict) -> int:
    """The memory a loaded cvmc model holds, from its plan: the arena, the weights, the
    inputs and the outputs (the runtime allocates exactly these)."""
    from cvmc_runtime.plan import tensor_bytes

    own = [*plan["weights"], *plan["inputs"], *plan["outputs"]]
    return plan["arena"]["bytes"] + sum(tensor_bytes(spec) for spec in own)


def _probe_memory(kind: str, model: Path, threads: int, data: Path) -> tuple[int, int]:
    """(first, further) RSS growth of `kind` loading `model`: benchmarks/memory.py in a
    fresh process, which sees this one's import path."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    done = subprocess.run([sys.executable, str(MEMORY_PY), kind, str(model), str(threads),
                           str(data)], capture_output=True, text=True, env=env, timeout=600,
                          check=False)
    if done.returncode != 0:
        raise BenchmarkError(f"memory of {kind} {model.name}: benchmarks/memory.py failed: "
                             f"{done.stderr.strip()[-500:]}")
    grown = json.loads(done.stdout.splitlines()[-1])
    return grown["first"], grown["further"]


def memory_use(w: Workload, plan: dict, threads: int, tmp: Path) -> list[Memory]:
    """A network's loaded-model memory in cvmc (RSS and plan), ORT and OpenVINO (RSS)."""
    np.save(tmp / "s8.npy", w.inputs["data"])
    np.save(tmp / "u8.npy", _as_u8(w.inputs["data"]))
    runs = [("cvmc", tmp / "model.cvmx", "s8.npy")]
    if onnx_available():
        (tmp / "ort.onnx").write_bytes(w.network.onnx_model().SerializeToString())
        runs.append(("onnxruntime", tmp / "ort.onnx", "u8.npy"))
    if openvino_available():
        (tmp / "qdq.onnx").write_bytes(w.network.qdq_model().SerializeToString())
        runs.append(("openvino", tmp / "qdq.onnx", "u8.npy"))
    return [Memory(w.name, kind, threads, *_probe_memory(kind, path, threads, tmp / data),
                   plan_bytes(plan) if kind == "cvmc" else None) for kind, path, data in runs]


def run_benchmarks(threads: int = 2, repeat: int = 20, name_filter: str = "",
                   shapes: list[str] | None = None, contention: bool = False) -> Results:
    """Build, verify and time every workload whose name contains `name_filter` (plus the
    convs of the benchdnn shape sets `shapes`)."""
    results = Results()
    makers = WORKLOADS + shape_workloads(shapes or [])[0]
    with tvm_threads(threads):
        for make in makers:
            w = make()
            if name_filter.lower() not in w.name.lower():
                continue
            with tempfile.TemporaryDirectory(prefix="cvmc-bench-") as tmp:
                results.extend(measure(w, threads, repeat, Path(tmp), contention))
    return results


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


def _markdown(head: list[str], align: str, lines: list[list[str]]) -> str:
    """A Markdown table; `align` has an 'l' or 'r' per column."""
    rule = ["---:" if a == "r" else "---" for a in align]
    return "".join(f"| {' | '.join(cells)} |\n" for cells in [head, rule, *lines])


def table(rows: list[Row]) -> str:
    """The rows as a Markdown table."""
    return _markdown(["workload", "baseline", "cvmc ms", "baseline ms", "ratio", "threads",
                      "CPU"], "llrrrrl",
                     [[r.workload, r.baseline, f"{r.cvmc_ms:.3f}", f"{r.baseline_ms:.3f}",
                       f"{r.ratio:.2f}", str(r.threads), r.cpu] for r in rows])


def geomeans(rows: list[Row]) -> list[dict]:
    """Per benchdnn shape set, thread count and baseline: the geometric mean of the
    ratios (baseline ms / cvmc ms) over the set's shapes."""
    groups: dict[tuple[str, int, str], list[float]] = {}
    for r in rows:
        if r.suite:
            groups.setdefault((r.suite, r.threads, r.baseline), []).append(r.ratio)
    return [{"suite": suite, "threads": threads, "baseline": baseline, "shapes": len(ratios),
             "geomean_ratio": math.exp(statistics.fmean(map(math.log, ratios)))}
            for (suite, threads, baseline), ratios in groups.items()]


def contention_table(slow: list[Slowdown]) -> str:
    """The slowdowns as a Markdown table."""
    return _markdown(["workload", "runtime", "threads", "busy processes", "quiet ms",
                      "quiet p99 ms", "contended ms", "contended p99 ms", "slowdown",
                      "load avg"], "llrrrrrrrr",
                     [[s.workload, s.runtime, str(s.threads), str(s.competitors),
                       f"{s.quiet_ms:.3f}", f"{s.quiet_p99_ms:.3f}", f"{s.contended_ms:.3f}",
                       f"{s.contended_p99_ms:.3f}", f"{s.slowdown:.2f}",
                       f"{s.load_average:.2f}"] for s in slow])


def memory_table(memory: list[Memory]) -> str:
    """The memory rows as a Markdown table, in MiB."""
    def mib(n: int | None) -> str:
        return "" if n is None else f"{n / 2 ** 20:.1f}"
    return _markdown(["workload", "runtime", "threads", "plan MiB (arena+weights+I/O)",
                      "RSS MiB, first load + run", "RSS MiB, each further instance"], "llrrrr",
                     [[m.workload, m.runtime, str(m.threads), mib(m.plan_bytes),
                       mib(m.first_bytes), mib(m.further_bytes)] for m in memory])


def _thread_counts(text: str) -> list[int]:
    """'1,2' -> [1, 2]; every count at least 1."""
    try:
        counts = [int(t) for t in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a list of integers: {text!r}") from None
    if not counts or min(counts) < 1:
        raise argparse.ArgumentTypeError("thread counts must be at least 1")
    return counts


def _parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=_thread_counts, default=[os.cpu_count() or 1],
                   help="TVM_NUM_THREADS, ONNX Runtime intra-op and OpenVINO inference "
                        "threads; a comma list runs everything at each (default: all cores)")
    p.add_argument("--repeat", type=int, default=20, help="timed runs per implementation")
    p.add_argument("--filter", default="", help="only workloads whose name contains this")
    p.add_argument("--shapes", default="", help="also every conv of these benchdnn shape "
                   "sets, e.g. resnet50,mobilenet,mobilenet_dw (../shared/data/"
                   "benchdnn-conv-shapes/shapes_<SET>, underscores ignored)")
    p.add_argument("--contention", action="store_true",
                   help="time the networks again beside 1, then 2 busy processes")
    p.add_argument("--json", type=Path, help="also write the results and the setup as JSON")
    args = p.parse_args(argv)
    if args.repeat < 1:
        p.error("--repeat must be at least 1")
    args.shapes = [s for s in args.shapes.split(",") if s]
    if args.shapes and SHAPES_FOLDER.is_dir():
        try:
            for name in args.shapes:
                shape_file(name)
        except ShapeError as e:
            p.error(str(e))
    return args


def _versions() -> dict[str, str]:
    """Versions of the baselines' packages that import."""
    from importlib.metadata import PackageNotFoundError, version

    found = {}
    for package in ("onnxruntime", "onnx", "openvino"):
        try:
            found[package] = version(package)
        except PackageNotFoundError:
            found[package] = "not installed"
    return found


def report(results: Results) -> None:
    """Print the tables, the geometric means and what each baseline was checked against."""
    print(table(results.rows), end="")
    for g in geomeans(results.rows):
        print(f"{g['suite']} ({g['shapes']} shapes, {g['threads']} threads): geometric mean "
              f"of {g['baseline']} ms / cvmc ms = {g['geomean_ratio']:.2f}")
    if results.memory:
        print("\nloaded-model memory (benchmarks/memory.py):")
        print(memory_table(results.memory), end="")
    if results.compiles:
        print("\ncompile time (cvmc.compile, TVM imported; cold: an empty kernel cache, "
              "warm: compiled again):")
        print("| workload | kernels | cold s | warm s |\n| --- | ---: | ---: | ---: |")
        for c in results.compiles:
            print(f"| {c.workload} | {c.kernels} | {c.cold_s:.2f} | {c.warm_s:.2f} |")
    if results.slowdowns:
        print("\ncontention: runs beside processes spinning on cores "
              f"{', '.join(map(str, results.slowdowns[-1].busy_cores))} "
              "(median / p99 of the same runs):")
        print(contention_table(results.slowdowns), end="")
    print("checked before timing:")
    for baseline, checks in dict.fromkeys((r.baseline, r.verified) for r in results.rows):
        print(f"  {baseline}: {checks}")
    if results.untimed:
        print("not timed: output not exact on this machine:")
        for line in results.untimed:
            print(f"  {line}")


def main(argv: list[str] | None = None) -> int:
    """Command line: run the benchmarks, print the tables, optionally write JSON."""
    from cvmc.errors import CvmcError

    args = _parse(argv)
    setup = {"date": datetime.date.today().isoformat(), "machine": machine(),
             "load_average": " ".join(f"{v:.2f}" for v in os.getloadavg()),
             "threads": args.threads, "repeat": args.repeat,
             "OPENBLAS_NUM_THREADS": os.environ.get("OPENBLAS_NUM_THREADS", "unset"),
             "OPENBLAS_CORETYPE": os.environ.get("OPENBLAS_CORETYPE", "unset"),
             **_versions()}
    print(" ".join(f"{k}={v}" for k, v in setup.items()))
    if not onnx_available():
        print("onnxruntime not installed: skipped")
    if not openvino_available():
        print("openvino not installed: skipped")
    for note in shape_workloads(args.shapes)[1]:
        print(note)
    results = Results()
    try:
        for threads in args.threads:
            results.extend(run_benchmarks(threads, args.repeat, args.filter, args.shapes,
                                          args.contention))
    except (CvmcError, BenchmarkError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    if not results.rows:
        print(f"no workload matches --filter {args.filter!r}", file=sys.stderr)
        return 1
    report(results)
    if args.json:
        args.json.write_text(json.dumps(
            {**setup, "rows": [asdict(r) for r in results.rows],
             "geomeans": geomeans(results.rows),
             "memory": [asdict(m) for m in results.memory],
             "contention": [asdict(s) for s in results.slowdowns],
             "compile": [asdict(c) for c in results.compiles],
             "untimed": results.untimed}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

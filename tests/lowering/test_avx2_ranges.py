"""AVX2 int8 convs chosen from the value intervals the compiler proves
(`cvmc.ops.infer.intervals`): the `vpmaddubsw` row (`x86-avx2-maddubs`) where every int16
pair sum u0*w0 + u1*w1 of the packed conv's bytes u = x + 128 (128 at padding) and its
weights provably fits, else the exact `vpmaddwd` row (`x86-avx2`). Each case runs on this
CPU (AVX2) and must equal the reference interpreter bit for bit at the extremes the proof
allows (a wrong proof saturates there); and `cvmc quantize --weight-bits 7` gives weights
in [-63, 63], which put any int8 data on the fast row."""
import tempfile
from pathlib import Path

import cvmc_runtime
import numpy as np
import pytest

from cvmc import load_graph
from cvmc.cli import main
from cvmc.codegen import compile_model
from cvmc.ir import Graph, Node, TensorType
from cvmc.lowering.x86 import maddubs_exact
from cvmc.ops import lookup
from cvmc.ops.infer import intervals, retype
from cvmc.reference import reference_run
from tests.lowering import test_packed_conv as packed_conv
from tests.quantize.onnx_nets import conv_bn_net

FAST, GENERAL = "x86-avx2-maddubs", "x86-avx2"


def conv_graph(x_precision: int, w: np.ndarray, before: tuple = (), channels: int = 8,
               padding: int = 1) -> Graph:
    """x (`x_precision` bits) -> the ops `before` ((op, attrs), ...) -> conv2d with weight
    `w` (OIHW, `channels` input channels), 3x3, padding `padding`, then a right shift."""
    types = {"x": TensorType((1, channels, 6, 7), "int32", x_precision),
             "w": TensorType(w.shape, "int32")}
    calls = [(op, attrs) for op, attrs in before] + [
        ("conv2d", {"padding": [padding, padding]}),
        ("cvm_right_shift", {"precision": 8, "shift_bit": 6})]
    nodes, value = [], "x"
    for k, (op, attrs) in enumerate(calls):
        d = lookup(op)
        a = d.normalize_attrs(attrs)
        inputs = (value, "w") if op == "conv2d" else (value,)
        (shape,) = d.infer_shapes([types[i] for i in inputs], a)
        value = f"v{k}"
        types[value] = TensorType(shape, "int32")
        nodes.append(Node(op, inputs, (value,), dict(a)))
    return retype(Graph("conv", ["x"], [value], nodes, types, {"w": w}))


def extreme_weights(low: int, high: int, oc: int = 16, c: int = 8) -> np.ndarray:
    """OIHW 3x3 weights at `low` and `high` in blocks, so that adjacent (pair-summed) input
    channels share a sign, plus a few in between."""
    w = np.where((np.arange(oc)[:, None, None, None] + np.arange(c)[None, :, None, None]
                  // 2) % 2 == 0, high, low) * np.ones((oc, c, 3, 3), np.int64)
    w[1, 2, 1, 1], w[3, 5, 0, 2] = 0, (low + high) // 2
    return w


def extreme_data(shape, low: int, high: int) -> np.ndarray:
    """Data at `low` and `high` (rows of each), and an alternating row."""
    x = np.full(shape, high)
    x[:, :, ::3] = low
    x[:, :, 1, ::2] = low
    return x


# (name, x precision, ops before the conv, data extremes, weight extremes, expected row).
# The packed conv's bytes are u = x + 128, and 128 at padding; its pair sums are
# 2 * u * w at the extremes (adjacent channels of equal sign).
CASES = [
    # any int8 data: u in [1, 255]; |w| <= 64 keeps 2 * 255 * 64 = 32640 in int16
    ("s8 data, w +-64", 8, (), (-127, 127), (-64, 64), FAST),
    ("s8 data, w +-63", 8, (), (-127, 127), (-63, 63), FAST),
    ("s8 data, w 65: outside", 8, (), (-127, 127), (-64, 65), GENERAL),
    ("s8 data, w -65: outside", 8, (), (-127, 127), (-65, 64), GENERAL),
    ("s8 data, w +-127: outside", 8, (), (-127, 127), (-127, 127), GENERAL),
    # ReLU data [0, 127]: u in [128, 255], the same weights as any int8 data
    ("relu data, w +-64", 8, (("relu", {}),), (0, 127), (-64, 64), FAST),
    ("relu data, w +-127: outside", 8, (("relu", {}),), (0, 127), (-127, 127), GENERAL),
    # 7-bit data [-63, 63]: u in [65, 191]; 2 * 191 * 85 = 32470, 2 * 191 * 86 = 32852
    ("s7 data, w +-85", 7, (), (-63, 63), (-85, 85), FAST),
    ("s7 data, w 86: outside", 7, (), (-63, 63), (-85, 86), GENERAL),
    # data clipped to [-126, -1]: u in [2, 128]; full int8 weights, 2 * 128 * 127 = 32512
    ("negative data, w +-127", 8, (("clip", {"a_min": -126, "a_max": -1}),), (-126, -1),
     (-127, 127), FAST),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_rows_chosen_from_intervals_are_exact_at_the_extremes(case):
    _, p, before, (x_lo, x_hi), (w_lo, w_hi), row = case
    graph = conv_graph(p, extreme_weights(w_lo, w_hi), before)
    conv = next(n for n in graph.nodes if n.op == "conv2d")
    proven = intervals(graph)
    assert proven[conv.inputs[0]] == (x_lo, x_hi) and proven["w"] == (w_lo, w_hi)
    # computed by hand above; the row must agree with it
    assert maddubs_exact((x_lo, x_hi), (w_lo, w_hi)) == (row == FAST)
    # the extremes of the input that reach the conv as (x_lo, x_hi)
    lo, hi = (-(2 ** (p - 1)) + 1, 2 ** (p - 1) - 1) if not before else (-127, 127)
    x = extreme_data(graph.types["x"].shape, lo, hi)
    packed_conv.compiled_vs_reference(graph, "znver3", x, row)


def test_fast_row_on_random_data_and_odd_shapes():
    """Random in-range weights and data, 6 input channels (a padded 4-channel word), 20
    output channels (a padded 16-channel block), no spatial padding."""
    rng = np.random.default_rng(7)
    w = rng.integers(-64, 65, (20, 6, 3, 3))
    graph = conv_graph(8, w, channels=6, padding=0)
    x = rng.integers(-127, 128, graph.types["x"].shape)
    packed_conv.compiled_vs_reference(graph, "znver3", x, FAST)


@pytest.fixture(scope="module")
def quantized_7bit(tmp_path_factory):
    """conv_bn_net (conv, BN, ReLU, max pool, twice, then gemm) quantized with per-channel
    7-bit weights."""
    onnx = pytest.importorskip("onnx")
    pytest.importorskip("nnef_tools", reason="needs the convert extra: pip install 'cvmc[convert]'")
    tmp = tmp_path_factory.mktemp("q7")
    onnx.save(conv_bn_net(), tmp / "net.onnx")
    np.save(tmp / "x.npy", np.random.default_rng(3).standard_normal((8, 1, 1, 12, 12))
            .astype(np.float32))
    assert main(["quantize", str(tmp / "net.onnx"), "-o", str(tmp / "q"), "--calib",
                 f"x={tmp / 'x.npy'}", "--per-channel", "--weight-bits", "7",
                 "--calib-on", "reference"]) == 0
    return load_graph(tmp / "q")


def test_weight_bits_7_bounds_weights_and_relu_data(quantized_7bit):
    graph = quantized_7bit
    proven = intervals(graph)
    linear = [n for n in graph.nodes if n.op in ("conv2d", "dense")]
    assert len(linear) == 3
    for n in linear:
        w = graph.constants[n.inputs[1]]
        assert np.abs(w).max() <= 63 and proven[n.inputs[1]] == (int(w.min()), int(w.max()))
        assert np.abs(w).max() == 63  # each channel's absmax takes the full 7 bits
    # the second conv and the dense read ReLU outputs (through max pools and a reshape),
    # which the quantizer stores on the whole 8-bit grid, offset by half their range
    # (docs/quantize.md, shifted clamps): any int8 data, so |w| <= 63 alone takes the
    # vpmaddubsw row (test_weight_bits_7_net_takes_the_fast_row)
    assert [proven[n.inputs[0]] for n in linear[1:]] == [(-127, 127), (-127, 127)]


def test_weight_bits_out_of_range_is_one_error_line(tmp_path, capsys):
    onnx = pytest.importorskip("onnx")
    onnx.save(conv_bn_net(), tmp_path / "net.onnx")
    assert main(["quantize", str(tmp_path / "net.onnx"), "-o", str(tmp_path / "q"),
                 "--weight-bits", "9"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["error: --weight-bits must be in 2..8, got 9"]


def test_weight_bits_7_net_takes_the_fast_row(quantized_7bit):
    """Every conv of the 7-bit net (its dense too: the CPU passes make it a 1x1 conv)
    takes the vpmaddubsw row, bit-exact with the reference."""
    graph = quantized_7bit
    x = np.random.default_rng(5).integers(-127, 128, graph.types["x"].shape)
    x[..., 0, :] = -127
    x[..., 1, :] = 127
    want = reference_run(graph, {"x": x})
    with tempfile.TemporaryDirectory() as tmp:
        plan = compile_model(graph, Path(tmp) / "m.cvmx", mcpu="znver3").plan
        rows = [k["schedule"] for k in plan["kernels"] if k["ops"][0] == "conv2d_packed"]
        assert rows == [FAST] * 3  # the two convs, and the dense as a 1x1 conv
        got = cvmc_runtime.load(Path(tmp) / "m.cvmx").run({"x": x})
    for name in want:
        assert np.array_equal(got[name], want[name]), name


@pytest.mark.parametrize("geometry", list(packed_conv.GEOMETRIES))
def test_fast_row_on_every_packed_conv_geometry(geometry):
    """The packed conv geometries of test_packed_conv (strides, dilations, groups, padded
    channel words and blocks, 1x1 and 7x7) with their weights clipped to [-64, 64]: the
    fast row, bit-exact on random int8 data."""
    graph = packed_conv.conv_graph(*packed_conv.GEOMETRIES[geometry])
    graph = retype(graph.replace(constants={**graph.constants,
                                            "w": np.clip(graph.constants["w"], -64, 64)}))
    packed_conv.compiled_vs_reference(graph, "znver3", schedule=FAST)

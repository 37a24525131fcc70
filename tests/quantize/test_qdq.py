"""`cvmc quantize` of ONNX models already quantized (docs/quantize.md, "Models already
quantized"): a float net quantized by ONNX Runtime's own `quantize_static` (QDQ; s8
weights per tensor and per channel; s8 and u8 activations) and a QLinearConv model written
with onnx.helper; the integer model is checked against ORT's own int8 run of the same
model, against float, and llvm against the reference bit for bit."""
import json

import numpy as np
import pytest
from cvmc_runtime import dequantize, quantize

from cvmc import load_graph, reference_run
from cvmc.cli import main

pytest.importorskip("nnef_tools", reason="needs the convert extra: pip install 'cvmc[convert]'")
onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
from onnx import TensorProto, helper, numpy_helper

SHAPE = (1, 2, 8, 8)


def _model(nodes, inits, out_shape, out="y"):
    graph = helper.make_graph(
        nodes, "net", [helper.make_tensor_value_info("x", TensorProto.FLOAT, SHAPE)],
        [helper.make_tensor_value_info(out, TensorProto.FLOAT, out_shape)],
        [numpy_helper.from_array(np.asarray(a), n) for n, a in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model


def float_net():
    """conv / relu, maxpool, conv, a residual add, relu, flatten, gemm."""
    r = np.random.default_rng(5)
    f32 = np.float32
    inits = {"w1": (r.standard_normal((4, 2, 3, 3)) * 0.4).astype(f32),
             "b1": (r.standard_normal(4) * 0.1).astype(f32),
             "w2": (r.standard_normal((4, 4, 3, 3)) * 0.3).astype(f32),
             "b2": (r.standard_normal(4) * 0.1).astype(f32),
             "wf": (r.standard_normal((5, 64)) * 0.3).astype(f32),
             "bf": (r.standard_normal(5) * 0.1).astype(f32)}
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c1"], ["r1"]),
             helper.make_node("MaxPool", ["r1"], ["p1"], kernel_shape=[2, 2], strides=[2, 2]),
             helper.make_node("Conv", ["p1", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1]),
             helper.make_node("Add", ["c2", "p1"], ["s"]),
             helper.make_node("Relu", ["s"], ["r2"]),
             helper.make_node("Flatten", ["r2"], ["f"]),
             helper.make_node("Gemm", ["f", "wf", "bf"], ["y"], transB=1)]
    return _model(nodes, inits, [1, 5])


def samples(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, *SHAPE)).astype(np.float32)


CASES = {"u8-per-tensor": ("QUInt8", False), "u8-per-channel": ("QUInt8", True),
         "s8-per-tensor": ("QInt8", False), "s8-per-channel": ("QInt8", True)}


def ort_qdq(model, tmp, act: str | None, per_channel: bool, shape=SHAPE, fmt: str = "QDQ"):
    """`model` as float.onnx, ORT's QDQ (or `fmt`) quantization of it (32 random
    calibration samples) as qdq.onnx, and cvmc's quantization of that as q, in `tmp`. 7-bit
    weights (reduce_range) keep ORT's own int8 kernels exact on AVX2 machines; `act` None:
    all of quantize_static's defaults."""
    from onnxruntime.quantization import (
        CalibrationDataReader,
        QuantFormat,
        QuantType,
        quantize_static,
    )
    onnx.save(model, tmp / "float.onnx")
    rng = np.random.default_rng(1)

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.it = iter({"x": rng.standard_normal(shape).astype(np.float32)}
                           for _ in range(32))

        def get_next(self):
            return next(self.it, None)
    quantize_static(str(tmp / "float.onnx"), str(tmp / "qdq.onnx"), Reader(),
                    **({} if act is None else {
                        "quant_format": getattr(QuantFormat, fmt), "per_channel": per_channel,
                        "activation_type": getattr(QuantType, act),
                        "weight_type": QuantType.QInt8, "reduce_range": True}))
    assert main(["quantize", str(tmp / "qdq.onnx"), "-o", str(tmp / "q")]) == 0
    return tmp


@pytest.fixture(scope="module", params=list(CASES))
def qdq(request, tmp_path_factory):
    """The folder of one ORT quantize_static setting of float_net (ort_qdq)."""
    return ort_qdq(float_net(), tmp_path_factory.mktemp(request.param), *CASES[request.param])


def _runs(folder, onnx_path, xs, options=None):
    """(cvmc's dequantized outputs, ORT's outputs of `onnx_path` (session `options`), the
    output scale)."""
    manifest = json.loads((folder / "quantization.json").read_text())
    (name, out), = manifest["outputs"].items()
    inp = manifest["inputs"]["x"]
    graph = load_graph(folder)
    got = np.array([dequantize(reference_run(graph, {"x": quantize(
        "x", x, inp["scale"], inp["precision"]).astype(np.int8)})[name], out["scale"])
        for x in xs])
    session = ort.InferenceSession(str(onnx_path), sess_options=options,
                                   providers=["CPUExecutionProvider"])
    want = np.array([session.run(None, {"x": x})[0] for x in xs], np.float64)
    return got, want, out["scale"]


def _onnx_grid(path, tensor):
    """(scale, largest |q - zero point|) of the QuantizeLinear of `tensor`."""
    model = onnx.load(path)
    node = next(n for n in model.graph.node if n.op_type == "QuantizeLinear"
                and n.input[0] == tensor)
    inits = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    zero = inits[node.input[2]]
    info = np.iinfo(zero.dtype)
    return float(inits[node.input[1]]), max(int(zero) - info.min, info.max - int(zero))


def test_agrees_with_ort_int8_and_with_float(qdq):
    xs = samples(24, 7)
    got, want, scale = _runs(qdq / "q", qdq / "qdq.onnx", xs)
    # The output grid is kept (scale 1 / s) where |q - z| <= 128, else its larger end maps
    # to 127 (docs/quantize.md).
    step, span = _onnx_grid(qdq / "qdq.onnx", "y_QuantizeLinear_Input")
    assert scale == pytest.approx(1 / step if span <= 128 else 127 / (span * step), rel=1e-12)
    # Each requantized value differs from ORT's by at most one unit of its CVM grid (ties
    # rounded up, not to even; the fixed point's < 0.01 unit) plus ORT's half unit; the
    # gemm's sum |w| over its input's difference and the output's own rounding give at
    # most 4 output units here (2.2 measured).
    assert np.abs(got - want).max() <= 4 / scale
    session = ort.InferenceSession(str(qdq / "float.onnx"), providers=["CPUExecutionProvider"])
    real = np.array([session.run(None, {"x": x})[0] for x in xs], np.float64)
    # against float: within ORT's own quantization error plus the bound above
    assert np.abs(got - real).max() <= np.abs(want - real).max() + 6 / scale


def test_llvm_is_bit_exact_with_the_reference(qdq):
    import cvmc_runtime

    import cvmc
    graph = load_graph(qdq / "q")
    cvmc.compile(graph, str(qdq / "q.cvmx"), target="llvm")
    model = cvmc_runtime.load(str(qdq / "q.cvmx"))
    scale = json.loads((qdq / "q" / "quantization.json").read_text())["inputs"]["x"]["scale"]
    for x in samples(4, 9):
        xi = quantize("x", x, scale, 8).astype(np.int8)
        assert np.array_equal(model.run({"x": xi})["y"], reference_run(graph, {"x": xi})["y"])
    assert main(["check", str(qdq / "q")]) == 0
    assert main(["export", str(qdq / "q"), "--format", "cvm", "-o", str(qdq / "cvm")]) == 0


def test_branchy_net_whose_relus_and_clip_ort_dropped(tmp_path):
    """Residual add, concat, sigmoid, padded and global average pools, clip, tanh, gemm,
    softmax (tests/quantize/onnx_nets.py); ORT drops the Relus and the Clip into u8 ranges."""
    from tests.quantize.onnx_nets import branchy_net
    ort_qdq(branchy_net(), tmp_path, "QUInt8", True, (1, 2, 8, 8))
    ops = {n.op_type for n in onnx.load(tmp_path / "qdq.onnx").graph.node}
    assert "Relu" not in ops and "Clip" not in ops
    xs = np.random.default_rng(50).standard_normal((10, 1, 2, 8, 8)).astype(np.float32)
    got, want, scale = _runs(tmp_path / "q", tmp_path / "qdq.onnx", xs)
    assert scale == 127  # softmax's own output scale (the rule's integer divide)
    # softmax: ORT's half step 1 / 510 plus one unit 1 / 127 and the rule's own error
    # (docs/quantize.md: (n + 1) / 2^15 plus half a unit) over inputs that differ a little
    assert np.abs(got - want).max() <= 2 / scale
    session = ort.InferenceSession(str(tmp_path / "float.onnx"),
                                   providers=["CPUExecutionProvider"])
    real = np.array([session.run(None, {"x": x})[0] for x in xs], np.float64)
    assert np.abs(got - real).max() <= np.abs(want - real).max() + 2 / scale


def qlinear_conv_net(matmul: bool = False):
    """QuantizeLinear (u8), QLinearConv (s8 weights per channel, int32 bias, u8 output with
    zero point 0: a relu), [Flatten of the u8 tensor, QLinearMatMul (s8 weight, u8 output
    with a zero point)], DequantizeLinear, written with onnx.helper."""
    r = np.random.default_rng(11)
    w = r.integers(-40, 41, (3, 2, 3, 3)).astype(np.int8)
    # ORT's symmetric weights reach +-127 in each channel; the others stay within +-40 (and
    # the inputs within about 3 sigma) because ORT's u8 x s8 kernels on AVX2 without VNNI
    # saturate int16 pair sums (the reason for its reduce_range option)
    w[:, 0, 0, 0] = 127
    inits = {"xs": np.array(0.02, np.float32), "xz": np.array(128, np.uint8),
             "w": w, "ws": np.array([0.004, 0.002, 0.003], np.float32),
             "wz": np.zeros(3, np.int8), "ys": np.array(0.05, np.float32),
             "yz": np.array(0, np.uint8), "b": r.integers(-3000, 3000, 3).astype(np.int32)}
    nodes = [helper.make_node("QuantizeLinear", ["x", "xs", "xz"], ["xq"]),
             helper.make_node("QLinearConv", ["xq", "xs", "xz", "w", "ws", "wz", "ys", "yz",
                                              "b"], ["yq"], pads=[1, 1, 1, 1]),
             helper.make_node("DequantizeLinear", ["yq", "ys", "yz"], ["y"])]
    if not matmul:
        return _model(nodes, inits, [1, 3, 8, 8])
    m = r.integers(-30, 31, (192, 4)).astype(np.int8)
    m[0] = 127
    inits.update({"m": m, "ms": np.array(0.001, np.float32), "mz": np.array(0, np.int8),
                  "zs": np.array(0.01, np.float32), "zz": np.array(20, np.uint8)})
    nodes[-1:] = [helper.make_node("Flatten", ["yq"], ["fq"]),
                  helper.make_node("QLinearMatMul", ["fq", "ys", "yz", "m", "ms", "mz", "zs",
                                                     "zz"], ["zq"]),
                  helper.make_node("DequantizeLinear", ["zq", "zs", "zz"], ["y"])]
    return _model(nodes, inits, [1, 4])


def test_qlinear_conv(tmp_path, capsys):
    onnx.save(qlinear_conv_net(), tmp_path / "ql.onnx")
    assert main(["quantize", str(tmp_path / "ql.onnx"), "-o", str(tmp_path / "q")]) == 0
    assert "ONNX scales kept" in capsys.readouterr().out
    xs = samples(8, 3) * 0.5
    got, want, scale = _runs(tmp_path / "q", tmp_path / "ql.onnx", xs)
    assert scale == pytest.approx(1 / 0.05 * 127 / 255)  # u8 [0, 255]: the grid halved
    # the input's u8 grid (zero point 128, 128 steps below) is 0.02 * 128 / 127 wide in
    # CVM: at most 0.5 * 0.02 / 127 more per input, over sum |w| of each channel; then one
    # CVM unit of the halved output grid plus ORT's own half unit
    w = np.array([0.004, 0.002, 0.003])[:, None] * numpy_helper.to_array(
        onnx.load(tmp_path / "ql.onnx").graph.initializer[2]).reshape(3, -1)
    bound = 0.5 * 0.02 / 127 * np.abs(w).sum(1).max() + 1 / scale + 0.025
    assert np.all(got >= 0)
    assert np.abs(got - want).max() <= bound


def test_qlinear_matmul_after_flatten_of_integers(tmp_path):
    onnx.save(qlinear_conv_net(matmul=True), tmp_path / "qm.onnx")
    assert main(["quantize", str(tmp_path / "qm.onnx"), "-o", str(tmp_path / "q")]) == 0
    got, want, scale = _runs(tmp_path / "q", tmp_path / "qm.onnx", samples(8, 4) * 0.5)
    assert scale == pytest.approx(127 / (235 * 0.01))  # u8, zero point 20: 235 steps up
    # the conv's u8 output (halved grid, unit 0.05 * 255 / 127) differs from ORT's by at
    # most one unit plus ORT's half step 0.025 per element, times sum |w| of a column;
    # then one output unit plus ORT's half step 0.005
    m = numpy_helper.to_array(onnx.load(tmp_path / "qm.onnx").graph.initializer[-5])
    bound = 0.001 * np.abs(m.astype(float)).sum(0).max() * (0.05 * 255 / 127 + 0.025) \
        + 1 / scale + 0.005
    assert np.abs(got - want).max() <= bound, (np.abs(got - want).max(), bound)


@pytest.mark.parametrize("per_channel", [False, True])
def test_weight_quantized_inside_the_model(tmp_path, per_channel):
    """A float weight through QuantizeLinear / DequantizeLinear (not stored as int8; per
    output channel, axis 0, as PyTorch's fake-quantized export writes it): its grid is
    ONNX's rounding of it, kept exactly; the output is s8 with zero point 0."""
    r = np.random.default_rng(2)
    w = r.standard_normal((3, 2, 3, 3)).astype(np.float32)
    ws = (np.abs(w).max(axis=(1, 2, 3)) if per_channel else np.abs(w).max()) / 127
    inits = {"xs": np.array(0.02, np.float32), "xz": np.array(0, np.int8), "w": w,
             "ws": np.asarray(ws, np.float32), "wz": np.zeros(np.shape(ws), np.int8),
             "ys": np.array(0.1, np.float32), "yz": np.array(0, np.int8)}
    q, dq = "QuantizeLinear", "DequantizeLinear"
    nodes = [helper.make_node(q, ["x", "xs", "xz"], ["xq"]),
             helper.make_node(dq, ["xq", "xs", "xz"], ["xd"]),
             helper.make_node(q, ["w", "ws", "wz"], ["wq"], axis=0),
             helper.make_node(dq, ["wq", "ws", "wz"], ["wd"], axis=0),
             helper.make_node("Conv", ["xd", "wd"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node(q, ["c", "ys", "yz"], ["cq"]),
             helper.make_node(dq, ["cq", "ys", "yz"], ["y"])]
    onnx.save(_model(nodes, inits, [1, 3, 8, 8]), tmp_path / "w.onnx")
    assert main(["quantize", str(tmp_path / "w.onnx"), "-o", str(tmp_path / "q")]) == 0
    got, want, scale = _runs(tmp_path / "q", tmp_path / "w.onnx", samples(6, 5) * 0.5)
    assert scale == pytest.approx(10)  # s8, zero point 0: the grid kept
    # x and w on ONNX's grids exactly, so the accumulator is ORT's: only the output's
    # rounding (half up, not to even; the fixed point's < 0.01 unit) differs
    assert np.abs(got - want).max() <= 1 / scale + 1e-6


def _one_error(capsys, argv, match):
    assert main(argv) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and match in err, err


def test_errors(tmp_path, capsys):
    onnx.save(qlinear_conv_net(), tmp_path / "ql.onnx")
    np.save(tmp_path / "x.npy", samples(2, 0))
    _one_error(capsys, ["quantize", str(tmp_path / "ql.onnx"), "-o", str(tmp_path / "a"),
                        "--calib", f"x={tmp_path / 'x.npy'}"], "already quantized")
    model = qlinear_conv_net()
    model.graph.node.insert(2, helper.make_node(
        "QLinearReduceMean", ["yq", "ys", "yz", "ys", "yz"], ["yq2"], domain="com.microsoft",
        name="sig", axes=[1]))
    model.graph.node[3].input[0] = "yq2"
    model.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    onnx.save(model, tmp_path / "bad.onnx")
    _one_error(capsys, ["quantize", str(tmp_path / "bad.onnx"), "-o", str(tmp_path / "b")],
               "node 'sig' (QLinearReduceMean)")
    onnx.save(float_net(), tmp_path / "float.onnx")
    _one_error(capsys, ["quantize", str(tmp_path / "float.onnx"), "-o", str(tmp_path / "c")],
               "--calib: no samples for input 'x'")


# ---- bad quantized models: one line naming the node, exit 1 (issue 29 item 3) -----------
def _init(model, name, value):
    """Replace initializer `name` of `model` by `value`."""
    t = next(t for t in model.graph.initializer if t.name == name)
    t.CopyFrom(numpy_helper.from_array(np.asarray(value), name))


def _node(model, output):
    return next(n for n in model.graph.node if n.output[0] == output)


def _attr(model, output, **attrs):
    _node(model, output).attribute.extend(helper.make_attribute(k, v) for k, v in attrs.items())


def qdq_conv_net(axis=None):
    """x -> Q/DQ (s8) -> Conv by an int8 weight through DequantizeLinear (per channel on
    `axis` when given) -> Q/DQ (s8), written with onnx.helper."""
    r = np.random.default_rng(3)
    w = r.integers(-127, 128, (3, 2, 3, 3)).astype(np.int8)
    inits = {"xs": np.array(0.02, np.float32), "xz": np.array(0, np.int8), "w": w,
             "ws": np.array(0.003 if axis is None else [0.003, 0.002, 0.004], np.float32),
             "wz": np.zeros(() if axis is None else 3, np.int8),
             "ys": np.array(0.1, np.float32), "yz": np.array(0, np.int8)}
    q, dq = "QuantizeLinear", "DequantizeLinear"
    nodes = [helper.make_node(q, ["x", "xs", "xz"], ["xq"]),
             helper.make_node(dq, ["xq", "xs", "xz"], ["xd"]),
             helper.make_node(dq, ["w", "ws", "wz"], ["wd"],
                              **({} if axis is None else {"axis": axis})),
             helper.make_node("Conv", ["xd", "wd"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node(q, ["c", "ys", "yz"], ["cq"]),
             helper.make_node(dq, ["cq", "ys", "yz"], ["y"])]
    return _model(nodes, inits, [1, 3, 8, 8])


def qoperator_net(op="QLinearGlobalAveragePool", **attrs):
    """qlinear_conv_net, then a com.microsoft op on its u8 output: a global average pool
    (4-D output), or QGemm after a Flatten (2-D)."""
    model = qlinear_conv_net()
    inits = {"gs": np.array(0.01, np.float32), "g": np.ones((4, 192), np.int8),
             "gws": np.array(0.01, np.float32), "gwz": np.array(0, np.int8)}
    model.graph.initializer.extend(numpy_helper.from_array(v, k) for k, v in inits.items())
    ms = "com.microsoft"
    if op == "QGemm":
        nodes = [helper.make_node("Flatten", ["yq"], ["fq"]),
                 helper.make_node(op, ["fq", "ys", "yz", "g", "gws", "gwz", "", "gs", "yz"],
                                  ["gq"], domain=ms, transB=1, **attrs)]
        shape = [1, 4]
    else:
        nodes = [helper.make_node(op, ["yq", "ys", "yz", "gs", "yz"], ["gq"], domain=ms,
                                  **attrs)]
        shape = [1, 3, 1, 1]
    nodes.append(helper.make_node("DequantizeLinear", ["gq", "gs", "yz"], ["y"]))
    model.graph.node.pop()
    model.graph.node.extend(nodes)
    model.graph.output[0].CopyFrom(helper.make_tensor_value_info("y", TensorProto.FLOAT,
                                                                 shape))
    model.opset_import.append(helper.make_opsetid(ms, 1))
    return model


def _drop_input(model, output, keep):
    node = _node(model, output)
    del node.input[keep:]


def _rename_input(model, output, index, name):
    _node(model, output).input[index] = name


QL, QC = "node 'yq' (QLinearConv)", "node 'xq' (QuantizeLinear)"
WD = "node 'wd' (DequantizeLinear)"
BAD_MODELS = {
    "scale-0": (qlinear_conv_net, lambda m: _init(m, "xs", np.float32(0)), QC),
    "scale-negative": (qlinear_conv_net, lambda m: _init(m, "ys", np.float32(-0.05)), QL),
    "scale-nan": (qlinear_conv_net, lambda m: _init(m, "ws", np.array([0.004, np.nan, 0.003],
                                                                      np.float32)), QL),
    "scale-inf": (qlinear_conv_net, lambda m: _init(m, "xs", np.float32(np.inf)), QC),
    "scale-denormal": (qlinear_conv_net, lambda m: _init(m, "ys", np.float32(1e-40)), QL),
    "scale-1e30": (qlinear_conv_net, lambda m: _init(m, "xs", np.float32(1e30)), QL),
    "scale-16-bit-grid-beyond-float32": (qlinear_conv_net, lambda m: (
        _init(m, "xz", np.uint16(0)), _init(m, "xs", np.float32(1e37))), QC),
    "scale-integer": (qlinear_conv_net, lambda m: _init(m, "xs", np.int32(1)), QC),
    "scale-per-axis-activation": (qlinear_conv_net,
                                  lambda m: _init(m, "xs", np.float32([0.02, 0.02])), QC),
    "weight-scales-length": (qlinear_conv_net,
                             lambda m: _init(m, "ws", np.float32([0.004, 0.002])), QL),
    "weight-zero-points-length": (qlinear_conv_net,
                                  lambda m: _init(m, "wz", np.zeros(2, np.int8)), QL),
    "weight-zero-point-type": (qlinear_conv_net,
                               lambda m: _init(m, "wz", np.zeros(3, np.uint8)), QL),
    "weight-float": (qlinear_conv_net,
                     lambda m: _init(m, "w", np.ones((3, 2, 3, 3), np.float32)), QL),
    "zero-point-int32": (qlinear_conv_net, lambda m: _init(m, "xz", np.int32(0)), QC),
    "zero-point-float": (qlinear_conv_net, lambda m: _init(m, "xz", np.float32(0)), QC),
    "zero-point-vs-output_dtype": (
        qlinear_conv_net, lambda m: _attr(m, "xq", output_dtype=TensorProto.INT8), QC),
    "output_dtype-999": (qlinear_conv_net, lambda m: (_drop_input(m, "xq", 2),
                                                      _attr(m, "xq", output_dtype=999)), QC),
    "qlinearconv-3-inputs": (qlinear_conv_net, lambda m: _drop_input(m, "yq", 3), QL),
    "bias-float": (qlinear_conv_net, lambda m: _init(m, "b", np.ones(3, np.float32)), QL),
    "bias-length": (qlinear_conv_net, lambda m: _init(m, "b", np.ones(2, np.int32)), QL),
    "missing-initializer": (qlinear_conv_net, lambda m: _rename_input(m, "yq", 4, "nope"), QL),
    "quantize-no-inputs": (qlinear_conv_net, lambda m: _drop_input(m, "xq", 0), QC),
    "dq-axis-out-of-range": (lambda: qdq_conv_net(axis=4), lambda m: None, WD),
    "dq-scales-length": (lambda: qdq_conv_net(axis=1), lambda m: None, WD),
    "dq-int32-zero-point": (qdq_conv_net, lambda m: (
        _init(m, "w", np.ones((3, 2, 3, 3), np.int32)), _init(m, "wz", np.int32(1))), WD),
    "relu-of-integers-with-zero-point": (qlinear_conv_net, lambda m: (
        m.graph.node.insert(1, helper.make_node("Relu", ["xq"], ["xr"])),
        _rename_input(m, "yq", 0, "xr")), "node 'xr' (Relu)"),
    "quantize-of-integers": (qlinear_conv_net, lambda m: (
        m.graph.node.insert(1, helper.make_node("QuantizeLinear", ["xq", "xs", "xz"], ["xr"])),
        _rename_input(m, "yq", 0, "xr")), "node 'xr' (QuantizeLinear)"),
    "qoperator-channels-last": (lambda: qoperator_net(channels_last=1), lambda m: None,
                                "node 'gq' (QLinearGlobalAveragePool)"),
    "qoperator-inputs": (lambda: qoperator_net("QLinearConcat", axis=1), lambda m: None,
                         "node 'gq' (QLinearConcat)"),
    "qlinearsoftmax-of-another-opset": (
        lambda: qoperator_net("QLinearSoftmax", axis=1, opset=11), lambda m: None,
        "node 'gq' (QLinearSoftmax)"),
    "qgemm-alpha": (lambda: qoperator_net("QGemm", alpha=2.0), lambda m: None,
                    "node 'gq' (QGemm)"),
    "qgemm-float-output": (lambda: qoperator_net("QGemm"), lambda m: _drop_input(m, "gq", 7),
                           "node 'gq' (QGemm)"),
    "output-without-name": (qlinear_conv_net, lambda m: m.graph.node[0].output.__setitem__(
        0, ""), "first output has no name"),
    "pass-op-without-input": (lambda: qlinear_conv_net(matmul=True),
                              lambda m: _node(m, "fq").input.pop(), "node 'fq' (Flatten)"),
    "float-op-without-input": (qdq_conv_net, lambda m: m.graph.node.insert(
        3, helper.make_node("Sigmoid", [], ["s"])), "shape inference fails"),
    "float-conv-weight-of-rank-2": (qdq_conv_net, lambda m: _init(
        m, "w", np.ones((3, 18), np.int8)), "node 'c' (Conv)"),
    "float-bias-inf": (qdq_conv_net, lambda m: (
        _node(m, "c").input.append("b"), m.graph.initializer.append(numpy_helper.from_array(
            np.array([np.inf, 0, 0], np.float32), "b"))), "node 'c' (Conv)"),
}


@pytest.mark.parametrize("case", list(BAD_MODELS))
def test_bad_quantized_models(tmp_path, capsys, case):
    make, edit, where = BAD_MODELS[case]
    model = make()
    edit(model)
    onnx.save(model, tmp_path / "bad.onnx")
    _one_error(capsys, ["quantize", str(tmp_path / "bad.onnx"), "-o", str(tmp_path / "q")],
               where)


def test_per_channel_dequantize_of_a_weight(tmp_path):
    """The control of the dq-* cases: the same model with valid per-channel scales."""
    onnx.save(qdq_conv_net(axis=0), tmp_path / "w.onnx")
    assert main(["quantize", str(tmp_path / "w.onnx"), "-o", str(tmp_path / "q")]) == 0
    got, want, scale = _runs(tmp_path / "q", tmp_path / "w.onnx", samples(6, 5) * 0.5)
    assert np.abs(got - want).max() <= 1 / scale + 1e-6


def _external(tmp, location, length=None):
    """qlinear_conv_net in tmp/m/bad.onnx with its weight 'w' in tmp/m/w.bin, read at
    `location` (and `length`)."""
    from onnx.external_data_helper import set_external_data
    (tmp / "m").mkdir()
    model = qlinear_conv_net()
    t = next(t for t in model.graph.initializer if t.name == "w")
    (tmp / "m" / "w.bin").write_bytes(numpy_helper.to_array(t).tobytes())
    set_external_data(t, location, length=length)
    t.ClearField("raw_data")
    t.data_location = TensorProto.EXTERNAL
    onnx.save(model, tmp / "m" / "bad.onnx")
    return tmp / "m" / "bad.onnx"


@pytest.mark.parametrize("location, length, message", [
    ("../w.bin", None, "must be a relative path inside"),
    ("ABSOLUTE", None, "must be a relative path inside"),
    ("link.bin", None, "symbolic link"),
    ("missing.bin", None, "no such file"),
    ("w.bin", 1 << 40, "lies beyond the end"),
])
def test_bad_external_data(tmp_path, capsys, location, length, message):
    (tmp_path / "w.bin").write_bytes(bytes(54))
    if location == "ABSOLUTE":
        location = str(tmp_path / "w.bin")
    path = _external(tmp_path, location, length)
    (path.parent / "link.bin").symlink_to(path.parent / "w.bin")
    assert main(["quantize", str(path), "-o", str(tmp_path / "q")]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "initializer 'w'" in err and message in err, err


def test_external_data_inside_the_folder_is_read(tmp_path):
    path = _external(tmp_path, "w.bin")
    assert main(["quantize", str(path), "-o", str(tmp_path / "q")]) == 0
    onnx.save(qlinear_conv_net(), tmp_path / "inline.onnx")
    assert main(["quantize", str(tmp_path / "inline.onnx"), "-o", str(tmp_path / "q2")]) == 0
    assert (tmp_path / "q" / "graph.nnef").read_text() == \
        (tmp_path / "q2" / "graph.nnef").read_text()


# ---- what exporters write: Constant and Identity nodes, shared weights (issue 30) --------
def _qdq_semantics():
    """ORT session options that run a QDQ model as written (Q/DQ and float ops, no int8
    kernels): the model's own meaning on any CPU."""
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return options


@pytest.mark.parametrize("per_channel", [False, True], ids=["defaults", "per-channel-7-bit"])
def test_torch_like_export_quantized_by_ort(tmp_path, per_channel):
    """A Constant scalar (ORT quantizes it as an activation: s8 with a zero point), an
    Identity, one weight shared by two convs; quantize_static with all its defaults, or
    per channel with reduce_range (it was 'NNEF-Tools failed ... NoneType')."""
    from tests.quantize.onnx_nets import torch_like_net
    ort_qdq(torch_like_net(), tmp_path, "QInt8" if per_channel else None, per_channel,
            (1, 2, 8, 8))
    ops = [n.op_type for n in onnx.load(tmp_path / "qdq.onnx").graph.node]
    assert {"Constant", "Identity"} <= set(ops) and ops.count("Conv") == 3
    xs = np.random.default_rng(51).standard_normal((24, 1, 2, 8, 8)).astype(np.float32)
    got, want, scale = _runs(tmp_path / "q", tmp_path / "qdq.onnx", xs, _qdq_semantics())
    # as in test_agrees_with_ort_int8_and_with_float: a unit per requantized tensor
    # (ties, the halved grid of a one-sided range) through the gemm, plus ORT's half unit
    # (1.3 and 2.2 units measured)
    assert np.abs(got - want).max() <= 4 / scale
    session = ort.InferenceSession(str(tmp_path / "float.onnx"),
                                   providers=["CPUExecutionProvider"])
    real = np.array([session.run(None, {"x": x})[0] for x in xs], np.float64)
    assert np.abs(got - real).max() <= np.abs(want - real).max() + 4 / scale
    if per_channel:  # llvm = the reference, bit for bit
        import cvmc_runtime

        import cvmc
        graph = load_graph(tmp_path / "q")
        cvmc.compile(graph, str(tmp_path / "q.cvmx"), target="llvm")
        model = cvmc_runtime.load(str(tmp_path / "q.cvmx"))
        x_scale = json.loads((tmp_path / "q" / "quantization.json").read_text())[
            "inputs"]["x"]["scale"]
        for x in xs[:4]:
            xi = quantize("x", x, x_scale, 8).astype(np.int8)
            assert np.array_equal(model.run({"x": xi})["y"],
                                  reference_run(graph, {"x": xi})["y"])


def test_constant_and_identity_nodes_by_hand(tmp_path):
    """qdq_conv_net with its int8 weight and its scale from Constant nodes, and Identity
    nodes on the integer input, on the dequantized weight and on the output: the grids are
    kept exactly, so only the output's rounding differs from ORT."""
    model = qdq_conv_net()
    inits = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    for name in ("w", "ws"):
        model.graph.initializer.remove(next(t for t in model.graph.initializer
                                            if t.name == name))
    nodes = [helper.make_node("Constant", [], ["w"], value=numpy_helper.from_array(inits["w"])),
             helper.make_node("Constant", [], ["ws"], value_float=float(inits["ws"]))]
    for n in model.graph.node:
        nodes.append(n)
        if n.output[0] in ("xq", "wd"):
            nodes.append(helper.make_node("Identity", [n.output[0]], [n.output[0] + "i"]))
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    _node(model, "xd").input[0] = "xqi"
    _node(model, "c").input[1] = "wdi"
    _node(model, "y").output[0] = "yd"
    model.graph.node.append(helper.make_node("Identity", ["yd"], ["y"]))
    onnx.checker.check_model(model)
    onnx.save(model, tmp_path / "w.onnx")
    assert main(["quantize", str(tmp_path / "w.onnx"), "-o", str(tmp_path / "q")]) == 0
    got, want, scale = _runs(tmp_path / "q", tmp_path / "w.onnx", samples(6, 5) * 0.5,
                             _qdq_semantics())
    assert scale == pytest.approx(10)
    assert np.abs(got - want).max() <= 1 / scale + 1e-6


@pytest.mark.parametrize("case", ["scale-0", "qlinearconv-3-inputs", "output_dtype-999",
                                  "external-data-outside"])
def test_the_command_exits_1_without_a_traceback(tmp_path, case):
    """`python -m cvmc.cli quantize bad.onnx -o DIR` in its own process."""
    import subprocess
    import sys
    if case == "external-data-outside":
        path = _external(tmp_path, "../w.bin")
    else:
        make, edit, _ = BAD_MODELS[case]
        model = make()
        edit(model)
        path = tmp_path / "bad.onnx"
        onnx.save(model, path)
    run = subprocess.run([sys.executable, "-m", "cvmc.cli", "quantize", str(path), "-o",
                          str(tmp_path / "q")], check=False, capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 1 and "Traceback" not in run.stderr, run.stderr
    assert len(run.stderr.strip().splitlines()) == 1 and not (tmp_path / "q").exists()


def _branchy_net_without_tanh():
    """branchy_net without its tanh (ORT's QOperator format leaves it in float between a
    DequantizeLinear and a QuantizeLinear: it has no scale)."""
    from tests.quantize.onnx_nets import branchy_net
    model = branchy_net()
    model.graph.node.remove(_node(model, "th"))
    _node(model, "gap").input[0] = "cl"
    return model


def _leaky_branchy_net():
    """_branchy_net_without_tanh with a LeakyRelu in place of its softmax."""
    model = _branchy_net_without_tanh()
    last = model.graph.node[-1]
    last.op_type = "LeakyRelu"
    del last.attribute[:]
    last.attribute.append(helper.make_attribute("alpha", 0.1))
    return model


def _integers(folder, xs):
    """The integer outputs of the quantized model in `folder` on the reference."""
    graph = load_graph(folder)
    scale = json.loads((folder / "quantization.json").read_text())["inputs"]["x"]["scale"]
    return [reference_run(graph, {"x": quantize("x", x, scale, 8).astype(np.int8)})
            for x in xs]


@pytest.mark.parametrize("net, per_channel", [("torch_like", False), ("leaky", True),
                                              ("softmax", False)])
def test_qoperator_model_of_ort(tmp_path, net, per_channel):
    """QuantFormat.QOperator: QLinearConv, QLinearAdd, QLinearMul (by a quantized Constant),
    QLinearSigmoid, QLinearConcat, QLinearGlobalAveragePool, QGemm (torch_like_net);
    QLinearAveragePool and QLinearLeakyRelu or QLinearSoftmax too (branchy_net), against
    ORT's own int8 run of the same file (its com.microsoft kernels)."""
    from tests.quantize.onnx_nets import torch_like_net
    model = {"torch_like": torch_like_net, "leaky": _leaky_branchy_net,
             "softmax": _branchy_net_without_tanh}[net]()
    ort_qdq(model, tmp_path, "QInt8", per_channel, (1, 2, 8, 8), fmt="QOperator")
    ops = {n.op_type for n in onnx.load(tmp_path / "qdq.onnx").graph.node}
    assert ops >= {"torch_like": {"QLinearAdd", "QLinearMul", "QLinearSigmoid", "QLinearConcat",
                                  "QLinearGlobalAveragePool", "QGemm"},
                   "leaky": {"QLinearAveragePool", "QLinearLeakyRelu", "QGemm"},
                   "softmax": {"QLinearAveragePool", "QLinearSoftmax", "QGemm"}}[net]
    xs = np.random.default_rng(52).standard_normal((24, 1, 2, 8, 8)).astype(np.float32)
    got, want, scale = _runs(tmp_path / "q", tmp_path / "qdq.onnx", xs)
    if net == "torch_like":
        # as for the QDQ models: a unit per requantized tensor through the gemm, plus
        # ORT's half unit (1.6 measured)
        assert np.abs(got - want).max() <= 4 / scale
        session = ort.InferenceSession(str(tmp_path / "float.onnx"),
                                       providers=["CPUExecutionProvider"])
        real = np.array([session.run(None, {"x": x})[0] for x in xs], np.float64)
        assert np.abs(got - real).max() <= np.abs(want - real).max() + 4 / scale
        return
    # branchy: the concat's, the global pool's and the gemm's s8 grids have zero points
    # far from the middle, so each loses a bit in CVM (docs/quantize.md); the concat of
    # a sigmoid on a grid 24 times coarser rounds its values the same way in every sample,
    # and the pools average that bias instead of noise: 5.5 units of the LeakyRelu's grid
    # measured, 3.3 of the softmax's (scale 127). The import itself is checked against
    # the QDQ model of the same net and calibration, whose import the tests above check
    # against ORT: the same integers.
    assert np.abs(got - want).max() <= (8 if net == "leaky" else 4) / scale
    (tmp_path / "qdq").mkdir()
    ort_qdq(model, tmp_path / "qdq", "QInt8", per_channel, (1, 2, 8, 8))
    for a, b in zip(_integers(tmp_path / "q", xs), _integers(tmp_path / "qdq" / "q", xs)):
        assert np.array_equal(a["prob"], b["prob"])


@pytest.mark.parametrize("op", ["QLinearGlobalAveragePool", "QGemm"])
def test_qoperator_nets_by_hand(tmp_path, op):
    """The controls of the qoperator and qgemm cases: the same models, valid, within the
    output's rounding of ORT's own run plus the conv's halved u8 grid carried through."""
    onnx.save(qoperator_net(op), tmp_path / "m.onnx")
    assert main(["quantize", str(tmp_path / "m.onnx"), "-o", str(tmp_path / "q")]) == 0
    got, want, scale = _runs(tmp_path / "q", tmp_path / "m.onnx", samples(8, 6) * 0.5)
    # the conv output (u8, zero point 0) is on a grid twice ORT's (0.05 * 255 / 127): one
    # unit of it and ORT's half step per element, averaged (pool) or times the 192 unit
    # weights (gemm); then one output unit and ORT's half step
    per_element = 0.05 * 255 / 127 + 0.025
    bound = per_element * (1 if op == "QLinearGlobalAveragePool" else 192 * 0.01) \
        + 1 / scale + 0.005
    assert np.abs(got - want).max() <= bound, (np.abs(got - want).max(), bound)

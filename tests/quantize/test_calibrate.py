"""Calibration thresholds over all samples, against NumPy on the concatenated values."""
import numpy as np
import pytest

from cvmc.quantize.calibrate import Stats


@pytest.fixture
def samples():
    rng = np.random.default_rng(11)
    return [rng.standard_normal((3, 5, 7)) * (k + 1) for k in range(4)]


def test_every_sample_counts(samples):
    stats = Stats()
    for s in samples:
        stats.add(s)
    every = np.abs(np.concatenate([s.reshape(-1) for s in samples]))
    assert stats.threshold("absmax", 0, 0) == every.max()  # not the last sample's alone
    assert stats.threshold("percentile", 99.0, 0) == pytest.approx(np.percentile(every, 99.0))
    mrt = abs(every.mean()) + 2.0 * every.std()
    assert stats.threshold("lambda", 0, 2.0) == pytest.approx(mrt)
    assert stats.threshold("lambda", 0, 100.0) == every.max()  # never above absmax


def test_an_all_zero_tensor_still_has_a_scale():
    stats = Stats()
    stats.add(np.zeros((2, 3)))
    assert stats.threshold("absmax", 0, 0) == 1.0


def _net(tmp, nodes, inits):
    """A float ONNX model of input x [1, 2, 4, 4] and output y, in tmp/net.onnx."""
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper, numpy_helper
    graph = helper.make_graph(
        nodes, "net", [helper.make_tensor_value_info("x", TensorProto.FLOAT, (1, 2, 4, 4))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(v, k) for k, v in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.save(model, tmp / "net.onnx")
    return tmp / "net.onnx"


def _conv(w):
    from onnx import helper
    return [helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1])], {"w": w}


def _conv_bn_infinite_offset():
    """conv then a BatchNormalization whose offset is inf: folding it must not warn."""
    from onnx import helper
    ones = np.ones(3, np.float32)
    return ([helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("BatchNormalization", ["c", "g", "o", "m", "v"], ["y"])],
            {"w": np.full((3, 2, 3, 3), 0.1, np.float32), "g": ones,
             "o": np.full(3, np.inf, np.float32), "m": ones * 0, "v": ones})


def _square():
    from onnx import helper
    return [helper.make_node("Mul", ["x", "x"], ["y"])], {}


@pytest.mark.parametrize("net, magnitude, layer", [
    (lambda: _conv(np.full((3, 2, 3, 3), 1e38, np.float32)), 1.0, "layer 'y' (conv)"),
    # +1e38 and -1e38 taps: inf - inf
    (lambda: _conv(np.where(np.arange(54).reshape(3, 2, 3, 3) % 2, 1e38, -1e38)
                   .astype(np.float32)), 1e3, "layer 'y' (conv)"),
    (_square, 1e20, "layer 'y' (mul)"),
    # refused before calibrating (quantize_graph's dry run): the weight is not finite
    (_conv_bn_infinite_offset, 1.0, "layer 'y' (add): weight"),
])
def test_overflow_in_the_float_model_is_one_error_line(tmp_path, capsys, net, magnitude,
                                                       layer):
    """Issue 29 item 4: a float model that overflows float32 on the calibration samples
    has no scale; the error names the layer and says why (it was an assert). The conv's
    weights of 1e38 give no fixed-point ratio at the dry run's unit thresholds, which does
    not decide: calibration does."""
    pytest.importorskip("nnef_tools")
    from cvmc.cli import main
    path = _net(tmp_path, *net())
    xs = np.random.default_rng(0).standard_normal((2, 1, 2, 4, 4)) * magnitude
    np.save(tmp_path / "x.npy", xs.astype(np.float32))
    assert main(["quantize", str(path), "-o", str(tmp_path / "q"),
                 "--calib", f"x={tmp_path / 'x.npy'}"]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and layer in err and "not finite" in err, err


def test_weights_of_1e30_on_inputs_of_1e_30_quantize(tmp_path):
    """The dry run before calibration, at unit thresholds, finds no fixed-point ratio for
    this conv (7.9e33); the calibrated ranges give one (about 0.01), so the model is not
    refused, and its output agrees with ONNX Runtime's float run."""
    pytest.importorskip("nnef_tools")
    ort = pytest.importorskip("onnxruntime")
    import json

    from cvmc_runtime import dequantize, quantize

    from cvmc import load_graph, reference_run
    from cvmc.cli import main
    r = np.random.default_rng(0)
    path = _net(tmp_path, *_conv((r.standard_normal((3, 2, 3, 3)) * 1e30).astype(np.float32)))
    xs = (r.standard_normal((4, 1, 2, 4, 4)) * 1e-30).astype(np.float32)
    np.save(tmp_path / "x.npy", xs)
    assert main(["quantize", str(path), "-o", str(tmp_path / "q"),
                 "--calib", f"x={tmp_path / 'x.npy'}"]) == 0
    manifest = json.loads((tmp_path / "q" / "quantization.json").read_text())
    graph = load_graph(tmp_path / "q")
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    for x in xs:
        q = quantize("x", x, manifest["inputs"]["x"]["scale"], 8).astype(np.int8)
        got = dequantize(reference_run(graph, {"x": q})["y"], manifest["outputs"]["y"]["scale"])
        want = session.run(None, {"x": x})[0].astype(np.float64)
        # 8-bit input and weights over 18 taps: a few per cent of the output's range
        assert np.abs(got - want).max() <= 0.05 * np.abs(want).max()


def test_mse_threshold_is_the_least_error_candidate():
    """Oracle: each candidate's exact squared error over every value (NumPy's own
    rounding of each value, not the histogram's bin centres); mse's choice is within 1%
    of the best candidate's. A heavy-tailed sample: absmax is far from the best."""
    rng = np.random.default_rng(8)
    samples = [rng.standard_normal(60_000) for _ in range(10)]  # each kept whole
    samples[3][7], samples[8][2] = 40.0, -35.0
    values = np.concatenate(samples).astype(np.float32)
    stats = Stats()
    for sample in samples:
        stats.add(sample.astype(np.float32))

    def error(t: float, bits: int) -> float:
        step = t / ((1 << (bits - 1)) - 1)
        q = np.clip(np.round(values / step), -(t / step), t / step) * step
        return float(np.square(values - q).sum())
    for bits in (4, 8):
        candidates = [40.0 * k / 256 for k in range(1, 257)]
        best = min(error(t, bits) for t in candidates)
        chosen = stats.threshold("mse", 99.99, 10, bits)
        assert chosen in candidates and chosen < 20
        assert error(chosen, bits) <= 1.01 * best
        assert error(chosen, bits) < error(40.0, bits) / 2  # far better than absmax

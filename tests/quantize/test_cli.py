"""`cvmc quantize` end to end on small float ONNX models built in the test: the integer
model agrees with float, CVM tools accept it, llvm computes the reference's bits, and bad
input is one error line with exit code 1."""
import json

import numpy as np
import pytest
from cvmc_runtime import dequantize, quantize

from cvmc import load_graph, reference_run
from cvmc.cli import main

pytest.importorskip("nnef_tools", reason="needs the convert extra: pip install 'cvmc[convert]'")
onnx = pytest.importorskip("onnx")

from tests.cvm_runtime import DEVICES, needs_cvm_runtime, run_exported
from tests.quantize.onnx_nets import branchy_net, conv_bn_net

NETS = {"conv_bn": (conv_bn_net, "logits", (1, 1, 12, 12)),
        "branchy": (branchy_net, "prob", (1, 2, 8, 8))}


@pytest.fixture(scope="module", params=list(NETS))
def quantized(request, tmp_path_factory):
    """(float NNEF folder, quantized folder, samples, output name) of one net."""
    make, out, shape = NETS[request.param]
    tmp = tmp_path_factory.mktemp(request.param)
    onnx.save(make(), tmp / "net.onnx")
    rng = np.random.default_rng(3)
    samples = rng.standard_normal((24, *shape)).astype(np.float32)
    np.save(tmp / "x.npy", samples)
    assert main(["convert", str(tmp / "net.onnx"), "-o", str(tmp / "float")]) == 0
    assert main(["quantize", str(tmp / "net.onnx"), "-o", str(tmp / "q"), "--calib",
                 f"x={tmp / 'x.npy'}", "--per-channel", "--report-json",
                 str(tmp / "report.json"), "--dump-ir", str(tmp / "dump")]) == 0
    return tmp, out, samples


def test_integer_model_agrees_with_float(quantized):
    tmp, out, samples = quantized
    manifest = json.loads((tmp / "q" / "quantization.json").read_text())
    scale, precision = manifest["inputs"]["x"]["scale"], manifest["inputs"]["x"]["precision"]
    fgraph, qgraph = load_graph(tmp / "float"), load_graph(tmp / "q")
    want = np.array([reference_run(fgraph, {"x": x})[out] for x in samples], np.float64)
    got = np.array([dequantize(reference_run(qgraph, {"x": quantize("x", x, scale, precision)
                                                      .astype(np.int8)})[out],
                               manifest["outputs"][out]["scale"]) for x in samples])
    # The stated whole-model bound (docs/quantize.md): error <= 4% of the output range and
    # SQNR >= 25 dB on the calibration samples; the top class agrees on >= 90% of them.
    err = np.abs(got - want)
    assert err.max() <= 0.04 * np.abs(want).max()
    assert 10 * np.log10(np.square(want).sum() / np.square(got - want).sum()) >= 25
    assert np.mean(got.argmax(-1) == want.argmax(-1)) >= 0.9
    report = json.loads((tmp / "report.json").read_text())
    assert report["samples"] == 24 and report["layers"][-1]["layer"] == out
    assert sorted(p.name for p in (tmp / "dump").iterdir()) == [
        "00-group-layers.nnef", "01-fold-batch-norm.nnef", "02-fuse-elementwise.nnef",
        "03-quantize.nnef", "04-infer-precision.nnef"]


def test_check_and_export_accept_it(quantized, capsys):
    tmp, out, samples = quantized
    assert main(["check", str(tmp / "q")]) == 0
    assert main(["export", str(tmp / "q"), "--format", "cvm", "-o", str(tmp / "cvm")]) == 0
    # CVM-Runtime's form of the model (read back) computes the same bits as the folder
    manifest = json.loads((tmp / "q" / "quantization.json").read_text())
    scale, precision = manifest["inputs"]["x"]["scale"], manifest["inputs"]["x"]["precision"]
    folder = load_graph(tmp / "q")
    cvm = load_graph(tmp / "cvm" / "symbol.json", params=tmp / "cvm" / "params")
    for x in samples[:4]:
        feeds = {"x": quantize("x", x, scale, precision).astype(np.int8)}
        want = reference_run(folder, feeds)
        got = reference_run(cvm, {cvm.inputs[0]: feeds["x"]})
        assert np.array_equal(got[cvm.outputs[0]], want[out])


@needs_cvm_runtime
@pytest.mark.parametrize("device", DEVICES)
def test_cli_export_runs_on_cvm_runtime(quantized, device):
    """What `cvmc export --format cvm` wrote loads in CVM-Runtime and gives the folder's
    bits (the branchy net holds sigmoid and tanh tables and a softmax)."""
    tmp, out, samples = quantized
    exported = tmp / f"cvm-{device}"
    assert main(["export", str(tmp / "q"), "--format", "cvm", "-o", str(exported)]) == 0
    scale = json.loads((tmp / "q" / "quantization.json").read_text())["inputs"]["x"]["scale"]
    folder = load_graph(tmp / "q")
    for x in samples[:4]:
        xi = quantize("x", x, scale, 8).astype(np.int8)
        got = run_exported(exported / "symbol.json", exported / "params", xi, device)
        assert np.array_equal(got, reference_run(folder, {"x": xi})[out].ravel())


@pytest.mark.parametrize("target", ["llvm", "cuda"])
def test_compiled_is_bit_exact_with_the_reference(quantized, target):
    import cvmc_runtime
    from cvmc_runtime.model import cuda_available

    import cvmc
    tmp, out, samples = quantized
    graph = load_graph(tmp / "q")
    cvmc.compile(graph, str(tmp / f"q-{target}.cvmx"), target=target)  # CUDA: nvcc builds it
    if target == "cuda" and not cuda_available():
        pytest.skip("built for CUDA by nvcc; no CUDA GPU here to run it")
    model = cvmc_runtime.load(str(tmp / f"q-{target}.cvmx"))
    scale = json.loads((tmp / "q" / "quantization.json").read_text())["inputs"]["x"]["scale"]
    for x in samples[:6]:
        xi = quantize("x", x, scale, 8).astype(np.int8)
        assert np.array_equal(model.run({"x": xi})[out], reference_run(graph, {"x": xi})[out])


def _one_error(capsys, argv, match):
    assert main(argv) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err and match in err, err


def test_bad_inputs_are_one_error_line(tmp_path, capsys):
    onnx.save(conv_bn_net(), tmp_path / "net.onnx")
    net = str(tmp_path / "net.onnx")
    out = str(tmp_path / "q")
    _one_error(capsys, ["quantize", net, "-o", out, "--calib", f"x={tmp_path}/none.npy"],
               "--calib x: cannot read")
    np.save(tmp_path / "wrong.npy", np.zeros((4, 1, 1, 10, 10), np.float32))
    _one_error(capsys, ["quantize", net, "-o", out, "--calib", f"x={tmp_path}/wrong.npy"],
               "expected samples of shape [N, 1, 1, 12, 12]")
    nan = np.zeros((4, 1, 1, 12, 12), np.float32)
    nan[2, 0, 0, 3, 4] = np.nan
    np.save(tmp_path / "nan.npy", nan)
    _one_error(capsys, ["quantize", net, "-o", out, "--calib", f"x={tmp_path}/nan.npy"],
               "value at index [2, 0, 0, 3, 4] is nan")
    _one_error(capsys, ["quantize", net, "-o", out, "--calib", f"y={tmp_path}/nan.npy"],
               "no samples for input 'x'")
    assert not (tmp_path / "q").exists()


def test_calib_shape_is_checked_before_converting(tmp_path, capsys, monkeypatch):
    def convert(*args, **kwargs):
        raise AssertionError("converted before checking --calib")
    monkeypatch.setattr("cvmc.frontend.onnx_convert.convert_onnx", convert)
    onnx.save(conv_bn_net(), tmp_path / "net.onnx")
    for shape in [(4, 1, 1, 10, 10), (4, 1, 12, 10)]:
        np.save(tmp_path / "wrong.npy", np.zeros(shape, np.float32))
        _one_error(capsys, ["quantize", str(tmp_path / "net.onnx"), "-o", str(tmp_path / "q"),
                            "--calib", f"x={tmp_path}/wrong.npy"],
                   f"expected samples of shape [N, 1, 1, 12, 12] with real values, got "
                   f"{list(shape)}")


def test_unsupported_op_is_one_error_line(tmp_path, capsys):
    from tests.quantize.onnx_nets import div_net

    onnx.save(div_net(), tmp_path / "sq.onnx")
    np.save(tmp_path / "x.npy", np.ones((2, 3, 3), np.float32))
    _one_error(capsys, ["quantize", str(tmp_path / "sq.onnx"), "-o", str(tmp_path / "q"),
                        "--calib", f"x={tmp_path}/x.npy"], "(div)")

"""What a new user of `cvmc quantize` ran into (issue 30, item 7): ONNX Clip bounds that
are infinite, both forms of sample files, progress, ONNX node names in the report and in
errors, and saturation counted where a quantized model runs."""
from __future__ import annotations

import numpy as np
import pytest

from cvmc import load_graph, reference_run
from cvmc.cli import main
from cvmc.errors import CvmcError

pytest.importorskip("nnef_tools", reason="needs the convert extra: pip install 'cvmc[convert]'")
onnx = pytest.importorskip("onnx")

from onnx import TensorProto, helper, numpy_helper

from cvmc.frontend.onnx_convert import convert_onnx


def _clip_model(low, high):
    """y = Clip(x, low, high) with constant bounds (None: the bound left out)."""
    inits = {k: np.array(v, np.float32) for k, v in (("lo", low), ("hi", high)) if v is not None}
    node = helper.make_node("Clip", ["x", "lo" if low is not None else "",
                                     "hi" if high is not None else ""], ["y"], name="/act/Clip")
    graph = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 5])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 5])],
        [numpy_helper.from_array(v, k) for k, v in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model


@pytest.mark.parametrize("low, high", [(-np.inf, 6.0), (0.0, np.inf), (-np.inf, np.inf),
                                       (None, None), (-1.5, 2.0)])
def test_clip_with_infinite_bounds_converts(tmp_path, low, high):
    """A bound of -inf (min) or +inf (max) bounds nothing: NumPy's clip of the same
    values, and the NNEF text holds no bare `inf`."""
    onnx.save(_clip_model(low, high), tmp_path / "m.onnx")
    folder = convert_onnx(tmp_path / "m.onnx", tmp_path / "nnef")
    assert "inf" not in (folder / "graph.nnef").read_text()
    x = np.array([[-1e30, -2.0, 0.5, 3.0, 1e30]], np.float32)
    want = np.clip(x, -np.inf if low is None else low, np.inf if high is None else high)
    np.testing.assert_array_equal(reference_run(load_graph(folder), {"x": x})["y"], want)


@pytest.mark.parametrize("low, high, bound", [(np.inf, 1.0, "min is inf"),
                                              (0.0, -np.inf, "max is -inf")])
def test_clip_with_a_bound_infinite_the_other_way_is_refused(tmp_path, low, high, bound):
    onnx.save(_clip_model(low, high), tmp_path / "m.onnx")
    with pytest.raises(CvmcError, match=f"Clip '/act/Clip': its {bound}, an infinite bound"):
        convert_onnx(tmp_path / "m.onnx", tmp_path / "nnef")


def test_calibration_samples_in_either_form(tmp_path, capsys):
    """[N, 1, 1, 12, 12] and [N, 1, 12, 12] samples of a [1, 1, 12, 12] input calibrate
    the same model, from ONNX and from NNEF; a third shape is refused before the model is
    converted, naming the input, both forms and the shape given."""
    from tests.quantize.onnx_nets import conv_bn_net
    onnx.save(conv_bn_net(), tmp_path / "net.onnx")
    rows = np.random.default_rng(5).standard_normal((6, 1, 12, 12)).astype(np.float32)
    np.save(tmp_path / "rows.npy", rows)
    np.save(tmp_path / "whole.npy", rows[:, None])
    assert main(["convert", str(tmp_path / "net.onnx"), "-o", str(tmp_path / "float")]) == 0
    made = {}
    for model in ("net.onnx", "float"):
        for form in ("rows", "whole"):
            out = tmp_path / f"q-{model}-{form}"
            assert main(["quantize", str(tmp_path / model), "-o", str(out), "--calib",
                         f"x={tmp_path / form}.npy"]) == 0
            made[model, form] = [(out / f).read_text() for f in ("graph.nnef",
                                                                  "quantization.json")]
    assert len({tuple(v) for v in made.values()}) == 1
    np.save(tmp_path / "bad.npy", rows[:, :, :6])
    capsys.readouterr()
    assert main(["quantize", str(tmp_path / "net.onnx"), "-o", str(tmp_path / "q-bad"),
                 "--calib", f"x={tmp_path / 'bad.npy'}"]) == 1
    assert capsys.readouterr().err == ("error: --calib x: expected samples of shape [N, 1, 1, "
                                       "12, 12] with real values, got [6, 1, 6, 12] float32 "
                                       "(the batch of 1 may be left out: [N, 1, 12, 12])\n")


def test_progress_on_a_terminal_only(tmp_path, capsys, monkeypatch):
    """On a terminal, quantize shows compile's bars: conversion, calibration and the report
    each count their samples; in a pipe (the tests' captured output) nothing of them."""
    import io

    from rich.console import Console

    from tests.quantize.onnx_nets import conv_bn_net
    onnx.save(conv_bn_net(), tmp_path / "net.onnx")
    np.save(tmp_path / "x.npy", np.random.default_rng(5).standard_normal((6, 1, 12, 12))
            .astype(np.float32))
    argv = ["quantize", str(tmp_path / "net.onnx"), "--calib", f"x={tmp_path / 'x.npy'}",
            "--samples", "5", "--report-json", str(tmp_path / "r.json")]
    capsys.readouterr()
    assert main([*argv, "-o", str(tmp_path / "q1")]) == 0
    piped = capsys.readouterr().out
    assert "5/5" not in piped and "quantized" in piped
    screen = io.StringIO()
    monkeypatch.setattr("cvmc.cli.quantize.console",
                        Console(file=screen, force_terminal=True, width=120))
    assert main([*argv, "-o", str(tmp_path / "q2")]) == 0
    shown = screen.getvalue()
    for stage in ("convert", "quantize", "report"):
        assert stage in shown
    assert shown.count("5/5") >= 2  # calibration's and the report's bars, complete


def test_saturation_counts_hand_computed():
    """quantize clips |round(x s)| > 2^(p-1) - 1, i.e. |x s| >= 127.5 at 8 bits (halves
    away from zero); an output value at +-127 is at the end of its range."""
    from cvmc_runtime import Saturation
    s = Saturation()
    s.count_input("x", np.array([12.74, 12.75, -12.75, -12.7, np.inf]), 10.0, 8)
    s.count_output("y", np.array([[127, -127, 126, 0]], np.int32), 8)
    s.count_output("y", np.array([[-127, 5, 5, 5]], np.int32), 8)
    assert s.inputs == {"x": [3, 5]} and s.outputs == {"y": [3, 8]}
    assert s.message().startswith("saturated: 3 of 5 values of input 'x' beyond its "
                                  "calibrated range; 3 of 8 values of output 'y' at the "
                                  "ends of its integer range")
    assert Saturation().message() is None


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    """conv_bn_net quantized with 8-bit outputs and with --output-bits 10+2, compiled."""
    from tests.quantize.onnx_nets import conv_bn_net
    tmp = tmp_path_factory.mktemp("saturation")
    onnx.save(conv_bn_net(), tmp / "net.onnx")
    x = np.random.default_rng(7).standard_normal((8, 1, 1, 12, 12)).astype(np.float32)
    np.save(tmp / "x.npy", x)
    for name, bits in (("q", "8"), ("wide", "10+2")):
        assert main(["quantize", str(tmp / "net.onnx"), "-o", str(tmp / name), "--calib",
                     f"x={tmp / 'x.npy'}", "--output-bits", bits]) == 0
        assert main(["compile", str(tmp / name), "-o", str(tmp / f"{name}.cvmx")]) == 0
    return tmp, x


def test_model_run_warns_once_with_the_counts(compiled):
    import json
    import warnings

    import cvmc_runtime
    tmp, x = compiled
    scale = json.loads((tmp / "q" / "quantization.json").read_text())["inputs"]["x"]["scale"]
    model = cvmc_runtime.load(tmp / "q.cvmx")
    big = 4 * x[0]
    with pytest.warns(cvmc_runtime.SaturationWarning) as caught:
        out = model.run({"x": big})["logits"]
    clipped_in = int(np.count_nonzero(np.abs(big.astype(np.float64) * scale) >= 127.5))
    clipped_out = int(np.count_nonzero(np.abs(out) == 127))
    assert clipped_in > 0 and len(caught) == 1
    assert str(caught[0].message).startswith(
        f"saturated: {clipped_in} of 144 values of input 'x' beyond its calibrated range"
        + (f"; {clipped_out} of 10 values of output 'logits'" if clipped_out else " ("))
    assert model.saturation.inputs == {"x": [clipped_in, 144]}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        model.run({"x": np.zeros_like(big)})
    assert model.saturation.inputs == {"x": [0, 144]}


def test_output_bits_add_range(compiled):
    """--output-bits 10+2: the outputs' threshold is 4 times the calibrated absmax, so the
    scale is 511 / (4 absmax) against 8 bits' 127 / absmax, and the calibration samples
    reach at most a quarter of the 10-bit range (plus rounding)."""
    import json

    import cvmc_runtime
    tmp, x = compiled
    scales = {name: json.loads((tmp / name / "quantization.json").read_text())
              ["outputs"]["logits"]["scale"] for name in ("q", "wide")}
    assert scales["wide"] == pytest.approx(scales["q"] * 511 / (4 * 127), rel=1e-9)
    model = cvmc_runtime.load(tmp / "wide.cvmx")
    peak = max(int(np.abs(model.run({"x": s})["logits"]).max()) for s in x)
    assert 120 <= peak <= 129


def test_run_and_eval_print_one_warning_line(compiled, capsys):
    tmp, x = compiled
    np.save(tmp / "big.npy", 4 * x[0])
    np.save(tmp / "big_rows.npy", 4 * x[:, 0])
    capsys.readouterr()
    assert main(["run", str(tmp / "q.cvmx"), "--input", f"x={tmp / 'big.npy'}"]) == 0
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("warning: saturated: ")
    assert main(["eval", str(tmp / "q.cvmx"), "--data", str(tmp / "big_rows.npy"),
                 "--compare", str(tmp / "wide.cvmx")]) == 0
    err = capsys.readouterr().err.splitlines()
    # one line per artifact, over all 8 samples (input values: 8 * 144)
    assert len(err) == 2 and all(" of 1152 values of input 'x'" in e for e in err)


@pytest.mark.parametrize("bits", ["1", "17", "8+7", "8+", "x"])
def test_output_bits_shape_is_checked(bits, capsys):
    with pytest.raises(SystemExit):
        main(["quantize", "m.onnx", "-o", "q", "--output-bits", bits])
    assert f"expected B or B+R with 2 <= B <= 16 and 0 <= R <= B - 2, got '{bits}'" in \
        capsys.readouterr().err


def _named_net():
    """conv / relu / sigmoid / flatten / gemm with PyTorch-style node and weight names."""
    r = np.random.default_rng(0)
    inits = {"layer1.conv1.weight": r.standard_normal((4, 1, 3, 3)),
             "layer1.conv1.bias": r.standard_normal(4), "fc.weight": r.standard_normal((3, 144))}
    nodes = [helper.make_node("Conv", ["input", "layer1.conv1.weight", "layer1.conv1.bias"],
                              ["/layer1/conv1/Conv_output_0"], name="/layer1/conv1/Conv",
                              pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["/layer1/conv1/Conv_output_0"], ["/layer1/relu/Relu_o"],
                              name="/layer1/relu/Relu"),
             helper.make_node("Sigmoid", ["/layer1/relu/Relu_o"], ["/act/Sigmoid_o"],
                              name="/act/Sigmoid"),
             helper.make_node("Flatten", ["/act/Sigmoid_o"], ["/Flatten_o"], name="/Flatten"),
             helper.make_node("Gemm", ["/Flatten_o", "fc.weight"], ["output"], name="/fc/Gemm",
                              transB=1)]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, 1, 6, 6])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, [1, 3])],
        [numpy_helper.from_array(v.astype(np.float32), k) for k, v in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model


def test_converter_records_each_tensor_onnx_origin(tmp_path):
    """Every converted op carries its ONNX node's name; weights map to their initializers."""
    onnx.save(_named_net(), tmp_path / "m.onnx")
    origins = {}
    folder = convert_onnx(tmp_path / "m.onnx", tmp_path / "nnef", origins=origins)
    text = (folder / "graph.nnef").read_text()
    defined = {line.split("=")[0].strip(): line for line in text.splitlines() if " = " in line}
    conv = next(n for n, line in defined.items() if "= conv(" in line)
    sig = next(n for n, line in defined.items() if "= sigmoid(" in line)
    assert origins[conv] == "/layer1/conv1/Conv" and origins[sig] == "/act/Sigmoid"
    assert origins["output"] == "/fc/Gemm"
    weights = {origins[n] for n, line in defined.items() if "= variable<" in line}
    assert weights == {"layer1.conv1.weight", "layer1.conv1.bias", "fc.weight"}


def test_report_and_folder_name_the_onnx_nodes(tmp_path, capsys, monkeypatch):
    import json

    from cvmc.cli.common import console
    # the table's rows whole, as a pipe prints them (a test run may set COLUMNS)
    monkeypatch.setattr(console, "width", 10_000)
    onnx.save(_named_net(), tmp_path / "m.onnx")
    np.save(tmp_path / "x.npy", np.random.default_rng(1).standard_normal((4, 1, 6, 6))
            .astype(np.float32))
    capsys.readouterr()
    assert main(["quantize", str(tmp_path / "m.onnx"), "-o", str(tmp_path / "q"), "--calib",
                 f"input={tmp_path / 'x.npy'}", "--report", "--report-json",
                 str(tmp_path / "r.json")]) == 0
    out = capsys.readouterr().out
    rows = json.loads((tmp_path / "r.json").read_text())["layers"]
    by_node = {r["onnx_node"]: r for r in rows}
    assert {"/layer1/conv1/Conv", "/act/Sigmoid", "/fc/Gemm"} <= set(by_node)
    for node, r in by_node.items():
        assert any(node in line and r["layer"] in line for line in out.splitlines())
    nodes = json.loads((tmp_path / "q" / "onnx_nodes.json").read_text())
    assert nodes["output"] == "/fc/Gemm" and nodes[by_node["/act/Sigmoid"]["layer"]] == \
        "/act/Sigmoid"


def test_an_error_names_the_onnx_node_not_the_deleted_folder(tmp_path, capsys):
    from tests.quantize.onnx_nets import div_net

    onnx.save(div_net("/head/Div"), tmp_path / "sq.onnx")
    np.save(tmp_path / "x.npy", np.ones((2, 3, 3), np.float32))
    capsys.readouterr()
    assert main(["quantize", str(tmp_path / "sq.onnx"), "-o", str(tmp_path / "q"),
                 "--calib", f"x={tmp_path}/x.npy"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: cvmc quantize: layer 'y' (div): ")
    assert err.endswith(" (ONNX node '/head/Div')\n") and "cvmc-quantize-" not in err


def test_calib_method_mse_through_the_command(tmp_path):
    """The input's scale is 127 / t for the t that mse chose: within 1% of the least
    squared error of the 256 candidates, each rounded exactly by NumPy (the oracle)."""
    import json

    from tests.quantize.onnx_nets import conv_bn_net
    onnx.save(conv_bn_net(), tmp_path / "net.onnx")
    x = np.random.default_rng(9).standard_t(2, (8, 1, 1, 12, 12)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    assert main(["quantize", str(tmp_path / "net.onnx"), "-o", str(tmp_path / "q"), "--calib",
                 f"x={tmp_path / 'x.npy'}", "--calib-method", "mse"]) == 0
    scale = json.loads((tmp_path / "q" / "quantization.json").read_text())["inputs"]["x"]["scale"]

    def error(t: float) -> float:
        q = np.clip(np.round(x / (t / 127)), -127, 127) * (t / 127)
        return float(np.square(x - q).sum())
    top = float(np.abs(x).max())
    best = min(error(top * k / 256) for k in range(1, 257))
    assert error(127 / scale) <= 1.01 * best < error(top)


def test_a_qdq_model_folder_names_its_onnx_nodes(tmp_path):
    """An ONNX QDQ model's float ops keep their node names: onnx_nodes.json maps the conv's
    output (the model output y) to its node."""
    import json

    r = np.random.default_rng(2)
    inits = {"xs": np.array(0.02, np.float32), "xz": np.array(0, np.int8),
             "w": r.integers(-127, 128, (2, 1, 3, 3)).astype(np.int8),
             "ws": np.array(0.01, np.float32), "wz": np.array(0, np.int8),
             "ys": np.array(0.05, np.float32), "yz": np.array(0, np.int8)}
    nodes = [helper.make_node("QuantizeLinear", ["x", "xs", "xz"], ["xq"], name="/in/Q"),
             helper.make_node("DequantizeLinear", ["xq", "xs", "xz"], ["xd"], name="/in/DQ"),
             helper.make_node("DequantizeLinear", ["w", "ws", "wz"], ["wd"], name="/w/DQ"),
             helper.make_node("Conv", ["xd", "wd"], ["c"], name="/body/conv/Conv",
                              pads=[1, 1, 1, 1]),
             helper.make_node("QuantizeLinear", ["c", "ys", "yz"], ["cq"], name="/out/Q"),
             helper.make_node("DequantizeLinear", ["cq", "ys", "yz"], ["y"], name="/out/DQ")]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 6, 6])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2, 6, 6])],
        [numpy_helper.from_array(v, k) for k, v in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.save(model, tmp_path / "qdq.onnx")
    assert main(["quantize", str(tmp_path / "qdq.onnx"), "-o", str(tmp_path / "q")]) == 0
    nodes = json.loads((tmp_path / "q" / "onnx_nodes.json").read_text())
    assert nodes["y"] == "/body/conv/Conv"

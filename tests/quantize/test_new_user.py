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

"""`cvmc quantize` on the layers real networks hold, each a small float ONNX model built
with onnx.helper: an unrolled LSTM and GRU (split, sigmoid and tanh gates, products of
activations).

Oracle: ONNX Runtime's float run of the same model; each case states its bound (output
SQNR in dB over the calibration samples). The integer model's llvm build computes the
reference interpreter's bits.
"""
from __future__ import annotations

import json

import numpy as np
import pytest
from cvmc_runtime import dequantize, quantize

from cvmc import load_graph, reference_run
from cvmc.cli import main

pytest.importorskip("nnef_tools", reason="needs the convert extra: pip install 'cvmc[convert]'")
onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

from onnx import TensorProto, helper

from tests.frontend.test_onnx_coverage import B, I, S, _rnn


def _sqnr(want: np.ndarray, got: np.ndarray) -> float:
    return 10 * np.log10(np.square(want).sum() / np.square(got - want).sum())


def quantized_sqnr(tmp, model, samples: np.ndarray, compiled: int = 3) -> float:
    """The output SQNR (dB) of `cvmc quantize` of a one-input, one-output ONNX model against
    ONNX Runtime's float run over `samples` ([N, *input shape], also the calibration
    set); the first `compiled` samples run on the llvm build too, bit-exact with the
    reference interpreter."""
    import cvmc_runtime

    import cvmc
    onnx.save(model, tmp / "m.onnx")
    np.save(tmp / "x.npy", samples)
    assert main(["quantize", str(tmp / "m.onnx"), "-o", str(tmp / "q"), "--calib",
                 f"x={tmp / 'x.npy'}"]) == 0
    graph = load_graph(tmp / "q")
    manifest = json.loads((tmp / "q" / "quantization.json").read_text())
    (out,) = graph.outputs
    session = ort.InferenceSession(str(tmp / "m.onnx"), providers=["CPUExecutionProvider"])
    ints = [quantize("x", x, manifest["inputs"]["x"]["scale"], 8).astype(np.int8)
            for x in samples]
    got = np.array([dequantize(reference_run(graph, {"x": xi})[out],
                               manifest["outputs"][out]["scale"]) for xi in ints])
    want = np.array([session.run(None, {"x": x})[0] for x in samples], np.float64)
    if compiled:
        cvmc.compile(graph, str(tmp / "q.cvmx"), target="llvm")
        built = cvmc_runtime.load(str(tmp / "q.cvmx"))
        for xi in ints[:compiled]:
            assert np.array_equal(built.run({"x": xi})[out], reference_run(graph, {"x": xi})[out])
    return _sqnr(want, got.reshape(want.shape))


@pytest.mark.parametrize("op", ["LSTM", "GRU"])
def test_recurrent_layers_unrolled_by_the_converter(tmp_path, op):
    """A bidirectional LSTM / GRU whose Y feeds a relu: the converter's unrolling into
    split, matmuls, sigmoid and tanh gates, and products of two activations; 32.6 / 35.0 dB
    measured."""
    model = _rnn(op, "bidirectional", initial=False, outputs=("Y",))
    model.graph.node.append(helper.make_node("Relu", ["Y"], ["r"]))
    del model.graph.output[0]
    model.graph.output.append(helper.make_tensor_value_info("r", TensorProto.FLOAT, None))
    samples = np.random.default_rng(4).standard_normal((16, S, B, I)).astype(np.float32)
    assert quantized_sqnr(tmp_path, model, samples) >= 25

"""Transformers as PyTorch exports them (`tests/torch_exports.py`: a 2-layer
`nn.TransformerEncoder` and a ViT, opsets 16 and 17, static and dynamic batch), converted
as exported: cvmc folds their shape computations itself.

Oracle: ONNX Runtime on the same model. Bounds as in `test_onnx_coverage.py`: float32 end
to end, a few ULPs per op (docs/float.md), outputs of magnitude 0.3 to 1.
"""
from __future__ import annotations

import os

import numpy as np
import pytest

if os.environ.get("CI"):  # CI installs the dev extra, which has the convert extra: run them
    import nnef_tools  # noqa: F401
pytest.importorskip("nnef_tools", reason="needs the convert extra: pip install 'cvmc[convert]'")
onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

from cvmc.frontend import load_graph
from cvmc.frontend.onnx_convert import convert_onnx
from tests.torch_exports import encoder, vit

RTOL, ATOL = 1e-4, 1e-5


def _check(tmp_path, model, shape, input_shapes=None, compile=False):
    """Convert `model`; its reference run (and compiled run) on data of `shape` matches
    ONNX Runtime."""
    import cvmc

    onnx.save(model, tmp_path / "m.onnx")
    feeds = {"data": np.random.default_rng(0).standard_normal(shape).astype(np.float32)}
    session = ort.InferenceSession(str(tmp_path / "m.onnx"), providers=["CPUExecutionProvider"])
    want = session.run(None, feeds)[0]
    graph = load_graph(convert_onnx(tmp_path / "m.onnx", tmp_path / "nnef",
                                    input_shapes=input_shapes))
    runs = {"reference": cvmc.reference_run(graph, feeds)["out"]}
    if compile:
        import cvmc_runtime
        cvmc.compile(graph, tmp_path / "m.cvmx", target="llvm")
        runs["compiled"] = cvmc_runtime.load(tmp_path / "m.cvmx").run(feeds)["out"]
    for how, got in runs.items():
        np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL, err_msg=how)


@pytest.mark.parametrize("opset", [16, 17])
def test_encoder_as_exported(tmp_path, opset):
    _check(tmp_path, encoder(opset), [1, 8, 32], compile=opset == 17)


@pytest.mark.parametrize("opset", [16, 17])
def test_vit_as_exported(tmp_path, opset):
    _check(tmp_path, vit(opset), [1, 3, 16, 16], compile=opset == 16)


def test_encoder_with_a_dynamic_batch(tmp_path):
    _check(tmp_path, encoder(16, dynamic=True), [3, 8, 32], {"data": [3, 8, 32]})


def test_vit_with_a_dynamic_batch(tmp_path):
    _check(tmp_path, vit(17, dynamic=True), [2, 3, 16, 16], {"data": [2, 3, 16, 16]})

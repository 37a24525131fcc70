"""ONNX files as `torch.onnx.export` writes them (tests/data/torch_exports, made by its
make.py with torch 2.11): no simplifier, so the shape computations (Shape -> Gather ->
Concat -> Reshape), Identity and Constant nodes are the converter's to fold.

Oracle: ONNX Runtime on the same file. Bounds as in test_onnx_coverage.py: float32 end to
end, a few ULPs per op.
"""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

import cvmc
from cvmc.errors import CvmcError
from cvmc.frontend import load_graph

if os.environ.get("CI"):  # CI installs the dev extra, which has the convert extra: run them
    import nnef_tools  # noqa: F401
pytest.importorskip("nnef_tools", reason="needs the convert extra: pip install 'cvmc[convert]'")
ort = pytest.importorskip("onnxruntime")

from cvmc.frontend.onnx_convert import convert_onnx

EXPORTS = Path(__file__).resolve().parents[1] / "data" / "torch_exports"
RTOL, ATOL = 1e-4, 1e-5
SHAPES = {"encoder": (1, 16, 32), "encoder_op16": (1, 16, 32), "vit": (1, 3, 32, 32),
          "small_cnn": (1, 3, 16, 16), "flatten_cnn": (1, 3, 16, 16), "crnn": (1, 1, 8, 20)}
COMPILED = ("encoder", "vit", "flatten_cnn")  # crnn's unrolled LSTM: the reference only


def _ort(name: str, x: np.ndarray) -> np.ndarray:
    session = ort.InferenceSession(str(EXPORTS / f"{name}.onnx"),
                                   providers=["CPUExecutionProvider"])
    return session.run(None, {"x": x})[0]


def _x(shape) -> np.ndarray:
    return np.random.default_rng(0).standard_normal(shape).astype(np.float32)


@pytest.mark.parametrize("name", sorted(SHAPES))
def test_a_torch_export_converts_as_exported(tmp_path, name):
    x = _x(SHAPES[name])
    want = _ort(name, x)
    graph = load_graph(convert_onnx(EXPORTS / f"{name}.onnx", tmp_path / "nnef"))
    runs = {"reference": cvmc.reference_run(graph, {"x": x})["y"]}
    if name in COMPILED:
        import cvmc_runtime
        cvmc.compile(graph, tmp_path / "m.cvmx", target="llvm")
        runs["compiled"] = cvmc_runtime.load(tmp_path / "m.cvmx").run({"x": x})["y"]
    for how, got in runs.items():
        np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL, err_msg=how)


@pytest.mark.parametrize("name, batch", [("flatten_cnn", 4), ("encoder_dynamic", 3)])
def test_the_batch_changes_where_the_graph_allows_it(tmp_path, name, batch):
    # flatten_cnn: exported at batch 1, its Flatten takes any batch; encoder_dynamic:
    # exported with a dynamic batch axis. Samples are independent, so ORT's run of each
    # alone is the oracle.
    shape = (batch, *SHAPES["encoder" if name == "encoder_dynamic" else name][1:])
    x = _x(shape)
    want = np.concatenate([_ort(name, x[i:i + 1]) for i in range(batch)])
    graph = load_graph(convert_onnx(EXPORTS / f"{name}.onnx", tmp_path / "nnef",
                                    input_shapes={"x": list(shape)}))
    np.testing.assert_allclose(cvmc.reference_run(graph, {"x": x})["y"], want,
                               rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("name, node", [("small_cnn", "'/Reshape'"),
                                        ("encoder", "self_attn/Reshape")])
def test_a_batch_pinned_by_a_traced_reshape_is_named(tmp_path, name, node):
    # x.view(x.size(0), -1) traced at batch 1 is Reshape(x, [1, -1]); the attention's
    # view(len, bsz * heads, dim) likewise keeps bsz = 1: a new batch cannot fit
    shape = [4, *SHAPES[name][1:]]
    with pytest.raises(CvmcError, match=f"batch 1 cannot be changed to 4: Reshape .*{node}"):
        convert_onnx(EXPORTS / f"{name}.onnx", tmp_path / "nnef", input_shapes={"x": shape})

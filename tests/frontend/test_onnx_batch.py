"""A new batch for a model exported with a fixed one (`--input-shape data=4,...` of a
[1, ...] model): converted where the graph carries the batch, refused naming the node
where the graph pins it.

Oracle: ONNX Runtime on the model as exported, one sample at a time (it runs a fixed-batch
model at its own batch only); the batch's outputs are those samples' outputs stacked.
"""
from __future__ import annotations

import os
import re

import numpy as np
import pytest

if os.environ.get("CI"):  # CI installs the dev extra, which has the convert extra: run them
    import nnef_tools  # noqa: F401
pytest.importorskip("nnef_tools", reason="needs the convert extra: pip install 'cvmc[convert]'")
onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

from onnx import TensorProto, helper, numpy_helper

from cvmc.cli import main
from cvmc.errors import CvmcError
from cvmc.frontend import load_graph
from cvmc.frontend.onnx_convert import convert_onnx
from tests.onnx_models import cnn, shapes
from tests.torch_exports import encoder, vit


def _convert(tmp_path, model, input_shapes):
    onnx.save(model, tmp_path / "m.onnx")
    return convert_onnx(tmp_path / "m.onnx", tmp_path / "nnef", input_shapes=input_shapes)


def test_a_batch_the_graph_carries_changes(tmp_path, capsys):
    """A CNN exported at batch 1 (conv, batch norm, pools, Flatten, Gemm, Softmax), run at 4
    on the reference interpreter and compiled."""
    import cvmc_runtime

    import cvmc

    model = cnn()
    onnx.save(model, tmp_path / "m.onnx")
    assert main(["convert", str(tmp_path / "m.onnx"), "-o", str(tmp_path / "nnef"),
                 "--input-shape", "data=4,3,16,16"]) == 0
    assert "inputs data [4, 3, 16, 16]; outputs prob [4, 10]" in capsys.readouterr().out
    x = np.random.default_rng(0).standard_normal([4, 3, 16, 16]).astype(np.float32)
    session = ort.InferenceSession(str(tmp_path / "m.onnx"), providers=["CPUExecutionProvider"])
    want = np.concatenate([session.run(None, {"data": x[i:i + 1]})[0] for i in range(4)])
    graph = load_graph(tmp_path / "nnef")
    cvmc.compile(graph, tmp_path / "m.cvmx", target="llvm")
    for how, got in (("reference", cvmc.reference_run(graph, {"data": x})["prob"]),
                     ("compiled", cvmc_runtime.load(tmp_path / "m.cvmx").run({"data": x})["prob"])):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6, err_msg=how)


@pytest.mark.parametrize("build, shape", [(encoder, [3, 8, 32]), (vit, [2, 3, 16, 16])])
def test_reshapes_computed_from_shapes_carry_the_batch(tmp_path, build, shape):
    """A dynamic-batch export whose batch a tool fixed to 1 afterwards: its attention
    reshapes merge the batch into dimension 0 (`[S, B, H, D] -> [S * B, E]`) by shapes
    computed from Shape, which follow the data; the new batch converts."""
    import cvmc

    model = build(16, dynamic=True)
    onnx.save(model, tmp_path / "dynamic.onnx")
    model.graph.input[0].type.tensor_type.shape.dim[0].dim_value = 1
    model.graph.output[0].type.tensor_type.shape.dim[0].dim_value = 1
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    session = ort.InferenceSession(str(tmp_path / "dynamic.onnx"),
                                   providers=["CPUExecutionProvider"])
    want = session.run(None, {"data": x})[0]
    got = cvmc.reference_run(load_graph(_convert(tmp_path, model, {"data": shape})),
                             {"data": x})["out"]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def _view_one(width=12):
    """`x.view(1, -1)` of a [1, 3, 4] input, then a Relu: the Reshape hard-codes batch 1."""
    nodes = [helper.make_node("Reshape", ["x", "target"], ["flat"], name="view"),
             helper.make_node("Relu", ["flat"], ["y"], name="relu")]
    return helper.make_model(helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, width])],
        [numpy_helper.from_array(np.array([1, -1], np.int64), "target")]),
        opset_imports=[helper.make_opsetid("", 13)])


def _class_token():
    """A constant [1, 1, 4] token concatenated in front of the [1, 2, 4] input."""
    token = numpy_helper.from_array(np.ones([1, 1, 4], np.float32), "token")
    nodes = [helper.make_node("Concat", ["token", "x"], ["y"], name="cat", axis=1)]
    return helper.make_model(helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3, 4])], [token]),
        opset_imports=[helper.make_opsetid("", 13)])


@pytest.mark.parametrize("build, shape, message", [
    (shapes, {"x": [2, 4, 4, 4]},
     ("--input-shape x: the model's batch 1 cannot be changed to 2: Reshape 'rows' pins it "
     "(its input 'nhwc' [1, 16, 16, 8] becomes [2, 16, 16, 8], its output 'rows' stays "
     "[1, 256, 8]); export the model with a dynamic batch")),
    (_view_one, {"x": [3, 3, 4]},
     ("Reshape 'view' pins it (its input 'x' [1, 3, 4] becomes [3, 3, 4], its output 'flat' "
     "becomes [1, 36] with the batch moved out of dimension 0)")),
    (_class_token, {"x": [2, 2, 4]},
     ("--input-shape x: the model's batch 1 cannot be changed to 2: onnx shape inference "
     "fails at Concat 'cat': Can't merge shape info")),
    (encoder, {"data": [3, 8, 32]},
     ("Reshape '/layers.0/self_attn/Reshape_3' pins it (its input "
     "'/layers.0/self_attn/Gather_output_0' [8, 1, 32] becomes [8, 3, 32]")),
    (vit, {"data": [2, 3, 16, 16]},
     ("Reshape '/Reshape' pins it (its input '/conv_proj/Conv_output_0' [1, 32, 4, 4] becomes "
     "[2, 32, 4, 4], its output '/Reshape_output_0' stays [1, 32, 16])")),
])
def test_a_batch_the_graph_pins_is_refused_naming_the_node(tmp_path, build, shape, message):
    with pytest.raises(CvmcError, match=re.escape(message)) as e:
        _convert(tmp_path, build(), shape)
    assert "\n" not in str(e.value)


def test_only_the_batch_may_change(tmp_path):
    with pytest.raises(CvmcError, match=re.escape(
            "--input-shape data: [4, 3, 32, 32] does not fit the model's shape [1, 3, 16, 16] "
            "(only the batch, dimension 0, may change)")):
        _convert(tmp_path, cnn(), {"data": [4, 3, 32, 32]})

"""Who failed: a conversion error names the model's fault, NNEF-Tools' failure, or a bug in
cvmc's own converter code (`onnx_convert`, `onnx_rewrite`) at the node it was at; a bug in
cvmc is never reported as NNEF-Tools' failure."""
from __future__ import annotations

import os

import numpy as np
import pytest

if os.environ.get("CI"):  # CI installs the dev extra, which has the convert extra: run them
    import nnef_tools  # noqa: F401
pytest.importorskip("nnef_tools", reason="needs the convert extra: pip install 'cvmc[convert]'")
onnx = pytest.importorskip("onnx")

from onnx import TensorProto, helper, numpy_helper

from cvmc.cli import main
from cvmc.frontend import onnx_convert, onnx_rewrite


def _model(nodes, opset, inits=()):
    model = helper.make_model(helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], list(inits)),
        opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 7
    return model


def _softmax_of_unknown_rank(opset):
    """Softmax of x reshaped to its own shape, sliced to a length computed from x's values:
    onnx's shape inference cannot tell the rank, so NNEF-Tools' reader gives no shape."""
    def const(name, value, dtype=np.int64):
        return numpy_helper.from_array(np.array(value, dtype), name)
    nodes = [helper.make_node("ReduceMax", ["x"], ["top"], keepdims=0),
             helper.make_node("Abs", ["top"], ["size"]),
             helper.make_node("Add", ["size", "ten"], ["end_f"]),
             helper.make_node("Cast", ["end_f"], ["end0"], to=TensorProto.INT64),
             helper.make_node("Unsqueeze", ["end0"], ["end"], axes=[0]) if opset < 13 else
             helper.make_node("Unsqueeze", ["end0", "zero"], ["end"]),
             helper.make_node("Shape", ["x"], ["shape"]),
             helper.make_node("Slice", ["shape", "zero", "end"], ["dims"]),
             helper.make_node("Reshape", ["x", "dims"], ["r"]),
             helper.make_node("Softmax", ["r"], ["y"], name="attention_softmax", axis=2)]
    return _model(nodes, opset, [const("zero", [0]), const("ten", 10.0, np.float32)])


def _convert(tmp_path, model, capsys):
    """`cvmc convert` of `model`: its exit code and its one line of error."""
    onnx.save(model, tmp_path / "m.onnx")
    code = main(["convert", str(tmp_path / "m.onnx"), "-o", str(tmp_path / "nnef")])
    err = capsys.readouterr().err.strip()
    return code, err


@pytest.mark.parametrize("opset", [12, 13])
def test_softmax_of_an_unknown_shape_is_the_converters_dynamic_shape(tmp_path, capsys, opset):
    """The input's shape is unknown (not None-subscripted by cvmc): NNEF-Tools refuses the
    dynamic shape, without advice about options cvmc does not have."""
    code, err = _convert(tmp_path, _softmax_of_unknown_rank(opset), capsys)
    assert code == 1
    assert "NNEF-Tools cannot convert this model: Input graph contains tensors with dynamic " \
           "shape: 'dims', 'r' (their shapes depend on values known only when the model runs" \
           in err
    assert len(err.splitlines()) == 1
    assert "--fold-constants" not in err and "TypeError" not in err and "Traceback" not in err


def _broken(*args):
    raise TypeError("'NoneType' object is not subscriptable")


@pytest.mark.parametrize("module, function, model, node", [
    (onnx_convert, "_softmax_axis",
     _model([helper.make_node("Softmax", ["x"], ["y"], name="sm", axis=-1)], 13),
     "Softmax 'sm'"),
    (onnx_rewrite, "_hard_sigmoid",
     _model([helper.make_node("HardSigmoid", ["x"], ["y"], name="hs")], 13), "HardSigmoid 'hs'"),
    (onnx_rewrite, "_evaluate",
     _model([helper.make_node("Shape", ["x"], ["s"], name="shape"),
             helper.make_node("Cast", ["s"], ["c"], name="cast", to=TensorProto.INT64),
             helper.make_node("Reshape", ["x", "c"], ["y"], name="reshape")], 13),
     "Cast 'cast'"),
])
def test_a_bug_in_cvmcs_converter_code_is_an_internal_error_naming_the_node(
        tmp_path, capsys, monkeypatch, module, function, model, node):
    """A crash in cvmc's own code (simulated) is told as cvmc's bug at the node, exit 1, one
    line, never as NNEF-Tools' failure or the model's."""
    monkeypatch.setattr(module, function, _broken)
    code, err = _convert(tmp_path, model, capsys)
    assert code == 1
    assert f"{node}: internal error in cvmc's ONNX converter (TypeError: 'NoneType' object " \
           f"is not subscriptable); this is a bug in cvmc" in err
    assert "NNEF-Tools" not in err and len(err.splitlines()) == 1

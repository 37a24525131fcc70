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

"""A Graph is typed: every loader returns one (`retype`), `verify` checks it against the op
rules, and a pass that changes nodes without retyping is caught."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from cvmc import GraphBuilder
from cvmc.errors import CvmcError
from cvmc.frontend import load_checked, load_graph
from cvmc.frontend.nnef import parse_nnef
from cvmc.frontend.tensorfile import write_tensor
from cvmc.ir import Graph, InvalidGraph, Node, TensorType
from cvmc.ops.infer import require_typed, retype, verify
from cvmc.passes import pipeline

# x (precision 8) + w (data [3, -100]: 8 bits), then a shift: the precisions by hand are
# elemwise_add max(8, 8) + 1 = 9, and cvm_right_shift's result has its attribute's, 7.
NNEF = """version 1.0;
graph G( x ) -> ( y )
{
    x = external<integer>(shape = [2], precision = 8);
    w = variable<integer>(shape = [2], label = 'w');
    s = elemwise_add(x, w);
    y = cvm_right_shift(s, shift_bit = 2, precision = 7);
}
"""
W = np.array([3, -100], np.int32)
HAND = {"x": TensorType((2,), "int8", 8), "w": TensorType((2,), "int8", 8),
        "s": TensorType((2,), "int32", 9), "y": TensorType((2,), "int8", 7)}


def _folder(tmp_path: Path, data: bool = True, text: str = NNEF) -> Path:
    (tmp_path / "graph.nnef").write_text(text)
    if data:
        write_tensor(tmp_path / "w.dat", W)
    return tmp_path


def test_nnef_loader_returns_a_typed_graph(tmp_path: Path) -> None:
    g = load_graph(_folder(tmp_path))
    verify(g)
    assert g.typed and g.types == HAND


def test_a_graph_without_weight_data_keeps_unknown_precisions(tmp_path: Path) -> None:
    """Without w.dat the weight's precision (from its values) is unknown, and so is every
    one downstream: checked, not typed; compile and run refuse it at the weight."""
    with pytest.warns(UserWarning, match="leave precisions uninferred"):
        g = load_checked(_folder(tmp_path, data=False), need_data=False)
    verify(g)
    assert not g.typed and g.types["s"] == TensorType((2,), "int32", None)
    with pytest.raises(CvmcError, match="weight 'w': its data file 'w.dat' was not found"):
        require_typed(g)
    with pytest.raises(CvmcError, match="weight 'w': its data file 'w.dat' was not found"):
        load_checked(tmp_path)


def test_a_declared_precision_types_a_graph_without_weight_data(tmp_path: Path) -> None:
    text = NNEF.replace("label = 'w'", "label = 'w', precision = 8")
    with pytest.warns(UserWarning, match="checked structure, shapes and types only;"):
        g = load_checked(_folder(tmp_path, data=False, text=text), need_data=False)
    verify(g)
    assert g.typed and g.types == HAND


def test_cvm_json_loader_returns_a_typed_graph(tmp_path: Path) -> None:
    from tests.frontend.test_cvm_json import _dense_doc, _dense_params, _write

    g = load_graph(_write(tmp_path, _dense_doc(), _dense_params()))
    verify(g)
    # by hand (test_cvm_json): w 3 bits, b 4, dense max(8 + 3 + bitlen(3), 4) + 1 = 14
    assert g.typed and [g.types[v].precision for v in ("data", "w", "b", "fc")] == \
        [8, 3, 4, 14]


def test_builder_returns_a_typed_graph() -> None:
    b = GraphBuilder("g")
    x = b.input("x", [2], "int32", precision=8)
    y = b.cvm_right_shift(b.elemwise_add(x, b.constant(W, name="w"), name="s"), shift_bit=2,
                          precision=7, name="y")
    g = b.build([y])
    verify(g)
    assert g.typed and g.types == HAND


def test_onnx_conversion_returns_a_typed_graph(tmp_path: Path) -> None:
    pytest.importorskip("nnef_tools", reason="needs the convert extra")
    pytest.importorskip("onnx")
    from cvmc.frontend.onnx_convert import convert_onnx
    from tests.onnx_models import MODELS

    model = MODELS["mlp"]()
    (tmp_path / "m.onnx").write_bytes(model.SerializeToString())
    g = load_graph(convert_onnx(tmp_path / "m.onnx", tmp_path / "nnef"))
    verify(g)
    assert g.typed and g.types["y"] == TensorType((2, 4), "float32")  # the model declares it


def test_verify_catches_a_pass_that_forgets_to_retype(monkeypatch) -> None:
    """A pass that widens the shift's result (precision attribute 7 -> 9: 9 bits, int32)
    but keeps the old types fails `verify`; the pipeline runs it after every pass in the
    tests."""
    g = parse_nnef(NNEF, weights=None)
    g = retype(g.replace(constants={"w": W}))

    def widen_shift(graph: Graph) -> Graph:
        nodes = [Node(n.op, n.inputs, n.outputs, {**n.attrs, "precision": 9}, n.span)
                 if n.op == "cvm_right_shift" else n for n in graph.nodes]
        return graph.replace(nodes=nodes)

    with pytest.raises(InvalidGraph, match=r"types differ from the op rules' at \['y'\]"):
        verify(widen_shift(g))
    verify(retype(widen_shift(g)))
    assert retype(widen_shift(g)).types["y"] == TensorType((2,), "int32", 9)
    monkeypatch.setattr(pipeline, "VERIFY_TYPES", True)
    with pytest.raises(InvalidGraph, match="types differ"):
        pipeline.run_passes(g, [pipeline.Pass("widen", widen_shift)])


def test_graph_verify_needs_every_precision_of_a_typed_graph() -> None:
    g = retype(Graph("g", ["x"], ["y"], [Node("relu", ("x",), ("y",), {})],
                     {"x": TensorType((2,), "int32", 8), "y": TensorType((2,))}))
    g.verify()
    with pytest.raises(InvalidGraph, match="'y': integer tensor without a precision"):
        g.replace(types={**g.types, "y": TensorType((2,), "int8")}).verify()
    with pytest.raises(InvalidGraph, match="'y': precision 8 is stored as int8, not int32"):
        g.replace(types={**g.types, "y": TensorType((2,), "int32", 8)}).verify()
    with pytest.raises(InvalidGraph, match="types of values the graph does not define"):
        g.replace(types={**g.types, "gone": TensorType((2,), "int8", 8)}).verify()


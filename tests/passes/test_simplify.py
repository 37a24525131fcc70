"""Constant folding and dead-code elimination on small hand-built graphs."""
import numpy as np

from cvmc.ir import Graph, Node, TensorType
from cvmc.passes.pipeline import run_pipeline
from cvmc.passes.precision import infer_precision
from cvmc.passes.simplify import eliminate_dead_code, fold_constants


def graph():
    t = TensorType((3,), "int32", None)
    types = {n: t for n in ("x", "w", "a", "b", "dead")}
    types["x"] = TensorType((3,), "int32", 8)
    nodes = [Node("relu", ("w",), ("a",)), Node("relu", ("x",), ("b",)),
             Node("relu", ("x",), ("dead",))]
    return Graph("g", ["x"], ["a", "b"], nodes, types, {"w": np.array([-5, 0, 7])},
                 labels={"w": "w"})


def test_fold_constants_evaluates_weight_only_nodes():
    g = fold_constants(infer_precision(graph()))
    assert [n.name for n in g.nodes] == ["b", "dead"]
    assert np.array_equal(g.constants["a"], [0, 0, 7])  # relu by hand
    assert g.constants["a"].dtype == np.int8


def test_fold_constants_keeps_float_values():
    # 2.5 * 1.5 = 3.75 and 3.75 > 3.5 by hand (folding once read float weights as int64:
    # 2 * 1 = 2)
    t, b = TensorType((), "float32"), TensorType((), "bool")
    g = Graph("g", [], ["p", "q"], [Node("mul", ("a", "c"), ("p",)),
                                    Node("gt", ("p", "d"), ("q",))],
              {"a": t, "c": t, "d": t, "p": t, "q": b},
              {"a": np.float32(2.5), "c": np.float32(1.5), "d": np.float32(3.5)})
    g = fold_constants(infer_precision(g))
    assert not g.nodes
    assert g.constants["p"] == np.float32(3.75) and g.constants["p"].dtype == np.float32
    assert g.constants["q"] == np.True_


def test_dead_code_removes_unused_nodes_and_weights():
    g = eliminate_dead_code(fold_constants(infer_precision(graph())))
    assert [n.name for n in g.nodes] == ["b"]
    assert "dead" not in g.types and "w" not in g.constants and "w" not in g.labels
    assert g.inputs == ["x"]
    g.verify()


def test_pipeline_stop_after():
    g = run_pipeline(graph(), stop_after="infer-precision")
    assert len(g.nodes) == 3 and g.types["b"].precision == 8

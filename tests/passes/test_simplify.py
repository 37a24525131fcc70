"""Constant folding and dead-code elimination on small hand-built graphs."""
import numpy as np

from cvmc.ir import Graph, Node, TensorType
from cvmc.ops.infer import retype
from cvmc.passes.pipeline import run_pipeline
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
    g = fold_constants(retype(graph()))
    assert [n.name for n in g.nodes] == ["b", "dead"]
    assert np.array_equal(g.constants["a"], [0, 0, 7])  # relu by hand
    assert g.constants["a"].dtype == np.int8


def test_fold_constants_evaluates_nodes_without_inputs():
    t = TensorType((), "float32")
    g = Graph("g", [], ["c", "d"], [Node("cinn.const_scalar", (), ("c",), {"value": 0.1}),
                                    Node("cinn.const_scalar", (), ("d",), {"value": -3})],
              {"c": t, "d": TensorType((), "int32")})
    g = fold_constants(retype(g))
    assert not g.nodes
    assert g.constants["c"] == np.float32(0.1) and g.constants["c"].dtype == np.float32
    assert g.constants["d"] == -3 and g.constants["d"].dtype == np.int8  # precision 3


def test_dead_code_removes_unused_nodes_and_weights():
    g = eliminate_dead_code(fold_constants(retype(graph())))
    assert [n.name for n in g.nodes] == ["b"]
    assert "dead" not in g.types and "w" not in g.constants and "w" not in g.labels
    assert g.inputs == ["x"]
    g.verify()


def test_pipeline_stop_after():
    g = run_pipeline(retype(graph()), stop_after="infer-precision")
    assert len(g.nodes) == 3 and g.types["b"].precision == 8


def test_folding_a_float_subgraph_keeps_its_fraction():
    """Constant folding evaluates as the reference does (float64 rounded to float32): it
    once cast every constant operand to int64, so 0.75 * 2.5 folded to 0."""
    from cvmc.frontend.nnef import parse_nnef
    from cvmc.passes.simplify import fold_constants

    g = parse_nnef("version 1.0;\ngraph G(x) -> (y) { x = external(shape = [2]); "
                   "c = mul(0.75, 2.5); y = add(x, c); }")
    folded = fold_constants(retype(g))
    assert [n.op for n in folded.nodes] == ["add"]
    c = folded.constants["c"]
    assert c.dtype == np.float32 and c == np.float32(1.875)


def test_fold_constants_keeps_float_and_bool_weights():
    """Weight-only float nodes fold with the values the reference interpreter sees (float32
    as float64, rounded once; not truncated to integers) and bool results stay bool."""
    f = TensorType((2,), "float32")
    types = {"v": f, "e": TensorType((), "float32"), "s": f, "r": f, "c": TensorType((2,), "bool")}
    nodes = [Node("add", ("v", "e"), ("s",)), Node("pow", ("s", "e"), ("r",)),
             Node("gt", ("v", "s"), ("c",))]
    g = Graph("g", [], ["r", "c"], nodes, types,
              {"v": np.array([0.5, 2.25], np.float32), "e": np.array(0.25, np.float32)})
    g = fold_constants(retype(g))
    assert not g.nodes
    want = (np.array([0.5, 2.25]) + 0.25) ** 0.25  # float64, then rounded once
    assert g.constants["r"].dtype == np.float32
    assert np.array_equal(g.constants["r"], want.astype(np.float32))
    assert g.constants["c"].dtype == np.bool_ and not g.constants["c"].any()

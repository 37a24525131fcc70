"""The pattern-rewrite engine (`cvmc.ir.rewrite`): matching, bindings, the private-node
constraint, the typing editor, the frozen result; and `Graph.verify` as a real error."""
from __future__ import annotations

import dataclasses
import os
import subprocess
import sys

import pytest

from cvmc.ir import Graph, Node, TensorType
from cvmc.ir.rewrite import Editor, P, Rule, V, apply_rules, match
from cvmc.ops.infer import infer_node, retype, verify

I8 = TensorType((4,), "int8", 8)


def _graph(nodes: list[Node], outputs: list[str]) -> Graph:
    """Integer inputs x, z (8 bits) and `nodes`, typed by the op rules."""
    values = {o for n in nodes for o in n.outputs}
    types = {"x": I8, "z": I8, **{v: TensorType((4,)) for v in values}}
    return retype(Graph("g", ["x", "z"], outputs, nodes, types))


def _found(graph: Graph, pattern, node_name: str):
    return match(graph, pattern, graph.producers()[node_name])


def test_a_pattern_binds_nodes_and_values_either_way_round_with_commute():
    g = _graph([Node("relu", ("x",), ("r",)), Node("elemwise_add", ("z", "r"), ("s",))],
               ["s"])
    pattern = P("elemwise_add", P("relu", V("x"), name="relu"), V("other"), commute=True)
    m = _found(g, pattern, "s")
    assert m["x"] == "x" and m["other"] == "z" and m["relu"].name == "r"
    assert _found(g, dataclasses.replace(pattern, commute=False), "s") is None
    assert _found(g, P("elemwise_add", V(), V(), where=lambda e, n: n.inputs[0] == "x"),
                  "s") is None


def test_a_name_bound_twice_is_one_value():
    g = _graph([Node("elemwise_add", ("x", "x"), ("a",)),
                Node("elemwise_add", ("x", "z"), ("b",))], ["a", "b"])
    twice = P("elemwise_add", V("v"), V("v"))
    assert _found(g, twice, "a")["v"] == "x"
    assert _found(g, twice, "b") is None


def test_an_interior_node_read_outside_the_match_stops_it_unless_shared():
    nodes = [Node("relu", ("x",), ("r",)), Node("elemwise_add", ("r", "z"), ("s",)),
             Node("negative", ("r",), ("n",))]
    g = _graph(nodes, ["s", "n"])
    assert _found(g, P("elemwise_add", P("relu", V()), V()), "s") is None
    assert _found(g, P("elemwise_add", P("relu", V(), shared=True), V()), "s") is not None
    # a graph output is read outside too
    g = _graph(nodes[:2], ["s", "r"])
    assert _found(g, P("elemwise_add", P("relu", V()), V()), "s") is None


def test_a_rewrite_drops_the_private_nodes_and_types_what_it_inserts():
    """relu(relu(x)) -> cvm_clip(x, precision 4): the new node is typed as inserted
    (precision 4, int8), and so is the relu that reads its value, whose type changed from
    8 bits to 4 (cvm-semantics: relu keeps its input's precision)."""
    g = _graph([Node("relu", ("x",), ("a",)), Node("relu", ("a",), ("b",)),
                Node("relu", ("b",), ("c",))], ["c"])
    assert g.types["b"].precision == g.types["c"].precision == 8

    def clip(m, e: Editor) -> Node:
        return Node("cvm_clip", (m["x"],), m.root.outputs, {"precision": 4})

    out = apply_rules(g, [Rule(P("relu", P("relu", V("x")), where=lambda e, n: n.name == "b"),
                               clip)], infer_node)
    assert [(n.op, n.inputs, n.outputs) for n in out.nodes] == [
        ("cvm_clip", ("x",), ("b",)), ("relu", ("b",), ("c",))]
    assert out.types["b"] == out.types["c"] == TensorType((4,), "int8", 4)
    assert "a" not in out.types
    verify(out)  # the types are the ones the op rules give the whole graph
    assert [n.op for n in g.nodes] == ["relu"] * 3 and g.types["c"].precision == 8


def test_inserted_nodes_get_fresh_names_and_a_replacement_is_tried_again():
    g = _graph([Node("relu", ("x",), ("y",))], ["y"])

    def twice(m, e: Editor) -> Node:
        mid = e.add(Node("negative", (m["x"],), (e.fresh("y"),)))
        return Node("negative", (mid.name,), m.root.outputs)

    def clip(m, e: Editor) -> Node:
        return Node("cvm_clip", (m["x"],), m.root.outputs, {"precision": 8})

    rules = [Rule(P("relu", V("x")), lambda m, e: None),  # declines: the next rule runs
             Rule(P("relu", V("x")), twice)]
    out = apply_rules(g, rules, infer_node)
    assert [(n.op, n.inputs, n.outputs) for n in out.nodes] == [
        ("negative", ("x",), ("y_1",)), ("negative", ("y_1",), ("y",))]
    assert out.types["y_1"] == I8
    verify(out)
    # negative(negative(x)) is matched again at once, dropping the inserted node
    out = apply_rules(g, [*rules, Rule(P("negative", P("negative", V("x"))), clip)],
                      infer_node)
    assert [(n.op, n.inputs, n.outputs) for n in out.nodes] == [("cvm_clip", ("x",), ("y",))]
    assert set(out.types) == {"x", "z", "y"}
    verify(out)


def test_the_result_is_frozen():
    g = _graph([Node("relu", ("x",), ("y",))], ["y"])
    out = apply_rules(g, [], infer_node)
    with pytest.raises(dataclasses.FrozenInstanceError):
        out.nodes = []  # type: ignore[misc]
    assert out == g and out is not g


def test_a_rule_that_declines_after_inserting_or_renames_the_root_is_refused():
    g = _graph([Node("relu", ("x",), ("y",))], ["y"])

    def sloppy(m, e: Editor) -> None:
        e.add(Node("negative", ("x",), (e.fresh("n"),)))

    with pytest.raises(ValueError, match="declined node 'y' after inserting"):
        apply_rules(g, [Rule(P("relu", V()), sloppy)], infer_node)
    with pytest.raises(ValueError, match=r"computes \('w',\), not \('y',\)"):
        apply_rules(g, [Rule(P("relu", V("x")), lambda m, e: Node("negative", ("x",), ("w",)))],
                    infer_node)


def test_graph_verify_raises_under_python_O():
    """`Graph.verify` is no `assert`: under `python -O` it still refuses a bad graph, with
    one error naming the value."""
    code = ("from cvmc.ir import Graph, InvalidGraph, Node, TensorType\n"
            "g = Graph('g', ['x'], ['y'], [Node('relu', ('x',), ('y',), {})],\n"
            "          {'x': TensorType((2,), 'int8', 8)}, typed=True)\n"
            "try:\n    g.verify()\nexcept InvalidGraph as e:\n    print(e)\n")
    run = subprocess.run([sys.executable, "-O", "-c", code], capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
                         check=True)
    assert run.stdout.strip() == "error: invalid graph: types of values the graph does not " \
                                 "define: [], values without a type: ['y']"

"""The quantizer's layers: each stdlib call grouped by the origin the NNEF evaluator
records on its nodes, and the rule table (`LAYER_RULES`) matching a layer by structure."""
from __future__ import annotations

from cvmc.frontend.nnef import parse_nnef
from cvmc.ir import Node
from cvmc.quantize.layers import Layers, group_layers
from cvmc.quantize.rewrite import Rewriter, rule_of

DOC = """version 1.0;
graph G( x ) -> ( y, z )
{
    x = external(shape = [2, 5]);
    s = sigmoid(x);
    y = softmax(s, axes = [1]);
    z = relu(x);
}"""


def test_expanded_nodes_record_the_stdlib_call_they_come_from():
    """The document is text only (no file to read back): each primitive names the fragment
    the document calls; an op called as itself names none."""
    g = parse_nnef(DOC, "nowhere.nnef")
    origins = {n.name: n.origin for n in g.nodes}
    assert origins["y"] == "softmax" and origins["s"] == "sigmoid"
    assert sum(o == "softmax" for o in origins.values()) == 5  # max, sub, exp, sum, div
    layers = group_layers(g)
    assert [n.op for n in layers.graph.nodes] == ["sigmoid", "softmax", "relu"]
    assert [n.op for n in layers.bodies["y"]] == ["max_reduce", "sub", "exp", "sum_reduce",
                                                  "div"]


def test_softmax_rule_matches_the_structure_not_only_the_op_names():
    """A body of softmax's five ops whose sum reduces another axis than its max is no
    softmax (`rule_of` finds no rule); the real one is the softmax rule."""
    g = parse_nnef(DOC.replace("[2, 5]", "[2, 5, 3]"), "nowhere.nnef")
    layers = group_layers(g)
    softmax = layers.graph.producers()["y"]
    assert rule_of(layers, softmax).rewrite is Rewriter.softmax
    body = [n if n.op != "sum_reduce" else Node(
        n.op, n.inputs, n.outputs, {**n.attrs, "axes": (2,)}, n.span, n.origin)
        for n in layers.bodies["y"]]
    other = Layers(layers.graph, {**layers.bodies, "y": body})
    assert rule_of(other, softmax) is None

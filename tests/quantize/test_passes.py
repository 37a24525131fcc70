"""The quantizer's passes on the one pass manager (`run_passes`): what they hand on is
`Layers`, each result checked as the graph of its primitives."""
from __future__ import annotations

import pytest

from cvmc.frontend.nnef import parse_nnef
from cvmc.ir import InvalidGraph
from cvmc.passes.pipeline import Pass, run_passes
from cvmc.quantize.layers import Layers, fold_batch_norm, group_layers

CONV_BN = """version 1.0;
graph G( x ) -> ( y )
{
    x = external(shape = [1, 1, 4, 4]);
    w = constant(shape = [2, 1, 1, 1], value = [1.0, 2.0]);
    c = conv(x, w);
    m = constant(shape = [1, 2], value = [0.5, 1.0]);
    v = constant(shape = [1, 2], value = [4.0, 9.0]);
    o = constant(shape = [1, 2], value = [0.0, 1.0]);
    s = constant(shape = [1, 2], value = [2.0, 3.0]);
    y = batch_normalization(c, m, v, o, s, epsilon = 0.0);
}"""


def test_a_pass_list_names_the_check_of_what_it_hands_on():
    seen = []
    assert run_passes(1, [Pass("inc", lambda n: n + 1), Pass("double", lambda n: 2 * n)],
                      check=seen.append) == 4
    assert seen == [2, 4]


def test_folding_batch_norm_leaves_a_graph_whose_primitives_verify():
    """The BatchNorm layer's body and the conv's first weight are folded away: their
    values keep no type (`Graph.verify` refuses types of values nothing defines)."""
    layers = group_layers(parse_nnef(CONV_BN, "nowhere.nnef"))
    assert [n.op for n in layers.graph.nodes] == ["conv", "batch_normalization"]
    with pytest.raises(InvalidGraph, match="does not define"):
        layers.graph.verify()  # the layer's body defines its values, not the graph
    layers.primitives().verify()
    folded = fold_batch_norm(layers)
    assert [n.op for n in folded.graph.nodes] == ["conv"] and not folded.bodies
    folded.primitives().verify()
    conv = folded.graph.nodes[0]
    # y = s (c - m) / sqrt(v) + o: weights w * s / sqrt(v), bias o - s m / sqrt(v)
    assert folded.graph.constants[conv.inputs[1]].reshape(-1).tolist() == [1.0, 2.0]
    assert folded.graph.constants[conv.inputs[2]].reshape(-1).tolist() == [-0.5, 0.0]


def test_a_layer_result_whose_primitives_use_an_undefined_value_is_refused():
    layers = Layers(parse_nnef(CONV_BN, "nowhere.nnef"))
    broken = Pass("drop-first", lambda ls: Layers(ls.graph.replace(nodes=ls.graph.nodes[1:])))
    with pytest.raises(InvalidGraph, match="used before definition"):
        run_passes(layers, [broken], check=lambda ls: ls.primitives().verify())

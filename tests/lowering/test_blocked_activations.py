"""The `block-activations` pass: conv2d_packed -> [unary epilogue] -> conv2d_packed keeps
its activations in NCHW16c, with a layout_transform back to NCHW only where something
else (another op, a graph output) reads them.

The oracle is the reference interpreter on the graph as written (plain conv2d); compiled
outputs must equal it bit for bit.
"""
from __future__ import annotations

import numpy as np
import pytest

from cvmc.ops import lookup
from cvmc.ops.registry import Attrs
from cvmc.passes.pipeline import run_pipeline
from tests.codegen.op_cases import packed_conv_inputs, rand
from tests.lowering.test_conv_schedule import run_both
from tests.lowering.test_fusion_and_plan import graph

SHIFT = {"precision": 8, "shift_bit": 6}


def chain(x_shape, convs, outputs=None, tail=()):
    """x -> (conv2d(oc, k, attrs) -> cvm_right_shift -> relu) per entry of `convs` [-> tail
    nodes]; outputs default to the last value."""
    nodes, weights, value, c = [], {}, "x", x_shape[1]
    for k, (oc, kernel, attrs) in enumerate(convs):
        weights[f"w{k}"] = rand((oc, c, kernel, kernel), 8, 10 + k)
        weights[f"b{k}"] = rand((oc,), 12, 20 + k)
        nodes += [("conv2d", [value, f"w{k}", f"b{k}"], f"c{k}", attrs),
                  ("cvm_right_shift", [f"c{k}"], f"s{k}", SHIFT),
                  ("relu", [f"s{k}"], f"r{k}", {})]
        value, c = f"r{k}", oc
    nodes += list(tail)
    return graph({"x": (x_shape, 8)}, nodes, outputs or [nodes[-1][2]], weights)


def blocked(g):
    """The graph after `block-activations` (llvm pipeline)."""
    return run_pipeline(g, stop_after="block-activations", target="llvm")


def layouts(g) -> list[tuple[str, str]]:
    return [(n.attrs["data_layout"], n.attrs["out_layout"]) for n in g.nodes
            if n.op == "conv2d_packed"]


def activation_transforms(g) -> list[str]:
    """The outputs of layout_transforms that act on activations (not on weights)."""
    return [n.outputs[0] for n in g.nodes
            if n.op == "layout_transform" and n.attrs["src_layout"] == "NCHW16c"]


P = "NCHW16c"
CHAINS = {
    "3x3 pad 1, 3x3 pad 1": ((1, 16, 9, 9), [(32, 3, {"padding": [1, 1]}),
                                             (16, 3, {"padding": [1, 1]})]),
    "3x3 stride 2, 1x1": ((1, 8, 11, 10), [(16, 3, {"padding": [1, 1], "stride": [2, 2]}),
                                           (32, 1, {})]),
    "three convs, 1x1 in the middle": ((1, 16, 7, 7), [(32, 3, {"padding": [1, 1]}),
                                                       (48, 1, {}),
                                                       (16, 3, {"padding": [2, 2],
                                                                "dilation": [2, 2]})]),
    "first conv 24 channels": ((1, 16, 6, 6), [(24, 3, {"padding": [1, 1]}),
                                               (32, 3, {"padding": [1, 1]}),
                                               (16, 1, {})]),
}
EXPECTED = {
    "3x3 pad 1, 3x3 pad 1": [("NCHW", P), (P, "NCHW")],
    "3x3 stride 2, 1x1": [("NCHW", P), (P, "NCHW")],
    "three convs, 1x1 in the middle": [("NCHW", P), (P, P), (P, "NCHW")],
    # 24 output channels are not whole blocks: that activation stays NCHW
    "first conv 24 channels": [("NCHW", "NCHW"), ("NCHW", P), (P, "NCHW")],
}


@pytest.mark.parametrize("name", CHAINS)
def test_conv_chain_is_blocked_and_exact(name):
    g = chain(*CHAINS[name])
    after = blocked(g)
    assert layouts(after) == EXPECTED[name]
    assert activation_transforms(after) == []  # every blocked value has only conv readers
    run_both(g)


def test_blocked_graph_output_gets_an_nchw_copy():
    """r0 is a graph output and the next conv's data: the conv reads the blocked value,
    the output is a layout_transform of it, under its own name."""
    g = chain((1, 16, 8, 8), [(32, 3, {"padding": [1, 1]}), (16, 3, {"padding": [1, 1]})],
              outputs=["r0", "r1"])
    after = blocked(g)
    assert layouts(after) == [("NCHW", P), (P, "NCHW")]
    assert activation_transforms(after) == ["r0"]
    (conv,) = [n for n in after.nodes if n.op == "conv2d_packed" and n.outputs == ("c1",)]
    assert conv.inputs[0] == "r0_nchw16c" and after.types["r0_nchw16c"].shape == (1, 2, 8, 8, 16)
    assert after.types["r0"].shape == (1, 32, 8, 8)
    run_both(g)


def test_other_consumers_read_an_nchw_copy():
    """r0 feeds a conv and a max_pool2d (not layout-aware): only the pool reads NCHW."""
    tail = [("max_pool2d", ["r0"], "p", {"pool_size": [2, 2], "strides": [2, 2]})]
    g = chain((1, 16, 8, 8), [(16, 3, {"padding": [1, 1]}), (16, 1, {})], outputs=["r1", "p"],
              tail=tail)
    after = blocked(g)
    assert layouts(after) == [("NCHW", P), (P, "NCHW")]
    assert activation_transforms(after) == ["r0"]
    (pool,) = [n for n in after.nodes if n.op == "max_pool2d"]
    assert pool.inputs == ("r0",)
    run_both(g)


def test_residual_join_is_not_blocked():
    """conv -> shift feeding an add (the ResNet join) stays NCHW: not a conv reader."""
    tail = [("elemwise_add", ["s1", "x"], "a", {})]
    g = chain((1, 16, 6, 6), [(16, 3, {"padding": [1, 1]}), (16, 3, {"padding": [1, 1]})],
              outputs=["a"], tail=tail)
    after = blocked(g)
    assert layouts(after) == [("NCHW", P), (P, "NCHW")]
    run_both(g)


def test_pass_is_listed_and_idempotent():
    g = blocked(chain(*CHAINS["three convs, 1x1 in the middle"]))
    from cvmc.passes.layout import block_activations
    assert block_activations(g) == g


def test_reference_follows_the_layouts_literally():
    """conv2d_packed with NCHW16c data and result == layout_transform of the NCHW conv of
    the unblocked data."""
    conv, transform = lookup("conv2d_packed"), lookup("layout_transform")
    _, wp, comp = packed_conv_inputs(32, 16, 3, 3, 5)
    x, bias = rand((1, 16, 5, 6), 8, 6)[0], rand((32,), 12, 7)[0]

    def block(v, src=("NCHW", P)):
        (out,) = transform.run_reference([v], Attrs(src_layout=src[0], dst_layout=src[1]))
        return out

    def run(data, **layouts):
        a = conv.normalize_attrs({"padding": [1, 1], "channels": 32, **layouts})
        return conv.run_reference([data, wp, comp, bias], a)[0]
    plain, both = run(x), run(block(x), data_layout=P, out_layout=P)
    assert np.array_equal(both, block(plain))
    assert np.array_equal(block(both, (P, "NCHW")), plain)
    assert np.array_equal(run(block(x), data_layout=P), plain)

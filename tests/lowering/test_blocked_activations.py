"""The `block-activations` pass: conv2d_packed -> [element-wise epilogue, residual join]
-> conv2d_packed keeps its activations in NCHW16c, with a layout_transform to NCHW16c for
a join's other operand and one back to NCHW only where something else (another op, a
graph output) reads them.

The oracle is the reference interpreter on the graph as written (plain conv2d); compiled
outputs must equal it bit for bit.
"""
from __future__ import annotations

import numpy as np
import pytest

from cvmc.ops import lookup
from cvmc.ops.registry import Attrs
from cvmc.passes.layout import block_activations
from cvmc.passes.target import Target
from tests.codegen.op_cases import packed_conv_inputs, rand
from tests.lowering.test_conv_schedule import run_both
from tests.lowering.test_fusion_and_plan import graph
from tests.lowering.test_packed_conv import compiled_vs_reference
from tests.oputil import compile_passes

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
    return compile_passes(g, stop_after="block-activations", target=Target.make())


def layouts(g) -> list[tuple[str, str]]:
    return [(n.attrs["data_layout"], n.attrs["out_layout"]) for n in g.nodes
            if n.op == "conv2d_packed"]


def activation_transforms(g) -> list[tuple[str, str]]:
    """(destination layout, output) of each layout_transform on activations (the weights'
    go to OIHW16o4i)."""
    return [(n.attrs["dst_layout"], n.outputs[0]) for n in g.nodes
            if n.op == "layout_transform" and "NCHW16c" in (n.attrs["src_layout"],
                                                            n.attrs["dst_layout"])]


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
    assert activation_transforms(after) == [("NCHW", "r0")]
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
    assert activation_transforms(after) == [("NCHW", "r0")]
    (pool,) = [n for n in after.nodes if n.op == "max_pool2d"]
    assert pool.inputs == ("r0",)
    run_both(g)


def resnet_like():
    """conv -> relu -> max_pool, then two residual blocks (the second with a strided 1x1
    shortcut conv), then a sum over H and W: ResNet-18's structure, small."""
    def conv(x, w, out, stride=1, k=3):
        return [("conv2d", [x, w, f"{w}b"], f"{out}c",
                 {"padding": [k // 2] * 2, "stride": [stride] * 2}),
                ("cvm_right_shift", [f"{out}c"], out, SHIFT)]

    def join(a, b, out):
        return [("elemwise_add", [a, b], f"{out}s", {}),
                ("cvm_clip", [f"{out}s"], f"{out}k", {"precision": 8}),
                ("relu", [f"{out}k"], out, {})]
    nodes = [*conv("x", "w0", "s0"), ("relu", ["s0"], "r0", {}),
             ("max_pool2d", ["r0"], "p", {"pool_size": [3, 3], "strides": [2, 2],
                                          "padding": [1, 1]}),
             *conv("p", "w1", "s1"), ("relu", ["s1"], "r1", {}), *conv("r1", "w2", "s2"),
             *join("s2", "p", "j1"),
             *conv("j1", "w3", "s3", 2), ("relu", ["s3"], "r3", {}), *conv("r3", "w4", "s4"),
             *conv("j1", "w5", "s5", 2, 1), *join("s4", "s5", "j2"),
             ("sum", ["j2"], "t", {"axes": [2, 3]})]
    shapes = {"w0": (16, 3, 3, 3), "w1": (16, 16, 3, 3), "w2": (16, 16, 3, 3),
              "w3": (32, 16, 3, 3), "w4": (32, 32, 3, 3), "w5": (32, 16, 1, 1)}
    weights = {}
    for k, (w, shape) in enumerate(shapes.items()):
        weights[w], weights[f"{w}b"] = rand(shape, 8, 30 + k), rand(shape[:1], 12, 40 + k)
    return graph({"x": ((1, 3, 12, 12), 8)}, nodes, ["t"], weights)


def test_residual_blocks_stay_blocked():
    """From the first conv to the last join every activation is blocked: the pool runs on
    NCHW16c (max_pool2d_blocked) and no layout_transform is left (the join's shortcut and
    the first block's conv both read the pool's blocked result). The last join (read by
    the sum) stays NCHW: blocking it would only add a transform back."""
    after = blocked(resnet_like())
    assert layouts(after) == [("NCHW", P), (P, P), (P, P), (P, P), (P, "NCHW"),
                              (P, "NCHW")]
    assert activation_transforms(after) == []
    (pool,) = [n for n in after.nodes if n.outputs == ("p",)]
    assert pool.op == "max_pool2d_blocked" and pool.inputs == ("r0",)
    (join,) = [n for n in after.nodes if n.outputs == ("j1s",)]
    assert join.inputs == ("s2", "p") and after.types["j1s"].shape == (1, 1, 6, 6, 16)
    plan = compiled_vs_reference(resnet_like())
    assert not [k for k in plan["kernels"] if k["ops"] == ["layout_transform"]]


def mobilenet_like(channels: int = 32, outputs=("t",)):
    """conv 3x3/2 -> shift -> relu, then depthwise-separable blocks (a 3x3 depthwise conv
    -> shift -> relu -> a 1x1 conv -> shift -> relu), the second depthwise conv strided,
    then a sum over H and W: MobileNet-v1's structure, small."""
    nodes, weights, value, c = [], {}, "x", 3
    layers = [(channels, 3, 1, 2), (channels, 3, channels, 1), (2 * channels, 1, 1, 1),
              (2 * channels, 3, 2 * channels, 2), (32, 1, 1, 1)]
    for k, (oc, kernel, groups, stride) in enumerate(layers):
        weights[f"w{k}"] = rand((oc, c // groups, kernel, kernel), 8, 60 + k)
        weights[f"b{k}"] = rand((oc,), 12, 70 + k)
        nodes += [("conv2d", [value, f"w{k}", f"b{k}"], f"c{k}",
                   {"padding": [kernel // 2] * 2, "stride": [stride] * 2, "groups": groups}),
                  ("cvm_right_shift", [f"c{k}"], f"s{k}", SHIFT),
                  ("relu", [f"s{k}"], f"r{k}", {})]
        value, c = f"r{k}", oc
    nodes.append(("sum", [value], "t", {"axes": [2, 3]}))
    return graph({"x": ((1, 3, 14, 14), 8)}, nodes, list(outputs), weights)


def test_depthwise_convs_stay_blocked():
    """Every depthwise conv reads and writes NCHW16c (depthwise_conv2d_blocked on an
    OIHW16o weight, folded into a weight): the packed convs around them read and write
    blocked and no layout_transform is left; compiled == reference."""
    after = blocked(mobilenet_like())
    depthwise = [n for n in after.nodes if n.op == "depthwise_conv2d_blocked"]
    assert [n.outputs[0] for n in depthwise] == ["c1", "c3"]
    assert all(n.inputs[1] in after.constants and after.types[n.inputs[1]].shape[1:] ==
               (1, 3, 3, 16) for n in depthwise)
    assert not [n for n in after.nodes if n.op == "conv2d"]
    assert layouts(after) == [("NCHW", P), (P, P), (P, "NCHW")]
    assert activation_transforms(after) == []
    plan = compiled_vs_reference(mobilenet_like())
    assert [k["schedule"] for k in plan["kernels"] if "depthwise_conv2d_blocked" in k["ops"]] \
        == ["cpu-depthwise-blocked"] * 2


def test_depthwise_conv_reads_blocked_beside_a_graph_output():
    """r0 is a graph output and the depthwise conv's data: the conv reads the blocked
    value under its new name, the output an NCHW copy."""
    g = mobilenet_like(outputs=("t", "r0"))
    after = blocked(g)
    (depthwise, _) = [n for n in after.nodes if n.op == "depthwise_conv2d_blocked"]
    assert depthwise.inputs[0] == "r0_nchw16c"
    assert activation_transforms(after) == [("NCHW", "r0")]
    run_both(g)


def test_depthwise_conv_on_partial_blocks_stays_nchw():
    """24 channels are not whole blocks: the depthwise conv stays a conv2d on NCHW (the
    cpu-depthwise rule), and so do the activations around it."""
    after = blocked(mobilenet_like(24))
    assert [n.op for n in after.nodes if "conv" in n.op] == \
        ["conv2d_packed", "conv2d", "conv2d_packed", "depthwise_conv2d_blocked",
         "conv2d_packed"]
    run_both(mobilenet_like(24))


@pytest.mark.parametrize("conv_after_join", [True, False])
def test_residual_join_with_a_graph_input(conv_after_join):
    """conv -> conv -> shift joined with the graph input x. With a conv reading the join,
    x enters blocked (a transform; the first conv reads that copy too) and the join's
    result, also a graph output, leaves through one. Without, the join stays NCHW, and so
    does x: a conv alone is no reason to transform its data."""
    tail = [("elemwise_add", ["s1", "x"], "j", {}), ("cvm_clip", ["j"], "a", {"precision": 8})]
    if conv_after_join:
        tail.append(("conv2d", ["a", "w0"], "y", {"padding": [1, 1]}))
    g = chain((1, 16, 6, 6), [(16, 3, {"padding": [1, 1]}), (16, 3, {"padding": [1, 1]})],
              outputs=["a", *(["y"] if conv_after_join else [])], tail=tail)
    after = blocked(g)
    if conv_after_join:
        assert layouts(after) == [(P, P), (P, P), (P, "NCHW")]
        assert activation_transforms(after) == [(P, "x_nchw16c"), ("NCHW", "a")]
    else:
        assert layouts(after) == [("NCHW", P), (P, "NCHW")]
        assert activation_transforms(after) == []
    run_both(g)


@pytest.mark.parametrize("make", [lambda: chain(*CHAINS["three convs, 1x1 in the middle"]),
                                  resnet_like, mobilenet_like])
def test_pass_is_idempotent(make):
    g = blocked(make())
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


def test_cuda_pipeline_blocks_the_same_and_keeps_dense():
    """CUDA gets the same packed convs and blocked activations as the CPU (a blocked conv
    reads 4 channels of a pixel as one 32-bit word there), except that its pools and
    depthwise convs stay NCHW ops (the pool's result enters the blocks through a
    layout_transform); dense stays dense on CUDA (dlight's GEMV) and becomes a packed 1x1
    conv on the CPU."""
    cuda = compile_passes(resnet_like(), stop_after="block-activations",
                        target=Target.make("cuda"))
    assert layouts(cuda) == [("NCHW", "NCHW"), *layouts(blocked(resnet_like()))[1:]]
    assert activation_transforms(cuda) == [(P, "p_nchw16c")]
    cuda = compile_passes(mobilenet_like(), stop_after="block-activations",
                        target=Target.make("cuda"))
    assert [n.op for n in cuda.nodes if "conv" in n.op] == \
        ["conv2d_packed", "conv2d", "conv2d_packed", "conv2d", "conv2d_packed"]
    g = graph({"x": ((1, 64), 8)}, [("dense", ["x", "w", "b"], "y", {})], ["y"],
              {"w": rand((10, 64), 8, 50), "b": rand((10,), 12, 51)})
    ops = {t: [n.op for n in compile_passes(g, target=Target.make(t)).nodes]
           for t in ("llvm", "cuda")}
    assert ops == {"llvm": ["reshape", "conv2d_packed", "reshape"], "cuda": ["dense"]}


def benchmark_network(name: str, tmp_path):
    """benchmarks/models.py's network `name` at 32x32, loaded as cvmc reads it."""
    import importlib.util
    import sys
    from pathlib import Path

    import cvmc

    path = Path(__file__).resolve().parents[2] / "benchmarks" / "models.py"
    spec = importlib.util.spec_from_file_location("cvmc_benchmark_models", path)
    models = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = models  # dataclasses look their module up by name
    spec.loader.exec_module(models)
    return cvmc.load_graph(models.MODELS[name](32).write(tmp_path / name))


def test_mobilenet_v1_is_blocked_from_the_first_conv_to_the_classifier(tmp_path):
    """All 13 depthwise convs run blocked, every conv between the first and the last
    block's 1x1 conv (which writes NCHW for the pool) reads and writes NCHW16c, and no
    layout_transform is left."""
    after = blocked(benchmark_network("mobilenet_v1", tmp_path))
    assert len([n for n in after.nodes if n.op == "depthwise_conv2d_blocked"]) == 13
    assert not [n for n in after.nodes if n.op == "conv2d"]
    convs = layouts(after)  # 14 convs and the classifier
    assert convs == [("NCHW", P), *[(P, P)] * 12, (P, "NCHW"), ("NCHW", "NCHW")]
    assert activation_transforms(after) == []


def test_resnet18_stem_writes_blocked_and_pools_blocked(tmp_path):
    """conv1 writes NCHW16c and the max pool reads and writes it (max_pool2d_blocked): no
    layout_transform into NCHW16c is left, only the last block's back to NCHW."""
    after = blocked(benchmark_network("resnet18", tmp_path))
    (pool,) = [n for n in after.nodes if n.op.startswith("max_pool2d")]
    assert pool.op == "max_pool2d_blocked"
    assert layouts(after)[0] == ("NCHW", P)
    assert [layout for layout, _ in activation_transforms(after)] == ["NCHW"]

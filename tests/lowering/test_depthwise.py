"""The CPU depthwise conv schedule (`cpu-depthwise`): bit-exact against the reference on
awkward geometries, and taken by depthwise kernels only.

Each geometry runs with batch 2 through the whole pipeline (`compiled_vs_reference`:
compile for llvm, run with the runtime, compare every output with the reference
interpreter bit for bit) and must get the depthwise rule, so none of them passes by
falling back to the default schedule.
"""
from __future__ import annotations

import pytest
import tvm
from tvm import s_tir

from cvmc.lowering.depthwise import schedule_depthwise
from cvmc.lowering.lower import lower_graph
from cvmc.passes.fusion import fuse_kernels
from cvmc.passes.target import Target
from tests.codegen.op_cases import rand
from tests.lowering.test_conv_schedule import run_both
from tests.lowering.test_fusion_and_plan import graph
from tests.lowering.test_packed_conv import compiled_vs_reference, conv_graph

# name: (channels, input H x W, kernel, {stride, padding, dilation}, bias?, epilogue?)
# Widths 7, 13, 26, 56 and 69 are not multiples of a 16-lane vector; they cover each path
# of the schedule: rows of up to 32 output columns vectorised in TIR (at stride 1, under 8
# columns through an int32 padded plane), longer ones by LLVM, and at column stride 2 with
# padding the padded plane split into even and odd columns (odd widths included).
GEOMETRIES = {
    "c1 7x7 pad 1 epilogue": (1, (7, 7), 3, {"padding": [1, 1]}, True, True),
    "c3 13x13 pad 0": (3, (13, 13), 3, {}, True, False),
    "c16 7x7 pad 1 epilogue": (16, (7, 7), 3, {"padding": [1, 1]}, True, True),
    "c33 9x9 5x5 pad 1 no bias": (33, (9, 9), 5, {"padding": [1, 1]}, False, True),
    "c16 56x56 pad 1 epilogue": (16, (56, 56), 3, {"padding": [1, 1]}, True, True),
    "c32 14x14 pad 1 epilogue": (32, (14, 14), 3, {"padding": [1, 1]}, False, True),
    "c32 14x14 stride 2": (32, (14, 14), 3, {"padding": [1, 1], "stride": [2, 2]}, True,
                           True),
    "c33 13x7 stride 2 no epilogue": (33, (13, 7), 3, {"padding": [1, 1], "stride": [2, 2]},
                                      True, False),
    "c16 56x56 stride 2 epilogue": (16, (56, 56), 3, {"padding": [1, 1], "stride": [2, 2]},
                                    True, True),
    "c16 6x26 pad 1": (16, (6, 26), 3, {"padding": [1, 1]}, True, True),
    "c3 5x69 stride 2": (3, (5, 69), 3, {"padding": [1, 1], "stride": [2, 2]}, True, True),
    "c3 13x13 5x5 pad 2": (3, (13, 13), 5, {"padding": [2, 2]}, True, True),
    "c16 9x56 5x5 stride 2 pad 2": (16, (9, 56), 5, {"padding": [2, 2], "stride": [2, 2]},
                                    False, True),
    "c33 11x13 dilation 2 pad 2": (33, (11, 13), 3, {"padding": [2, 2], "dilation": [2, 2]},
                                   True, True),
    "c16 12x7 dilation 2 stride 2": (16, (12, 7), 3, {"stride": [2, 2], "dilation": [2, 2]},
                                     False, False),
    "c1 7x13 5x5 pad 0": (1, (7, 13), 5, {}, True, True),
    "c3 7x7 5x5 stride 2 dilation 2": (3, (7, 7), 5, {"padding": [2, 2], "stride": [2, 2],
                                                       "dilation": [2, 2]}, True, True),
    "c16 9x13 pad 0x1": (16, (9, 13), 3, {"padding": [0, 1]}, True, True),
    "c16 8x13 stride 1x2": (16, (8, 13), 3, {"padding": [1, 1], "stride": [1, 2]}, True,
                            True),
    "c33 9x13 pad 1x0 stride 2": (33, (9, 13), 3, {"padding": [1, 0], "stride": [2, 2]},
                                  True, True),
    "c16 8x13 stride 2x1": (16, (8, 13), 3, {"padding": [1, 1], "stride": [2, 1]}, True,
                            True),
}


def depthwise_graph(name: str):
    """The graph of a GEOMETRIES row, batch 2."""
    c, (h, w), k, attrs, bias, epilogue = GEOMETRIES[name]
    return conv_graph((2, c, h, w), (c, 1, k, k), {**attrs, "groups": c}, bias, epilogue)


def kernel_rules(plan: dict) -> list[tuple[str, str]]:
    """(anchor op, schedule rule) of each kernel of a compiled plan."""
    return [(k["ops"][0], k["schedule"]) for k in plan["kernels"]]


# The host CPU (AVX-512 here), AVX2 and plain SSE2: the rule assumes no vector width.
@pytest.mark.parametrize("mcpu", [None, "haswell", "x86-64"])
@pytest.mark.parametrize("name", GEOMETRIES)
def test_depthwise_conv_is_exact(name, mcpu):
    plan = compiled_vs_reference(depthwise_graph(name), mcpu)
    ((anchor, rule),) = kernel_rules(plan)
    if GEOMETRIES[name][0] == 1:  # groups = 1, an ordinary conv too: the layout pass packs it
        assert anchor == "conv2d_packed"
    else:
        assert (anchor, rule) == ("conv2d", "cpu-depthwise")


def test_conv_result_also_a_kernel_output():
    """The conv's own result and its epilogue are both kernel outputs: both exact."""
    c, shape = 16, (2, 16, 9, 13)
    g = graph({"x": (shape, 8)}, [
        ("conv2d", ["x", "w", "b"], "c", {"padding": [1, 1], "groups": c}),
        ("cvm_right_shift", ["c"], "s", {"precision": 8, "shift_bit": 5}),
        ("relu", ["s"], "r", {}),
    ], ["c", "r"], {"w": rand((c, 1, 3, 3), 8, 1), "b": rand((c,), 12, 2)})
    run_both(g)


@pytest.mark.parametrize("x_shape, w_shape, groups, rule", [
    ((2, 8, 9, 9), (8, 1, 3, 3), 8, "cpu-depthwise"),
    # grouped with 2 input channels per group, and a channel multiplier of 2: not depthwise
    ((2, 8, 9, 9), (8, 4, 3, 3), 2, "cpu-default"),
    ((2, 8, 9, 9), (16, 1, 3, 3), 8, "cpu-default"),
])
def test_only_depthwise_kernels_get_the_rule(x_shape, w_shape, groups, rule):
    plan = compiled_vs_reference(conv_graph(x_shape, w_shape, {"padding": [1, 1],
                                                               "groups": groups}, True, True))
    assert kernel_rules(plan) == [("conv2d", rule)]


def test_rule_refuses_an_ordinary_conv():
    """An unpacked ordinary conv2d kernel (the layout pass not run): the rule raises
    ValueError, so the table falls through to `cpu-default`."""
    g = conv_graph((1, 8, 9, 9), (16, 8, 3, 3), {"padding": [1, 1]}, True, True)
    mod, _, _ = lower_graph(fuse_kernels(g, Target.make()), Target.make())
    (gv, func), = mod.functions.items()
    sch = s_tir.Schedule(tvm.IRModule({gv: func}))
    sch.work_on(gv.name_hint)
    with pytest.raises(ValueError, match="no depthwise conv block"):
        schedule_depthwise(sch, gv.name_hint)

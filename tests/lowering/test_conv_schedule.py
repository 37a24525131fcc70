"""The CPU conv schedule (register tile + fused epilogue): awkward shapes run bit-exact."""
from __future__ import annotations

import cvmc_runtime
import numpy as np
import pytest

from cvmc.codegen import compile_model
from cvmc.lowering.lower import lower_graph
from cvmc.passes.fusion import fuse_kernels
from cvmc.passes.target import Target
from cvmc.reference import reference_run
from tests.codegen.op_cases import rand
from tests.lowering.test_fusion_and_plan import graph
from tests.oputil import check_op

# (input NCHW, output channels, kernel, attributes): each breaks some tile assumption.
SHAPES = {
    "odd-width-7": ((1, 8, 7, 7), 16, 3, {"padding": [1, 1]}),
    "odd-width-13-no-pad": ((1, 3, 13, 13), 8, 3, {}),
    "stride-2": ((1, 4, 14, 14), 8, 3, {"padding": [1, 1], "stride": [2, 2]}),
    "dilation-2-asym-pad": ((1, 4, 11, 12), 6, 3, {"padding": [2, 1], "dilation": [2, 2]}),
    "depthwise": ((1, 8, 9, 9), 8, 3, {"padding": [1, 1], "groups": 8}),
    "groups-2": ((1, 4, 10, 10), 6, 3, {"padding": [1, 1], "groups": 2}),
    "1x1": ((1, 16, 5, 6), 32, 1, {}),
    "oc-prime-17": ((1, 3, 8, 8), 17, 3, {"padding": [1, 1]}),
    "oc-18-wide-20": ((1, 2, 6, 20), 18, 3, {"padding": [1, 1]}),
    "batch-2": ((2, 3, 6, 6), 20, 3, {"padding": [1, 1], "stride": [1, 2]}),
    "5x3-kernel-rect": ((1, 3, 9, 8), 4, (5, 3), {"padding": [2, 0]}),
}


def conv_inputs(name: str, bias: bool = True):
    """(input shape, weights {name: (array, precision)}, attributes) of a SHAPES case."""
    shape, oc, kernel, attrs = SHAPES[name]
    kh, kw = kernel if isinstance(kernel, tuple) else (kernel, kernel)
    weights = {"w": rand((oc, shape[1] // attrs.get("groups", 1), kh, kw), 8, 1)}
    if bias:
        weights["b"] = rand((oc,), 12, 2)
    return shape, weights, attrs


def run_both(g, seed: int = 5) -> None:
    """Compile `g` for llvm, run it with the runtime, compare every output bit-exactly."""
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory(prefix="cvmc-conv-") as tmp:
        compile_model(g, Path(tmp) / "m.cvmx", "llvm")
        model = cvmc_runtime.load(Path(tmp) / "m.cvmx")
    feeds = {s.name: rand(s.shape, s.precision, seed)[0] for s in model.inputs}
    got, want = model.run(feeds), reference_run(g, feeds)
    for name in g.outputs:
        assert got[name].dtype == want[name].dtype, name
        assert np.array_equal(got[name], want[name]), f"{name}: compiled differs"


@pytest.mark.parametrize("name", SHAPES)
def test_single_conv_matches_reference(name):
    shape, weights, attrs = conv_inputs(name, bias=name != "1x1")
    inputs = [rand(shape, 8, 3), *weights.values()]
    check_op("conv2d", inputs, attrs, weights=tuple(range(1, len(inputs))))


@pytest.mark.parametrize("name", SHAPES)
def test_conv_with_fused_epilogue_matches_reference(name):
    shape, weights, attrs = conv_inputs(name)
    g = graph({"x": (shape, 8)}, [
        ("conv2d", ["x", "w", "b"], "c", attrs),
        ("cvm_right_shift", ["c"], "s", {"precision": 8, "shift_bit": 5}),
        ("cvm_clip", ["s"], "k", {"precision": 6}),
        ("relu", ["k"], "r", {}),
    ], ["r"], weights)
    assert lower_graph(fuse_kernels(g, Target.make()), Target.make())[1][0].ops == \
        ["conv2d", "cvm_right_shift", "cvm_clip", "relu"]
    assert "conv2d_local" in _scheduled_kernel(g)  # the tile applied (no silent fallback)
    run_both(g)


def test_conv_result_also_a_kernel_output():
    """The accumulator's write-back cannot fold into the epilogue: both outputs correct."""
    shape, weights, attrs = conv_inputs("stride-2")
    g = graph({"x": (shape, 8)}, [
        ("conv2d", ["x", "w", "b"], "c", attrs),
        ("cvm_right_shift", ["c"], "s", {"precision": 8, "shift_bit": 5}),
    ], ["c", "s"], weights)
    run_both(g)


@pytest.mark.parametrize("m", [1, 3])
def test_dense_with_fused_epilogue_matches_reference(m):
    g = graph({"x": ((m, 37), 8)}, [
        ("dense", ["x", "w", "b"], "y", {}),
        ("cvm_right_shift", ["y"], "s", {"precision": 8, "shift_bit": 4}),
        ("cvm_clip", ["s"], "k", {"precision": 8}),
    ], ["k"], {"w": rand((19, 37), 8, 1), "b": rand((19,), 12, 2)})
    run_both(g)


def _scheduled_kernel(g) -> str:
    import tvm
    from tvm import s_tir

    from cvmc.lowering.schedule import schedule_cpu

    mod, _, _ = lower_graph(fuse_kernels(g, Target.make()), Target.make())
    (gv, func), = mod.functions.items()
    sch = s_tir.Schedule(tvm.IRModule({gv: func}))
    sch.work_on(gv.name_hint)
    schedule_cpu(sch, gv.name_hint)
    return sch.mod.script()


def _block(script: str, name: str) -> tuple[str, str]:
    """(the loop line directly enclosing block `name`, the block's text) in a listing."""
    lines = script.splitlines()
    start = next(i for i, line in enumerate(lines) if f'T.sblock("{name}")' in line)
    end = next((i for i in range(start + 1, len(lines)) if "T.sblock(" in lines[i]), len(lines))
    return lines[start - 1], "\n".join(lines[start:end])


def test_conv_kernel_is_register_tiled_and_vectorised():
    shape, weights, attrs = conv_inputs("odd-width-7")
    script = _scheduled_kernel(graph({"x": (shape, 8)}, [
        ("conv2d", ["x", "w", "b"], "c", attrs),
        ("cvm_right_shift", ["c"], "s", {"precision": 8, "shift_bit": 5}),
    ], ["s"], weights))
    loop, update = _block(script, "conv2d_update")
    assert "T.vectorized(7)" in loop and "T.if_then_else" not in update  # padding hoisted
    assert "T.vectorized(7)" in _block(script, "s_cast")[0]  # the epilogue, under the tile
    assert 'scope="local"' in script and "T.parallel" in script


def test_dense_and_pooling_keep_the_default_schedule():
    dense = graph({"x": ((2, 16), 8)}, [("dense", ["x", "w"], "y", {})], ["y"],
                  {"w": rand((8, 16), 8, 1)})
    pool = graph({"x": ((1, 2, 6, 6), 8)}, [("max_pool2d", ["x"], "y", {"pool_size": [2, 2]})],
                 ["y"])
    for g in (dense, pool):
        assert 'scope="local"' not in _scheduled_kernel(g)


def test_pool_interior_is_split_off_and_takes_its_epilogue():
    """max_pool2d's columns split into borders and a clamp-free interior; the fused relu is
    inlined into the pool (not the pool into it, which would lose the split)."""
    g = graph({"x": ((1, 3, 9, 20), 8)}, [
        ("max_pool2d", ["x"], "p", {"pool_size": [3, 3], "strides": [2, 2], "padding": [1, 1]}),
        ("relu", ["p"], "y", {}),
    ], ["y"])
    script = _scheduled_kernel(g)
    assert [n for n in ("max_pool2d_q0", "max_pool2d_q1", "max_pool2d_q2")
            if f'T.sblock("{n}")' in script] == ["max_pool2d_q0", "max_pool2d_q1"]
    interior = _block(script, "max_pool2d_q1")[1]
    # relu and the int8 cast are inlined: the pool writes the kernel's output, max(., 0)
    assert "y_cast[v_n, v_c, v_p, v_q] = " in interior and interior.endswith(", 0))")
    assert script.count("T.sblock(") == 2 + 2 * 2  # root, common; 2 parts x (part, block)
    run_both(g)

"""conv2d on the CPU through the layout pass: packed weights (OIHW16o4i) and the
compensation folded at compile time, then each CPU schedule path of the table.

The oracle is the reference interpreter on the graph as written (plain conv2d, itself
checked against `tvm.topi.testing` in tests/ops/test_nn.py); compiled outputs must equal
it bit for bit on every path. Paths are forced with --mcpu: `znver4` has AVX-512 VNNI
(`vpdpbusd`), `haswell` and `znver3` (AVX2) take `vpmaddwd` on int16 and `x86-64`
(SSE2) the plain vector loop. Every path is compiled and its schedule checked on any
host; its kernels run where the host has the CPU features the artifact records (a Zen 3
has no AVX-512: the znver4 runs skip there, naming what is missing).
"""
from __future__ import annotations

import tempfile
from pathlib import Path

import cvmc_runtime
import numpy as np
import pytest
from cvmc_runtime.cpu import check_host_cpu

from cvmc.codegen import compile_model
from cvmc.errors import CvmcError
from cvmc.ir import Graph, Node, TensorType
from cvmc.ops import lookup
from cvmc.ops.infer import retype
from cvmc.ops.packed import MAX_PACKED_REDUCTION
from cvmc.passes.target import Target
from cvmc.reference import reference_run
from tests.oputil import rand_in_precision

PATHS = {"znver4": "x86-avx512-vnni", "haswell": "x86-avx2", "znver3": "x86-avx2",
         "x86-64": "cpu-packed-vector"}

# (data shape, weight shape, attributes, bias?, epilogue?)
GEOMETRIES = {
    "3x3 pad 1": ((1, 16, 9, 9), (32, 16, 3, 3), {"padding": [1, 1]}, True, True),
    "1x1": ((1, 32, 6, 5), (16, 32, 1, 1), {}, True, False),
    "7x7 stride 2 pad 3": ((1, 3, 15, 15), (16, 3, 7, 7),
                           {"padding": [3, 3], "stride": [2, 2]}, False, True),
    "dilated, asymmetric": ((2, 5, 8, 11), (20, 5, 3, 2),
                            {"padding": [2, 0], "dilation": [2, 3], "stride": [1, 2]}, True,
                            False),
    "odd channels": ((1, 6, 5, 7), (3, 6, 3, 3), {"padding": [1, 1]}, False, False),
    "wide row": ((1, 8, 3, 29), (16, 8, 3, 3), {"padding": [1, 1]}, True, True),
    # 5 columns: the register tile takes 2 output channel blocks (see test_tile_shape).
    "narrow, 2 channel blocks": ((1, 16, 5, 5), (128, 16, 3, 3), {"padding": [1, 1]}, True,
                                 True),
    # Rows of 16 and 8 columns, NCHW in and out, column stride 1: on the VNNI path the
    # accumulator lanes are output columns (see test_column_lanes); odd channel counts pad
    # the 4-channel words and the 16-channel block.
    "1x1, 16-column rows": ((2, 20, 3, 16), (24, 20, 1, 1), {}, True, True),
    "3x3 pad 1, 8-column rows": ((1, 8, 4, 8), (16, 8, 3, 3), {"padding": [1, 1]}, True, True),
    # Grouped (AlexNet's conv2 and conv4/5 are 2 groups): each group's 16-channel blocks
    # read its own input channels; 6 and 5 channels per group pad their 4-channel words
    # per group.
    "grouped, 2 groups": ((1, 12, 6, 7), (32, 6, 3, 3), {"padding": [1, 1], "groups": 2},
                          True, True),
    "grouped, 3 groups, stride 2": ((2, 15, 9, 8), (48, 5, 3, 3),
                                    {"padding": [1, 0], "stride": [2, 2], "groups": 3}, False,
                                    False),
    # 16 output columns but column stride 2: channels stay in the lanes.
    "1x1 stride 2, 16-column rows": ((1, 8, 4, 32), (16, 8, 1, 1), {"stride": [2, 2]}, False,
                                     True),
}


def conv_graph(x_shape, w_shape, attrs, bias: bool, epilogue: bool, seed: int = 0,
               p: int = 8) -> Graph:
    """x -> conv2d(x, w[, b]) [-> cvm_right_shift -> cvm_clip -> relu] with random weights."""
    rng = np.random.default_rng(seed)
    consts = {"w": rand_in_precision(rng, w_shape, p)}
    if bias:
        consts["b"] = rand_in_precision(rng, (w_shape[0],), 12)
    types = {"x": TensorType(x_shape, "int32", p),
             **{k: TensorType(v.shape, "int32") for k, v in consts.items()}}
    calls = [("conv2d", ("x", "w", *(("b",) if bias else ())), "c", attrs)]
    if epilogue:
        calls += [("cvm_right_shift", ("c",), "s", {"precision": 16, "shift_bit": 5}),
                  ("cvm_clip", ("s",), "k", {"precision": 8}), ("relu", ("k",), "y", {})]
    nodes = []
    for op, inputs, out, given in calls:
        d = lookup(op)
        a = d.normalize_attrs(given)
        (shape,) = d.infer_shapes([types[i] for i in inputs], a)
        types[out] = TensorType(shape, "int32")
        nodes.append(Node(op, inputs, (out,), dict(a)))
    return retype(Graph("conv", ["x"], [nodes[-1].outputs[0]], nodes, types, consts))


def compiled_vs_reference(graph: Graph, mcpu: str | None = None,
                          x: np.ndarray | None = None, schedule: str | None = None) -> dict:
    """Compile for llvm (`mcpu`), check the conv kernel's `schedule` rule, run on `x`
    (default: random data) and assert equal to the reference; returns the plan. The run
    skips where this CPU lacks a feature the artifact needs (the runtime refuses it)."""
    t = graph.types["x"]
    if x is None:
        x = rand_in_precision(np.random.default_rng(1), t.shape, t.precision)
    want = reference_run(graph, {"x": x})
    with tempfile.TemporaryDirectory() as tmp:
        plan = compile_model(graph, Path(tmp) / "m.cvmx", mcpu=mcpu).plan
        if schedule is not None:  # the one packed conv's kernel
            assert [k["schedule"] for k in plan["kernels"]
                    if k["ops"][0] == "conv2d_packed"] == [schedule]
        try:
            check_host_cpu(plan["target"])
        except cvmc_runtime.ModelError as e:
            pytest.skip(f"compiled; not run: {e}")
        got = cvmc_runtime.load(Path(tmp) / "m.cvmx").run({"x": x})
    for name in want:
        assert np.array_equal(got[name], want[name]), name
    return plan


@pytest.mark.parametrize("mcpu", list(PATHS))
@pytest.mark.parametrize("geometry", list(GEOMETRIES))
def test_packed_conv_is_exact_on_every_path(geometry, mcpu):
    compiled_vs_reference(conv_graph(*GEOMETRIES[geometry]), mcpu, schedule=PATHS[mcpu])


@pytest.mark.parametrize("n, blocks, rows, columns, tile", [
    (1, 32, 7, 7, (7, 2)),  # ResNet-18's last stage: 2 blocks of 16 channels per tile
    (1, 16, 14, 14, (14, 1)),  # 14 columns fill the accumulators alone
    (1, 4, 112, 112, (16, 1)),  # ResNet-18's first conv: 16 columns
    (1, 8, 5, 5, (5, 2)),  # "narrow, 2 channel blocks" above
    (1, 4, 3, 3, (3, 1)),  # 2 blocks would leave 6 parallel tasks
    (1, 63, 1, 1, (1, 3)),  # dense 512 -> 1000: 21 tasks of 3 blocks
])
def test_tile_shape(n, blocks, rows, columns, tile):
    from cvmc.lowering.x86 import tile_shape

    assert tile_shape(n, blocks, rows, columns) == tile


@pytest.mark.parametrize("n, blocks, rows, columns, tile", [
    (1, 4, 56, 56, (2, 1)),  # ResNet's 56x56 stage: 2 columns x 1 block (8 accumulators)
    (1, 16, 14, 14, (2, 1)),
    (1, 32, 7, 7, (1, 2)),  # an odd row: 1 column x 2 blocks
    (1, 8, 5, 5, (1, 2)),
    (1, 4, 3, 3, (1, 1)),  # 2 blocks would leave 6 parallel tasks
    (1, 63, 1, 1, (1, 1)),  # 63 blocks: no 2-block tile divides them
])
def test_avx2_tile_shape(n, blocks, rows, columns, tile):
    from cvmc.lowering.x86 import avx2_tile_shape

    """The AVX2 tile: (columns x blocks) pairs of 4 ymm accumulators, 2 pairs at most."""
    assert avx2_tile_shape(n, blocks, rows, columns) == tile


@pytest.mark.parametrize("columns, lanes", [
    (112, 16), (16, 16), (56, 8), (8, 8), (28, 0), (14, 0), (7, 0)])
def test_column_lanes(columns, lanes):
    from cvmc.lowering.x86 import column_lanes

    assert column_lanes(columns) == lanes


@pytest.mark.parametrize("geometry, width", [
    ("1x1, 16-column rows", 512), ("3x3 pad 1, 8-column rows", 256),
    ("1x1 stride 2, 16-column rows", None), ("1x1", None)])
def test_columns_in_lanes_where_they_apply(geometry, width):
    """Columns in the lanes: `vpdpbusd` on 16 (512-bit) or 8 (256-bit) columns, the input
    bytes a vector and the weight word broadcast; else the 16x4 channel form (the input
    word broadcast)."""
    with tempfile.TemporaryDirectory() as tmp:
        tir = compile_model(conv_graph(*GEOMETRIES[geometry]), Path(tmp) / "m.cvmx",
                            mcpu="znver4").tir
    channels = 'T.reinterpret("uint8x64", T.Broadcast(word, 16))' in tir
    assert channels == (width is None)
    assert ("llvm.x86.avx512.vpdpbusd.256" in tir) == (width == 256)


def test_vnni_code_uses_vpdpbusd():
    graph = conv_graph(*GEOMETRIES["3x3 pad 1"])
    with tempfile.TemporaryDirectory() as tmp:
        source = compile_model(graph, Path(tmp) / "m.cvmx", mcpu="znver4").source
    assert "llvm.x86.avx512.vpdpbusd.512" in source


def test_avx2_code_uses_pmaddwd_never_pmaddubsw():
    """AVX2: `vpmaddwd` on int16; never the saturating u8 x s8 `vpmaddubsw`."""
    graph = conv_graph(*GEOMETRIES["3x3 pad 1"])
    with tempfile.TemporaryDirectory() as tmp:
        result = compile_model(graph, Path(tmp) / "m.cvmx", mcpu="haswell")
    assert result.plan["kernels"][0]["schedule"] == "x86-avx2"
    assert "llvm.x86.avx2.pmadd.wd" in result.source
    assert "pmadd.ub.sw" not in result.source


@pytest.mark.parametrize("mcpu", list(PATHS))
def test_long_reduction_at_the_extremes(mcpu):
    """C*KH*KW = 4608 with every weight +-127 and every input +-127 (input bytes 255 and
    1): the largest sums and partial sums the 8-bit precisions allow, exact on every path
    (`vpmaddwd`'s partials included)."""
    graph = conv_graph((2, 512, 3, 3), (32, 512, 3, 3), {"padding": [1, 1]}, False, False)
    w = np.full((32, 512, 3, 3), 127, np.int32)
    w[1::2] = -127  # odd output channels all negative
    w[2::4, ::2] = -127  # and some mixed
    graph = graph.replace(constants={**graph.constants, "w": w})
    x = np.full((2, 512, 3, 3), 127, np.int32)
    x[1] = -127  # the second image: bytes 1
    x[1, 3::5] = 127
    compiled_vs_reference(graph, mcpu, x, schedule=PATHS[mcpu])


def test_weights_are_packed_at_compile_time():
    """No kernel packs weights or computes the compensation: both are stored weights."""
    graph = conv_graph(*GEOMETRIES["3x3 pad 1"])
    plan = compiled_vs_reference(graph)
    shapes = {w["name"]: w["shape"] for w in plan["weights"]}
    assert shapes == {"w_packed": [2, 4, 3, 3, 16, 4], "w_compensation": [32], "b": [32]}
    assert [k["ops"] for k in plan["kernels"]] == [
        ["conv2d_packed", "cvm_right_shift", "cvm_clip", "relu"]]


@pytest.mark.parametrize("length, packed", [(MAX_PACKED_REDUCTION, True),
                                            (MAX_PACKED_REDUCTION + 1, False)])
def test_reduction_length_bound(length, packed):
    """255 * 127 * K < 2^31 holds up to K = 66311: one channel more and conv2d stays
    unpacked (2-bit operands, so the precision rule itself allows this K)."""
    assert 255 * 127 * MAX_PACKED_REDUCTION <= 2**31 - 1 < 255 * 127 * (length + 1)
    graph = conv_graph((1, length, 1, 1), (1, length, 1, 1), {}, False, False, p=2)
    plan = compiled_vs_reference(graph)
    assert plan["kernels"][0]["ops"] == ["conv2d_packed" if packed else "conv2d"]


@pytest.mark.parametrize("groups, oc, packed", [(2, 8, False), (2, 32, True), (4, 48, False)])
def test_grouped_conv_is_packed_with_whole_blocks_per_group(groups, oc, packed):
    """A grouped conv is packed where each group's output channels fill 16-channel blocks
    (8 / 2 = 4 and 48 / 4 = 12 do not: those keep the default schedule)."""
    plan = compiled_vs_reference(conv_graph((1, 8, 5, 5), (oc, 8 // groups, 3, 3),
                                            {"groups": groups, "padding": [1, 1]}, True, False))
    assert plan["kernels"][0]["ops"] == ["conv2d_packed" if packed else "conv2d"]


def test_cuda_convs_and_dense_take_the_dp4a_rules():
    """On CUDA every geometry above is packed too and scheduled with `dp4a` (u8 x s8, the
    PTX `dp4a.u32.s32`), and dense with `__dp4a` (s8 x s8) where K is a multiple of 4;
    tests/gpu runs them on a GPU (tests/gpu/prebuilt.py: dp4a_cases). Here: each takes its
    rule, and one conv and one dense of each rule compile with nvcc."""
    from cvmc.codegen.targets.cuda import BACKEND, cuda_translation_unit, find_nvcc, nvcc_shared
    from tests.gpu.prebuilt import dp4a_cases

    cuda = Target.make("cuda")
    calls = {"cuda-conv-dp4a": "cvmc_dp4a_u8s8(", "cuda-dense-dp4a": "__dp4a(",
             "cuda-dlight": None}
    sources = {}
    for name, (graph, rule) in dp4a_cases().items():
        mod, _, _ = BACKEND.lower(BACKEND.run_passes(graph, cuda), cuda)
        _, sources[rule], rules = cuda_translation_unit(mod, cuda)
        assert list(rules.values()) == [rule], name
        kernels = sources[rule].split("extern \"C\" __global__", 1)[1]
        assert calls[rule] is None or calls[rule] in kernels, name
    try:
        find_nvcc()
    except CvmcError as e:
        pytest.skip(e.message)
    with tempfile.TemporaryDirectory() as tmp:
        for rule, source in sources.items():
            nvcc_shared(source, cuda, Path(tmp) / f"{rule}.so")


def test_dlight_schedules_a_one_pixel_packed_conv():
    """A kernel the CUDA rows leave goes to dlight, whose GEMV rule raises ValueError on a
    packed conv with one output pixel (its epilogue has one loop): the rule is skipped."""
    from cvmc.lowering.lower import lower_graph
    from cvmc.lowering.schedule import cuda_target, has_thread_binding, schedule_cuda
    from tests.oputil import compile_passes

    k = MAX_PACKED_REDUCTION
    cuda = Target.make("cuda")
    graph = compile_passes(conv_graph((1, k, 1, 1), (1, k, 1, 1), {}, False, False, p=2),
                         target=cuda)
    mod, _, _ = lower_graph(graph, cuda)
    scheduled = schedule_cuda(mod, cuda_target(cuda))
    assert all(has_thread_binding(f) for f in scheduled.functions.values())

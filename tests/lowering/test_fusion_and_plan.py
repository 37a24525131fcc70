"""Fusion groups, the execution plan, default schedules; fused graphs run bit-exact."""
from __future__ import annotations

import cvmc_runtime
import numpy as np
import pytest

from cvmc.codegen import compile_model
from cvmc.errors import CvmcError
from cvmc.ir import Graph, Node, TensorType
from cvmc.lowering.lower import lower_graph, lower_node
from cvmc.ops.infer import retype
from cvmc.passes.fusion import fuse_groups, fuse_kernels
from cvmc.passes.target import Target
from cvmc.reference import reference_run
from tests.codegen.op_cases import rand


def graph(inputs: dict[str, tuple], nodes: list[tuple], outputs: list[str],
          weights: dict[str, tuple[np.ndarray, int]] | None = None) -> Graph:
    """A typed graph: inputs {name: (shape, precision)}, nodes [(op, ins, out, attrs)]."""
    from cvmc.ops import lookup

    weights = weights or {}
    types = {n: TensorType(s, "int32", p) for n, (s, p) in inputs.items()}
    types.update({n: TensorType(a.shape, "int32", p) for n, (a, p) in weights.items()})
    graph_nodes = []
    for op, ins, out, attrs in nodes:
        d = lookup(op)
        a = d.normalize_attrs(attrs)
        types[out] = TensorType(d.infer_shapes([types[i] for i in ins], a)[0])
        graph_nodes.append(Node(op, tuple(ins), (out,), dict(a)))
    consts = {n: a for n, (a, _) in weights.items()}
    return retype(Graph("g", list(inputs), outputs, graph_nodes, types, consts))


def cnn() -> Graph:
    return graph({"x": ((1, 2, 6, 6), 8)}, [
        ("conv2d", ["x", "w"], "c", {"padding": [1, 1]}),
        ("cvm_right_shift", ["c"], "s", {"precision": 8, "shift_bit": 4}),
        ("cvm_clip", ["s"], "k", {"precision": 8}),
        ("relu", ["k"], "r", {}),
        ("max_pool2d", ["r"], "p", {"pool_size": [2, 2], "strides": [2, 2]}),
        ("flatten", ["p"], "f", {}),
        ("dense", ["f", "dw"], "y", {}),
    ], ["y"], {"w": rand((3, 2, 3, 3), 8, 1), "dw": rand((4, 27), 8, 2)})


def diamond() -> Graph:
    """relu feeds two consumers; an independent abs joins the last add."""
    return graph({"x": ((2, 64), 8), "z": ((2, 64), 8)}, [
        ("relu", ["x"], "a", {}),
        ("abs", ["a"], "b", {}),
        ("negative", ["a"], "c", {}),
        ("abs", ["z"], "d", {}),
        ("elemwise_add", ["c", "d"], "e", {}),
        ("sum", ["e"], "t", {"axes": [1]}),
        ("relu", ["t"], "u", {}),
    ], ["b", "u"])


def test_conv_absorbs_its_elementwise_epilogue():
    groups = fuse_groups(cnn())
    assert [g.ops for g in groups] == [["conv2d", "cvm_right_shift", "cvm_clip", "relu"],
                                       ["max_pool2d"], ["flatten"], ["dense"]]
    assert groups[0].inputs == ["x", "w"] and groups[0].outputs == ["r"]


def test_cuda_fuses_epilogues_into_the_cuda_tables_anchors():
    """On CUDA conv2d and dense (cvmc's own schedules, the CUDA backend's rows) take their epilogues;
    other kernels (dlight's) do not."""
    assert [len(k) for k in fuse_kernels(cnn(), Target.make("cuda")).kernels] == [4, 1, 1, 1]
    fc = graph({"x": ((1, 27), 8)}, [
        ("dense", ["x", "dw"], "y", {}),
        ("cvm_right_shift", ["y"], "s", {"precision": 8, "shift_bit": 4}),
    ], ["s"], {"dw": rand((4, 27), 8, 2)})
    assert [len(k) for k in fuse_kernels(fc, Target.make("cuda")).kernels] == [2]
    assert [len(k) for k in fuse_kernels(fc, Target.make()).kernels] == [2]


def test_cuda_epilogue_anchors_are_the_cuda_tables_anchors():
    """The fusion pass knows which CUDA kernels take an epilogue without importing the
    schedule table (passes sit below lowering); the two must name the same ops."""
    from cvmc.codegen.targets import cuda

    assert Target.make("cuda").epilogue_anchors == {rule.anchor for rule in cuda.ROWS}


def test_shared_values_outputs_and_reductions_end_groups():
    groups = fuse_groups(diamond())
    assert [g.ops for g in groups] == [["relu"], ["abs"], ["negative"],
                                       ["abs", "elemwise_add"], ["sum"], ["relu"]]
    assert groups[3].inputs == ["z", "c"] and groups[3].outputs == ["e"]


def test_fusion_is_a_pass_whose_kernels_lowering_builds_and_dumps_show(tmp_path):
    from cvmc.frontend.nnef import parse_nnef
    from cvmc.frontend.printer import graph_dumper, print_graph
    from tests.oputil import compile_passes

    fused = fuse_kernels(diamond(), Target.make())
    assert fused.kernels == [["a"], ["b"], ["c"], ["d", "e"], ["t"], ["u"]]
    assert len(lower_graph(fused, Target.make())[1]) == 6
    # lowering takes the partition from the pass: a graph without one is refused
    with pytest.raises(CvmcError, match="no kernel partition; run the target's passes"):
        lower_graph(diamond(), Target.make())
    # lowering builds the partition the graph carries, not one of its own
    merged = fused.replace(kernels=[["a", "b", "c"], ["d", "e"], ["t", "u"]])
    assert [g.ops for g in lower_graph(merged, Target.make())[1]] == \
        [["relu", "abs", "negative"], ["abs", "elemwise_add"], ["sum", "relu"]]
    # a pass that rewrites the nodes drops the stale partition
    assert fused.replace(nodes=fused.nodes[:1], outputs=["a"]).kernels == []
    # --dump-ir: each kernel is a comment before its first node; the text parses back
    compile_passes(diamond(), after_pass=graph_dumper(tmp_path),
                 target=Target.make())
    (dump,) = tmp_path.glob("*-fuse-kernels.nnef")  # its index: the passes before it
    text = dump.read_text()
    assert "    # kernel 3: abs, elemwise_add\n    d = abs(z);\n    e = elemwise_add(c, d);" \
        in text
    assert retype(parse_nnef(text, "dump.nnef")) == diamond()
    assert print_graph(diamond()).count("# kernel") == 0


def test_plan_buffers_and_peak_memory():
    _, _, plan = lower_graph(fuse_kernels(diamond(), Target.make()), Target.make())
    assert [b["name"] for b in plan["buffers"]] == ["a", "c", "e", "t"]
    assert [k["args"] for k in plan["kernels"]][:2] == [["x", "a"], ["a", "b"]]
    # Hand-computed: x z a b c are int8 [2, 64] (128 B); e = c + d has precision 9, so
    # int32 (512 B); t, u are int32 [2] (8 B). Live during kernel 3 (abs + add): z (read
    # there), b (an output), c (read there), e (written there) = 3 * 128 + 512.
    assert plan["peak_activation_bytes"] == 896


@pytest.mark.parametrize("make", [cnn, diamond], ids=["cnn", "diamond"])
def test_fused_graph_matches_reference(tmp_path, make):
    g = make()
    compile_model(g, tmp_path / "m.cvmx", "llvm")
    model = cvmc_runtime.load(tmp_path / "m.cvmx")
    feeds = {s.name: rand(s.shape, s.precision, 5)[0] for s in model.inputs}
    got = model.run(feeds)
    want = reference_run(g, feeds)
    for name in g.outputs:
        assert np.array_equal(got[name], want[name]), name


def _scheduled_cpu_script(g: Graph) -> str:
    import tvm
    from tvm import s_tir

    from cvmc.lowering.schedule import schedule_cpu

    mod = tvm.IRModule({"k": lower_node(g.nodes[0], g.types, "k", Target.make())})
    sch = s_tir.Schedule(mod)
    sch.work_on("k")
    schedule_cpu(sch, "k")
    return sch.mod.script()


def test_cpu_schedule_parallel_and_vectorised():
    script = _scheduled_cpu_script(graph({"x": ((4, 64), 12)}, [("relu", ["x"], "y", {})],
                                         ["y"]))
    assert "T.parallel" in script and "T.vectorized" in script
    assert script.count("T.sblock(") == 2  # root + relu: the int32 view/cast are inlined


def test_cpu_schedule_parallelises_reduction_outer_loop():
    script = _scheduled_cpu_script(graph({"x": ((6, 10), 12)},
                                         [("sum", ["x"], "y", {"axes": [1]})], ["y"]))
    assert "T.parallel" in script


def test_cuda_schedule_binds_every_kernel():
    from cvmc.lowering.schedule import cuda_target, has_thread_binding, schedule_cuda

    cuda = Target.make("cuda")
    mod, _, _ = lower_graph(fuse_kernels(diamond(), cuda), cuda)
    mod = schedule_cuda(mod, cuda_target(cuda))
    assert all(has_thread_binding(f) for f in mod.functions.values())

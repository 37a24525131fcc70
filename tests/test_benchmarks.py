"""Smoke test of benchmarks/run.py: it builds, verifies and times a workload (no timing asserts)."""
from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import numpy as np
import pytest

RUN_PY = Path(__file__).resolve().parent.parent / "benchmarks" / "run.py"


@pytest.fixture(scope="module")
def bench():
    """benchmarks/run.py imported as a module (benchmarks/ is scripts, not a package)."""
    spec = importlib.util.spec_from_file_location("cvmc_benchmarks_run", RUN_PY)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    yield module
    del sys.modules[spec.name]


def test_smallest_workload_gives_a_verified_row(bench):
    rows = bench.run_benchmarks(threads=1, repeat=1, name_filter="small_cnn").rows
    reference = [r for r in rows if r.baseline == "reference (NumPy)"]
    assert len(reference) == 1
    row = reference[0]
    assert row.workload == "small_cnn"
    assert row.cvmc_ms > 0 and row.baseline_ms > 0
    assert row.ratio == pytest.approx(row.baseline_ms / row.cvmc_ms)
    assert row.verified == "cvmc == reference"
    assert "| small_cnn | reference (NumPy) |" in bench.table(rows)


def test_a_wrong_output_is_never_timed(bench):
    expected = {"y": np.array([1, 2, 3], np.int32)}
    bench._check_equal("cvmc w", {"y": expected["y"].copy()}, expected)
    with pytest.raises(bench.VerificationError, match="output 'y' differs .* in 1 of 3 elements"):
        bench._check_equal("cvmc w", {"y": np.array([1, 2, 4], np.int32)}, expected)
    with pytest.raises(bench.VerificationError, match=r"shape \(2,\), expected \(3,\)"):
        bench._check_equal("cvmc w", {"y": np.array([1, 2], np.int32)}, expected)


def test_unknown_filter_exits_nonzero(bench, capsys):
    assert bench.main(["--filter", "no such workload", "--repeat", "1"]) == 1
    assert "no workload matches" in capsys.readouterr().err


def test_missing_onnxruntime_is_reported(bench, capsys, monkeypatch):
    monkeypatch.setattr(bench, "onnx_available", lambda: False)
    bench.main(["--filter", "no such workload", "--repeat", "1"])
    assert "onnxruntime not installed: skipped" in capsys.readouterr().out




def test_missing_openvino_is_reported(bench, capsys, monkeypatch):
    monkeypatch.setattr(bench, "openvino_available", lambda: False)
    bench.main(["--filter", "no such workload", "--repeat", "1"])
    assert "openvino not installed: skipped" in capsys.readouterr().out


# ---- the networks' QDQ twin (OpenVINO's input)

QUANTIZED = {"Conv", "Add", "MaxPool", "GlobalAveragePool", "Gemm"}


@pytest.mark.parametrize("name", ["resnet18", "mobilenet_v1"])
def test_qdq_twin_is_standard_onnx_with_every_op_between_dq_and_q(bench, name):
    """Valid ONNX, default domain only; every float op reads DequantizeLinear outputs, and
    every one but the classifier's Gemm feeds a QuantizeLinear: nothing left in float."""
    onnx = pytest.importorskip("onnx")
    from models import MODELS

    net = MODELS[name](32)
    model = net.qdq_model()
    onnx.checker.check_model(model, full_check=True)
    assert [o.domain for o in model.opset_import] == [""]
    nodes = model.graph.node
    producer = {out: n.op_type for n in nodes for out in n.output}
    consumers: dict[str, list[str]] = {}
    for n in nodes:
        for i in n.input:
            consumers.setdefault(i, []).append(n.op_type)
    float_ops = [n for n in nodes if n.op_type in QUANTIZED]
    counts = {op: sum(n.op_type == op for n in float_ops) for op in QUANTIZED}
    convs = 20 if name == "resnet18" else 27
    assert counts == {"Conv": convs, "Add": 8 if name == "resnet18" else 0,
                      "MaxPool": 1 if name == "resnet18" else 0, "GlobalAveragePool": 1,
                      "Gemm": 1}
    for n in float_ops:
        assert {producer[i] for i in n.input} == {"DequantizeLinear"}, n.name
        if n.op_type != "Gemm":
            assert consumers[n.output[0]] == ["QuantizeLinear"], n.op_type
    assert [i.name for i in model.graph.input] == ["data"]
    assert model.graph.input[0].type.tensor_type.elem_type == onnx.TensorProto.UINT8


def test_openvino_runs_the_qdq_twin_in_int8(bench):
    """OpenVINO's runtime model reports an int8 kernel for each of the 21 conv/dense layers
    of ResNet-18 (20 convs + the classifier), and the float twin would be refused."""
    pytest.importorskip("onnx")
    ov = pytest.importorskip("openvino")
    from models import MODELS

    core = ov.Core()
    qdq = MODELS["resnet18"](32).qdq_model()
    compiled = core.compile_model(core.read_model(qdq.SerializeToString()), "CPU",
                                  {"INFERENCE_NUM_THREADS": 1})
    layers, not_int8, kernels = bench.openvino_int8_layers(compiled)
    assert len(layers) == 21 and not_int8 == []
    assert all(k.endswith("I8") for k in kernels), kernels
    # The same graph without its Q/DQ nodes runs in f32: the check sees it.
    compiled = core.compile_model(core.read_model(_float_twin(qdq).SerializeToString()), "CPU")
    layers, not_int8, _ = bench.openvino_int8_layers(compiled)
    assert len(layers) == 21 and len(not_int8) == 21


def _float_twin(qdq):
    """`qdq` with its QuantizeLinear/DequantizeLinear nodes removed: float in, float out."""
    from onnx import TensorProto, helper, numpy_helper

    alias = {n.output[0]: n.input[0] for n in qdq.graph.node
             if n.op_type in ("DequantizeLinear", "QuantizeLinear")}

    def real(name: str) -> str:
        while name in alias:
            name = alias[name]
        return name

    nodes = [helper.make_node(n.op_type, [real(i) for i in n.input], list(n.output),
                              **{a.name: helper.get_attribute_value(a) for a in n.attribute})
             for n in qdq.graph.node if n.op_type not in ("DequantizeLinear", "QuantizeLinear")]
    used = {i for n in nodes for i in n.input}
    consts = [numpy_helper.from_array(numpy_helper.to_array(t).astype(np.float32), t.name)
              for t in qdq.graph.initializer if t.name in used]
    graph = helper.make_graph(
        nodes, "f32", [helper.make_tensor_value_info("data", TensorProto.FLOAT, [1, 3, 32, 32])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, 1000])], consts)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


# ---- benchdnn shape lists (rules in ../shared/data/benchdnn-conv-shapes/README.md)

def test_benchdnn_descriptors_follow_the_benchdnn_rules(bench):
    from benchdnn import parse_descriptor

    s = parse_descriptor('g1mb50ic256ih56iw56oc512oh28ow28kh1kw1sh2sw2ph0pw0n"r50:res3a_branch1"')
    assert (s.name, s.count, s.groups, s.ic, s.ih, s.iw, s.oc, s.kh, s.kw) == \
        ("r50:res3a_branch1", 1, 1, 256, 56, 56, 512, 1, 1, )
    assert (s.stride, s.pad, s.dilation, s.out_hw()) == ((2, 2), (0, 0), (1, 1), (28, 28))
    # '*3' counts occurrences; w copies h; '_' separates; mb is ignored
    s = parse_descriptor('mb50_ic64ih56_oc64oh56_kh3ph1n"r50:res2a_branch2b*3"')
    assert (s.name, s.count, s.iw, s.kw, s.pad, s.out_hw()) == \
        ("r50:res2a_branch2b", 3, 56, 3, (1, 1), (56, 56))
    # p from o: ((56 - 1) * 1 - 56 + 3) / 2 = 1
    assert parse_descriptor('ic64ih56oc64oh56kh3n"p"').pad == (1, 1)
    # o from p: (224 - 3 + 2) // 2 + 1 = 112
    assert parse_descriptor('ic3ih224oc32kh3sh2ph1n"o"').out_hw() == (112, 112)
    # benchdnn dilation 1 is CVM dilation 2: span 5, o = 20 - 5 + 1 = 16
    s = parse_descriptor('g8ic8ih20oc8kh3dh1n"d"')
    assert (s.groups, s.dilation, s.out_hw()) == (8, (2, 2), (16, 16))


@pytest.mark.parametrize("text, why", [
    ('ic8ih10oc8oh10kh2n"a"', "asymmetric padding"),   # p = 0 gives 9, not 10
    ('ic4id5ih5oc4kd3kh3n"c"', "3D"),
    ('ic4iw5oc4kw3n"l"', "'ih' is missing"),
    ('g3ic8ih5oc8kh1n"g"', "multiple of groups"),
    ('ic4ih5oc4kh1xx2n"u"', "unknown key 'xx'"),
])
def test_benchdnn_descriptors_cvm_cannot_run_are_refused(bench, text, why):
    from benchdnn import ShapeError, parse_descriptor

    with pytest.raises(ShapeError, match=why):
        parse_descriptor(text)


def test_benchdnn_file_comments_and_set_names(bench, tmp_path):
    from benchdnn import ShapeError, read_shapes, shape_file

    (tmp_path / "shapes_resnet_50").write_text(
        '# resnet\n\nic3ih8oc4kh3ph1n"a"  ic4ih8oc4kh1n"b*2"  # ic4ih8oc4kh1n"c"\n'
        '# ic4ih8oc4kh1n"d"\nic4id8oc4kd1n"e"\n')
    shapes, skipped = read_shapes(shape_file("resnet50", tmp_path))
    assert [(s.name, s.count) for s in shapes] == [("a", 1), ("b", 2)]
    assert len(skipped) == 1 and "3D" in skipped[0]
    with pytest.raises(ShapeError, match=r"no benchdnn shape set 'vgg' .*available: resnet_50"):
        shape_file("vgg", tmp_path)


def test_shapes_are_skipped_without_the_shared_folder(bench, monkeypatch, tmp_path):
    monkeypatch.setattr(bench, "SHAPES_FOLDER", tmp_path / "absent")
    makers, notes = bench.shape_workloads(["resnet50"])
    assert makers == [] and len(notes) == 1 and "--shapes skipped" in notes[0]
    assert bench.shape_workloads([]) == ([], [])


def test_a_strided_grouped_conv_shape_is_verified_and_timed(bench, tmp_path):
    """A benchdnn-style conv (stride 2, groups 4, dilation 2) compiles, matches the
    reference bit for bit, and gives a QLinearConv row checked against its requant model
    when onnxruntime is there."""
    from benchdnn import parse_descriptor

    s = parse_descriptor('g4ic8ih11oc8kh3sh2ph2dh1n"t:grouped"')
    w = bench.conv_shift_clip(s, suite="benchdnn t")
    assert w.name == "conv 8x11x11 3x3/2 g4 d2 ->8 +shift+clip (t:grouped)"
    results = bench.measure(w, 1, 1, tmp_path)
    rows = results.rows
    if not bench.onnx_available():
        assert rows == [] and results.untimed == []
    elif results.untimed:  # ORT's saturating u8 x s8 kernel (AVX2 without VNNI)
        assert rows == [] and len(results.untimed) == 1
        assert results.untimed[0].startswith(f"{w.name}: onnxruntime QLinearConv u8: output "
                                             f"'out' differs from the expected in ")
    else:
        assert [r.baseline for r in rows] == ["onnxruntime QLinearConv u8"]
        assert rows[0].suite == "benchdnn t" and "half-even requant" in rows[0].verified


def test_an_onnx_baseline_whose_output_differs_is_marked_wrong(bench):
    class Session:  # an ORT session stand-in whose output is off by one in one element
        def run(self, _, feeds):
            return [feeds["data"] + (np.arange(feeds["data"].size) == 3)]

    x = np.zeros(8, np.int32)
    exact = bench._onnx_impl("Fake", Session(), {"data": x + 0}, x + (np.arange(8) == 3), "")
    wrong = bench._onnx_impl("Fake", Session(), {"data": x + 0}, x, "")
    assert exact.wrong == ""
    assert wrong.wrong == "onnxruntime Fake: output 'out' differs from the expected in 1 of 8 " \
                          "elements"


def test_geometric_mean_per_shape_set(bench):
    def row(suite, ratio, threads=1):
        return bench.Row("w", "b", 1.0, ratio, ratio, threads, "cpu", "", suite)

    means = bench.geomeans([row("s", 2.0), row("s", 8.0), row("t", 3.0), row("", 5.0),
                            row("s", 0.5, threads=2)])
    assert [(m["suite"], m["threads"], m["shapes"]) for m in means] == \
        [("s", 1, 2), ("t", 1, 1), ("s", 2, 1)]
    assert [m["geomean_ratio"] for m in means] == pytest.approx([4.0, 3.0, 0.5])


# ---- contention and memory

@pytest.mark.parametrize("count", [1, 2])
def test_busy_processes_spin_pinned_and_are_stopped(bench, count):
    import os

    mine = sorted(os.sched_getaffinity(0), reverse=True)
    with bench.busy_processes(count, limit_s=30) as (cores, procs):
        assert len(procs) == count and all(p.poll() is None for p in procs)
        assert [os.sched_getaffinity(p.pid) for p in procs] == [{c} for c in cores]
        assert cores == [mine[i % len(mine)] for i in range(count)]
    assert all(p.poll() is not None for p in procs)


@pytest.mark.parametrize("name", ["resnet18", "mobilenet_v1"])
def test_networks_compile_to_the_reference_and_measure(bench, name, tmp_path, monkeypatch):
    """The benchmark networks at 32x32 through every network path: cvmc matches the
    reference; a row per available baseline; each runtime's memory (cvmc's plan holds at
    least its weights); slowdowns beside 1 and 2 busy processes."""
    import cvmc_runtime

    import cvmc

    monkeypatch.setattr(bench, "CONTENTION_REPEAT", 3)  # the path, not a p99 worth reading
    user_cache = os.environ.get("CVMC_CACHE_DIR")

    w = bench.network(name, 32)
    results = bench.measure(w, 1, 1, tmp_path, contention=True)
    model = cvmc_runtime.load(tmp_path / "model.cvmx")
    got = model.run(w.inputs)
    want = cvmc.reference_run(cvmc.load_graph(tmp_path), w.inputs)
    assert got["logits"].shape == (1, 1000)
    assert np.array_equal(got["logits"], want["logits"])

    expected = ["onnxruntime QLinearConv u8 network"] if bench.onnx_available() else []
    if bench.openvino_available():
        expected.append("openvino QDQ int8 network")
    assert [r.baseline for r in results.rows] == expected
    runtimes = ["cvmc", *expected]
    assert [(s.competitors, s.runtime) for s in results.slowdowns] == \
        [(n, r) for n in bench.COMPETITORS for r in runtimes]
    assert all(s.slowdown == pytest.approx(s.contended_ms / s.quiet_ms)
               and s.quiet_p99_ms >= s.quiet_ms and s.contended_p99_ms >= s.contended_ms
               for s in results.slowdowns)
    memory = results.memory[0]
    weights = sum(v.nbytes for v in w.weights.values())
    assert memory.runtime == "cvmc" and memory.plan_bytes >= weights
    assert memory.plan_bytes >= model.plan["arena"]["bytes"]
    assert len(results.memory) == 1 + len(expected)
    assert all(m.first_bytes > 0 for m in results.memory)
    # compiled cold (an empty kernel cache of its own), then warm; the user's cache setting
    # is left as it was
    (compiled,) = results.compiles
    assert compiled.kernels == len(model.plan["kernels"])
    assert compiled.cold_s > 0 and compiled.warm_s > 0
    assert os.environ.get("CVMC_CACHE_DIR") == user_cache


def test_implementations_are_timed_in_turns(bench, monkeypatch):
    """median_ms alternates the runtimes, WARMUP untimed calls before each turn of at most
    BURST timed ones, until each has `repeat` timed calls."""
    monkeypatch.setattr(bench, "PAUSE_S", 0)
    log = []
    w, b = bench.WARMUP, bench.BURST
    medians = bench.median_ms([lambda: log.append("a"), lambda: log.append("b")], b + 2)
    assert log == ["a"] * (w + b) + ["b"] * (w + b) + ["a"] * (w + 2) + ["b"] * (w + 2)
    assert len(medians) == 2 and all(m >= 0 for m in medians)

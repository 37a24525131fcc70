"""Smoke test of benchmarks/run.py: it builds, verifies and times a workload (no timing asserts)."""
from __future__ import annotations

import importlib.util
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
    rows = bench.run_benchmarks(threads=1, repeat=1, name_filter="small_cnn")
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


def test_onnx_baseline_rejects_a_wrong_result(bench):
    class Session:
        def run(self, names, feeds):
            return [np.array([5], np.int32)]

    with pytest.raises(bench.VerificationError, match="onnxruntime Fake: .* 1 of 1 elements"):
        bench._onnx_impl("Fake", Session(), {}, np.array([6], np.int32), "int32 == reference")


def test_unknown_filter_exits_nonzero(bench, capsys):
    assert bench.main(["--filter", "no such workload", "--repeat", "1"]) == 1
    assert "no workload matches" in capsys.readouterr().err


def test_missing_onnxruntime_is_reported(bench, capsys, monkeypatch):
    monkeypatch.setattr(bench, "onnx_available", lambda: False)
    bench.main(["--filter", "no such workload", "--repeat", "1"])
    assert "onnxruntime not installed: skipped" in capsys.readouterr().out


@pytest.mark.parametrize("name", ["resnet18", "mobilenet_v1"])
def test_network_generators_compile_to_the_reference(bench, name, tmp_path):
    """The benchmark networks at 32x32: cvmc accepts them and matches the reference."""
    import cvmc_runtime

    import cvmc

    w = bench.network(name, 32)
    graph = cvmc.load_graph(bench._model_folder(w, tmp_path))
    cvmc.compile(graph, tmp_path / "m.cvmx")
    got = cvmc_runtime.load(tmp_path / "m.cvmx").run(w.inputs)
    want = cvmc.reference_run(graph, w.inputs)
    assert got["logits"].shape == (1, 1000)
    assert np.array_equal(got["logits"], want["logits"])

"""Smoke test of benchmarks/float_suite.py: its smallest model exported, compiled, checked
against ONNX Runtime and timed once (shape and accuracy asserted, never speed)."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest

SUITE_PY = Path(__file__).resolve().parent.parent / "benchmarks" / "float_suite.py"


@pytest.fixture(scope="module")
def suite():
    """benchmarks/float_suite.py imported as a module (benchmarks/ is scripts)."""
    pytest.importorskip("onnxruntime")
    pytest.importorskip("onnx")
    spec = importlib.util.spec_from_file_location("cvmc_float_suite", SUITE_PY)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    if not Path(module.TORCH_PYTHON).is_file():
        pytest.skip(f"no torch venv at {module.TORCH_PYTHON} to export the model")
    yield module
    del sys.modules[spec.name]


def test_smallest_model_matches_onnx_runtime(suite, tmp_path):
    # the 2-layer transformer encoder: d_model 256, 4 heads, sequence 64, batch 1
    (row,) = suite.measure(suite.MODELS["transformer_encoder"], [1], repeat=1, cache=tmp_path)
    assert row.error == ""
    assert row.out_shape == [1, 64, 256]
    assert row.max_rel_error <= suite.REL_TOL
    assert row.cvmc_ms > 0 and row.ort_ms > 0 and row.compile_s > 0
    assert "| transformer_encoder | 1 | 16 |" in suite.table([row])
    assert (tmp_path / "transformer_encoder-opset16.onnx").is_file()


def test_rel_error_refuses_another_shape(suite):
    expected = np.array([[1.0, -4.0]], np.float32)
    assert suite.rel_error(np.array([[1.0, -3.0]], np.float32), expected) == 0.25
    assert suite.rel_error(expected.T, expected) == np.inf


def test_a_failing_model_is_a_row(suite, tmp_path, monkeypatch):
    monkeypatch.setattr(suite, "TORCH_PYTHON", str(tmp_path / "no-python"))
    rows = suite.measure(suite.MODELS["resnet18"], [1, 2], repeat=1, cache=tmp_path)
    assert [(r.threads, r.cvmc_ms) for r in rows] == [(1, None), (2, None)]
    assert all("no torch venv" in r.error for r in rows)
    assert "no torch venv" in suite.table(rows)

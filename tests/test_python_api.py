"""The README's Python API example runs as written, and API mistakes raise CvmcError."""
from __future__ import annotations

from pathlib import Path

import pytest

import cvmc
from tests.shared import run_doc_example

ROOT = Path(__file__).resolve().parents[1]


def test_readme_python_api_example_runs(tmp_path):
    run_doc_example("## Python API", tmp_path)
    assert (tmp_path / "small_cnn.cvmx").is_file()


def test_api_mistakes_are_cvmc_errors(tmp_path):
    with pytest.raises(cvmc.CvmcError, match="no such file"):
        cvmc.load_graph(tmp_path / "missing.nnef")
    graph = cvmc.load_graph(ROOT / "examples" / "small_cnn")
    with pytest.raises(cvmc.CvmcError, match="does not exist"):
        cvmc.compile(graph, tmp_path / "no" / "m.cvmx")
    with pytest.raises(cvmc.CvmcError, match="unknown target"):
        cvmc.compile(graph, tmp_path / "m.cvmx", target="tpu")
    with pytest.raises(cvmc.CvmcError, match="is a folder"):
        cvmc.compile(graph, tmp_path)

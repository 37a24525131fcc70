"""The graph's edges, compiled and run: constant outputs (a weight passed straight out, an
output that constant folding computes, a graph with no kernel at all), an input passed
straight out, an output that another kernel also
reads. Every compiled result equals the reference interpreter's (issue 9, item 1: a
constant output used to come back as uninitialised heap memory)."""
from __future__ import annotations

import dataclasses

import cvmc_runtime
import numpy as np
import pytest

import cvmc
from cvmc.codegen import compile_model
from cvmc.frontend.tensorfile import write_tensor
from tests.oputil import compile_passes

W = np.array([-1, 3, -5, 7], np.int8)  # the issue's weight; relu(W) = [0, 3, 0, 7]
X = np.array([1, -2, 3, -4], np.int8)

CASES = {  # name: (graph outputs, graph body)
    "weight_output_after_folding": ("y, z", "y = relu(w); z = relu(x);"),
    "weight_passed_out": ("w, z", "z = relu(x);"),
    "only_constants": ("y", "y = relu(w);"),
    "input_passed_out": ("x, z", "z = relu(x);"),
    "output_also_consumed": ("z, s", "z = relu(x); s = negative(z);"),
}


def _document(outputs: str, body: str) -> str:
    return f"""version 1.0;
graph G( x ) -> ( {outputs} )
{{
    x = external<integer>(shape = [4], precision = 8);
    w = variable<integer>(shape = [4], label = "w", precision = 8);
    {body}
}}
"""


@pytest.mark.parametrize("name", list(CASES))
def test_edge_compiles_to_the_reference(name, tmp_path):
    outputs, body = CASES[name]
    (tmp_path / "graph.nnef").write_text(_document(outputs, body))
    write_tensor(tmp_path / "w.dat", W)
    graph = compile_passes(cvmc.load_graph(tmp_path / "graph.nnef"))
    want = cvmc.reference_run(graph, {"x": X})
    compile_model(graph, tmp_path / "m.cvmx")
    model = cvmc_runtime.load(tmp_path / "m.cvmx")
    for _ in range(2):  # a second run must not see anything left from the first
        got = model.run({"x": X})
        assert got.keys() == want.keys()
        for key in want:
            assert np.array_equal(got[key], want[key]), key


def test_issue_repro_values(tmp_path):
    """The issue's numbers, by hand: relu([-1, 3, -5, 7]) = [0, 3, 0, 7]."""
    (tmp_path / "graph.nnef").write_text(_document(*CASES["weight_output_after_folding"]))
    write_tensor(tmp_path / "w.dat", W)
    compile_model(compile_passes(cvmc.load_graph(tmp_path / "graph.nnef")), tmp_path / "m.cvmx")
    got = cvmc_runtime.load(tmp_path / "m.cvmx").run({"x": X})
    assert got["y"].tolist() == [0, 3, 0, 7]
    assert got["z"].tolist() == [1, 0, 3, 0]


def test_value_listed_twice_as_output(tmp_path):
    """NNEF refuses a repeated output name, but a graph built in Python (or imported) may
    list one value twice: a kernel output, an input and a folded constant, each twice."""
    (tmp_path / "graph.nnef").write_text(_document("y, z, x", "y = relu(w); z = relu(x);"))
    write_tensor(tmp_path / "w.dat", W)
    graph = compile_passes(cvmc.load_graph(tmp_path / "graph.nnef"))
    graph = dataclasses.replace(graph, outputs=["z", "y", "z", "x", "y", "x"])
    want = cvmc.reference_run(graph, {"x": X})
    compile_model(graph, tmp_path / "m.cvmx")
    got = cvmc_runtime.load(tmp_path / "m.cvmx").run({"x": X})
    assert got.keys() == want.keys() == {"x", "y", "z"}
    for key in want:
        assert np.array_equal(got[key], want[key]), key

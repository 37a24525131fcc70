"""Calibration on compiled code (`--calib-on llvm`, the default) against the reference
interpreter's (the oracle): the same statistics of every input and layer output within
float rounding, in batches and one sample at a time."""
from __future__ import annotations

import numpy as np
import pytest

from cvmc import load_graph
from cvmc.cli import main
from cvmc.cli.quantize import compiled_calibration, reference_calibration
from cvmc.codegen import Quiet
from cvmc.quantize import Options, quantize_graph
from cvmc.quantize.calibrate import calibration_graph
from cvmc.quantize.layers import group_layers

pytest.importorskip("nnef_tools", reason="needs the convert extra: pip install 'cvmc[convert]'")
onnx = pytest.importorskip("onnx")

from tests.quantize.onnx_nets import branchy_net, conv_bn_net

NETS = {"conv_bn": (conv_bn_net, (1, 1, 12, 12)), "branchy": (branchy_net, (1, 2, 8, 8))}


def _stats(folder, samples, calibrator):
    """The statistics `calibrator` hands quantize_graph for the model in `folder`."""
    kept = {}

    def keep(layers, data, count):
        kept.update(calibrator(layers, data, count))
        return kept
    quantize_graph(load_graph(folder), {"x": samples}, Options(), calibrator=keep)
    return kept


@pytest.mark.parametrize("net", list(NETS))
@pytest.mark.parametrize("batch", [1, 4])
def test_compiled_statistics_are_the_interpreters(tmp_path, net, batch):
    make, shape = NETS[net]
    onnx.save(make(), tmp_path / "net.onnx")
    assert main(["convert", str(tmp_path / "net.onnx"), "-o", str(tmp_path / "f")]) == 0
    samples = np.random.default_rng(3).standard_normal((7, *shape)).astype(np.float32)
    want = _stats(tmp_path / "f", samples, lambda *a: reference_calibration(*a, Quiet()))
    got = _stats(tmp_path / "f", samples,
                 lambda *a: compiled_calibration(*a, Quiet(), batch, tmp_path))
    assert set(got) == set(want) and len(want) > 5
    for name, w in want.items():
        g = got[name]
        assert g.count == w.count, name
        assert g.absmax == pytest.approx(w.absmax, rel=1e-5, abs=1e-6), name
        assert g.total == pytest.approx(w.total, rel=1e-4, abs=1e-4), name
        assert g.squares == pytest.approx(w.squares, rel=1e-4, abs=1e-4), name
        assert len(g.kept) == len(w.kept) == 7
        for a, b in zip(g.kept, w.kept):
            np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


def test_a_graph_that_fixes_its_batch_runs_one_sample_at_a_time(tmp_path):
    """A reshape to [1, 8] ties the graph to batch 1: no batched graph, the same
    statistics one sample a run."""
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "graph.nnef").write_text("""version 1.0;

graph g(x) -> (y)
{
    x = external<scalar>(shape = [1, 2, 4]);
    r = relu(x);
    y = reshape(r, shape = [1, 8]);
}
""")
    graph = load_graph(tmp_path / "m")
    layers = group_layers(graph)
    assert calibration_graph(layers, 4) is None
    assert calibration_graph(layers, None).outputs == ["r", "y"]
    samples = np.random.default_rng(4).standard_normal((5, 1, 2, 4)).astype(np.float32)
    got = _stats(tmp_path / "m", samples,
                 lambda *a: compiled_calibration(*a, Quiet(), 4, tmp_path))
    want = np.abs(np.maximum(samples, 0)).max()
    assert got["y"].absmax == pytest.approx(float(want), rel=1e-6)
    assert got["x"].absmax == pytest.approx(float(np.abs(samples).max()), rel=1e-6)

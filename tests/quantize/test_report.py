"""`--report`'s per-layer precision and sensitivity (issue 30, item 4): a layer whose 8-bit
scale is made coarse by an outlier is the most sensitive; a one-layer model's sensitivity is
the SQNR of its output rounded to its own grid (NumPy); the precision column is the integer
graph's."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest

from cvmc.cli import main
from cvmc.frontend import load_checked
from cvmc.quantize import Options, quantize_graph
from cvmc.quantize.report import layer_report
from tests.quantize.tiny import rule

RNG = np.random.default_rng(7)
W1 = RNG.normal(size=(4, 6)).round(2)
W1[0, 0] = 500.0  # a[:, 0] ~ 500 x[:, 0]: a's 8-bit step (~12) rounds its other columns to 0
W2 = RNG.normal(size=(6, 5)).round(2)
W2[0, :] = 0.001  # ... and h hardly reads the outlier column: y depends on a's others
W3 = RNG.normal(size=(5, 3)).round(2)


def _net(folder, weights: dict[str, np.ndarray], body: str):
    """A float NNEF folder: x [2, 4], the weights as constants, the body's lines -> y."""
    folder.mkdir(exist_ok=True)
    consts = "".join(f"    {n} = constant<scalar>(shape = {list(w.shape)}, "
                     f"value = {w.ravel().tolist()});\n" for n, w in weights.items())
    (folder / "graph.nnef").write_text(
        f"version 1.0;\ngraph g( x ) -> ( y )\n{{\n    x = external<scalar>(shape = [2, 4]);\n"
        f"{consts}{body}}}\n")
    return folder


def _chain(tmp_path):
    return _net(tmp_path / "chain", {"w1": W1, "w2": W2, "w3": W3},
                "    a = matmul(x, w1);\n    h = matmul(a, w2);\n    y = matmul(h, w3);\n")


def _samples(n: int) -> dict[str, np.ndarray]:
    return {"x": RNG.normal(size=(n, 2, 4)).astype(np.float32)}


def test_the_coarse_layer_is_the_most_sensitive(tmp_path):
    samples = _samples(6)
    q = quantize_graph(load_checked(_chain(tmp_path)), samples, Options())
    rows = {r["layer"]: r for r in layer_report(q, samples, 6)}
    assert set(rows) == {"a", "h", "y"}
    assert rows["a"]["sensitivity_rank"] == 1
    # a's columns other than the outlier are mostly 0: y keeps almost none of its signal
    assert rows["a"]["sensitivity_db"] < 10.0
    assert min(rows["h"]["sensitivity_db"], rows["y"]["sensitivity_db"]) > 30.0


@pytest.mark.parametrize("sensitivity", [8, 2])
def test_one_layer_sensitivity_is_its_output_sqnr(tmp_path, sensitivity):
    w = RNG.normal(size=(4, 3)).round(2)
    samples = _samples(5)
    q = quantize_graph(load_checked(_net(tmp_path / "one", {"w": w}, "    y = matmul(x, w);\n")),
                       samples, Options())
    [row] = layer_report(q, samples, 5, sensitivity=sensitivity)
    scale = q.manifest()["outputs"]["y"]["scale"]
    f = np.matmul(samples["x"][:sensitivity], w.astype(np.float32)).astype(np.float64)
    d = rule(f, scale, 8) / scale  # an 8-bit output: the default --output-bits
    want = 10 * math.log10(np.square(f).sum() / np.square(f - d).sum())
    assert row["sensitivity_db"] == pytest.approx(want, abs=1e-4)
    assert row["sensitivity_rank"] == 1


def test_precision_is_the_integer_graphs(tmp_path):
    samples = _samples(3)
    q = quantize_graph(load_checked(_chain(tmp_path)), samples, Options(output_bits=16))
    rows = {r["layer"]: (r["precision"], r["dtype"]) for r in layer_report(q, samples, 3)}
    assert rows == {n: (q.graph.types[n].precision, q.graph.types[n].dtype) for n in rows}
    assert rows["y"] == (16, "int32") and rows["a"] == (8, "int8")


def test_cli_report_shows_precision_and_marks_the_most_sensitive(tmp_path, capsys):
    np.save(tmp_path / "x.npy", _samples(4)["x"])
    capsys.readouterr()
    assert main(["quantize", str(_chain(tmp_path)), "-o", str(tmp_path / "q"), "--calib",
                 f"x={tmp_path / 'x.npy'}", "--output-bits", "16", "--report",
                 "--report-json", str(tmp_path / "r.json"), "--sensitivity-samples", "3"]) == 0
    lines = capsys.readouterr().out.splitlines()
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["samples"] == 4 and report["sensitivity_samples"] == 3
    ranks = {r["layer"]: r["sensitivity_rank"] for r in report["layers"]}
    assert ranks["a"] == 1 and sorted(ranks.values()) == [1, 2, 3]
    row = {n: next(ln for ln in lines if ln.strip("│ ").startswith(n + " ")) for n in ranks}
    assert "16 (int32)" in row["y"] and "◀ 1" in row["a"]


def test_sensitivity_samples_must_be_positive(tmp_path, capsys):
    with pytest.raises(SystemExit):
        main(["quantize", str(_chain(tmp_path)), "-o", str(tmp_path / "q"), "--report",
              "--sensitivity-samples", "0"])
    assert "positive integer" in capsys.readouterr().err


def test_a_shifted_clamp_is_fake_quantized_about_its_offset(tmp_path):
    """h = relu(c) read by a matmul is a shifted clamp: [0, absmax] on the whole 8-bit grid,
    offset absmax / 2 (docs/quantize.md); its sensitivity rounds h - offset."""
    w1, w2 = RNG.normal(size=(4, 6)).round(2), RNG.normal(size=(6, 3)).round(2)
    samples = _samples(4)
    folder = _net(tmp_path / "clamp", {"w1": w1, "w2": w2},
                  "    c = matmul(x, w1);\n    h = relu(c);\n    y = matmul(h, w2);\n")
    q = quantize_graph(load_checked(folder), samples, Options())
    rows = {r["layer"]: r for r in layer_report(q, samples, 4)}
    h = np.maximum(np.matmul(samples["x"], w1.astype(np.float32)), 0).astype(np.float64)
    offset = float(np.abs(h).max()) / 2
    assert q.offsets["h"] == pytest.approx(offset, rel=1e-6)
    scale = q.scales["h"]
    d = rule(h - offset, scale, 8) / scale + offset
    f, got = h @ w2, d @ w2
    want = 10 * math.log10(np.square(f).sum() / np.square(f - got).sum())
    assert rows["h"]["sensitivity_db"] == pytest.approx(want, abs=1e-3)

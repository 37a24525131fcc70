"""Float outputs through `cvmc run` (a compiled artifact) and `run --reference`: NaN, inf
and -0 are written as computed and summarised as floats (issue 22, item 3)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from cvmc.cli import main

LOG = """version 1.0;
graph g( x ) -> ( y )
{
    x = external<scalar>(shape = [8]);
    y = log(x);
}
"""


def _nan32(bits: int) -> np.float32:
    return np.array([bits], np.uint32).view(np.float32)[0]


INPUTS = {
    # log of 0, -0, -1 and NaN; 1e300 and -1e300 are beyond float32: +-inf by IEEE rounding.
    "float64": np.array([0.0, -1.0, np.nan, 1e300, 1.0, -0.0, 2.0, -1e300], np.float64),
    # NaN payloads (quiet, negative, signalling) and log's other special points.
    "payloads": np.array([_nan32(0x7FC12345), _nan32(0xFFC00001), _nan32(0x7F800001), 0.0,
                          -0.0, 0.5, np.inf, -np.inf], np.float32),
    "all-nan": np.full(8, np.nan, np.float32),
}


def expected_log(x: np.ndarray) -> np.ndarray:
    """NumPy's log of the float32 input, computed in float64 and rounded once."""
    with np.errstate(all="ignore"):
        return np.log(x.astype(np.float32).astype(np.float64)).astype(np.float32)


def summary(y: np.ndarray) -> str:
    """The summary the README promises, from NumPy: min/max of the ordered values, NaN
    counted apart."""
    nan = np.isnan(y)
    rest = y[~nan]
    low, high = (str(rest.min()), str(rest.max())) if rest.size else ("nan", "nan")
    return f"y: shape [8] float32 min {low} max {high}" + \
        (f" ({int(nan.sum())} NaN)" if nan.any() else "")


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("log")
    (d / "g.nnef").write_text(LOG)
    assert main(["compile", str(d / "g.nnef"), "-o", str(d / "g.cvmx")]) == 0
    return {"reference": d / "g.nnef", "compiled": d / "g.cvmx"}


def _run(model: Path, x: np.ndarray, out: Path, capsys, reference: bool) -> tuple:
    np.save(out / "x.npy", x)
    capsys.readouterr()
    assert main(["run", str(model), "--input", f"x={out / 'x.npy'}", "--output-dir",
                 str(out / "o"), *(["--reference"] if reference else [])]) == 0
    captured = capsys.readouterr()
    assert captured.err == ""  # no warning: the float64 -> float32 rule is IEEE rounding
    return np.load(out / "o" / "y.npy"), captured.out


@pytest.mark.parametrize("case", INPUTS)
def test_float_outputs_are_written_and_summarised(model, tmp_path, capsys, case):
    x, want = INPUTS[case], expected_log(INPUTS[case])
    (tmp_path / "r").mkdir()
    (tmp_path / "c").mkdir()
    ref, ref_out = _run(model["reference"], x, tmp_path / "r", capsys, reference=True)
    got, got_out = _run(model["compiled"], x, tmp_path / "c", capsys, reference=False)
    for y, out in ((ref, ref_out), (got, got_out)):
        assert y.dtype == np.float32 and np.array_equal(np.isnan(y), np.isnan(want))
        assert out.startswith(summary(want) + " -> "), out
    ordered = ~np.isnan(want)
    # The interpreter is NumPy's log bit for bit; the compiled kernel matches it bit for
    # bit on these inputs (inf, -inf, -0 and 0 included: their signs are in the bits).
    assert np.array_equal(ref[ordered].view(np.uint32), want[ordered].view(np.uint32))
    assert np.array_equal(got[ordered].view(np.uint32), ref[ordered].view(np.uint32))


def test_float_summary_keeps_fractions(model, tmp_path, capsys):
    x = np.array([2.0, 0.5, 1.5, 3.0, 1.0, 4.0, 8.0, 0.25], np.float32)
    (tmp_path / "r").mkdir()
    _, out = _run(model["reference"], x, tmp_path / "r", capsys, reference=True)
    # ln(0.25) = -1.3862944 and ln(8) = 2.0794415 as float32 prints them (not -1 and 2).
    assert "min -1.3862944 max 2.0794415 ->" in out, out

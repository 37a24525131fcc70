"""`cvmc eval` (issue 19 item 6): top-1 accuracy and agreement over a dataset cut into
each artifact's compiled batches, in this process, in worker processes and on Ray Data
(local; skipped without Ray), against NumPy's argmax of the models written out."""
from __future__ import annotations

import os
import sys

import cvmc_runtime
import numpy as np
import pytest
from cvmc_runtime import ModelError

import cvmc
from cvmc.cli import main
from tests.quantize.tiny import float_graph, float_logits, quantized_logits, write_quantized

N = 7  # batches of 2 (quantized) and 3 (float): both end with a partial batch


@pytest.fixture(scope="module")
def case(tmp_path_factory):
    """The quantized (batch 2) and float (batch 3) artifacts, float data, labels, and the
    predictions each model gives, by NumPy."""
    d = tmp_path_factory.mktemp("eval")
    assert main(["compile", str(write_quantized(d / "q")), "-o", str(d / "q.cvmx")]) == 0
    cvmc.compile(float_graph(), d / "f.cvmx")
    rng = np.random.default_rng(3)
    x = (rng.standard_normal((N, 4)) * 4).astype(np.float32)
    labels = rng.integers(0, 3, N)
    np.save(d / "x.npy", x)
    np.save(d / "y.npy", labels)
    want_q = np.argmax(quantized_logits(x), axis=1)
    want_f = np.argmax(float_logits(x), axis=1)
    # The data must exercise the counts: some right, some wrong, some disagreement.
    assert 0 < (want_q == labels).sum() < N and 0 < (want_q != want_f).sum()
    return d, x, labels, want_q, want_f


# The quantized model sees random data beyond its calibrated range: the warning that says
# so is tested in test_new_user.py.
pytestmark = pytest.mark.filterwarnings("ignore::cvmc_runtime.quant.SaturationWarning")


def test_predictions_are_numpy_argmax(case):
    d, x, _, want_q, want_f = case
    assert np.array_equal(cvmc_runtime.predict(d / "q.cvmx", x), want_q)
    assert np.array_equal(cvmc_runtime.predict(d / "f.cvmx", x), want_f)
    # Fewer samples than one batch, and none.
    assert np.array_equal(cvmc_runtime.predict(d / "f.cvmx", x[:1]), want_f[:1])
    assert cvmc_runtime.predict(d / "q.cvmx", x[:0]).shape == (0,)


def test_two_workers_give_the_same_predictions(case):
    d, x, _, want_q, _ = case
    assert np.array_equal(cvmc_runtime.predict(d / "q.cvmx", x, workers=2), want_q)


def _percent(hits: int) -> str:
    return f"{100 * hits / N:.2f}% ({hits}/{N})"


def test_cli_top1_and_agreement(case, capsys):
    d, _, labels, want_q, want_f = case
    capsys.readouterr()
    assert main(["eval", str(d / "q.cvmx"), "--data", str(d / "x.npy"), "--labels",
                 str(d / "y.npy"), "--compare", str(d / "f.cvmx"), "--workers", "1"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith(f"{d / 'q.cvmx'}: top-1 {_percent((want_q == labels).sum())}")
    assert lines[1].startswith(f"{d / 'f.cvmx'}: top-1 {_percent((want_f == labels).sum())}")
    assert lines[2] == f"agreement (same top-1): {_percent((want_q == want_f).sum())}"


@pytest.mark.parametrize("argv, message", [
    ([], "nothing to measure: give --labels"),
    (["--labels", "short.npy"], "--labels: expected 7 integer class indices"),
    (["--labels", "x.npy"], "--labels: expected 7 integer class indices"),
    (["--data", "missing.npy", "--compare", "q.cvmx"], "--data: cannot read"),
    (["--data", "wide.npy", "--compare", "q.cvmx"],
     "data of shape [7, 5] does not hold samples of input 'x' [2, 4]: expected [N, 4]"),
    (["--data", "scalar.npy", "--compare", "q.cvmx"], "--data: a 0-d array holds no samples"),
])
def test_cli_errors(case, capsys, argv, message):
    d = case[0]
    np.save(d / "short.npy", np.zeros(3, np.int64))
    np.save(d / "wide.npy", np.zeros((N, 5), np.float32))
    np.save(d / "scalar.npy", np.float32(1))
    data = [] if "--data" in argv else ["--data", str(d / "x.npy")]
    argv = [str(d / a) if a.endswith((".npy", ".cvmx")) else a for a in argv]
    capsys.readouterr()
    assert main(["eval", str(d / "q.cvmx"), *data, *argv]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err and message in err, err


def test_ray_missing_is_one_clear_error(case, capsys, monkeypatch):
    d = case[0]
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray raises ImportError
    with pytest.raises(ModelError, match=r"pip install 'cvmc\[ray\]'"):
        cvmc_runtime.predict_ray(d / "q.cvmx", case[1])
    capsys.readouterr()
    assert main(["eval", str(d / "q.cvmx"), "--data", str(d / "x.npy"), "--compare",
                 str(d / "f.cvmx"), "--ray"]) == 1
    assert capsys.readouterr().err.strip() == f"error: {cvmc_runtime.evaluate.RAY_MISSING}"


def test_ray_data_gives_the_same_predictions(case):
    # CI installs the `ray` extra (.ci/run): there the test runs, never skips
    if os.environ.get("CI"):
        import ray.data
    ray = pytest.importorskip("ray")
    pytest.importorskip("ray.data")
    d, x, _, want_q, want_f = case
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        assert np.array_equal(cvmc_runtime.predict_ray(d / "q.cvmx", x, workers=2), want_q)
        assert np.array_equal(cvmc_runtime.predict_ray(d / "f.cvmx", x), want_f)
    finally:
        ray.shutdown()


def test_whole_inputs_are_samples_too(case):
    """N whole inputs [N, 2, 4] of the batch-2 model are its 2N samples."""
    d, x, _, want_q, _ = case
    assert np.array_equal(cvmc_runtime.predict(d / "q.cvmx", x[:6].reshape(3, 2, 4)),
                          want_q[:6])

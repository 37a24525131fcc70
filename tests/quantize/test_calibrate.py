"""Calibration thresholds over all samples, against NumPy on the concatenated values."""
import numpy as np
import pytest

from cvmc.quantize.calibrate import Stats


@pytest.fixture
def samples():
    rng = np.random.default_rng(11)
    return [rng.standard_normal((3, 5, 7)) * (k + 1) for k in range(4)]


def test_every_sample_counts(samples):
    stats = Stats()
    for s in samples:
        stats.add(s)
    every = np.abs(np.concatenate([s.reshape(-1) for s in samples]))
    assert stats.threshold("absmax", 0, 0) == every.max()  # not the last sample's alone
    assert stats.threshold("percentile", 99.0, 0) == pytest.approx(np.percentile(every, 99.0))
    mrt = abs(every.mean()) + 2.0 * every.std()
    assert stats.threshold("lambda", 0, 2.0) == pytest.approx(mrt)
    assert stats.threshold("lambda", 0, 100.0) == every.max()  # never above absmax


def test_an_all_zero_tensor_still_has_a_scale():
    stats = Stats()
    stats.add(np.zeros((2, 3)))
    assert stats.threshold("absmax", 0, 0) == 1.0

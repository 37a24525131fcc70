"""The input quantization rule (cvmc_runtime.quantize) on hand-computed cases."""
import numpy as np
import pytest
from cvmc_runtime import ModelError, dequantize, quantize


def test_rounds_half_away_from_zero_and_clips():
    x = np.array([0.5, -0.5, 1.5, -2.5, 0.49999999999999994, 126.6, -1000.0, np.inf, -np.inf])
    # x * 1.0: halves go away from zero; the largest double below 0.5 rounds down; 8 bits
    # clip to +-127; infinities saturate.
    want = [1, -1, 2, -3, 0, 127, -127, 127, -127]
    q = quantize("x", x, 1.0, 8)
    assert q.dtype == np.int32 and np.array_equal(q, want)


def test_scale_multiplies_before_rounding():
    # 0.1 * 25 = 2.5 (2.5000000000000004 in float64) -> 3; 0.3 * 10 = 3.0000000000000004 -> 3
    assert np.array_equal(quantize("x", np.array([0.1, 0.3], np.float32), 10.0, 4),
                          [1, 3])
    assert np.array_equal(quantize("x", [0.1], 25.0, 8), [3])


@pytest.mark.parametrize("scale", [0.0, -1.0, float("nan"), float("inf"), True, "2"])
def test_bad_scale_is_named(scale):
    with pytest.raises(ModelError, match="data: the scale must be"):
        quantize("data", [1.0], scale, 8)


def test_nan_is_an_error_naming_its_index():
    with pytest.raises(ModelError, match=r"data: NaN at index \(1, 0\)"):
        quantize("data", [[0.0], [np.nan]], 2.0, 8)


def test_dequantize_is_the_inverse_on_the_grid():
    q = np.array([-127, 0, 5, 127], np.int32)
    assert np.array_equal(dequantize(q, 4.0), np.array([-31.75, 0, 1.25, 31.75], np.float32))
    assert np.array_equal(quantize("q", dequantize(q, 4.0), 4.0, 8), q)


# ---- issue 29, item 6: every argument checked, no wrapping, no inf from a zero scale ----
def test_precision_32_holds_the_largest_values_without_wrapping():
    assert np.array_equal(quantize("x", [1e12, -1e12], 1.0, 32), [2**31 - 1, -(2**31 - 1)])
    assert np.array_equal(quantize("x", [3.0, -3.0], 1.0, 1), [0, 0])


@pytest.mark.parametrize("precision", [0, -3, 33, 40, 8.0, True, "8", None])
def test_bad_precision_is_named(precision):
    # precision 0 gave "negative shift count"; 40 wrapped 1e12 to -2147483648
    with pytest.raises(ModelError, match="x: the precision must be an integer in 1..32"):
        quantize("x", [1e12], 1.0, precision)


@pytest.mark.parametrize("x", ["abc", [1 + 2j], [[1.0], [2.0, 3.0]], {"a": 1}])
def test_values_that_are_not_real_arrays_are_named(x):
    with pytest.raises(ModelError, match="x: "):
        quantize("x", x, 1.0, 8)


@pytest.mark.parametrize("scale", [0, 0.0, -2.0, float("nan"), float("inf"), None, "4"])
def test_dequantize_refuses_a_bad_scale(scale):
    with pytest.raises(ModelError, match="dequantize: the scale must be a finite number > 0"):
        dequantize(np.array([1, 2], np.int32), scale)


@pytest.mark.parametrize("q", [np.array([0.5]), "12", [object()]])
def test_dequantize_takes_integers(q):
    with pytest.raises(ModelError, match="dequantize: expected an integer array"):
        dequantize(q, 2.0)

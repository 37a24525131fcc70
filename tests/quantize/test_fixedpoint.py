"""plan_requant: the fixed point it picks fits int32 by CVM's precision rules, and the
integer pipeline it describes, simulated here in exact Python integers, stays within its
stated error of the real product."""
import numpy as np
import pytest

from cvmc.ops.common import bitlen, prec_max
from cvmc.quantize.fixedpoint import FixedPointError, plan_requant


def _half_up_shift(v: np.ndarray, s: int) -> np.ndarray:
    """cvm_right_shift's rounding, written from the spec: floor(v / 2^s + 1/2)."""
    return np.array([(int(x) + (1 << (s - 1))) >> s for x in v.reshape(-1)],
                    dtype=object).reshape(v.shape)


def _run(plan, y: np.ndarray, out_precision: int) -> np.ndarray:
    """The CVM ops the plan stands for, on Python ints (no overflow possible)."""
    y = y.astype(object)
    q = prec_max(plan.clip_precision)
    if plan.pre_shift:
        y = _half_up_shift(y, plan.pre_shift)
    y = np.clip(y, -q, q)
    y = y * plan.multiplier.reshape(-1).astype(object)
    top = prec_max(out_precision)
    return np.clip(_half_up_shift(y, plan.shift), -top, top).astype(np.int64)


@pytest.mark.parametrize("ratio,pin,pout", [
    (1 / 3000.0, 27, 8), (0.0137, 20, 8), (1.0 / 9, 12, 8), (258.3, 8, 16),
    (0.75, 9, 8), (1 / 65536.0 * 1.37, 31, 8), (np.array([0.002, 0.0011, 0.0007]), 24, 8),
    (1.3035810929236272e-4, 8, 8), (1e-7, 8, 8)])  # a concat branch far finer than its output
def test_plan_is_overflow_free_and_within_its_bound(ratio, pin, pout):
    plan = plan_requant(ratio, pin, pout)
    m = plan.multiplier
    # broadcast_mul's precision p_a + p_b must stay <= 32
    assert plan.clip_precision + bitlen(int(m.max()) + 1) + 1 <= 32
    assert 1 <= plan.shift <= 32 and m.min() >= 1
    r2 = np.asarray(ratio, np.float64) * 2.0 ** plan.pre_shift
    rel = np.abs(m / 2.0 ** plan.shift - r2) / r2
    assert np.all(rel <= 2.0 ** -np.vectorize(bitlen)(m))  # the docstring's bound
    rng = np.random.default_rng(0)
    top_in = prec_max(pin)
    r = np.asarray(ratio, np.float64).reshape(-1)
    y = np.concatenate([rng.integers(-top_in, top_in, 2000), [top_in, -top_in, 0, 1, -1]])
    y = np.concatenate([y, np.round(rng.uniform(-1.2, 1.2, 500) * prec_max(pout) / r.min())
                        .clip(-top_in, top_in).astype(np.int64)])
    y = y[:, None]  # one column per ratio (per channel)
    exact = np.clip(y * r, -prec_max(pout), prec_max(pout))
    assert np.abs(_run(plan, y, pout) - exact).max() <= plan.error + 0.5 + 1e-9


def test_error_is_small_for_typical_conv_ratios():
    # 8-bit x 8-bit conv over 3x3x64 taps, back to 8 bits: the bound is a small part of a unit
    plan = plan_requant(1 / 2345.6, 8 + 8 + bitlen(576) + 1, 8)
    assert plan.error < 0.02


@pytest.mark.parametrize("ratio", [0.0, -1.0, np.nan, np.inf, 1e40, np.array([0.5, 0.0]),
                                   np.array([])])
def test_a_ratio_without_fixed_point_form_is_a_user_error(ratio):
    """Scales come from user data (calibration, a QDQ model): no assert (issue 29 item 4)."""
    with pytest.raises(FixedPointError, match="scale ratio"):
        plan_requant(ratio, 16, 8)

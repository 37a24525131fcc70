"""Fixed-point requantization: a real ratio as an integer multiplier and a right shift.

An integer tensor Y at scale s_in (real ~= Y / s_in) becomes one at scale s_out by
y = Y * r with r = s_out / s_in, computed in CVM as

    [cvm_right_shift(Y, sb) or cvm_clip(Y)]  ->  broadcast_mul(., m)  ->  cvm_right_shift(., s)

with r * 2^sb ~= m / 2^s. `r` may be an array (per output channel, per position) that
broadcasts against Y; m is then an integer array of that shape and s one shift.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from cvmc.errors import CvmcError
from cvmc.ops.common import bitlen, numprec, prec_max


class FixedPointError(CvmcError):
    """A scale ratio with no fixed-point form (a user's scales or data; the caller names
    the layer)."""


@dataclass(frozen=True)
class Requant:
    """How to requantize: pre-step (shift `pre_shift` bits, or clip, to `clip_precision`),
    multiply by `multiplier`, shift right by `shift`; `error` bounds the result's deviation
    from Y * r in output units, before the final rounding's own half unit."""

    pre_shift: int
    clip_precision: int
    multiplier: np.ndarray
    shift: int
    error: float


# The requantization's right shift stays below 31: CVM-Runtime's CPU backend computes
# cvm_right_shift by 31 or 32 as x >> 31 without rounding (-1 for every negative value
# where the spec and FORMAL give 0; docs/cvm-runtime.md), and a quantized model must give
# the same bits there.
MAX_SHIFT = 30


def plan_requant(ratio, in_precision: int, out_precision: int) -> Requant:
    """The requantization of a precision-`in_precision` tensor by `ratio` (> 0) to
    `out_precision` bits that precision inference proves overflow-free, with the least
    error bound over every pre-shift.

    The pre-step clips (after shifting right by sb) to the smallest precision q beyond which
    every value saturates the output anyway, so it loses nothing there; m is then at most
    2^(31-q) - 1, so broadcast_mul's precision q + p_m is at most 32. With m = round(r' 2^s)
    (r' = r 2^sb) the multiplier's relative error is |m / 2^s - r'| / r' <= 1 / (2m) <=
    2^-bitlen(m): at most 2^-(magnitude bits of m). `error` (output units) is that times
    the output bound, plus r' / 2 for the pre-shift's rounding when sb > 0.
    """
    r = np.asarray(ratio, dtype=np.float64)
    if not (r.size and np.all(r > 0) and np.all(np.isfinite(r))):
        raise FixedPointError(f"the scale ratio {r.reshape(-1)[:4].tolist()} (output scale "
                              f"over input scale) is not a finite number > 0")
    out_max = prec_max(out_precision)
    best = None
    for sb in range(in_precision):
        r2 = r * 2.0 ** sb
        natural = in_precision - sb + (sb > 0)  # floor(Y/2^sb + 1/2) can reach 2^(P-1-sb)
        q = min(numprec(int(np.ceil((out_max + 1) / r2.min()))), natural)
        m_max = prec_max(32 - q)
        if m_max < 1:
            continue
        # At most MAX_SHIFT: a tiny ratio (a concat branch 10^4 times finer than the
        # output) takes a smaller multiplier, still of ample bits
        shift = min(MAX_SHIFT, int(np.floor(np.log2(m_max / r2.max()))))
        while shift >= 1 and np.round(r2.max() * 2.0 ** shift) > m_max:
            shift -= 1
        if shift < 1:
            continue
        m = np.round(r2 * 2.0 ** shift).astype(np.int64)
        rel = np.abs(m / 2.0 ** shift - r2) / r2
        error = out_max * float(rel.max()) + (float(r2.max()) / 2 if sb else 0.0)
        if best is None or error < best.error:
            best = Requant(sb, q, m, shift, error)
    if best is None:
        raise FixedPointError(f"the scale ratio {r.min():.3g}..{r.max():.3g} (output scale "
                              f"over input scale) has no fixed-point form: a multiplier "
                              f"below 2^31 and a right shift of 1..{MAX_SHIFT} bits")
    return best


def multiplier_bits(plan: Requant) -> int:
    """Magnitude bits of the smallest multiplier (its relative error is <= 2^-bits)."""
    return bitlen(int(plan.multiplier.min()))

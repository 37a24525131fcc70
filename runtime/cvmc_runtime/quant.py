"""The one rule that turns real numbers into CVM integers, and back.

A quantized model's integer tensor q stands for the real q / scale (symmetric, no zero
point, as CVM's quantizer MRT does). A real input x becomes

    q = clip(round_half_away_from_zero(x * scale), -(2^(p-1) - 1), 2^(p-1) - 1)

computed in float64, so that the product of a float32 input and a float64 scale is exact to
0.5 ulp of float64 and the rounding is the same on every machine. `cvmc quantize` (the
calibration samples, the report), `cvmc run`, `Model.run` and the reference interpreter all
call `quantize`; nobody writes the rule again.

A scale is one number, or (an output that concatenates differently scaled parts) one per
slice along an axis: quantization.json's {"scale": [s1, s2, ...], "axis": a, "sizes": [n1,
n2, ...]}, held as a float64 array that broadcasts along `a` (`cvmc_runtime.signature.sliced_scale`).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from cvmc_runtime.signature import ModelError, precision_bound


def round_half_away(v: np.ndarray) -> np.ndarray:
    """Round float64 values to the nearest integer, halves away from zero (exactly: the
    fractional part v - trunc(v) of a float64 is exact, so no 0.49999999999999994 + 0.5
    rounds up)."""
    whole = np.trunc(v)
    return whole + np.sign(v) * (np.abs(v - whole) >= 0.5)


def check_scale(name: str, scale):
    """A scale is a finite positive number, or an array of them (`sliced_scale`); anything
    else is a ModelError naming `name`."""
    if isinstance(scale, np.ndarray) and scale.dtype.kind == "f":
        if scale.size == 0 or not (np.isfinite(scale) & (scale > 0)).all():
            raise ModelError(f"{name}: every scale must be a finite number > 0, got "
                             f"{scale.reshape(-1).tolist()!r:.80}")
        return scale.astype(np.float64)
    if isinstance(scale, (bool, np.bool_)) or \
            not isinstance(scale, (int, float, np.integer, np.floating)) or \
            not np.isfinite(scale) or scale <= 0:
        raise ModelError(f"{name}: the scale must be a finite number > 0, got {scale!r}")
    return float(scale)


def check_precision(name: str, precision: int) -> int:
    """A precision is an integer in 1..32 (the int32 result holds it); anything else is a
    ModelError naming `name`."""
    if isinstance(precision, (bool, np.bool_)) or \
            not isinstance(precision, (int, np.integer)) or not 1 <= precision <= 32:
        raise ModelError(f"{name}: the precision must be an integer in 1..32, got "
                         f"{precision!r:.40}")
    return int(precision)


def _real_array(name: str, x, kinds: str, what: str) -> np.ndarray:
    """`x` as an array of one of the dtype `kinds`, checked before any conversion."""
    try:
        v = np.asarray(x)
    except (ValueError, TypeError) as e:  # ragged lists, objects with a bad __array__
        raise ModelError(f"{name}: not an array ({e})") from None
    if v.dtype.kind not in kinds:
        raise ModelError(f"{name}: expected {what} array, got {v.dtype}")
    return v


def quantize(name: str, x, scale: float | np.ndarray, precision: int) -> np.ndarray:
    """Real array x -> int32 CVM integers of `precision` bits (1..32) by the rule above.
    NaN is an error naming the input and the first index; +-inf saturates like any large
    value."""
    scale = check_scale(name, scale)
    bound = precision_bound(check_precision(name, precision))
    v = _real_array(name, x, "fiu", "a real-valued").astype(np.float64, copy=False)
    nan = np.isnan(v)
    if nan.any():
        raise ModelError(f"{name}: NaN at index {tuple(int(i) for i in np.argwhere(nan)[0])} "
                         "cannot be quantized")
    with np.errstate(over="ignore", invalid="ignore"):
        q = round_half_away(v * scale)
    return np.clip(q, -bound, bound).astype(np.int32)


def dequantize(q: np.ndarray, scale: float | np.ndarray) -> np.ndarray:
    """CVM integers -> the float32 reals they stand for, q / scale (a finite scale > 0, or
    an array of them that broadcasts against q; beyond float32's range a real is +-inf)."""
    scale = check_scale("dequantize", scale)
    v = _real_array("dequantize", q, "iu", "an integer")
    with np.errstate(over="ignore"):
        return (v.astype(np.float64) / scale).astype(np.float32)


class SaturationWarning(UserWarning):
    """A quantized model clipped values: inputs beyond their calibrated range, or outputs
    at the ends of their integer range."""


@dataclass
class Saturation:
    """Counts of clipped values of a quantized model's runs, per tensor: `inputs[name]` =
    (float values beyond the range the input's scale and precision cover, values given),
    `outputs[name]` = (values at +-(2^(p-1) - 1), values)."""

    inputs: dict[str, list[int]] = field(default_factory=dict)
    outputs: dict[str, list[int]] = field(default_factory=dict)

    def count_input(self, name: str, x: np.ndarray, scale: float, precision: int) -> None:
        """Count the float values of `x` that `quantize` clips (|round(x scale)| > bound)."""
        bound = precision_bound(precision)
        with np.errstate(over="ignore", invalid="ignore"):
            clipped = int(np.count_nonzero(np.abs(np.asarray(x, np.float64) * scale) >=
                                           bound + 0.5))
        self._add(self.inputs, name, clipped, np.size(x))

    def count_output(self, name: str, q: np.ndarray, precision: int) -> None:
        """Count the integers of `q` at either end of `precision`."""
        self._add(self.outputs, name,
                  int(np.count_nonzero(np.abs(q) >= precision_bound(precision))), np.size(q))

    def merge(self, other: Saturation) -> None:
        """Add `other`'s counts to these."""
        for mine, theirs in ((self.inputs, other.inputs), (self.outputs, other.outputs)):
            for name, (hits, total) in theirs.items():
                self._add(mine, name, hits, total)

    @staticmethod
    def _add(where: dict[str, list[int]], name: str, hits: int, total: int) -> None:
        counts = where.setdefault(name, [0, 0])
        counts[0] += hits
        counts[1] += total

    def message(self) -> str | None:
        """One line of the counts of every tensor that clipped, or None where none did."""
        parts = [f"{hits} of {total} values of input '{name}' beyond its calibrated range"
                 for name, (hits, total) in self.inputs.items() if hits]
        parts += [f"{hits} of {total} values of output '{name}' at the ends of its integer "
                  f"range" for name, (hits, total) in self.outputs.items() if hits]
        if not parts:
            return None
        return ("saturated: " + "; ".join(parts) + " (the quantized model clips them: "
                "calibrate on data that reaches these values, or give the outputs range "
                "with cvmc quantize --output-bits B+R)")

    def warn(self) -> None:
        """One SaturationWarning with the counts, where anything clipped."""
        import warnings

        text = self.message()
        if text is not None:
            warnings.warn(text, SaturationWarning, stacklevel=3)

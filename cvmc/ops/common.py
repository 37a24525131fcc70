"""Helpers shared by the op modules: CVM precision arithmetic and rule checks."""
from __future__ import annotations

from cvmc.errors import OpRuleError

INT32_MIN = -(2**31)


def bitlen(n: int) -> int:
    """Number of binary digits of n >= 0 (bitlen(1)=1, bitlen(8)=4, bitlen(576)=10)."""
    return max(int(n), 0).bit_length()


def numprec(r: int) -> int:
    """Precision needed to hold every integer in [-r, r] (cvm-semantics.md)."""
    return bitlen(r + 1) + 1


def prec_max(p: int) -> int:
    """Largest magnitude a tensor of precision p may hold: 2^(p-1) - 1."""
    return (1 << (p - 1)) - 1


def require(cond: bool, message: str) -> None:
    """Raise an OpRuleError with `message` unless `cond` holds."""
    if not cond:
        raise OpRuleError(message)


def normalize_axis(op: str, what: str, axis: int, ndim: int) -> int:
    """Map axis in [-ndim, ndim) to [0, ndim), or raise naming the op and attribute."""
    require(-ndim <= axis < ndim,
            f"{op}: {what} {axis} is out of range for a rank-{ndim} tensor "
            f"(expected {-ndim}..{ndim - 1})")
    return axis + ndim if axis < 0 else axis


def data_precision(values) -> int:
    """Smallest precision p holding every value (|v| <= 2^(p-1) - 1); 1 for all-zero data."""
    import numpy as np
    arr = np.asarray(values, dtype=np.int64)
    return bitlen(int(np.abs(arr).max(initial=0))) + 1

"""Compile-time evaluation of NNEF expressions on non-tensor values, with size limits.

NNEF arrays concatenate with `+` and repeat with `*`; integers divide with floor `/`.
Results are bounded (integers to 64 bits, arrays and strings to MAX_ITEMS items) so that
an expression such as `2 ^ 99999999` or `[1] * 10^9` is a clear error, not a hang.
"""
from __future__ import annotations

import operator
from typing import Any

MAX_ITEMS = 1 << 20  # length of a compile-time array or string
MAX_INT = 1 << 63  # magnitude bound of compile-time integers


class TooLarge(Exception):
    """A compile-time value beyond MAX_ITEMS / MAX_INT."""


def bounded(v: Any) -> Any:
    """`v`, or TooLarge when it exceeds the compile-time value limits."""
    if isinstance(v, int) and not isinstance(v, bool) and abs(v) > MAX_INT:
        raise TooLarge("the result is outside -2^63..2^63")
    if isinstance(v, (list, str)) and len(v) > MAX_ITEMS:
        raise TooLarge(f"the result has more than {MAX_ITEMS} items")
    return v


def compile_time(op: str, a: Any, b: Any) -> Any:
    """Compile-time arithmetic/logic on NNEF values (arrays: + concatenates, * repeats)."""
    if op in ("&&", "||"):
        if not (isinstance(a, bool) and isinstance(b, bool)):
            raise TypeError
        return (a and b) if op == "&&" else (a or b)
    if op == "in":
        if not isinstance(b, list):
            raise TypeError
        return a in b
    if op == "/" and is_int(a) and is_int(b):
        return a // b
    if op == "^":
        # Bound the result size before computing it: 2 ^ 10^9 would run for minutes.
        if is_int(a) and is_int(b) and abs(a) > 1 and b * (abs(a).bit_length() - 1) > 64:
            raise TooLarge("the result is outside -2^63..2^63")
        r = a ** b
        return float(r) if isinstance(r, float) or (is_int(b) and b < 0) else r
    if isinstance(a, bool) or isinstance(b, bool):
        if op in ("==", "!="):
            return (a == b) == (op == "==")
        raise TypeError
    if isinstance(a, list) and op == "*" and not is_int(b):
        raise TypeError
    if op == "*" and _repeat_length(a, b) > MAX_ITEMS:
        raise TooLarge(f"the result has more than {MAX_ITEMS} items")
    fn = {"+": operator.add, "-": operator.sub, "*": operator.mul, "/": operator.truediv,
          "<": operator.lt, "<=": operator.le, ">": operator.gt, ">=": operator.ge,
          "==": operator.eq, "!=": operator.ne}[op]
    return fn(a, b)


def _repeat_length(a: Any, b: Any) -> int:
    """The length of `a * b` when it repeats an array or string (else 0)."""
    seq, n = (a, b) if isinstance(a, (list, str)) else (b, a)
    return len(seq) * n if isinstance(seq, (list, str)) and is_int(n) else 0


def is_int(v: Any) -> bool:
    """True for a Python int that is not a bool."""
    return isinstance(v, int) and not isinstance(v, bool)

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


# A proven value interval [lo, hi] of an integer tensor (both ends included): the
# `interval` rules of the op records (cvmc.ops.registry) and `cvmc.ops.infer.intervals`.
Interval = tuple[int, int]


def precision_interval(p: int) -> Interval:
    """The values precision `p` allows: [-(2^(p-1) - 1), 2^(p-1) - 1]."""
    return -prec_max(p), prec_max(p)


def hull(*ivs: Interval) -> Interval:
    """The smallest interval holding every one of `ivs`."""
    return min(lo for lo, _ in ivs), max(hi for _, hi in ivs)


DATA_INTERVAL = "the data's interval"  # the words of `data_interval`


def data_interval(ivs, a) -> Interval:
    """The interval rule of an op whose results are values of its first input (reshapes,
    transposes, slices, gathers, max pools): that input's interval."""
    return ivs[0]


def monotone_interval(fn):
    """The interval rule of an elementwise `fn(x, a)` nondecreasing in x: [fn(lo), fn(hi)]."""
    return lambda ivs, a: (fn(ivs[0][0], a), fn(ivs[0][1], a))


CORNERS_INTERVAL = "the extremes of op(an end of a, an end of b)"  # `corners_interval`


def corners_interval(fn):
    """The interval rule of a two-input elementwise `fn(a, b)` that is monotone in each
    operand (+, -, max) or bilinear (*): its extremes are at the intervals' ends."""
    def rule(ivs, a):
        ends = [fn(x, y) for x in ivs[0] for y in ivs[1]]
        return min(ends), max(ends)
    return rule


def mac_ops(outputs: int, per_output: int) -> int:
    """GOPS (`arith` rules): 2 operations per multiply-add, `per_output` multiply-adds for
    each of `outputs` elements."""
    return 2 * outputs * per_output


def no_arith(ins, outs, a) -> int:
    """The `arith` rule of an op that only selects, gathers, copies or reshapes: 0."""
    return 0


def arith_per_output(ins, outs, a) -> int:
    """The `arith` rule of one operation per output element."""
    return outs[0].size


def arith_per_input(per_element: int):
    """The `arith` rule of `per_element` operations per element of the first input (the
    reductions)."""
    return lambda ins, outs, a: per_element * ins[0].size


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
    """Smallest precision p holding every value (|v| <= 2^(p-1) - 1); 1 for all-zero data.

    Exact for every integer dtype: the extremes are taken in the array's own dtype and
    compared as Python ints (a cast to int64 first would wrap uint64, and abs() of the
    int64 minimum overflows)."""
    import numpy as np
    arr = np.asarray(values)
    if arr.size == 0:
        return 1
    return bitlen(max(-int(arr.min()), int(arr.max()), 0)) + 1


def integer_data_error(values, precision: int | None) -> str | None:
    """Why integer `values` cannot enter cvmc with `precision` (None: inferred), or None.

    Every value must fit the precision (|v| <= 2^(p-1) - 1), and so int32 when the
    precision is inferred: CVM computes in int32, so a wider value would be narrowed
    silently (uint64 2^64-1 read as -1, 2^40+5 as 5)."""
    import numpy as np
    arr = np.asarray(values)
    if arr.dtype.kind == "b":
        arr = arr.astype(np.int8)  # True is 1, which precision 1 cannot hold
    if arr.size == 0:
        return None
    if arr.dtype.kind == "O":  # literal Python ints too wide for int64; compared exactly
        if not all(isinstance(v, int) for v in arr.flat):
            return "holds values that are not integers"
    elif arr.dtype.kind not in "iu":
        return f"holds {arr.dtype} values, not integers"
    limit = prec_max(precision or 32)
    # Comparisons with Python ints are exact in every integer dtype (no cast, no wrap).
    outside = np.flatnonzero((arr > limit) | (arr < -limit))
    if not outside.size:
        return None
    index = [int(i) for i in np.unravel_index(outside[0], arr.shape)]
    what = f"precision {precision}" if precision else "int32 (precision 32)"
    return (f"value {int(arr.flat[outside[0]])} at index {index} does not fit {what}: "
            f"|v| <= {limit}")


# Conversion between element types (NNEF cast, and every result stored in its tensor's
# dtype): float -> integer truncates toward zero and saturates to +-(2^31 - 1) (the range
# of precision 32), NaN -> 0; anything -> logical is `x != 0` (NaN is true); logical ->
# number is 0 / 1; integer -> float32 rounds to nearest even. C leaves an out-of-range
# float -> int conversion undefined, so it is spelled out; `ops.te.convert` is the
# kernels' side of this rule.
INT32_SAT = (1 << 31) - 1


def convert_np(value, dtype: str):
    """`value` (NumPy) converted to `dtype` by the rule above; integers come back as int64
    (the interpreter's integer representation)."""
    import numpy as np
    x = np.asarray(value)
    if dtype == "bool":
        return x != 0
    if dtype == "float32":
        return x.astype(np.float32)
    if x.dtype.kind == "f":
        return np.nan_to_num(np.trunc(np.clip(x, -INT32_SAT, INT32_SAT)), nan=0.0) \
            .astype(np.int64)
    return x.astype(np.int64)


# Every conv-like op (convolutions, pools, NNEF's sliding-window ops) reads input position
# i * s + j * d - p for output i and tap j. Bounding stride, dilation, the dilated window
# and the padding (given or automatic) by 2^24 keeps those positions inside int32 in the
# kernels (the shape relations keep i * s and j * d below p + X + q <= 3 * 2^24).
MAX_WINDOW = 2**24


def check_window(op_name: str, axis: str, extent: int, k: int, stride: int, dilation: int,
                 pad_begin: int, pad_end: int) -> None:
    """Check one window dimension of a conv-like op: input `extent` (up-scaled), filter
    size `k`, stride, dilation and the padding before / after (given or automatic)."""
    for name, value in (("stride", stride), ("dilation", dilation)):
        require(1 <= value <= MAX_WINDOW, f"{op_name}: {name} {value} along {axis} is "
                                          f"outside 1..{MAX_WINDOW}")
    span = 1 + (k - 1) * dilation
    require(span <= MAX_WINDOW, f"{op_name}: dilated kernel extent {span} (K={k}, dilation="
                                f"{dilation}) along {axis} is more than {MAX_WINDOW}")
    for side, pad in (("before", pad_begin), ("after", pad_end)):
        require(abs(pad) <= MAX_WINDOW, f"{op_name}: padding {pad} {side} {axis} is "
                                        f"outside -{MAX_WINDOW}..{MAX_WINDOW}")
        # A window that reaches past the input further than both the filter size and the
        # input's own extent reads border alone at most of its taps (a dilation 10^6 over
        # a 4-wide input): degenerate geometry, refused. NNEF (4.3, "Argument Validity")
        # recommends support for padding below the filter size; cvmc also takes padding
        # up to the input extent (a 3x3 'same' conv on a 1x1 input, a dilated conv whose
        # padding is its dilation).
        require(pad < k or pad <= extent,
                f"{op_name}: padding {pad} {side} {axis} (K={k}, dilation={dilation}) is "
                f"at least the filter size {k} and more than the input extent {extent}; "
                f"the padding on each side must be less than the filter size or at most "
                f"the input extent")
    check_window_fits(op_name, axis, extent, k, dilation, pad_begin, pad_end)


def check_window_fits(op_name: str, axis: str, extent: int, k: int, dilation: int,
                      pad_begin: int, pad_end: int) -> None:
    """The dilated kernel must fit in the padded input (every output reads a whole window)."""
    span = 1 + (k - 1) * dilation
    padded = extent + pad_begin + pad_end
    require(span <= padded, f"{op_name}: dilated kernel extent {span} (K={k}, dilation="
                            f"{dilation}) exceeds the padded input {padded} ({extent} + "
                            f"{pad_begin} + {pad_end}) along {axis}")

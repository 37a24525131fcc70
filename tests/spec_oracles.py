"""The formal spec's oracles of the CVM ops: a direct, element-by-element transcription of
each op's formula in ../shared/spec/cvm-operators-formal.txt (plain Python ints, loops over
every index), taking cvm-semantics.md's reading where the spec contradicts itself, and the
literal precision rule of cvm-semantics.md's table; Hypothesis draws the cases. Each CVM
op's test record (`tests/codegen/op_cases.py`, field `spec`) names its `Spec`;
tests/ops/test_spec_oracle.py runs them.

Where cvmc deliberately departs from the spec text, documented in its op module docstrings
or README, the oracle follows cvmc and the departure is listed in SPEC_EXCEPTIONS (and
named in a comment at the place the oracle applies it).
"""
from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from fractions import Fraction

import numpy as np
from hypothesis import strategies as st

INT32_MIN = -(2**31)

# Deliberate, documented departures from the spec text that the oracles below follow.
SPEC_EXCEPTIONS = {
    "reduce-rank0": "reducing every axis without keepdims gives shape (1,), not a rank-0 "
                    "tensor (CVM tensors have rank >= 1)",
    "conv2d-kernel-range": "the spec's kernel sums run to KH / KW inclusive; W has only KH "
                           "rows and KW columns",
    "max_pool2d-padding-window": "a ceil_mode window made only of padding (INT32_MIN, outside "
                                 "every precision) is rejected, as in CVM-Runtime",
    "slice-clamp": "begin / end clamp NumPy-style to [0, n] ([-1, n-1] for a negative "
                   "stride), not to e_range - 1 (cvm-semantics.md); negative-stride defaults "
                   "are n-1 / before the first element (transform.py); empty results rejected",
    "expand_dims-axis": "a negative axis adds N + 1 (cvm-semantics.md)",
    "flatten-2d": "flatten's shape is 2-D (n0, n1*...*n_{N-1}) (cvm-semantics.md)",
    "negative-axis": "repeat / concatenate also accept an axis in [-N, 0) (transform.py, "
                     "transform_gather.py)",
    "cvm_lut-order": "cvm_lut takes (indices, table) as CVM-Runtime and the v2 spec",
    "where-precision": "where has precision max(p_x, p_y), not the condition's (README)",
    "vision-filler": "get_valid_count / NMS data outputs have precision max(p_x, 2): the -1 "
                     "filler must fit (vision.py)",
    "get_valid_count-K": "K must be in 2..31 (cvm-semantics.md), the spec says 2..32",
    "nms-olr": "OLR is an integer percentage of corner boxes [x0, y0, x1, y1] in columns 2..5; "
               "an empty box overlaps nothing (vision.py)",
}


class Rejected(Exception):
    """Raised by an oracle for inputs cvmc must reject with a CvmcError."""


@dataclass
class Case:
    """One op application: inputs [(array, precision)] and attributes."""

    inputs: list[tuple[np.ndarray, int]]
    attrs: dict = field(default_factory=dict)

    def x(self, i: int) -> np.ndarray:
        """The i-th input array."""
        return self.inputs[i][0]

    def p(self, i: int) -> int:
        """The i-th input's precision."""
        return self.inputs[i][1]


@dataclass
class Spec:
    """How to draw cases for an op, its oracle and its literal precision rule."""

    gen: Callable[[Callable], Case]
    oracle: Callable[[Case], list[np.ndarray]]
    precision: Callable[[Case, list[np.ndarray]], list[int]]


# ---- oracle helpers: loops over every index, Python ints -------------------------------
def indices(shape) -> itertools.product:
    """Every index of `shape`, row-major."""
    return itertools.product(*(range(n) for n in shape))


def build(shape, f: Callable[[tuple], int]) -> np.ndarray:
    """The tensor Y of `shape` with Y[d] = f(d), element by element."""
    out = np.zeros(shape, dtype=np.int64)
    for d in indices(shape):
        out[d] = f(d)
    return out


def at(x: np.ndarray, d) -> int:
    """X[d] as a Python int."""
    return int(x[tuple(d)])


def volume(shape) -> int:
    """Number of elements of `shape`."""
    return math.prod(shape)


def bitlen(n: int) -> int:
    """cvm-semantics.md's bitlen: number of binary digits."""
    return int(n).bit_length()


def numprec(r: int) -> int:
    """cvm-semantics.md's numprec: bitlen(r + 1) + 1."""
    return bitlen(r + 1) + 1


def clip(v: int, lo: int, hi: int) -> int:
    """The spec's clip: a_max for v >= a_max, a_min for v <= a_min, else v."""
    return hi if v >= hi else max(lo, v)


def alpha(p: int) -> int:
    """Largest magnitude of precision p."""
    return 2 ** (p - 1) - 1


def flatten_index(d, n) -> int:
    """The spec's flatten_index(d_0..d_{N-1}, n_0..n_{N-1})."""
    return sum(d[i] * math.prod(n[i + 1:]) for i in range(len(n)))


# ---- strategies ---------------------------------------------------------------------------
def shape_of(draw, rank=(1, 3), dim=(1, 3)) -> tuple[int, ...]:
    """A small shape."""
    r = draw(st.integers(*rank))
    return tuple(draw(st.integers(*dim)) for _ in range(r))


def values(draw, shape, p: int) -> np.ndarray:
    """Integers of precision p, often the extremes +-(2^(p-1)-1), 0, +-1."""
    b = alpha(p)
    special = st.sampled_from(sorted({-b, b, 0, min(b, 1), -min(b, 1)}))
    elems = st.one_of(special, st.integers(-b, b))
    n = volume(shape)
    return np.array(draw(st.lists(elems, min_size=n, max_size=n)), dtype=np.int64).reshape(shape)


def tensor(draw, shape, p=(1, 32)) -> tuple[np.ndarray, int]:
    """(array, precision) with a drawn precision in the range `p`."""
    prec = draw(st.integers(*p)) if isinstance(p, tuple) else p
    return values(draw, shape, prec), prec


def axis_of(draw, ndim: int, extra: int = 0) -> int:
    """An axis in [-ndim-extra, ndim+extra), negative forms included."""
    return draw(st.integers(-ndim - extra, ndim - 1 + extra))


def same(x: np.ndarray) -> np.ndarray:
    """Y = X, element by element."""
    return build(x.shape, lambda d: at(x, d))


def p_first(c: Case, ys) -> list[int]:
    """Precision rule `p_x`."""
    return [c.p(0)]


# ---- elemwise -----------------------------------------------------------------------------
def gen_unary(draw, p=(1, 32)) -> Case:
    return Case([tensor(draw, shape_of(draw), p)])


def unary(f: Callable[[int], int]) -> Callable[[Case], list[np.ndarray]]:
    """Oracle Y[d] = f(X[d])."""
    return lambda c: [build(c.x(0).shape, lambda d: f(at(c.x(0), d)))]


def ceil_log2(v: int) -> int:
    """ceil(log2 v) for v >= 1, by counting powers of two."""
    k = 0
    while 2**k < v:
        k += 1
    return k


def gen_binary(draw) -> Case:
    shape = shape_of(draw)
    return Case([tensor(draw, shape, (1, 31)), tensor(draw, shape, (1, 31))])


def binary(f: Callable[[int, int], int]) -> Callable[[Case], list[np.ndarray]]:
    """Oracle Y[d] = f(A[d], B[d]) for same-shaped inputs."""
    return lambda c: [build(c.x(0).shape, lambda d: f(at(c.x(0), d), at(c.x(1), d)))]


def p_add(c: Case, ys) -> list[int]:
    return [max(c.p(0), c.p(1)) + 1]


def gen_clip(draw) -> Case:
    lo = draw(st.integers(-(2**30), 2**30 - 1))
    hi = draw(st.integers(lo + 1, 2**30))
    return Case([tensor(draw, shape_of(draw))], {"a_min": lo, "a_max": hi})


def clip_oracle(c: Case) -> list[np.ndarray]:
    lo, hi = c.attrs["a_min"], c.attrs["a_max"]
    return unary(lambda x: hi if x >= hi else x if lo < x < hi else lo)(c)


def gen_cvm_clip(draw) -> Case:
    return Case([tensor(draw, shape_of(draw))], {"precision": draw(st.integers(1, 32))})


def cvm_clip_oracle(c: Case) -> list[np.ndarray]:
    a = alpha(c.attrs["precision"])
    return unary(lambda x: clip(x, -a, a))(c)


def p_attr(c: Case, ys) -> list[int]:
    return [c.attrs["precision"]]


def gen_right_shift(draw) -> Case:
    return Case([tensor(draw, shape_of(draw))], {"precision": draw(st.integers(1, 32)),
                                                  "shift_bit": draw(st.integers(1, 32))})


def right_shift_oracle(c: Case) -> list[np.ndarray]:
    s, a = c.attrs["shift_bit"], alpha(c.attrs["precision"])

    def f(x: int) -> int:
        t = math.floor(Fraction(math.floor(Fraction(x, 2 ** (s - 1))) + 1, 2))
        return clip(t, -a, a)
    return unary(f)(c)


def gen_left_shift(draw) -> Case:
    p = draw(st.integers(1, 31))
    return Case([tensor(draw, shape_of(draw), p)],
                {"precision": draw(st.integers(1, 32)), "shift_bit": draw(st.integers(1, 32 - p))})


def left_shift_oracle(c: Case) -> list[np.ndarray]:
    s, a = c.attrs["shift_bit"], alpha(c.attrs["precision"])
    return unary(lambda x: clip(x * 2**s, -a, a))(c)


# ---- broadcast ----------------------------------------------------------------------------
def gen_broadcast(draw) -> Case:
    q = shape_of(draw)
    # each input takes a suffix of the output shape with some extents set to 1
    def operand():
        m = draw(st.integers(1, len(q)))
        dims = tuple(n if draw(st.booleans()) else 1 for n in q[len(q) - m:])
        return tensor(draw, dims, (1, 16))
    return Case([operand(), operand()])


def broadcast(op: Callable[[int, int], int]) -> Callable[[Case], list[np.ndarray]]:
    """The spec's Y[d] = A[a] OP B[b], a_j = d_{Q-M+j} if < m_j else 0."""
    def oracle(c: Case) -> list[np.ndarray]:
        a, b = c.x(0), c.x(1)
        m, n = a.shape, b.shape
        q = max(len(m), len(n))
        em = [1 if i < q - len(m) else m[i - q + len(m)] for i in range(q)]
        en = [1 if i < q - len(n) else n[i - q + len(n)] for i in range(q)]

        def f(d):
            ai = [d[q - len(m) + j] if d[q - len(m) + j] < m[j] else 0 for j in range(len(m))]
            bi = [d[q - len(n) + j] if d[q - len(n) + j] < n[j] else 0 for j in range(len(n))]
            return op(at(a, ai), at(b, bi))
        return [build([max(u, v) for u, v in zip(em, en)], f)]
    return oracle


def divide(u: int, v: int) -> int:
    """Quotient truncated toward zero; x / 0 = 0 (cvm-semantics.md)."""
    return 0 if v == 0 else int(Fraction(u, v))


# ---- reduce -------------------------------------------------------------------------------
def gen_reduce(draw) -> Case:
    x = tensor(draw, shape_of(draw), (1, 24))
    n = x[0].ndim
    axes = draw(st.lists(st.integers(0, n - 1), unique=True, max_size=n))
    axes = [ax - n if draw(st.booleans()) else ax for ax in axes]  # negative forms
    return Case([x], {"axes": axes, "keepdims": draw(st.booleans()),
                      "exclude": draw(st.booleans())})


def reduce_oracle(func: Callable[[list[int]], int]) -> Callable[[Case], list[np.ndarray]]:
    """The spec's reduce cases: exclude with M = N is Y = X, else reduce over R."""
    def oracle(c: Case) -> list[np.ndarray]:
        x, n = c.x(0), c.x(0).ndim
        axes, keep, excl = c.attrs["axes"], c.attrs["keepdims"], c.attrs["exclude"]
        t = {ax if ax >= 0 else ax + n for ax in axes}
        if excl and len(t) == n:
            return [same(x)]
        r = set(range(n)) - t if excl else t
        if not excl and not t:
            r = set(range(n))  # case 2: reduce everything
        kept = [i for i in range(n) if i not in r]
        groups: dict[tuple, list[int]] = {}
        for d in indices(x.shape):
            groups.setdefault(tuple(d[i] for i in kept), []).append(at(x, d))
        if keep:
            shape = [1 if i in r else x.shape[i] for i in range(n)]
            return [build(shape, lambda d: func(groups[tuple(d[i] for i in kept)]))]
        shape = [x.shape[i] for i in kept] or [1]  # SPEC_EXCEPTIONS["reduce-rank0"]
        return [build(shape, lambda d: func(groups[tuple(d) if kept else ()]))]
    return oracle


def p_sum(c: Case, ys) -> list[int]:
    return [c.p(0) + bitlen(c.x(0).size // ys[0].size)]


# ---- nn -----------------------------------------------------------------------------------
def gen_conv2d(draw) -> Case:
    g, ic, opg = draw(st.integers(1, 2)), draw(st.integers(1, 2)), draw(st.integers(1, 2))
    kh, kw = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    ph, pw = draw(st.integers(0, 2)), draw(st.integers(0, 2))
    dh, dw = draw(st.integers(1, 2)), draw(st.integers(1, 2))
    # the input is at least as large as the dilated kernel minus the padding
    h = draw(st.integers(max(1, dh * (kh - 1) + 1 - 2 * ph), 5))
    w = draw(st.integers(max(1, dw * (kw - 1) + 1 - 2 * pw), 5))
    ins = [tensor(draw, (draw(st.integers(1, 2)), ic * g, h, w), (1, 8)),
           tensor(draw, (opg * g, ic, kh, kw), (1, 8))]
    if draw(st.booleans()):
        ins.append(tensor(draw, (opg * g,), (1, 20)))
    return Case(ins, {"padding": [ph, pw], "stride": [draw(st.integers(1, 3)) for _ in "hw"],
                      "dilation": [dh, dw], "groups": g})


def conv2d_oracle(c: Case) -> list[np.ndarray]:
    x, w = c.x(0), c.x(1)
    _, _, h, wd = x.shape
    oc, ic, kh, kw = w.shape
    (ph, pw), (sh, sw), (dh, dw) = (c.attrs[k] for k in ("padding", "stride", "dilation"))
    opg = oc // c.attrs["groups"]
    y_h = math.floor(Fraction(h + 2 * ph - dh * (kh - 1) - 1, sh)) + 1
    y_w = math.floor(Fraction(wd + 2 * pw - dw * (kw - 1) - 1, sw)) + 1

    def pad(n, j, p, q):
        return at(x, (n, j, p, q)) if 0 <= p < h and 0 <= q < wd else 0

    def kernel(n, j, p, q, o, i):
        p0, q0 = p * sh - ph, q * sw - pw
        # SPEC_EXCEPTIONS["conv2d-kernel-range"]: k_i < KH, k_j < KW
        return sum(pad(n, j, p0 + ki * dh, q0 + kj * dw) * at(w, (o, i, ki, kj))
                   for ki in range(kh) for kj in range(kw))

    def y(d):
        n, o, p, q = d
        bias = at(c.x(2), (o,)) if len(c.inputs) == 3 else 0
        return sum(kernel(n, (o // opg) * ic + i, p, q, o, i) for i in range(ic)) + bias
    return [build((x.shape[0], oc, y_h, y_w), y)]


def p_conv(k: int, c: Case) -> list[int]:
    p = c.p(0) + c.p(1) + bitlen(k)
    return [max(p, c.p(2)) + 1 if len(c.inputs) == 3 else p]


def gen_dense(draw) -> Case:
    m, k, n = (draw(st.integers(1, 4)) for _ in range(3))
    ins = [tensor(draw, (m, k), (1, 8)), tensor(draw, (n, k), (1, 8))]
    if draw(st.booleans()):
        ins.append(tensor(draw, (n,), (1, 20)))
    return Case(ins)


def dense_oracle(c: Case) -> list[np.ndarray]:
    x, w = c.x(0), c.x(1)
    k = x.shape[1]

    def y(d):
        bias = at(c.x(2), (d[1],)) if len(c.inputs) == 3 else 0
        return sum(at(x, (d[0], j)) * at(w, (d[1], j)) for j in range(k)) + bias
    return [build((x.shape[0], w.shape[0]), y)]


def gen_max_pool2d(draw) -> Case:
    h, w = draw(st.integers(1, 5)), draw(st.integers(1, 5))
    ph, pw = draw(st.integers(0, 2)), draw(st.integers(0, 2))
    if draw(st.booleans()):
        pw, padding = ph, ph  # one int: PH = PW
    else:
        padding = [ph, pw]
    pool = [draw(st.integers(ph + 1, max(ph + 1, h + 2 * ph))),
            draw(st.integers(pw + 1, max(pw + 1, w + 2 * pw)))]
    return Case([tensor(draw, (draw(st.integers(1, 2)), draw(st.integers(1, 2)), h, w))],
                {"pool_size": pool, "padding": padding,
                 "strides": [draw(st.integers(1, 3)) for _ in "hw"],
                 "ceil_mode": draw(st.booleans())})


def max_pool2d_oracle(c: Case) -> list[np.ndarray]:
    x = c.x(0)
    _, _, h, w = x.shape
    pad_attr = c.attrs["padding"]
    ph, pw = (pad_attr, pad_attr) if isinstance(pad_attr, int) else pad_attr
    (psh, psw), (sh, sw) = c.attrs["pool_size"], c.attrs["strides"]
    if not (psh > ph and psw > pw and psh <= h + 2 * ph and psw <= w + 2 * pw):
        raise Rejected("pool window outside the spec's range")
    ceil_func = math.ceil if c.attrs["ceil_mode"] else math.floor
    oh = ceil_func(Fraction(h + 2 * ph - psh, sh)) + 1
    ow = ceil_func(Fraction(w + 2 * pw - psw, sw)) + 1

    def pad(n, i, p, q):
        return at(x, (n, i, p, q)) if 0 <= p < h and 0 <= q < w else INT32_MIN

    def y(d):
        n, i, p, q = d
        v = max(pad(n, i, pp, qq) for pp in range(p * sh - ph, p * sh - ph + psh)
                for qq in range(q * sw - pw, q * sw - pw + psw))
        if v == INT32_MIN:
            raise Rejected(SPEC_EXCEPTIONS["max_pool2d-padding-window"])
        return v
    return [build((*x.shape[:2], oh, ow), y)]


def gen_upsampling(draw) -> Case:
    return Case([tensor(draw, shape_of(draw, (4, 4), (1, 2)))],
                {"scale": draw(st.integers(1, 3))})


def upsampling_oracle(c: Case) -> list[np.ndarray]:
    x, s = c.x(0), c.attrs["scale"]
    n, ch, h, w = x.shape
    return [build((n, ch, h * s, w * s),
                  lambda d: at(x, (d[0], d[1], math.floor(Fraction(d[2], s)),
                                   math.floor(Fraction(d[3], s)))))]


# ---- transform ----------------------------------------------------------------------------
def gen_repeat(draw) -> Case:
    x = tensor(draw, shape_of(draw))
    return Case([x], {"axis": axis_of(draw, x[0].ndim), "repeats": draw(st.integers(1, 3))})


def repeat_oracle(c: Case) -> list[np.ndarray]:
    x, r, n = c.x(0), c.attrs["repeats"], c.x(0).ndim
    ax = c.attrs["axis"] % n  # SPEC_EXCEPTIONS["negative-axis"]
    shape = [m * r if i == ax else m for i, m in enumerate(x.shape)]
    return [build(shape, lambda d: at(x, [v // r if i == ax else v for i, v in enumerate(d)]))]


def gen_tile(draw) -> Case:
    return Case([tensor(draw, shape_of(draw))],
                {"reps": draw(st.lists(st.integers(1, 3), min_size=1, max_size=4))})


def tile_oracle(c: Case) -> list[np.ndarray]:
    x, reps = c.x(0), c.attrs["reps"]
    n, m = x.shape, reps
    k = max(len(m), len(n))
    # the spec's ranges [K-N, K-1) are a typo for [K-N, K): every axis has an extent
    sx = [n[p - k + len(n)] if p >= k - len(n) else 1 for p in range(k)]
    sr = [m[q - k + len(m)] if q >= k - len(m) else 1 for q in range(k)]
    return [build([a * b for a, b in zip(sx, sr)],
                  lambda kk: at(x, [kk[k - len(n) + j] % n[j] for j in range(len(n))]))]


def flatten_oracle(c: Case) -> list[np.ndarray]:
    x = c.x(0)
    flat = [0] * x.size
    for d in indices(x.shape):
        flat[flatten_index(d, x.shape)] = at(x, d)
    # SPEC_EXCEPTIONS["flatten-2d"]
    return [np.array(flat, dtype=np.int64).reshape(x.shape[0], x.size // x.shape[0])]


def gen_concatenate(draw) -> Case:
    base = shape_of(draw)
    axis = axis_of(draw, len(base))
    ins = []
    for _ in range(draw(st.integers(1, 3))):
        shape = list(base)
        shape[axis] = draw(st.integers(1, 3))
        ins.append(tensor(draw, tuple(shape)))
    return Case(ins, {"axis": axis})


def concatenate_oracle(c: Case) -> list[np.ndarray]:
    xs = [x for x, _ in c.inputs]
    ax = c.attrs["axis"] % xs[0].ndim  # SPEC_EXCEPTIONS["negative-axis"]
    shape = list(xs[0].shape)
    shape[ax] = sum(x.shape[ax] for x in xs)
    y = np.zeros(shape, dtype=np.int64)
    for i, x in enumerate(xs):
        for d in indices(x.shape):
            new_idx = sum(xs[j].shape[ax] for j in range(i)) + d[ax]
            y[(*d[:ax], new_idx, *d[ax + 1:])] = at(x, d)
    return [y]


def p_max_inputs(c: Case, ys) -> list[int]:
    return [max(p for _, p in c.inputs)]


def gen_transpose(draw) -> Case:
    x = tensor(draw, shape_of(draw, (1, 4)))
    n = x[0].ndim
    axes = [] if draw(st.booleans()) else [
        ax - n if draw(st.booleans()) else ax for ax in draw(st.permutations(range(n)))]
    return Case([x], {"axes": axes})


def transpose_oracle(c: Case) -> list[np.ndarray]:
    x, axes, n = c.x(0), c.attrs["axes"], c.x(0).ndim
    real = [n - 1 - i for i in range(n)] if not axes else [a + n if a < 0 else a for a in axes]
    y = np.zeros([x.shape[r] for r in real], dtype=np.int64)
    for d in indices(x.shape):
        y[tuple(d[r] for r in real)] = at(x, d)  # Y[d_real_0, ..., d_real_{N-1}] = X[d]
    return [y]


def gen_slice(draw) -> Case:
    x = tensor(draw, shape_of(draw, dim=(1, 5)))
    n = x[0].ndim
    bound = st.integers(-7, 7)
    attrs = {"begin": draw(st.lists(bound, max_size=n)), "end": draw(st.lists(bound, max_size=n))}
    if draw(st.booleans()):
        attrs["strides"] = draw(st.lists(st.integers(-3, 3).filter(bool), max_size=n))
    return Case([x], attrs)


def wrap(values: list[int], i: int, n: int) -> int:
    """values[i], plus n when negative (b_arr / e_arr of the spec)."""
    return values[i] + n if values[i] < 0 else values[i]


def slice_oracle(c: Case) -> list[np.ndarray]:
    x = c.x(0)
    begin, end, strides = c.attrs["begin"], c.attrs["end"], c.attrs.get("strides", [])
    b_vec, s_arr, lengths = [], [], []
    for i, n in enumerate(x.shape):
        s = strides[i] if i < len(strides) else 1
        # SPEC_EXCEPTIONS["slice-clamp"]: defaults, += n, then clamp to [b_range, e_range]
        lo, hi = (-1, n - 1) if s < 0 else (0, n)
        b = clip(wrap(begin, i, n), lo, hi) if i < len(begin) else (0 if s > 0 else n - 1)
        e = clip(wrap(end, i, n), lo, hi) if i < len(end) else (n if s > 0 else -1)
        length = math.ceil(Fraction(e - b, s))
        if length < 1:
            raise Rejected("empty slice")
        b_vec.append(b)
        s_arr.append(s)
        lengths.append(length)
    return [build(lengths, lambda d: at(x, [b_vec[i] + s_arr[i] * d[i]
                                            for i in range(len(d))]))]


def gen_slice_like(draw) -> Case:
    x = tensor(draw, shape_of(draw))
    n = x[0].ndim
    if draw(st.booleans()):
        axes = draw(st.lists(st.integers(-n, n - 1), min_size=1, max_size=n))
        like_rank = draw(st.integers(1, 4))
    else:
        axes, like_rank = [], n
    like = tuple(draw(st.integers(1, x[0].shape[i])) if i < n else draw(st.integers(1, 2))
                 for i in range(like_rank))
    return Case([x, tensor(draw, like)], {"axes": axes})


def slice_like_oracle(c: Case) -> list[np.ndarray]:
    x, like, axes = c.x(0), c.x(1).shape, c.attrs["axes"]
    n, m = x.ndim, len(like)
    sliced = {j if j >= 0 else j + n for j in axes} if axes else set(range(m))
    if any(j >= min(m, n) for j in sliced):
        raise Rejected("sliced axis beyond shape_like")
    shape = [like[j] if j in sliced else x.shape[j] for j in range(n)]
    return [build(shape, lambda d: at(x, d))]


def gen_take(draw) -> Case:
    x = tensor(draw, shape_of(draw))
    idx = values(draw, shape_of(draw, (1, 2)), draw(st.integers(1, 5)))
    axis = draw(st.one_of(st.none(), st.integers(-x[0].ndim, x[0].ndim - 1)))
    return Case([x, (idx, 5)], {} if axis is None else {"axis": axis})


def take(x: np.ndarray, ind: np.ndarray, axis: int | None) -> np.ndarray:
    """The spec's take: indices clipped into range."""
    if axis is None:
        t = flatten_oracle(Case([(x, 32)]))[0].reshape(-1)
        return build(ind.shape, lambda d: int(t[clip(at(ind, d), 0, t.size - 1)]))
    n, m = x.ndim, ind.ndim
    ax = axis if axis >= 0 else axis + n
    shape = [*x.shape[:ax], *ind.shape, *x.shape[ax + 1:]]

    def y(d):
        xidx = clip(at(ind, d[ax:ax + m]), 0, x.shape[ax] - 1)
        return at(x, (*d[:ax], xidx, *d[ax + m:]))
    return build(shape, y)


def gen_cvm_lut(draw) -> Case:
    table = tensor(draw, (draw(st.integers(1, 6)),))
    return Case([(values(draw, shape_of(draw), 4), 4), table])  # SPEC_EXCEPTIONS cvm_lut


def gen_expand_dims(draw) -> Case:
    x = tensor(draw, shape_of(draw))
    return Case([x], {"axis": axis_of(draw, x[0].ndim + 1),
                      "num_newaxis": draw(st.integers(0, 6 - x[0].ndim))})


def expand_dims_oracle(c: Case) -> list[np.ndarray]:
    x, axis, k = c.x(0), c.attrs["axis"], c.attrs["num_newaxis"]
    ra = axis if axis >= 0 else axis + x.ndim + 1  # SPEC_EXCEPTIONS["expand_dims-axis"]
    y = np.zeros((*x.shape[:ra], *(1,) * k, *x.shape[ra:]), dtype=np.int64)
    for d in indices(x.shape):
        y[(*d[:ra], *(0,) * k, *d[ra:])] = at(x, d)
    return [y]


def gen_reshape(draw) -> Case:
    x = tensor(draw, shape_of(draw, (1, 4)))
    target = [x[0].size] if x[0].size == 1 else []
    rest = x[0].size
    while rest > 1:  # a random factorisation of the volume
        f = draw(st.sampled_from([f for f in range(2, rest + 1) if rest % f == 0]))
        target.append(f)
        rest //= f
    return Case([x], {"target_shape": draw(st.permutations(target))})


def reshape_oracle(c: Case) -> list[np.ndarray]:
    t = flatten_oracle(c)[0].reshape(-1)
    m = list(c.attrs["target_shape"])
    return [build(m, lambda d: int(t[flatten_index(d, m)]))]


def gen_squeeze(draw) -> Case:
    x = tensor(draw, shape_of(draw, (1, 4), (1, 2)))
    n = x[0].ndim
    ones = [i for i in range(n) if x[0].shape[i] == 1]
    axes = [] if not ones or draw(st.booleans()) else \
        [ax - n if draw(st.booleans()) else ax
         for ax in draw(st.lists(st.sampled_from(ones), min_size=1))]
    return Case([x], {"axes": axes})


def squeeze_oracle(c: Case) -> list[np.ndarray]:
    x, axes, n = c.x(0), c.attrs["axes"], c.x(0).ndim
    real = {a + n if a < 0 else a for a in axes} if axes else \
        {a for a in range(n) if x.shape[a] == 1}
    kept = [i for i in range(n) if i not in real]
    y = np.zeros([x.shape[i] for i in kept] or [1], dtype=np.int64)  # rank >= 1
    for d in indices(x.shape):
        y[tuple(d[i] for i in kept) or (0,)] = at(x, d)
    return [y]


def gen_where(draw) -> Case:
    shape = shape_of(draw)
    cond_shape = shape[:1] if draw(st.booleans()) else shape
    return Case([tensor(draw, cond_shape, (1, 3)), tensor(draw, shape), tensor(draw, shape)])


def where_oracle(c: Case) -> list[np.ndarray]:
    cond, a, b = c.x(0), c.x(1), c.x(2)
    rows = cond.shape != a.shape

    def y(d):
        flag = at(cond, d[:1]) if rows else at(cond, d)
        return at(a, d) if flag != 0 else at(b, d)
    return [build(a.shape, y)]


# ---- vision -------------------------------------------------------------------------------
def gen_get_valid_count(draw) -> Case:
    shape = (draw(st.integers(1, 2)), draw(st.integers(1, 4)), draw(st.integers(2, 5)))
    x = tensor(draw, shape, (1, 8))
    return Case([x], {"score_threshold": draw(st.integers(-3, 3))})


def get_valid_count_oracle(c: Case) -> list[np.ndarray]:
    x, thr = c.x(0), c.attrs["score_threshold"]
    bs, n, k = x.shape
    count = [sum(1 for q in range(n) if at(x, (b, q, 1)) > thr) for b in range(bs)]
    y = np.full(x.shape, -1, dtype=np.int64)
    for b in range(bs):
        for row in range(n):
            if at(x, (b, row, 1)) > thr:
                idx = sum(1 for q in range(row) if at(x, (b, q, 1)) > thr)
                for kk in range(k):
                    y[b, idx, kk] = at(x, (b, row, kk))
    return [np.array(count, dtype=np.int64), y]


def p_get_valid_count(c: Case, ys) -> list[int]:
    _, n, k = c.x(0).shape
    return [numprec(n * k), max(c.p(0), 2)]  # SPEC_EXCEPTIONS["vision-filler"]


def gen_nms(draw) -> Case:
    bs, n = draw(st.integers(1, 2)), draw(st.integers(1, 5))
    # corner boxes (x0, y0, x0 + w, y0 + h), overlapping often; w or h = 0: an empty box
    rows = st.builds(lambda i, s, x0, y0, w, h: (i, s, x0, y0, x0 + w, y0 + h),
                     st.sampled_from([0, 0, 1, -1]), st.integers(-3, 3), st.integers(0, 2),
                     st.integers(0, 2), st.integers(0, 3), st.integers(1, 3))
    x = np.array([[draw(rows) for _ in range(n)] for _ in range(bs)], dtype=np.int64)
    # thresholds at and just above an OLR that occurs, so the >= / < boundary is hit
    olrs = {math.floor(olr_percent(u[2:], v[2:])) for batch in x.tolist()
            for u, v in itertools.combinations(batch, 2)}
    thresholds = sorted({1, 101} | {t + e for t in olrs if t > 0 for e in (0, 1)})
    # limits: mostly "none" (-1) or large, so that suppression decides the output
    limit = st.sampled_from([-1, -1, 5, 5, 0, 1, 2, 3])
    vc = np.array([draw(st.sampled_from([n, n, n + 1, -1, 0, 1, 2])) for _ in range(bs)],
                  dtype=np.int64)
    return Case([(x, 4), (vc, 4)],
                {"iou_threshold": draw(st.sampled_from(thresholds)),
                 "max_output_size": draw(limit),
                 "force_suppress": draw(st.booleans()), "top_k": draw(limit)})


def olr_percent(u: list[int], v: list[int]) -> Fraction:
    """100 * area(u & v) / area(u | v) of corner boxes; 0 for no overlap."""
    def area(r):
        return max(r[2] - r[0], 0) * max(r[3] - r[1], 0)
    inter = area([max(u[0], v[0]), max(u[1], v[1]), min(u[2], v[2]), min(u[3], v[3])])
    return Fraction(100 * inter, area(u) + area(v) - inter) if inter else Fraction(0)


def nms_sorted_rows(x: np.ndarray, b: int, t: int) -> list[list[int]]:
    """R[b]: the first t rows by score descending, ties by index (an insertion sort)."""
    order: list[int] = []
    for i in range(t):
        pos = 0
        while pos < len(order) and at(x, (b, order[pos], 1)) >= at(x, (b, i, 1)):
            pos += 1
        order.insert(pos, i)
    return [[at(x, (b, i, kk)) for kk in range(x.shape[2])] for i in order]


def nms_iou(r: list[list[int]], p: int, q: int, force: bool) -> Fraction:
    """The spec's iou(p, q): OLR when forced or of the same class, else 0."""
    if force or r[p][0] == r[q][0]:
        return olr_percent(r[p][2:], r[q][2:])  # SPEC_EXCEPTIONS["nms-olr"]
    return Fraction(0)


def nms_oracle(c: Case) -> list[np.ndarray]:
    x, vc, at_ = c.x(0), c.x(1), c.attrs
    tk = math.inf if at_["top_k"] < 0 else at_["top_k"]
    mos = math.inf if at_["max_output_size"] < 0 else at_["max_output_size"]
    y = np.full(x.shape, -1, dtype=np.int64)
    for b in range(x.shape[0]):
        t = max(min(x.shape[1], int(vc[b])), 0)
        r = nms_sorted_rows(x, b, t)
        u: list[int] = []
        for p in range(int(min(tk, t))):
            if r[p][0] >= 0 and all(nms_iou(r, p, q, at_["force_suppress"])
                                    < at_["iou_threshold"] for q in u):
                u.append(p)
        for i in range(int(min(t, mos, len(u)))):
            y[b, i] = r[u[i]]
    return [y]


def p_fill(c: Case, ys) -> list[int]:
    return [max(c.p(0), 2)]  # SPEC_EXCEPTIONS["vision-filler"]

"""get_valid_count and non_max_suppression: hand-computed cases, an independent oracle,
compiled (llvm) vs reference bit-exact, and rule errors.

The spec files give no worked examples for these ops; expected values below are worked
out by hand from the formal definitions (cvm-operators-formal.txt, "Vision Operators").
"""
from fractions import Fraction

import numpy as np
import pytest

from cvmc.errors import CvmcError, OpRuleError
from tests.oputil import check_op, one_op_graph

NMS = "non_max_suppression"
FILL = [-1] * 6


def gvc(x, threshold, precision=8):
    """Run get_valid_count (reference and compiled, compared); returns (count, data)."""
    return check_op("get_valid_count", [(np.asarray(x, dtype=np.int64), precision)],
                    {"score_threshold": threshold})


def nms(rows, valid_count, precision=8, **attrs):
    """Run NMS on one batch of rows (reference and compiled, compared); returns Y[0]."""
    x = np.asarray([rows], dtype=np.int64)
    (y,) = check_op(NMS, [(x, precision), (np.array([valid_count]), 8)],
                    {"iou_threshold": 50, **attrs})
    return y[0].tolist()


# ---- get_valid_count: hand-computed -------------------------------------------------
def test_get_valid_count_moves_valid_rows_forward_in_order():
    x = [[[0, 5, 1], [1, 2, 2], [2, 7, 3], [3, 3, 4]]]
    count, y = gvc(x, threshold=3)  # score 3 is not > 3: only rows 0 and 2 are valid
    assert count.tolist() == [2]
    assert y.tolist() == [[[0, 5, 1], [2, 7, 3], [-1, -1, -1], [-1, -1, -1]]]


def test_get_valid_count_per_batch_and_negative_threshold():
    x = [[[9, -3], [8, -6]], [[7, -7], [6, -1]]]
    count, y = gvc(x, threshold=-5)
    assert count.tolist() == [1, 1]
    assert y.tolist() == [[[9, -3], [-1, -1]], [[6, -1], [-1, -1]]]


def test_get_valid_count_all_below_threshold():
    count, y = gvc(np.full((2, 3, 4), 7), threshold=7)
    assert count.tolist() == [0, 0]
    assert (y == -1).all()


def test_get_valid_count_precisions():
    g = one_op_graph("get_valid_count", [(np.zeros((1, 5, 3), np.int64), 1)])
    # count: numprec(N*K) = bitlen(16) + 1; data: max(p_x, 2) so the -1 filler fits.
    assert (g.types["y0"].precision, g.types["y1"].precision) == (6, 2)
    count, y = gvc(np.zeros((1, 5, 3)), threshold=-1, precision=1)
    assert count.tolist() == [5] and (y == 0).all()


@pytest.mark.parametrize("shape, threshold, seed", [
    ((1, 1, 2), 0, 0), ((2, 7, 2), -3, 1), ((3, 16, 31), 0, 2), ((2, 33, 6), 5, 3),
    ((1, 12, 5), -128, 4), ((1, 9, 4), 127, 5)])
def test_get_valid_count_compiled_matches_reference(shape, threshold, seed):
    x = np.random.default_rng(seed).integers(-127, 128, size=shape)
    count, y = gvc(x, threshold)
    valid = x[:, :, 1] > threshold  # independent oracle: boolean-mask compaction
    assert count.tolist() == valid.sum(axis=1).tolist()
    for b in range(shape[0]):
        kept = x[b][valid[b]]
        assert np.array_equal(y[b, :len(kept)], kept) and (y[b, len(kept):] == -1).all()


@pytest.mark.parametrize("shape, message", [
    ((4, 6), "must be 3-D"), ((1, 4, 1), "K must be in 2..31, got 1"),
    ((1, 4, 32), "K must be in 2..31, got 32")])
def test_get_valid_count_shape_errors(shape, message):
    with pytest.raises(OpRuleError, match=message):
        one_op_graph("get_valid_count", [(np.zeros(shape, np.int64), 8)])


def test_get_valid_count_attribute_errors():
    x = [(np.zeros((1, 2, 2), np.int64), 8)]
    with pytest.raises(OpRuleError, match="'score_threshold' must be an integer"):
        one_op_graph("get_valid_count", x, {"score_threshold": 0.5})
    with pytest.raises(OpRuleError, match="unknown attribute 'threshold'"):
        one_op_graph("get_valid_counts", x, {"threshold": 1})


# ---- non_max_suppression: hand-computed ---------------------------------------------
A = [0, 0, 10, 10]  # area 100
A_RIGHT = [5, 0, 15, 10]  # overlaps A in 50 of a 150 union: OLR 33.3%
FAR = [20, 20, 30, 30]


def test_nms_sorts_by_score_ties_by_index():
    rows = [[0, 5, *FAR], [1, 9, *A], [2, 5, 40, 40, 41, 41], [3, 7, 50, 50, 51, 51]]
    assert nms(rows, 4) == [rows[1], rows[3], rows[0], rows[2]]


def test_nms_suppresses_same_class_only_unless_forced():
    rows = [[1, 9, *A], [2, 8, *A], [1, 7, *A], [2, 6, *FAR]]
    assert nms(rows, 4) == [rows[0], rows[1], rows[3], FILL]
    assert nms(rows, 4, force_suppress=True) == [rows[0], rows[3], FILL, FILL]


@pytest.mark.parametrize("threshold, kept", [(33, False), (34, True), (1, False)])
def test_nms_iou_at_threshold(threshold, kept):
    rows = [[0, 9, *A], [0, 8, *A_RIGHT]]  # OLR = 100 * 50 / 150 = 33.3
    expected = rows if kept else [rows[0], FILL]
    assert nms(rows, 2, iou_threshold=threshold) == expected


@pytest.mark.parametrize("threshold, kept", [(32, False), (33, True)])
def test_nms_iou_just_below_threshold(threshold, kept):
    # kept box 7x7 = 49 inside a 15x10 = 150 box: OLR = 4900 / 150 = 32.67, not 33
    rows = [[0, 9, 1, 2, 8, 9], [0, 8, 0, 0, 15, 10]]
    expected = rows if kept else [rows[0], FILL]
    assert nms(rows, 2, iou_threshold=threshold) == expected


@pytest.mark.parametrize("threshold, kept", [(50, False), (100, False), (101, True),
                                             (5000, True)])
def test_nms_full_overlap(threshold, kept):
    rows = [[0, 9, *A], [0, 8, *A]]  # identical boxes: OLR exactly 100
    expected = rows if kept else [rows[0], FILL]
    assert nms(rows, 2, iou_threshold=threshold) == expected


def test_nms_top_k_limits_candidates_before_suppression():
    rows = [[0, 1, *FAR], [0, 9, *A], [0, 5, 40, 40, 41, 41], [0, 7, 50, 50, 51, 51]]
    assert nms(rows, 4, top_k=2) == [rows[1], rows[3], FILL, FILL]
    assert nms(rows, 4, top_k=0) == [FILL] * 4


def test_nms_max_output_size_counts_kept_boxes():
    rows = [[0, 9, *A], [0, 8, *A], [0, 7, *FAR], [0, 6, 40, 40, 41, 41]]
    # row 1 is suppressed, so the two outputs are rows 0 and 2
    assert nms(rows, 4, max_output_size=2) == [rows[0], rows[2], FILL, FILL]


@pytest.mark.parametrize("valid_count, expected", [
    (2, [[0, 5, *A], [0, 3, *FAR], FILL, FILL]),   # row 2 (score 9) is not looked at
    (9, [[0, 9, 40, 40, 41, 41], [0, 5, *A], [0, 3, *FAR], [0, 1, 60, 60, 61, 61]]),
    (-3, [FILL] * 4)])
def test_nms_valid_count(valid_count, expected):
    rows = [[0, 3, *FAR], [0, 5, *A], [0, 9, 40, 40, 41, 41], [0, 1, 60, 60, 61, 61]]
    assert nms(rows, valid_count) == expected


def test_nms_skips_negative_ids_and_degenerate_boxes():
    point = [3, 3, 3, 3]  # zero area: overlaps nothing, suppresses nothing
    inverted = [10, 10, 0, 0]  # x_max < x_min: empty box
    rows = [[-1, 9, *A], [0, 8, *point], [0, 7, *point], [0, 6, *inverted], [0, 5, *A]]
    assert nms(rows, 5, iou_threshold=1) == rows[1:] + [FILL]


def test_nms_large_coordinates_exact():
    big = 2**29 - 1  # precision 30: areas near 2^60, threshold * union beyond int64
    outer = [-big, -big, big, big]
    inner = [-big, -big, big, big - 2]  # OLR = 100 * (1 - 2 / (2 * big)) = 99.999...
    rows = [[0, 9, *outer], [0, 8, *inner]]
    assert nms(rows, 2, precision=30, iou_threshold=100) == rows
    assert nms(rows, 2, precision=30, iou_threshold=99) == [rows[0], FILL]


def test_nms_precision_output():
    g = one_op_graph(NMS, [(np.zeros((1, 2, 6), np.int64), 1), (np.zeros(1, np.int64), 1)],
                     {"iou_threshold": 50})
    assert g.types["y0"].precision == 2
    assert nms([[0, 0, 0, 0, 0, 0]] * 2, 0, precision=1) == [FILL, FILL]


# ---- non_max_suppression: independent oracle ----------------------------------------
def olr_percent(a, b) -> Fraction:
    """Exact intersection-over-union of corner boxes, in percent."""
    def area(x0, y0, x1, y1):
        return max(x1 - x0, 0) * max(y1 - y0, 0)
    inter = area(max(a[0], b[0]), max(a[1], b[1]), min(a[2], b[2]), min(a[3], b[3]))
    union = area(*a) + area(*b) - inter
    return Fraction(100 * inter, union) if inter else Fraction(0)


def nms_oracle(x, vc, iou_threshold, force_suppress, top_k, max_output_size):
    """The spec's U / IDX construction with exact rational OLR."""
    out = np.full_like(x, -1)
    for b in range(x.shape[0]):
        t = max(min(x.shape[1], int(vc[b])), 0)
        order = sorted(range(t), key=lambda i: (-x[b, i, 1], i))
        r = [list(map(int, x[b, i])) for i in order]
        u = []
        for p in range(t if top_k < 0 else min(top_k, t)):
            if r[p][0] >= 0 and all(
                    olr_percent(r[p][2:], r[q][2:]) < iou_threshold
                    for q in u if force_suppress or r[p][0] == r[q][0]):
                u.append(p)
        n = min(t, len(u) if max_output_size < 0 else min(max_output_size, len(u)))
        for i in range(n):
            out[b, i] = r[u[i]]
    return out


@pytest.mark.parametrize("seed, shape, p, attrs", [
    (0, (1, 8, 6), 6, {"iou_threshold": 20}),
    (1, (2, 16, 6), 8, {"iou_threshold": 40, "force_suppress": True}),
    (2, (3, 12, 6), 5, {"iou_threshold": 10, "top_k": 7}),
    (3, (2, 20, 6), 8, {"iou_threshold": 60, "max_output_size": 5, "top_k": 15}),
    (4, (1, 30, 6), 7, {"iou_threshold": 101, "force_suppress": True}),
    (5, (2, 1, 6), 4, {"iou_threshold": 1}),
])
def test_nms_compiled_matches_reference_and_oracle(seed, shape, p, attrs):
    rng = np.random.default_rng(seed)
    hi = 2 ** (p - 1)
    x = rng.integers(-hi + 1, hi, size=shape)
    x[:, :, 0] = rng.integers(-1, 3, size=shape[:2])  # few classes: suppression happens
    x[:, :, 1] = rng.integers(0, 4, size=shape[:2])  # many score ties
    x[:, :, 4:6] = np.minimum(x[:, :, 2:4] + rng.integers(0, hi // 2, size=shape[:2] + (2,)),
                              hi - 1)
    vc = rng.integers(-1, shape[1] + 2, size=shape[0])
    (y,) = check_op(NMS, [(x, p), (vc, 8)], attrs)
    full = {"force_suppress": False, "top_k": -1, "max_output_size": -1, **attrs}
    assert np.array_equal(y, nms_oracle(x, vc, **full))


# ---- non_max_suppression: errors ----------------------------------------------------
def nms_graph(x_shape=(1, 4, 6), vc_shape=(1,), p=8, **attrs):
    """Build (and so check) an NMS graph."""
    return one_op_graph(NMS, [(np.zeros(x_shape, np.int64), p), (np.zeros(vc_shape, np.int64), 8)],
                        {"iou_threshold": 50, **attrs})


@pytest.mark.parametrize("kwargs, message", [
    ({"x_shape": (1, 4, 5)}, r"data must have shape \(B, N, 6\), got \(1, 4, 5\)"),
    ({"x_shape": (4, 6)}, r"data must have shape \(B, N, 6\)"),
    ({"vc_shape": (2,)}, r"valid_count must have shape \(1,\) .*got \(2,\)"),
    ({"coord_start": 0}, "'coord_start' must be 2 .*got 0"),
    ({"id_index": 1}, "'id_index' must be 0 .*got 1"),
    ({"score_index": 0}, "'score_index' must be 1 .*got 0"),
    ({"return_indices": True}, "'return_indices' must be false .*got true"),
    ({"invalid_to_bottom": False}, "'invalid_to_bottom' must be true .*got false"),
    ({"iou_threshold": 0}, r"'iou_threshold' must be in \[1, 2147483647\], got 0"),
    ({"force_suppress": 1}, "'force_suppress' must be a logical"),
])
def test_nms_shape_and_attribute_errors(kwargs, message):
    with pytest.raises(OpRuleError, match=message):
        nms_graph(**kwargs)


def test_nms_missing_threshold_and_precision_errors():
    with pytest.raises(OpRuleError, match="missing required attribute 'iou_threshold"):
        one_op_graph(NMS, [(np.zeros((1, 2, 6), np.int64), 8), (np.zeros(1, np.int64), 8)])
    with pytest.raises(CvmcError, match="data precision must be <= 30.*got 31"):
        nms_graph(p=31)

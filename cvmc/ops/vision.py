"""CVM vision operators: get_valid_count and non_max_suppression.

Spec: ../shared/spec/cvm-operators-formal.txt "Vision Operators" (the v2 file's NMS text
is looser and is not followed where they differ); precision rules and the K < 32 bound
from ../shared/design/cvm-semantics.md.

Decisions where the spec is silent:
- Both ops fill unused rows with -1, which precision 1 (values in [0, 0]) cannot hold, so
  their data outputs have precision max(p_x, 2) (equal to the table's p_x for p_x >= 2).
- Boxes are [x_min, y_min, x_max, y_max] in columns 2..5 (CVM-Runtime's corner format);
  a box with x_max <= x_min or y_max <= y_min is empty and overlaps nothing.
- OLR as an integer percentage: box q suppresses box p iff their intersection I > 0 and
  100 * I >= iou_threshold * U (U = union area), i.e. floor(100 * I / U) >= threshold.
  Full overlap gives 100, so thresholds of 101 and above never suppress (the spec's
  "101 stands for full overlap ... larger integer is equivalent").
- NMS data precision must be <= 30 (as in CVM-Runtime): box areas then fit in int64.
"""
from __future__ import annotations

import math

import numpy as np

from cvmc.ops.common import numprec, require
from cvmc.ops.registry import Attr, Fusion, op

# TE reductions use if_then_else, not `where=`: TVM 0.27's create_prim_func drops `where`.

INT32_RANGE = {"lo": -(2**31), "hi": 2**31 - 1}
FULL_OVERLAP = 101  # the smallest threshold that never suppresses (OLR <= 100)
NMS_K = 6  # NMS rows: id, score, x_min, y_min, x_max, y_max


def _fill_precision(p: int) -> int:
    """Precision of an output holding the input's values and the -1 filler."""
    return max(p, 2)


# ---- get_valid_count ------------------------------------------------------------------
get_valid_count = op(
    "get_valid_count", family="vision", inputs=("data",), outputs=("valid_count", "out"),
    aliases=("get_valid_counts",), cvm_name="get_valid_counts", fusion=Fusion.OPAQUE,
    attrs=(Attr("score_threshold", "int", 0, **INT32_RANGE),),
    precision_rule="valid_count: numprec(N*K); out: max(p_x, 2) (-1 filler)")


@get_valid_count.shape
def _gvc_shape(ins, a):
    x = ins[0]
    require(x.ndim == 3, f"get_valid_count: data must be 3-D (B, N, K), got shape {x.shape}")
    k = x.shape[2]
    require(2 <= k < 32, f"get_valid_count: data's last dimension K must be in 2..31, got {k}")
    return [(x.shape[0],), x.shape]


@get_valid_count.precision
def _gvc_precision(ins, a):
    _, n, k = ins[0].shape
    return numprec(n * k), _fill_precision(ins[0].precision)


@get_valid_count.arith
def _gvc_arith(ins, outs, a):
    """GOPS: one threshold test per box."""
    return math.prod(ins[0].shape[:-1])


@get_valid_count.cost
def _get_valid_count_cost(ins, outs, a):
    # CVM-Runtime's gas counts 1 per element of the data output (B, N, K), not of the
    # valid-count output (B,) that costs are counted against here: N*K per count.
    return outs[1].size // outs[0].size


@get_valid_count.reference
def _gvc_reference(xs, a):
    x = xs[0]
    valid = x[:, :, 1] > a.score_threshold
    idx = np.cumsum(valid, axis=1) - valid  # card{q < n : valid}: the row's new position
    y = np.full_like(x, -1)
    bs, ns = np.nonzero(valid)
    y[bs, idx[bs, ns]] = x[bs, ns]
    return valid.sum(axis=1).astype(np.int64), y


@get_valid_count.lower
def _gvc_lower(xs, a):
    from cvmc.ops.te import const, te, tirx

    x = xs[0]
    b_, n_, k_ = x.shape
    valid = te.compute((b_, n_), lambda b, n: (x[b, n, 1] > const(a.score_threshold))
                       .astype("int32"), name="gvc_valid")
    q = te.reduce_axis((0, n_), name="q")
    count = te.compute((b_,), lambda b: te.sum(valid[b, q], axis=q), name="gvc_count")
    q2 = te.reduce_axis((0, n_), name="q2")
    before = te.compute((b_, n_), lambda b, n: te.sum(
        tirx.if_then_else(q2 < n, valid[b, q2], 0), axis=q2), name="gvc_before")
    # Output row i comes from the unique valid row n with i valid rows before it; a sum
    # over n of (n + 1) picks it out (0 when there is none), so no scatter is needed.
    m = te.reduce_axis((0, n_), name="m")
    src = te.compute((b_, n_), lambda b, i: te.sum(
        tirx.if_then_else(tirx.all(valid[b, m] > 0, before[b, m] == i), m + 1, 0), axis=m),
        name="gvc_src")
    y = te.compute((b_, n_, k_), lambda b, i, k: tirx.if_then_else(
        src[b, i] > 0, x[b, src[b, i] - 1, k], const(-1)), name="gvc_out")
    return count, y


# ---- non_max_suppression --------------------------------------------------------------
# CVM-Runtime's extra attributes, accepted only with the one value it supports.
_NMS_FIXED = {"coord_start": 2, "score_index": 1, "id_index": 0,
              "return_indices": False, "invalid_to_bottom": True}

non_max_suppression = op(
    "non_max_suppression", family="vision", inputs=("data", "valid_count"),
    fusion=Fusion.OPAQUE,
    attrs=(Attr("iou_threshold", "int", lo=1, hi=INT32_RANGE["hi"]),
           Attr("max_output_size", "int", -1, **INT32_RANGE),
           Attr("force_suppress", "bool", False),
           Attr("top_k", "int", -1, **INT32_RANGE),
           Attr("coord_start", "int", 2, **INT32_RANGE),
           Attr("score_index", "int", 1, **INT32_RANGE),
           Attr("id_index", "int", 0, **INT32_RANGE),
           Attr("return_indices", "bool", False),
           Attr("invalid_to_bottom", "bool", True)),
    precision_rule="max(p_x, 2) (-1 filler); requires p_x <= 30")


@non_max_suppression.shape
def _nms_shape(ins, a):
    x, vc = ins
    for name, fixed in _NMS_FIXED.items():
        require(a[name] == fixed, f"non_max_suppression: attribute '{name}' must be "
                                  f"{_show(fixed)} (the only value CVM-Runtime supports), "
                                  f"got {_show(a[name])}")
    require(x.ndim == 3 and x.shape[2] == NMS_K,
            f"non_max_suppression: data must have shape (B, N, {NMS_K}), got {x.shape}")
    require(vc.shape == (x.shape[0],),
            f"non_max_suppression: valid_count must have shape ({x.shape[0]},) "
            f"(one count per batch), got {vc.shape}")
    return x.shape


def _show(v: int | bool) -> str:
    """An attribute value as written in NNEF (true/false for logicals)."""
    return str(v).lower() if isinstance(v, bool) else str(v)


@non_max_suppression.precision
def _nms_precision(ins, a):
    p = ins[0].precision
    require(p <= 30, f"non_max_suppression: data precision must be <= 30 (box areas must fit "
                     f"in int64), got {p}")
    return _fill_precision(p)


def _olr_suppresses(a, b, threshold: int) -> bool:
    """True if integer OLR(a, b) as a percentage is >= threshold (a, b: corner boxes)."""
    w = max(min(a[2], b[2]) - max(a[0], b[0]), 0)
    h = max(min(a[3], b[3]) - max(a[1], b[1]), 0)
    inter = w * h
    union = _area(a) + _area(b) - inter
    return inter > 0 and 100 * inter >= threshold * union


def _area(box) -> int:
    """Area of a corner box; 0 when it is empty (x_max <= x_min or y_max <= y_min)."""
    return max(box[2] - box[0], 0) * max(box[3] - box[1], 0)


def _limit(n, attr: int, minimum=min):
    """min(n, attr), where a negative attribute means no limit (TIR: minimum=tirx.min)."""
    return n if attr < 0 else minimum(n, attr)


@non_max_suppression.arith
def _nms_arith(ins, outs, a):
    """GOPS: one IoU test per pair of boxes at most."""
    return math.prod(ins[0].shape[:-1]) * ins[0].shape[1]


@non_max_suppression.cost
def _nms_cost(ins, outs, a):
    # CVM-Runtime's gas: 20 operations per output element per batch (data shape[0]).
    return 20 * ins[0].shape[0]


@non_max_suppression.reference
def _nms_reference(xs, a):
    x, vc = xs
    n_ = x.shape[1]
    y = np.full_like(x, -1)
    for b in range(x.shape[0]):
        t = max(min(n_, int(vc[b])), 0)
        # Stable sort: score descending, ties keep the lower index first.
        r = x[b, np.argsort(-x[b, :t, 1], kind="stable")].tolist()  # Python ints: exact
        kept: list[list[int]] = []
        for box in r[:_limit(t, a.top_k)]:
            if box[0] >= 0 and not any(
                    (a.force_suppress or q[0] == box[0])
                    and _olr_suppresses(q[2:], box[2:], a.iou_threshold) for q in kept):
                kept.append(box)
        kept = kept[:_limit(len(kept), a.max_output_size)]
        if kept:
            y[b, :len(kept)] = kept
    return y


@non_max_suppression.lower
def _nms_lower(xs, a):
    from cvmc.ops.te import te

    x, vc = xs
    order = _nms_sort_order(x, vc)
    return te.extern([x.shape], [x, vc, order], lambda ins, outs: _nms_greedy_ir(*ins, *outs, a),
                     name="nms", dtype="int32")


def _valid_rows(vc, b, n_):
    """T = max(min(N, valid_count[b]), 0): the rows NMS looks at."""
    from cvmc.ops.te import const, tirx
    return tirx.max(tirx.min(const(n_), vc[b]), const(0))


def _nms_sort_order(x, vc):
    """order[b, r]: the input row of rank r after a stable descending sort by score."""
    from cvmc.ops.te import te, tirx

    b_, n_, _ = x.shape
    j = te.reduce_axis((0, n_), name="j")

    def ahead(b, i):  # rows ranked before row i: higher score, or equal and lower index
        before = tirx.any(x[b, j, 1] > x[b, i, 1], tirx.all(x[b, j, 1] == x[b, i, 1], j < i))
        return te.sum(tirx.if_then_else(tirx.all(j < _valid_rows(vc, b, n_), before), 1, 0),
                      axis=j)
    rank = te.compute((b_, n_), ahead, name="nms_rank")
    i = te.reduce_axis((0, n_), name="i")
    return te.compute((b_, n_), lambda b, r: te.sum(tirx.if_then_else(
        tirx.all(i < _valid_rows(vc, b, n_), rank[b, i] == r), i, 0), axis=i), name="nms_order")


def _nms_greedy_ir(x_buf, vc_buf, order_buf, y_buf, a):
    """TIR: per batch, keep sorted boxes not suppressed by an earlier kept one; fill -1."""
    from cvmc.ops.te import IRBuilder as ir_builder
    from cvmc.ops.te import const, tirx
    from cvmc.ops.te import tir_builder as T
    b_, n_ = (int(d) for d in x_buf.shape[:2])
    with ir_builder() as ib:
        x, vc, order, y = (T.buffer_proxy(buf) for buf in (x_buf, vc_buf, order_buf, y_buf))
        # Batches are independent but tiny; a serial loop keeps the kernel one plain block.
        with T.serial(0, b_) as b:
            t = _valid_rows(vc, b, n_)
            p_max, n_max = _limit(t, a.top_k, tirx.min), _limit(t, a.max_output_size, tirx.min)
            kept = T.buffer_proxy(T.alloc_buffer((1,), "int32", scope="local"))
            kept[0] = const(0)
            with T.serial(0, n_) as p:
                row = order[b, p]
                cond = tirx.all(p < p_max, kept[0] < n_max, x[b, row, 0] >= 0)
                with T.If(cond), T.Then():
                    _emit_keep_if_alive(T, x, y, b, row, kept, a)
            with T.serial(0, n_) as r, T.If(r >= kept[0]), T.Then(), T.serial(0, NMS_K) as k:
                y[b, r, k] = const(-1)
    return ib.get()


def _emit_keep_if_alive(T, x, y, b, row, kept, a):
    """TIR: append input row `row` to Y unless a kept box (Y[b, :kept]) suppresses it."""
    from cvmc.ops.te import const, tirx

    threshold = min(a.iou_threshold, FULL_OVERLAP)  # same decisions, no int64 overflow
    alive = T.buffer_proxy(T.alloc_buffer((1,), "int32", scope="local"))
    alive[0] = const(1)
    with T.serial(0, kept[0]) as q:
        same = tirx.const(True) if a.force_suppress else y[b, q, 0] == x[b, row, 0]
        box_q = [y[b, q, c] for c in range(2, 6)]
        box_p = [x[b, row, c] for c in range(2, 6)]
        with T.If(tirx.all(same, _suppresses_expr(box_q, box_p, threshold))), T.Then():
            alive[0] = const(0)
    with T.If(alive[0] == 1), T.Then():
        with T.serial(0, NMS_K) as k:
            y[b, kept[0], k] = x[b, row, k]
        kept[0] = kept[0] + 1


def _suppresses_expr(a, b, threshold: int):
    """TIR bool: 100 * I >= threshold * U and I > 0, exact in int64 for p_x <= 30."""
    from cvmc.ops.te import const, tirx

    def wide(e):
        return tirx.max(e, const(0)).astype("int64")

    inter = wide(tirx.min(a[2], b[2]) - tirx.max(a[0], b[0])) * \
        wide(tirx.min(a[3], b[3]) - tirx.max(a[1], b[1]))
    union = wide(a[2] - a[0]) * wide(a[3] - a[1]) + wide(b[2] - b[0]) * wide(b[3] - b[1]) \
        - inter
    # threshold * U can exceed int64 (U < 2^61); with U = 100 * uq + ur the test becomes
    # I - threshold * uq >= ceil(threshold * ur / 100), every term in range.
    thr = const(threshold, "int64")
    lhs = inter - thr * (union // 100)
    rhs = (thr * (union % 100) + 99) // 100
    return tirx.all(inter > 0, lhs >= rhs)

"""CPU schedules of the window reductions on NCHW: the max window (`nnef.max_window`,
NNEF's max_pool) and box (NNEF's avg_pool): output columns in vector lanes, the window
unrolled, parallel over (batch, channel) planes.

The reduction runs its taps in row-major order in every lane (the order its result
depends on: of equal zeros the first tap wins), so the bits do not depend on the vector
width or the thread count. A padded ('constant' / 'ignore' border) input is extended per
plane, in cache, just before the plane's reduction: a fill, then the interior copied
without a bounds test.
"""
from __future__ import annotations

from cvmc.lowering.schedule import epilogue_under, inline_all, largest_divisor
from cvmc.ops.te import MATERIALIZE

_LANES = 8  # float32 lanes of one AVX2 register


def schedule_max_window(sch, func_name: str) -> None:
    """Schedule a max_window kernel over an NCHW (or NCHW{B}c) tensor whose window covers
    rows and columns only; ValueError for any other (the table then tries its next row)."""
    from tvm.s_tir.schedule import ScheduleError

    inline_all(sch, func_name)
    root = sch.get_sblock("root", func_name=func_name)
    blocks = sch.get_child_blocks(root)
    pads = [b for b in blocks if MATERIALIZE in sch.get(b).annotations]
    pool = [b for b in blocks if sch.get(b).name_hint == "max_window"]
    if len(pool) != 1 or len(blocks) != len(pads) + 1:
        raise ValueError(f"{func_name}: not one max_window block")
    plane = _window_in_lanes(sch, pool[0], func_name)
    for pad in pads:
        sch.compute_at(pad, plane)
        try:
            sch.decompose_padding(pad, sch.get_loops(pad)[1])
        except ScheduleError:  # none found: the bounds test stays, slower but correct
            pass


def schedule_box(sch, func_name: str) -> None:
    """Schedule a box kernel (NNEF's avg_pool: box and its division by the window size)
    over an NCHW tensor whose window covers rows and columns only, as max_window: columns
    in lanes, the taps in row-major order in every lane (the default schedule's order, so
    the same bits), the division under the plane; ValueError for any other kernel ('ignore'
    borders, which count their taps, keep the default schedule)."""
    inline_all(sch, func_name)
    blocks = {sch.get(b).name_hint: b for b in sch.get_child_blocks(
        sch.get_sblock("root", func_name=func_name))}
    if "box_sum" not in blocks or "box_count" in blocks or len(blocks) > 2:
        raise ValueError(f"{func_name}: not a box kernel with a constant border")
    plane = _window_in_lanes(sch, blocks["box_sum"], func_name)
    epilogue_under(sch, blocks["box_sum"], plane)


def _window_in_lanes(sch, pool, func_name: str):
    """The window reduction `pool` over NCHW: (batch, channel) planes parallel, output
    columns in vector lanes under the unrolled window taps; the plane loop."""
    loops = sch.get_loops(pool)
    if len(sch.get(pool).iter_vars) != len(loops) or len(loops) not in (6, 7):
        raise ValueError(f"{func_name}: not an NCHW window over rows and columns")
    blocked = len(loops) == 7  # NCHW{B}c (block-float-activations): B channels in lanes
    n, c, _, w, *rest = loops
    plane = sch.fuse(n, c)
    sch.parallel(plane)
    if blocked:
        column, (lane, ry, rx) = w, rest
    else:
        ry, rx = rest
        column, lane = sch.split(w, [None, largest_divisor(int(sch.get(w).extent), _LANES)])
    sch.reorder(column, ry, rx, lane)
    sch.unroll(ry)
    sch.unroll(rx)
    sch.vectorize(lane)
    init = sch.decompose_reduction(pool, ry)
    sch.vectorize(sch.get_loops(init)[-1])
    return plane

"""CPU schedule for depthwise conv2d kernels (groups == input channels == output channels).

A depthwise conv does 9 multiply-adds (3x3) per output and reuses nothing across channels,
so the default conv schedule's register tile (16 output channels x 16 columns sharing
each input vector) has nothing to share; it ran at 5-30 GOPS. This schedule (timings:
MobileNet-v1's nine depthwise shapes, 1 thread, Zen 4):

- one parallel loop over (batch, channel) planes; everything else runs inside it, so a
  kernel opens one parallel region and each thread works on its own planes (MobileNet's
  depthwise layers have 32-1024 channels: plenty of tasks for a few cores);
- the padded input stage (`conv2d_pad`, int8) is computed per plane, right before the
  plane's conv, and split (`decompose_padding`) into a zero fill and a branch-free copy of
  the interior rows, so neither the copy nor the conv's inner loop tests a bound;
- per output row: the conv over the row's columns with the kernel window unrolled (the
  window's taps and the accumulator stay in registers), then the fused epilogue (bias,
  shift, clip, relu, cast) on the finished row while it is in L1;
- at column stride 2 the padded plane is stored with even and odd columns apart
  (`w -> (w % 2, w // 2)`; an odd width gets a zero column), so tap `kx` of output
  column `q` reads column `q + kx // 2` of half `kx % 2`: contiguous vectors instead of
  per-lane byte gathers (`vpinsrb`) or LLVM's interleaved loads (1.2-1.8x faster). The
  fill and the copy loop over column pairs: with the halves' index affine in the loop,
  LLVM vectorises both (over single columns they were scalar byte stores, 2-3x slower);
- rows of up to 32 output columns (28x28 and smaller) are vectorised in TIR, in vectors
  of the largest divisor of the width up to 16 int32 lanes (one AVX-512 register), with
  the window's taps outside the vector: 2x faster than LLVM's vectoriser at 14 columns
  (so short a trip count leaves it in its remainder loop), 1.3x at 28 with stride 2.
  Longer rows are left whole for LLVM's loop vectoriser, which handles their widths with
  a remainder loop: vectors of 56 lanes in TIR were legalised element by element
  (`vpinsrd`/`vpextrd`), 1.4-2x slower;
- a stride-1 row of fewer than 8 columns (7x7) reads a padded plane of int32: LLVM loads
  7 bytes one `vpinsrb` at a time, 7 int32 as a vector (1.5x faster on 1024x7x7; the
  wider plane made 14-column rows 1.8x slower).
"""
from __future__ import annotations

from cvmc.lowering.schedule import (
    epilogue_under,
    inline_all,
    largest_divisor,
    stride_along,
    uses,
    vectorize_under,
)
from cvmc.ops.te import DEPTHWISE, MATERIALIZE

_LANES = 16  # int32 lanes of one AVX-512 register
_TIR_ROW = 2 * _LANES  # rows up to this many output columns are vectorised in TIR
_WIDE_PLANE_ROW = 8  # stride-1 rows shorter than this read an int32 padded plane


def schedule_depthwise(sch, func_name: str) -> None:
    """Schedule a depthwise conv kernel; ValueError when the kernel's conv is not one (the
    table then tries its next row)."""
    root = sch.get_sblock("root", func_name=func_name)
    convs = [b for b in sch.get_child_blocks(root) if DEPTHWISE in sch.get(b).annotations]
    if len(convs) != 1:
        raise ValueError(f"{func_name}: no depthwise conv block")
    (conv,) = convs
    inline_all(sch, func_name)
    root = sch.get_sblock("root", func_name=func_name)
    pads = [b for b in sch.get_child_blocks(root) if MATERIALIZE in sch.get(b).annotations]
    n, c, p, q, rc, ry, rx = sch.get_loops(conv)
    stride = _column_stride(sch.get(conv))
    columns = int(sch.get(q).extent)
    split_columns = stride == 2 and bool(pads)
    in_tir = columns <= _TIR_ROW and (stride == 1 or split_columns)
    tile = p
    if in_tir:
        tile, q = sch.split(q, [None, largest_divisor(columns, _LANES)])
        sch.reorder(rc, ry, rx, q)
    plane = sch.fuse(n, c)
    sch.parallel(plane)
    for consumer in sch.get_consumers(conv):
        sch.reverse_compute_at(consumer, tile)
        if in_tir:
            vectorize_under(sch, consumer, tile)
    for pad in pads:
        # int8 planes only (NNEF's float conv pads float32)
        _schedule_padded_plane(sch, pad, plane, split_columns, wide=stride == 1 and columns <
                               _WIDE_PLANE_ROW and sch.get(pad).writes[0].source.dtype == "int8")
    sch.unroll(ry)
    sch.unroll(rx)
    if in_tir:
        sch.vectorize(q)
    sch.decompose_reduction(conv, rc)


def _schedule_padded_plane(sch, pad, plane, split_columns: bool, wide: bool) -> None:
    """Compute the padded input per plane: a zero fill, then the interior copied without a
    bounds test; stored with even and odd columns apart (`split_columns`) or as int32
    (`wide`)."""
    from tvm.s_tir.schedule import ScheduleError

    sch.compute_at(pad, plane)
    try:
        fill = sch.decompose_padding(pad, sch.get_loops(pad)[1])
    except ScheduleError:  # none known: the bounds test would stay, slower but correct
        fill = None
    if wide:
        # "unsafe": a change of dtype; exact here, the plane holds int8 values
        sch.unsafe_set_dtype(pad, 0, "int32")
    if split_columns:
        sch.transform_layout(pad, ("write", 0), lambda n, c, h, w: (n, c, h, w % 2, w // 2),
                             pad_value=0)
        # the copy: each column pair read together, written to the two halves
        sch.unroll(_column_pairs(sch, pad)[1])
        if fill is not None:  # the fill: one half, then the other
            sch.reorder(*_column_pairs(sch, fill)[::-1])


def _column_pairs(sch, block):
    """(pair, column in the pair) loops: the block's innermost loop split in 2."""
    return sch.split(sch.get_loops(block)[-1], [None, 2])


def _column_stride(block) -> int | None:
    """How far the conv block's data read moves per output column (None: not linear)."""
    column = block.iter_vars[3].var  # iterators (batch, channel, row, column, reductions)
    data = next(r for r in block.reads if uses(r.region[-1].min, column))
    return stride_along(data.region[-1].min, column)


# Output columns per register tile of `schedule_depthwise_blocked`: each column holds its
# 16 channels' int32 sums (2 ymm, 1 zmm), so 4 columns leave AVX2 room for a tap's weights.
_BLOCKED_COLUMNS = 4
# Parallel tasks (n x channel blocks x row groups) the blocked schedule leaves, so 2
# threads stay balanced.
_MIN_TASKS = 16


def schedule_depthwise_blocked(sch, func_name: str, conv_name: str = "depthwise_conv2d_blocked",
                               columns: int = _BLOCKED_COLUMNS) -> None:
    """Schedule a depthwise_conv2d_blocked kernel (NCHW16c in and out): the 16 channels of
    a block in the vector lanes. (n, channel block, output row) fused and parallel; a tile
    of output columns; the kernel window unrolled, each tap's 16 weights loaded once for
    the tile's columns; each column's 16 int32 sums one vector (exact: int8 x int8
    products, no saturating instruction). The epilogue runs on each finished tile. The
    padded input (int8) is computed per task (a group of rows: n x channel blocks x
    groups >= _MIN_TASKS), right before its rows are (in L2, 16 bytes per pixel)."""
    inline_all(sch, func_name)
    conv = sch.get_sblock(conv_name, func_name=func_name)
    n, cb, p, q, ci, ry, rx = sch.get_loops(conv)
    tile, column = sch.split(q, [None, largest_divisor(int(sch.get(q).extent), columns)])
    sch.reorder(tile, ry, rx, column, ci)
    planes = int(sch.get(n).extent) * int(sch.get(cb).extent)
    rows = int(sch.get(p).extent)
    # Each task a group of rows, as few groups as give _MIN_TASKS tasks
    groups = next(d for d in range(1, rows + 1) if rows % d == 0 and
                  (planes * d >= _MIN_TASKS or d == rows))
    group, _ = sch.split(p, [groups, None])
    task = sch.fuse(n, cb, group)
    sch.parallel(task)
    epilogue_under(sch, conv, tile)
    sch.unroll(ry)
    sch.unroll(rx)
    sch.unroll(column)
    sch.vectorize(ci)
    sch.decompose_reduction(conv, ry)
    root = sch.get_sblock("root", func_name=func_name)
    for pad in [b for b in sch.get_child_blocks(root)
                if MATERIALIZE in sch.get(b).annotations]:
        sch.compute_at(pad, task)


# Output columns per tile of the float variant: each column's B float32 sums are one
# vector (8 lanes: a ymm; 16: a zmm), so 8 columns leave AVX2 registers for a tap's
# weights and the input vectors.
_FLOAT_BLOCKED_COLUMNS = 8


def schedule_depthwise_float_blocked(sch, func_name: str) -> None:
    """Schedule a float depthwise_conv_blocked kernel (NCHW{B}c in and out) as the int8
    blocked one (`schedule_depthwise_blocked`): B channels in the vector lanes, a tile of
    columns, the window unrolled, each output's taps summed in row-major window order
    whatever the thread count; the zero-padded input (float32) per task."""
    schedule_depthwise_blocked(sch, func_name, "depthwise_conv_blocked", _FLOAT_BLOCKED_COLUMNS)

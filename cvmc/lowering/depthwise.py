"""CPU schedule for depthwise conv2d kernels (groups == input channels == output channels).

A depthwise conv does 9 multiply-adds (3x3) per output and reuses nothing across channels,
so the default conv schedule's register tile (16 output channels x 16 columns sharing
each input vector) has nothing to share; it ran at 8-30 GOPS. This schedule:

- one parallel loop over (batch, channel) planes; everything else runs inside it, so a
  kernel opens one parallel region and each thread works on its own planes (MobileNet's
  depthwise layers have 32-1024 channels: plenty of tasks for a few cores);
- the padded input stage (`conv2d_pad`, int8) is computed per plane, right before the
  plane's conv, and split (`decompose_padding`) into a zero fill and a branch-free copy of
  the interior rows, so neither the copy nor the conv's inner loop tests a bound;
- per output row: the conv over the row's columns with the kernel window unrolled (the
  window's taps and the accumulator stay in registers), then the fused epilogue (bias,
  shift, clip, relu, cast) on the finished row while it is in L1;
- the column loop is left whole for LLVM's loop vectoriser: it handles widths that are
  not a multiple of the vector (56, 28, 7 ...) with a remainder loop, and a stride-2 row
  as an interleaved access (wide load + shuffle). Vectorising 56- or 112-column rows in
  TIR was 1.7-4x slower: per-lane byte gathers (`vpinsrb`) for stride 2, and odd-length
  vectors (56 lanes) that LLVM legalised element by element (`vpinsrd`/`vpextrd`).
- exception, measured: a row of at most 16 output columns (the 28x28 stride-2, 14x14 and
  7x7 layers) is one TIR vector with the window's taps outside it, 2x faster at 14
  columns (so short a trip count leaves LLVM's vectoriser in its remainder loop), 1.1x at
  7. At stride 2 its reads must be contiguous: the padded plane is stored with even and
  odd columns apart (`w -> (w % 2, w // 2)`, an odd width padded with a zero column), so
  tap `kx` of output column `q` reads column `q + kx // 2` of half `kx % 2` (2.2x faster
  on 256x28x28, 1.25x on 512x14x14).
  Long stride-2 rows keep LLVM's interleaved loads: there the copy into the split layout
  (scalar byte stores) cost more than it saved (1.7-2.4x slower on 112 and 56 columns).
  A stride-1 row of fewer than 8 columns (7x7) reads a padded plane of int32: LLVM loads
  7 bytes one `vpinsrb` at a time, 7 int32 as a vector (1.5x faster on 1024x7x7; the
  wider plane made 14-column rows 1.8x slower).
"""
from __future__ import annotations

from cvmc.lowering.schedule import MATERIALIZE, _try, _uses, inline_all, vectorize_under

# Block annotation conv2d's lower rule puts on a depthwise conv's reduction block. The op
# knows what it computed; the schedule reads that rather than guessing it from the TIR's
# shapes (an ordinary conv, a grouped one with several channels per group and a depthwise
# one with a channel multiplier all share the block's form).
DEPTHWISE = "cvmc.depthwise"
# An output row this short is one TIR vector (one AVX-512 register of int32); at stride 1
# one shorter than `_WIDE_PLANE_ROW` reads an int32 padded plane.
_SHORT_ROW = 16
_WIDE_PLANE_ROW = 8


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
    fits = columns <= _SHORT_ROW
    split_columns = fits and stride == 2 and bool(pads)
    short = fits and (stride == 1 or split_columns)
    if short:
        sch.reorder(rc, ry, rx, q)
    plane = sch.fuse(n, c)
    sch.parallel(plane)
    for consumer in sch.get_consumers(conv):
        sch.reverse_compute_at(consumer, p)
        if short:
            vectorize_under(sch, consumer, p)
    for pad in pads:
        sch.compute_at(pad, plane)
        # The zero fill goes before the plane's rows. A padding TVM could not decompose
        # would keep its bounds test: slower, still correct.
        _try(sch, lambda s, b=pad: s.decompose_padding(b, s.get_loops(b)[1]))
        if stride == 1 and columns < _WIDE_PLANE_ROW:
            # "unsafe": a change of dtype; exact here, the plane holds int8 values
            sch.unsafe_set_dtype(pad, 0, "int32")
        if split_columns:
            sch.transform_layout(pad, ("write", 0), lambda n, c, h, w: (n, c, h, w % 2, w // 2),
                                 pad_value=0)
    sch.unroll(ry)
    sch.unroll(rx)
    if short:
        sch.vectorize(q)
    sch.decompose_reduction(conv, rc)


def _column_stride(block) -> int | None:
    """How far the conv block's data read moves per output column (None: not linear)."""
    from tvm.sym.pattern import detect_linear_equation

    column = block.iter_vars[3].var  # iterators (batch, channel, row, column, reductions)
    data = next(r for r in block.reads if _uses(r.region[-1].min, column))
    coeff = detect_linear_equation(data.region[-1].min, [column])
    return int(coeff[0]) if len(coeff) == 2 else None

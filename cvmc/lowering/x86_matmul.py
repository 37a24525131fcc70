"""CPU schedules of float matmul kernels (NNEF matmul, batched; `linear` once its weight is
transposed back at compile time, `cvmc.passes.matmul_weights`), with their element-wise
epilogue (bias, activation) computed under the register tile.

The tile: `rows` rows of A times `cols` columns of B (one or two vector registers per row)
accumulate in registers while the whole K loop runs inside: each step broadcasts one
element of A per row and loads one row segment of B. The parallel loop runs over the tiles,
column panels outside row blocks, so consecutive tiles of a thread read the same K x cols
panel of B from cache. Each output element is the sum of its K products in the order k =
0, 1, ... whatever the thread count: the same bits at any TVM_NUM_THREADS.

`matmul_packed` (a constant B packed into column panels at compile time, `cvmc/ops/
packed_llvm.py`): the same tile, one panel wide, reads its panel contiguously; where a panel
does not fit a 16 KB block of L1, its K loop is blocked: for each panel and K block, every
row block, the panel's sums kept in a buffer from one K block to the next (each element's
sum still runs k = 0, 1, ...: the unblocked tile's bits).
"""
from __future__ import annotations

import math

from cvmc.lowering.schedule import (
    epilogue_under,
    inline_all,
    largest_divisor,
    root_blocks,
    try_schedule,
    uses,
)

_REDUCTION = 2  # tirx IterVar.iter_type of a reduction iterator
# Registers kept free of accumulators: the broadcast A element and the B row segments.
_SPARE_REGISTERS = 4
# A K block of a B panel: half of a 32 KB L1 data cache (Zen 3, Skylake), the other half
# for the tile's A rows and the accumulators.
_PANEL_BLOCK_BYTES = 16 * 1024
# Fewer panels (batches x column panels) than this: row blocks run in parallel too.
_MIN_PANELS = 8


def _matmul_block(sch, func_name: str):
    """The kernel's one reduction block, if it is a matmul: iterators (*batch, i, j, k),
    k the only reduction, and some read's innermost index walks j (B's row)."""
    blocks = [b for b in root_blocks(sch, func_name)
             if any(it.iter_type == _REDUCTION for it in sch.get(b).iter_vars)]
    if len(blocks) != 1:
        raise ValueError("not one reduction block")
    block = blocks[0]
    iters = sch.get(block).iter_vars
    kinds = [it.iter_type for it in iters]
    if len(iters) < 3 or kinds[-1] != _REDUCTION or _REDUCTION in kinds[:-1]:
        raise ValueError("not a matmul block")
    j = iters[-2].var
    reads = [r for r in sch.get(block).reads
             if not any(r.source.same_as(w.source) for w in sch.get(block).writes)]
    if not any(uses(r.region[-1].min, j) for r in reads):
        raise ValueError("B is read across its rows (transposeB)")
    return block


def _tile_rows(m: int, most: int) -> int:
    """Rows of the register tile for `m` rows and room for `most` accumulator rows."""
    rows = largest_divisor(m, most)
    if rows < most // 2:
        # No divisor of m fills the tile (m = 197, prime, in ViT-B/16): full tiles and one
        # last tile whose missing rows are masked off, rather than one row per tile (a row
        # reloads B's segment for every 1-2 FMAs: 7 GFLOPS against 30+).
        rows = min(most, m)
    return rows


def schedule_matmul(sch, func_name: str, lanes: int, registers: int) -> None:
    """Register-tile the matmul block of `func_name` for vectors of `lanes` float32 and
    `registers` vector registers; ValueError where it does not fit (N not whole vectors)."""
    inline_all(sch, func_name)
    block = _matmul_block(sch, func_name)
    *batch, i, j, k = sch.get_loops(block)
    m, n = int(sch.get(i).extent), int(sch.get(j).extent)
    if n % lanes:
        raise ValueError(f"{n} columns are not whole vectors of {lanes}")
    per_row = 2 if n % (2 * lanes) == 0 else 1
    rows = _tile_rows(m, (registers - _SPARE_REGISTERS) // per_row)
    io, ii = sch.split(i, [None, rows])
    jo, ji = sch.split(j, [None, per_row * lanes])
    sch.reorder(*batch, jo, io, k, ii, ji)
    _accumulate(sch, block, [*batch, jo, io], k, ii, ji)


def schedule_matmul_packed(sch, func_name: str, lanes: int, registers: int) -> None:
    """Register-tile the matmul_packed block of `func_name` (B in column panels, one tile
    wide) for vectors of `lanes` float32 and `registers` vector registers, its K loop
    blocked so that a panel's K block stays in L1 while every row block reads it."""
    inline_all(sch, func_name)
    block = _matmul_block(sch, func_name)
    *batch, i, j, k = sch.get_loops(block)
    (b_read,) = [r for r in sch.get(block).reads if len(r.source.shape) == len(batch) + 3]
    cols = int(b_read.source.shape[-1])
    if cols % lanes:
        raise ValueError(f"panels of {cols} columns are not whole vectors of {lanes}")
    m, depth = int(sch.get(i).extent), int(sch.get(k).extent)
    rows = _tile_rows(m, (registers - _SPARE_REGISTERS) // (cols // lanes))
    io, ii = sch.split(i, [None, rows])
    jo, ji = sch.split(j, [None, cols])
    panels = math.prod(int(sch.get(loop).extent) for loop in [*batch, jo])
    step = _k_block(depth, cols)
    if step == depth or panels < _MIN_PANELS:
        # The panel fits L1 whole (or too few panels to share among threads: row blocks
        # run in parallel too): every row block of a panel runs the whole K loop.
        sch.reorder(*batch, jo, io, k, ii, ji)
        _accumulate(sch, block, [*batch, jo, io], k, ii, ji)
        return
    ko, ki = sch.split(k, [None, step])
    # For each panel and K block, every row block: the panel block is read from L1, the
    # A rows of a tile from L2. The accumulators of the panel's M x cols outputs carry
    # over from one K block to the next (each element's sum stays k = 0, 1, ...).
    sch.reorder(*batch, jo, ko, io, ki, ii, ji)
    _accumulate(sch, block, [*batch, jo], ko, ii, ji)


def _k_block(depth: int, cols: int) -> int:
    """The K block for panels of `cols` columns: the largest that keeps a panel block in
    `_PANEL_BLOCK_BYTES`, a divisor of `depth` where one is at least half that (else the
    last block is partial)."""
    most = max(1, _PANEL_BLOCK_BYTES // (4 * cols))
    if depth <= most:
        return depth
    step = largest_divisor(depth, most)
    return step if 2 * step >= most else most


def _accumulate(sch, block, parallel: list, reduction, ii, ji) -> None:
    """The tile's accumulators in a local buffer (under `parallel`, fused and run in
    parallel), initialised before `reduction`; the epilogue under the parallel loop, the
    tile's rows `ii` unrolled and its columns `ji` vectorised."""
    # The write-back of the local buffer folds into the epilogue (when the matmul result
    # is itself a kernel output it stays a block of its own).
    write_back = sch.cache_write(block, 0, "local")
    try_schedule(sch, lambda s: s.compute_inline(write_back))
    fused = sch.fuse(*parallel)
    sch.parallel(fused)
    epilogue_under(sch, block, fused)
    sch.unroll(ii)
    sch.vectorize(ji)
    sch.decompose_reduction(block, reduction)

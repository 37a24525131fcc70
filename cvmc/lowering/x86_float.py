"""CPU schedules for float `conv_packed` kernels (`cvmc/ops/packed_llvm.py`): a register tile of
FMAs, output channels in the vector lanes.

The kernel's stages: `conv_packed_pad` (the zero-padded input, kept as a buffer where a
tap can fall outside the input), `conv_packed_acc` (N, OC/B, OH, OW, B), B output channels
per vector, and the epilogue (the NCHW result, bias, relu, clip, residual add) inlined
into the output stage. Loop order, as the int8 rule's (`cvmc/lowering/x86.py`,
`register_tile`): (n, output block groups, output row) fused and parallel, the padded
rows a task reads made under it (one parallel region per kernel), a tile of output
columns, then the reduction over input channels and the kernel window, then the
tile's columns x output blocks unrolled (each one vector accumulator held in a register),
innermost the B lanes: per step one weight vector per block and one broadcast input value
per column, one FMA per accumulator. The epilogue runs on each finished tile while it is
in cache. The reduction order is fixed by the loops (never split across threads): the
bits do not depend on the thread count.
"""
from __future__ import annotations

import functools

from cvmc.lowering.schedule import epilogue_under, inline_all
from cvmc.lowering.x86 import register_tile, tile_shape

# Accumulators per tile (columns x output blocks): AVX2 has 16 ymm registers, each step
# needs a weight vector per block and a broadcast input value besides the accumulators;
# AVX-512 has 32 zmm registers.
_AVX2_ACCUMULATORS, _AVX2_COLUMNS = 12, 6
_AVX512_ACCUMULATORS, _AVX512_COLUMNS = 24, 12


def schedule_conv_float(sch, func_name: str, avx512: bool = False) -> None:
    """Schedule a float conv_packed kernel: the register-tiled FMA loop (tile shape for
    AVX2's 16 or, with `avx512`, AVX-512's 32 vector registers)."""
    inline_all(sch, func_name)
    acc = sch.get_sblock("conv_packed_acc", func_name=func_name)
    shape = functools.partial(tile_shape, column_tile=_AVX512_COLUMNS if avx512 else
                              _AVX2_COLUMNS, accumulators=_AVX512_ACCUMULATORS if avx512
                              else _AVX2_ACCUMULATORS)
    tile, rc, lanes = register_tile(sch, acc, shape, lambda oi: (oi,))
    epilogue_under(sch, acc, tile)
    sch.vectorize(lanes)
    sch.decompose_reduction(acc, rc)

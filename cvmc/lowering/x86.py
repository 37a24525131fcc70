"""x86 schedules for `conv2d_packed` kernels: AVX-512 VNNI, and a plain vector loop.

The kernel's stages (see `cvmc/ops/layout.py`): `conv2d_packed_data` (the input as
unsigned bytes, 4 channels per 32-bit word, kept as a buffer), `conv2d_packed_acc` (the
u8 x s8 dot products into int32, 16 output channels per vector) and the epilogue
(compensation, bias, shift, clip, relu, cast), inlined into the kernel's output stage.

Loop order (measured on Zen 4/5 for ResNet layers, 2 threads): (n, OC/16, output row)
fused and parallel, then a tile of output columns; inside it the reduction over input
channel blocks and the kernel window; then the tile's columns, unrolled, each one 16-lane
accumulator; innermost the 16 output channels x 4 input channels that one `vpdpbusd`
computes. The epilogue runs on each finished tile while it is in cache.
"""
from __future__ import annotations

import functools

from cvmc.lowering.schedule import (
    inline_all,
    largest_divisor,
    parallelize_interior,
    vectorize_under,
)

VNNI_INTRIN = "cvmc_dot_16x4_u8i8i32_vnni"
# Output columns per tile: the largest divisor of the row up to 16 (14 on 56-, 28- and
# 14-wide rows; 16 on ResNet's 112-wide 7x7/2 first conv, where 14 ran 1.33 ms and 16
# 0.91 ms at 1 thread).
_COLUMN_TILE = 16
# Accumulator registers per tile (columns x output channel blocks). 28 would fit the 32
# zmm registers with a broadcast input word and a weight vector per block, but LLVM keeps
# the unrolled kernel window's broadcast words live to reuse them at the next tap: at 28
# it spills (14x14 3x3 conv 256 -> 256: 0.53 -> 0.68 ms, 1 thread), at 14 or 16 it does
# not.
_ACCUMULATORS = 16
# Parallel tasks (n x output channel block groups x rows) a tile shape must leave, so 2
# threads stay balanced.
_MIN_TASKS = 16


def tile_shape(n: int, blocks: int, rows: int, columns: int) -> tuple[int, int]:
    """(columns, output channel blocks) of one register tile. A narrow row (7 columns:
    ResNet's last stage) leaves registers free: the tile takes as many 16-channel blocks
    as fit, each input word then feeding several dot products (3x3 conv 512 -> 512 on
    7x7, 1 thread: 0.537 -> 0.518 ms with 2 blocks)."""
    tile = largest_divisor(columns, _COLUMN_TILE)
    fits = [k for k in range(1, blocks + 1) if blocks % k == 0 and k * tile <= _ACCUMULATORS
            and n * blocks // k * rows >= _MIN_TASKS]
    return tile, max(fits, default=1)


@functools.cache
def register_vnni_intrinsic() -> str:
    """Register the 16x4 u8 x s8 -> s32 VNNI dot product (once per process).

    TVM 0.27's own `dot_16x4_vnni` implementation fails LLVM 22's verifier (operand
    types); this one passes the byte vectors as i8x64, as LLVM's intrinsic declares them.
    (Importing `tvm.s_tir.tensor_intrin` for its description would parse every target's
    intrinsics: ~15 s per process; this file declares the few lines it needs.)
    """
    from tvm.s_tir import TensorIntrin
    from tvm.script import tirx as T

    @T.prim_func(s_tir=True)
    def dot(a: T.Buffer((4,), "uint8", offset_factor=1),
            b: T.Buffer((16, 4), "int8", offset_factor=1),
            c: T.Buffer((16,), "int32", offset_factor=1)):
        with T.sblock("root"):
            T.reads(c[0:16], a[0:4], b[0:16, 0:4])
            T.writes(c[0:16])
            for i, k in T.grid(16, 4):
                with T.sblock("update"):
                    vi, vk = T.axis.remap("SR", [i, k])
                    c[vi] = c[vi] + T.cast(a[vk], "int32") * T.cast(b[vi, vk], "int32")

    @T.prim_func(s_tir=True)
    def vnni(a: T.Buffer((4,), "uint8", offset_factor=1),
             b: T.Buffer((16, 4), "int8", offset_factor=1),
             c: T.Buffer((16,), "int32", offset_factor=1)):
        with T.sblock("root"):
            T.reads(c[0:16], a[0:4], b[0:16, 0:4])
            T.writes(c[0:16])
            word = T.reinterpret(a.vload([0], "uint8x4"), dtype="int32")
            c[T.ramp(T.int32(0), 1, 16)] = T.call_llvm_pure_intrin(
                T.llvm_lookup_intrinsic_id("llvm.x86.avx512.vpdpbusd.512"),
                c.vload([0], dtype="int32x16"),
                T.reinterpret(T.broadcast(word, 16), dtype="uint8x64"),
                b.vload([0, 0], dtype="int8x64"), dtype="int32x16")

    TensorIntrin.register(VNNI_INTRIN, dot, vnni)
    return VNNI_INTRIN


def schedule_conv_packed(sch, func_name: str, vnni: bool) -> None:
    """Schedule a conv2d_packed kernel; `vnni` tensorizes the inner 16x4 dot product, else
    the 16 output channels form one vector and the 4 input channels a scalar loop."""
    inline_all(sch, func_name)
    acc = sch.get_sblock("conv2d_packed_acc", func_name=func_name)
    n, ob, oh, ow, oi, rcb, ry, rx, rci = sch.get_loops(acc)
    extents = [int(sch.get(loop).extent) for loop in (n, ob, oh, ow)]
    columns, blocks = tile_shape(*extents)
    wo, wi = sch.split(ow, [None, columns])
    obo, obi = sch.split(ob, [None, blocks])
    inner = (oi, rci) if vnni else (rci, oi)
    sch.reorder(n, obo, oh, wo, rcb, ry, rx, wi, obi, *inner)
    sch.parallel(sch.fuse(n, obo, oh))
    for consumer in sch.get_consumers(acc):
        sch.reverse_compute_at(consumer, wo)
        vectorize_under(sch, consumer, wo)  # the tile's columns
    sch.unroll(wi)
    sch.unroll(obi)
    if not vnni:
        sch.vectorize(oi)
    sch.decompose_reduction(acc, rcb)
    if vnni:
        sch.tensorize(oi, register_vnni_intrinsic())
    _schedule_data(sch, sch.get_sblock("conv2d_packed_data", func_name=func_name))


def _schedule_data(sch, block) -> None:
    """The byte stage: (n, channel block, row) in parallel; each row's (column, 4
    channels) loops are left whole for LLVM, which vectorises them (2x faster than
    splitting them into parallel tasks: measured on a 1x1 conv, 256 -> 64, 56x56). The
    columns are split into the padding borders and the interior, whose copy then has no
    per-column test (the row's test is the same for the whole row)."""
    parallelize_interior(sch, block)

"""AArch64 schedules for `conv2d_packed` kernels (`--mtriple aarch64-linux-gnu`, a C
library).

With i8mm (ARMv8.6-A: `usdot`, u8 x s8 -> s32, VNNI's arithmetic on 128-bit vectors)
the 16 output channels x 4 input channels of a weight block (OIHW16o4i, as packed for
VNNI) are four `usdot`s, each 4 channels x 4 bytes with the input word broadcast; the
kernel is otherwise scheduled as VNNI's (`cvmc.lowering.x86.schedule_conv_tiled`: a
register tile of columns x channel blocks, one parallel region).

With `dotprod` alone (ARMv8.2-A: `sdot`, s8 x s8) the packed data's unsigned bytes a (the
input + 128) are taken as a - 128 (an exclusive or with 0x80) and the 128 x sum(b) that
drops is added back by two more `sdot`s of 64 x b: three per 4 x 4, exact (the sums stay
far inside int32). Without either the `cpu-packed-vector` row applies (16 channels one
vector: NEON's 4 x 128 bits).
"""
from __future__ import annotations

import functools

from cvmc.lowering.schedule import inline_all
from cvmc.lowering.x86 import dot_16x4, schedule_conv_tiled

USDOT_INTRIN = "cvmc_dot_16x4_u8i8i32_usdot"
SDOT_INTRIN = "cvmc_dot_16x4_u8i8i32_sdot"


@functools.cache
def register_usdot_intrinsic() -> str:
    """Register the 16x4 u8 x s8 -> s32 dot product as four `usdot`s (once per process)."""
    from tvm.s_tir import TensorIntrin
    from tvm.script import tirx as T

    @T.prim_func(s_tir=True)
    def usdot(a: T.Buffer((4,), "uint8", offset_factor=1),
              b: T.Buffer((16, 4), "int8", offset_factor=1),
              c: T.Buffer((16,), "int32", offset_factor=1)):
        with T.sblock("root"):
            T.reads(c[0:16], a[0:4], b[0:16, 0:4])
            T.writes(c[0:16])
            word = T.reinterpret(a.vload([0], "uint8x4"), dtype="int32")
            data = T.reinterpret(T.broadcast(word, 4), dtype="uint8x16")
            for j in T.unroll(4):
                c[T.ramp(j * 4, 1, 4)] = T.call_llvm_pure_intrin(
                    T.llvm_lookup_intrinsic_id("llvm.aarch64.neon.usdot.v4i32.v16i8"),
                    c.vload([j * 4], dtype="int32x4"), data,
                    b.vload([j * 4, 0], dtype="int8x16"), dtype="int32x4")

    TensorIntrin.register(USDOT_INTRIN, dot_16x4(), usdot)
    return USDOT_INTRIN


@functools.cache
def register_sdot_intrinsic() -> str:
    """Register the 16x4 u8 x s8 -> s32 dot product as `sdot`s (once per process):
    sum(a b) = sum((a - 128) b) + 2 sum(64 b)."""
    from tvm.s_tir import TensorIntrin
    from tvm.script import tirx as T

    @T.prim_func(s_tir=True)
    def sdot(a: T.Buffer((4,), "uint8", offset_factor=1),
             b: T.Buffer((16, 4), "int8", offset_factor=1),
             c: T.Buffer((16,), "int32", offset_factor=1)):
        with T.sblock("root"):
            T.reads(c[0:16], a[0:4], b[0:16, 0:4])
            T.writes(c[0:16])
            word = T.reinterpret(a.vload([0], "uint8x4"), dtype="int32")
            data = T.reinterpret(T.broadcast(T.bitwise_xor(word, T.int32(-2139062144)), 4),
                                 dtype="int8x16")  # 0x80808080: each byte a - 128
            half = T.broadcast(T.int8(64), 16)
            for j in T.unroll(4):
                weights = b.vload([j * 4, 0], dtype="int8x16")
                c[T.ramp(j * 4, 1, 4)] = T.call_llvm_pure_intrin(
                    T.llvm_lookup_intrinsic_id("llvm.aarch64.neon.sdot.v4i32.v16i8"),
                    T.call_llvm_pure_intrin(
                        T.llvm_lookup_intrinsic_id("llvm.aarch64.neon.sdot.v4i32.v16i8"),
                        T.call_llvm_pure_intrin(
                            T.llvm_lookup_intrinsic_id("llvm.aarch64.neon.sdot.v4i32.v16i8"),
                            c.vload([j * 4], dtype="int32x4"), data, weights,
                            dtype="int32x4"), half, weights, dtype="int32x4"),
                    half, weights, dtype="int32x4")

    TensorIntrin.register(SDOT_INTRIN, dot_16x4(), sdot)
    return SDOT_INTRIN


def schedule_conv_dot(sch, func_name: str, i8mm: bool) -> None:
    """Schedule a conv2d_packed kernel with `usdot` (`i8mm`), else `sdot` (dotprod)."""
    inline_all(sch, func_name)
    acc = sch.get_sblock("conv2d_packed_acc", func_name=func_name)
    schedule_conv_tiled(sch, acc, register_usdot_intrinsic if i8mm else register_sdot_intrinsic)

"""x86 schedules for `conv2d_packed` kernels: AVX-512 VNNI, AVX2 (`vpmaddubsw` where the
value intervals prove it exact, else `vpmaddwd`), and a plain vector loop.

The kernel's stages (see `cvmc/ops/packed.py`): `conv2d_packed_data` (the input as
unsigned bytes, 4 channels per 32-bit word, kept as a buffer), `conv2d_packed_acc` (the
u8 x s8 dot products into int32, 16 output channels per vector) and the epilogue
(compensation, bias, shift, clip, relu, cast), inlined into the kernel's output stage.

Loop order (measured on Zen 4/5 for ResNet layers, 2 threads): (n, OC/16, output row)
fused and parallel, then a tile of output columns; inside it the reduction over input
channel blocks and the kernel window; then the tile's columns, unrolled, each one 16-lane
accumulator; innermost the 16 output channels x 4 input channels that one `vpdpbusd`
computes. The epilogue runs on each finished tile while it is in cache.

NCHW data, NCHW output, column stride 1, a row of a multiple of 8 columns (MobileNet's
1x1 convs on 112- and 56-wide rows): the lanes of each accumulator are instead 16 (or 8)
output columns of one output channel (`schedule_conv_lanes`), so the epilogue reads and
writes whole rows. With channels in the lanes the NCHW epilogue transposes the 16x16 tile
through memory with scalar loads and `vpinsrd`: perf on a 1x1 conv 32 -> 64, 112x112,
1 thread, put ~60% of the kernel in the epilogue and ~35% in the `vpdpbusd` loop. In
MobileNet-v1 (cvmc bench, 1 / 2 threads) that conv went 0.369 -> 0.266 / 0.202 -> 0.157 ms,
64 -> 128 on 56x56 0.255 -> 0.211 / 0.147 -> 0.125 ms, 128 -> 128 on 56x56 0.376 -> 0.340 /
0.215 -> 0.198 ms. (Tile shapes with channels in the lanes moved these by under 8%.)

One parallel region per kernel (issue 20): the byte stage was a parallel loop of its own
before the conv's, two fork/joins per kernel, and under contention each join waits for
its slowest task. Every row now computes it under the conv's parallel loop
(`_data_under`): a task converts the input rows its output row reads into a buffer of its
own (the stack or its thread's arena; the tensorized dot products still read a buffer),
and owns that row for a group of output channel tiles (`_tasks`: the fewest groups that
leave `_MIN_TASKS` tasks), so the rows are made once per group. The cost is the rows
that neighbouring tasks make again (KH / stride of them, and once per group): for
ResNet-18 and MobileNet-v1 at most ~1.5% of a kernel's multiply-adds in bytes, less
where a stride skips rows the old stage converted. Measured on the Zen 3 (AVX2), each
kernel timed alone against main's in turns, 1 thread, CPU time of the thread (load 6-8):
ResNet-18's conv kernels 0.96-1.03x (medians; the whole network 1.00x), MobileNet-v1's
0.95-0.99x (the network 0.93x). No shape measured slower beyond the noise, so every
shape takes the merged form. Whole networks at 2 threads, beside 0-2 busy processes,
could only be timed under load from other work (ResNet-18 at load 3-5: medians
0.91-1.05x main's, p99 0.87-1.08x; at load 9-12 medians 1.03-1.17x): docs/speed.md.
"""
from __future__ import annotations

import functools
from collections.abc import Callable

from cvmc.lowering.schedule import (
    epilogue_under,
    inline_all,
    largest_divisor,
    split_interior,
    stride_along,
)
from cvmc.ops.te import INTERIOR, MATERIALIZE

VNNI_INTRIN = "cvmc_dot_16x4_u8i8i32_vnni"
AVX2_INTRIN = "cvmc_dot_16x4_u8i8i32x2_avx2"
MADDUBS_INTRIN = "cvmc_dot_16x4_u8i8i32_maddubs_avx2"
# The PrimFunc attribute (`ScheduleRule.facts`) by which lowering tells
# `schedule_conv_maddubs` that the intervals prove its pair sums exact.
MADDUBS_EXACT = "cvmc.maddubs_exact"
INT16 = (-(2**15), 2**15 - 1)
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
# `schedule_conv_maddubs`: a (column, 16-channel block) pair holds 2 ymm accumulators; a
# step needs the input word broadcast, 2 weight vectors, the int16 ones and 2 products.
# Measured with --mcpu znver3 on a Zen 5, 1 thread, 3x3 conv 64 -> 64 on 56x56, medians of
# 3 x 100 runs, interleaved (columns x pairs): 4 x 4 0.976-0.981 ms, 2 x 2 1.00-1.02,
# 2 x 4 (2 blocks) 1.00-1.02.
_MADDUBS_COLUMN_TILE = 4
_MADDUBS_PAIRS = 4
# Parallel tasks (n x output channel block groups x rows) a tile shape must leave, so 2
# threads stay balanced.
_MIN_TASKS = 16
# AVX2 (`schedule_conv_avx2`): a (column, 16-channel block) pair holds 4 ymm accumulators
# (16 channels x 2 partial sums), and its step needs the block's 4 weight slices as int16
# and the column's input word, so 2 pairs (8 accumulators) fit the 16 ymm registers.
# Measured for haswell on Zen 4, 1 thread (columns x blocks; 3x3 conv 64 -> 64 and 1x1
# 256 -> 64 on 56x56): 1x1 2.62 / 1.14 ms, 2x1 2.05 / 1.07, 1x2 2.22 / 1.06, 2x2 2.06 /
# 1.15, 4x1 (16 accumulators, LLVM spills) 2.03 / 1.13, 1x4 2.50 / 1.15.
_AVX2_COLUMN_TILE = 2
_AVX2_PAIRS = 2


def tile_shape(n: int, blocks: int, rows: int, columns: int, column_tile: int = _COLUMN_TILE,
               accumulators: int = _ACCUMULATORS) -> tuple[int, int]:
    """(columns, output channel blocks) of one register tile: up to `column_tile` columns,
    and (columns x blocks) at most `accumulators`. A narrow row (7 columns: ResNet's last
    stage) leaves registers free: the tile takes as many 16-channel blocks as fit, each
    input word then feeding several dot products (VNNI, 3x3 conv 512 -> 512 on 7x7,
    1 thread: 0.537 -> 0.518 ms with 2 blocks)."""
    tile = largest_divisor(columns, column_tile)
    fits = [k for k in range(1, blocks + 1) if blocks % k == 0 and k * tile <= accumulators
            and n * blocks // k * rows >= _MIN_TASKS]
    return tile, max(fits, default=1)


def avx2_tile_shape(n: int, blocks: int, rows: int, columns: int) -> tuple[int, int]:
    """`tile_shape` for `schedule_conv_avx2`: (columns x blocks) pairs of 4 ymm
    accumulators, at most `_AVX2_PAIRS` of them."""
    return tile_shape(n, blocks, rows, columns, _AVX2_COLUMN_TILE, _AVX2_PAIRS)


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

    TensorIntrin.register(VNNI_INTRIN, dot_16x4(), vnni)
    return VNNI_INTRIN


def dot_16x4():
    """The TIR of the 16x4 dot product a packed conv's inner loops compute: 16 output
    channels of int32 += the 4 bytes (u8) of one input word times 16 x 4 weights (s8);
    what an intrinsic tensorizing them (VNNI's `vpdpbusd`, AArch64's `usdot`) computes."""
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

    return dot


@functools.cache
def register_avx2_intrinsic() -> str:
    """Register the 16x4 u8 x s8 dot product into (16 output channels x 2 partial sums)
    int32 with AVX2's `vpmaddwd` (once per process): c[i, j] += a[2j] * b[i, 2j] +
    a[2j + 1] * b[i, 2j + 1]. Per 4-channel slice of the weight block: the 16 weight bytes
    sign-extended to 16 x int16 (`vpmovsxbw`), the 4 input bytes zero-extended to int16
    and broadcast (`vpmovzxbw` of the broadcast word), one `vpmaddwd` into 8 int32 =
    c[4 channels, 2 partials].

    Exact: the int16 operands are the bytes themselves (0..255 and -128..127), each pair
    sum at most 2 * 255 * 128 < 2^31, so `vpmaddwd` (which wraps only on 2 * (-32768)^2)
    never wraps; each partial sums half the products, so it is at most
    255 * 128 * C*KH*KW / 2 in magnitude, inside the bound the pass keeps the whole sum in
    (255 * 127 * C*KH*KW < 2^31, MAX_PACKED_REDUCTION). Not `vpmaddubsw` (u8 x s8 pairs
    summed into int16), which saturates at 2 * 255 * 127 > 32767: the kernels whose value
    intervals prove it exact take it (`schedule_conv_maddubs`).
    """
    from tvm.s_tir import TensorIntrin
    from tvm.script import tirx as T

    @T.prim_func(s_tir=True)
    def dot(a: T.Buffer((4,), "uint8", offset_factor=1),
            b: T.Buffer((16, 4), "int8", offset_factor=1),
            c: T.Buffer((16, 2), "int32", offset_factor=1)):
        with T.sblock("root"):
            T.reads(c[0:16, 0:2], a[0:4], b[0:16, 0:4])
            T.writes(c[0:16, 0:2])
            for i, j, k in T.grid(16, 2, 2):
                with T.sblock("update"):
                    # the rf block's iterators: the partial first (rfactor puts it there)
                    vj, vi, vk = T.axis.remap("SSR", [j, i, k])
                    c[vi, vj] = c[vi, vj] + T.cast(a[vj * 2 + vk], "int32") * \
                        T.cast(b[vi, vj * 2 + vk], "int32")

    @T.prim_func(s_tir=True)
    def pmaddwd(a: T.Buffer((4,), "uint8", offset_factor=1),
                b: T.Buffer((16, 4), "int8", offset_factor=1),
                c: T.Buffer((16, 2), "int32", offset_factor=1)):
        with T.sblock("root"):
            T.reads(c[0:16, 0:2], a[0:4], b[0:16, 0:4])
            T.writes(c[0:16, 0:2])
            word = T.reinterpret(a.vload([0], "uint8x4"), dtype="int32")
            data = T.Cast("int16x16", T.reinterpret(T.broadcast(word, 4), dtype="uint8x16"))
            for s in T.unroll(4):  # slice s: output channels 4s..4s+3, 8 lanes of c
                c[s * 4, T.ramp(0, 1, 8)] = c.vload([s * 4, 0], dtype="int32x8") + \
                    T.call_llvm_pure_intrin(
                        T.llvm_lookup_intrinsic_id("llvm.x86.avx2.pmadd.wd"), data,
                        T.Cast("int16x16", b.vload([s * 4, 0], dtype="int8x16")),
                        dtype="int32x8")

    TensorIntrin.register(AVX2_INTRIN, dot, pmaddwd)
    return AVX2_INTRIN


def packed_byte_interval(data):
    """The values of the unsigned byte operand of a packed conv whose data lies in the
    interval `data`: u = x + 128, and 128 (x = 0) at spatial and channel padding
    (`conv2d_packed`'s lowering)."""
    return min(data[0] + 128, 128), max(data[1] + 128, 128)


def maddubs_exact(data, weight) -> bool:
    """True if `vpmaddubsw` computes every pair sum u0*w0 + u1*w1 exactly (it saturates to
    int16) for the packed conv's bytes u (`packed_byte_interval` of the data interval) and
    weights in the interval `weight`: the extremes of a pair sum are twice the extreme
    products, which lie at the intervals' ends. With any int8 data (u in [1, 255]) that is
    weights in [-64, 64]; data in [0, 127] (ReLU) still has u in [128, 255], so it needs the
    same weights (ONNX Runtime's 7-bit weights, `cvmc quantize --weight-bits 7`)."""
    u = packed_byte_interval(data)
    products = [x * w for x in u for w in weight]
    return INT16[0] <= 2 * min(products) and 2 * max(products) <= INT16[1]


def maddubs_facts(anchor, proven) -> dict:
    """The `ScheduleRule.facts` of the `vpmaddubsw` row: `MADDUBS_EXACT` where the proven
    intervals of the conv's data and weight make `maddubs_exact` true."""
    data, weight = anchor.inputs[0], anchor.inputs[1]
    return {MADDUBS_EXACT: True} if maddubs_exact(proven[data], proven[weight]) else {}


@functools.cache
def register_maddubs_intrinsic() -> str:
    """Register the 16x4 u8 x s8 -> s32 dot product (`dot_16x4`) with AVX2's `vpmaddubsw`
    (once per process), for operands that `maddubs_exact` proves exact: per 8 output
    channels, the input word broadcast to 32 bytes times their 8 x 4 weights gives 16
    int16 pair sums (`vpmaddubsw`), which `vpmaddwd` with int16 ones adds into the 8
    channels' int32 sums (exact: two int16 values)."""
    from tvm.s_tir import TensorIntrin
    from tvm.script import tirx as T

    @T.prim_func(s_tir=True)
    def maddubs(a: T.Buffer((4,), "uint8", offset_factor=1),
                b: T.Buffer((16, 4), "int8", offset_factor=1),
                c: T.Buffer((16,), "int32", offset_factor=1)):
        with T.sblock("root"):
            T.reads(c[0:16], a[0:4], b[0:16, 0:4])
            T.writes(c[0:16])
            word = T.reinterpret(a.vload([0], "uint8x4"), dtype="int32")
            data = T.reinterpret(T.broadcast(word, 8), dtype="uint8x32")
            for h in T.unroll(2):  # output channels 8h..8h+7
                pairs = T.call_llvm_pure_intrin(
                    T.llvm_lookup_intrinsic_id("llvm.x86.avx2.pmadd.ub.sw"), data,
                    b.vload([h * 8, 0], dtype="int8x32"), dtype="int16x16")
                c[T.ramp(h * 8, 1, 8)] = c.vload([h * 8], dtype="int32x8") + \
                    T.call_llvm_pure_intrin(
                        T.llvm_lookup_intrinsic_id("llvm.x86.avx2.pmadd.wd"), pairs,
                        T.broadcast(T.int16(1), 16), dtype="int32x8")

    TensorIntrin.register(MADDUBS_INTRIN, dot_16x4(), maddubs)
    return MADDUBS_INTRIN


def maddubs_tile_shape(n: int, blocks: int, rows: int, columns: int) -> tuple[int, int]:
    """`tile_shape` for `schedule_conv_maddubs`: (columns x blocks) pairs of 2 ymm
    accumulators, at most `_MADDUBS_PAIRS` of them."""
    return tile_shape(n, blocks, rows, columns, _MADDUBS_COLUMN_TILE, _MADDUBS_PAIRS)


def schedule_conv_maddubs(sch, func_name: str) -> None:
    """Schedule a conv2d_packed kernel whose pair sums the intervals prove exact in int16
    (`MADDUBS_EXACT`, from `maddubs_facts`; else ValueError: the next row, the exact
    `vpmaddwd` one, takes it): `schedule_conv_tiled` with the `vpmaddubsw` dot product
    (`register_maddubs_intrinsic`), 2 ymm accumulators per (column, 16-channel block)."""
    if MADDUBS_EXACT not in (sch.mod[func_name].attrs or {}):
        raise ValueError("the intervals do not prove vpmaddubsw exact")
    inline_all(sch, func_name)
    acc = sch.get_sblock("conv2d_packed_acc", func_name=func_name)
    schedule_conv_tiled(sch, acc, register_maddubs_intrinsic, maddubs_tile_shape)


@functools.cache
def register_lanes_intrinsic(lanes: int) -> str:
    """Register the (`lanes` columns x 4 channels) u8 x (4 channels) s8 -> `lanes` s32 VNNI
    dot product: one input vector of `lanes` pixels x 4 channels, one broadcast weight word
    (LLVM folds it into `vpdpbusd`'s memory operand, {1to16})."""
    from tvm.s_tir import TensorIntrin
    from tvm.script import tirx as T

    @T.prim_func(s_tir=True)
    def dot(a: T.Buffer((lanes, 4), "uint8", offset_factor=1),
            b: T.Buffer((4,), "int8", offset_factor=1),
            c: T.Buffer((lanes,), "int32", offset_factor=1)):
        with T.sblock("root"):
            T.reads(c[0:lanes], a[0:lanes, 0:4], b[0:4])
            T.writes(c[0:lanes])
            for i, k in T.grid(lanes, 4):
                with T.sblock("update"):
                    vi, vk = T.axis.remap("SR", [i, k])
                    c[vi] = c[vi] + T.cast(a[vi, vk], "int32") * T.cast(b[vk], "int32")

    @T.prim_func(s_tir=True)
    def vnni(a: T.Buffer((lanes, 4), "uint8", offset_factor=1),
             b: T.Buffer((4,), "int8", offset_factor=1),
             c: T.Buffer((lanes,), "int32", offset_factor=1)):
        with T.sblock("root"):
            T.reads(c[0:lanes], a[0:lanes, 0:4], b[0:4])
            T.writes(c[0:lanes])
            word = T.reinterpret(b.vload([0], "int8x4"), dtype="int32")
            c[T.ramp(T.int32(0), 1, lanes)] = T.call_llvm_pure_intrin(
                T.llvm_lookup_intrinsic_id(f"llvm.x86.avx512.vpdpbusd.{32 * lanes}"),
                c.vload([0], dtype=f"int32x{lanes}"),
                a.vload([0, 0], dtype=f"uint8x{4 * lanes}"),
                T.reinterpret(T.broadcast(word, lanes), dtype=f"int8x{4 * lanes}"),
                dtype=f"int32x{lanes}")

    name = f"cvmc_dot_{lanes}x4_columns_u8i8i32_vnni"
    TensorIntrin.register(name, dot, vnni)
    return name


def column_lanes(columns: int) -> int:
    """Output columns per accumulator of `schedule_conv_lanes`, 0 where it does not apply.
    16 on 112-wide rows (1x1 conv 32 -> 64, 112x112, 1 thread: 0.264 ms with 8 lanes,
    0.253 ms with 16); 8 on 56-wide rows (a 256-bit `vpdpbusd`, as fast per lane on Zen 4:
    64 -> 128, 56x56: 0.249 -> 0.211 ms). Not 4 (28-wide rows: 256 -> 256, 0.320 ->
    0.561 ms): 28-, 14- and 7-wide rows keep channels in the lanes."""
    return next((lanes for lanes in (16, 8) if columns % lanes == 0), 0)


def _lanes_apply(sch, acc) -> int:
    """The lane count of `schedule_conv_lanes` for the acc block, 0 where it does not apply:
    NCHW data (its bytes NCHW4c: `lanes` pixels x 4 channels are contiguous only with
    column stride 1), NCHW output, and a row that `column_lanes` accepts."""
    block = sch.get(acc)
    q = block.iter_vars[3].var
    data = [r for r in block.reads if r.source.name == "conv2d_packed_data"]
    outputs = [sch.get(c).writes[0].source for c in sch.get_consumers(acc)]
    if len(data) != 1 or int(data[0].source.shape[-1]) != 4 or \
            any(len(buffer.shape) != 4 for buffer in outputs):
        return 0
    if stride_along(data[0].region[3].min, q) != 1:
        return 0
    return column_lanes(int(block.iter_vars[3].dom.extent))


def schedule_conv_lanes(sch, func_name: str, acc, lanes: int) -> None:
    """The acc buffer as (n, OC/16, row, 16 channels, columns); per tile `lanes` columns x
    16 output channels, one accumulator per channel (16 registers), each step one input
    vector and 16 `vpdpbusd` with a broadcast weight word. The epilogue then loads each
    channel's row of columns as one vector and stores it to the NCHW output."""
    sch.transform_layout(acc, ("write", 0), lambda b, o, p, q, i: (b, o, p, i, q))
    n, ob, oh, ow, oi, rcb, ry, rx, rci = sch.get_loops(acc)
    wo, wi = sch.split(ow, [None, lanes])
    _tasks(sch, acc, n, ob, oh, (wo, rcb, ry, rx, oi, wi, rci))
    epilogue_under(sch, acc, wo)
    sch.unroll(oi)
    sch.decompose_reduction(acc, rcb)
    sch.tensorize(wi, register_lanes_intrinsic(lanes))


def schedule_conv_packed(sch, func_name: str, vnni: bool) -> None:
    """Schedule a conv2d_packed kernel; `vnni` tensorizes the inner 16x4 dot product, else
    the 16 output channels form one vector and the 4 input channels a scalar loop."""
    inline_all(sch, func_name)
    acc = sch.get_sblock("conv2d_packed_acc", func_name=func_name)
    lanes = _lanes_apply(sch, acc) if vnni else 0
    if lanes:
        schedule_conv_lanes(sch, func_name, acc, lanes)
        return
    schedule_conv_tiled(sch, acc, register_vnni_intrinsic if vnni else None)


def schedule_conv_tiled(sch, acc, dot: Callable[[], str] | None, shape=tile_shape) -> None:
    """The acc block register-tiled (`register_tile`, tiles of `shape`), the epilogue
    under each tile; the inner 16x4 dot product tensorized by the intrinsic `dot()`
    registers, or (None) the 16 output channels one vector and the 4 input channels a
    scalar loop."""
    tile, rcb, oi = register_tile(sch, acc, shape, lambda oi, rci:
                                               (oi, rci) if dot else (rci, oi))
    epilogue_under(sch, acc, tile)
    if not dot:
        sch.vectorize(oi)
    sch.decompose_reduction(acc, rcb)
    if dot:
        sch.tensorize(oi, dot())


def schedule_conv_avx2(sch, func_name: str) -> None:
    """Schedule a conv2d_packed kernel with AVX2's `vpmaddwd` (int16 x int16, adjacent
    pairs summed into int32), on the weights as packed for VNNI (OIHW16o4i, no graph
    change). One 16x4 weight block is 4 slices of (4 output x 4 input channels): each
    slice sign-extended to 16 x int16, times the input word's 4 bytes zero-extended to
    int16 and broadcast, gives 8 int32 = (4 output channels x 2 partial sums: input
    channels (0, 1) and (2, 3)). So the 4-channel reduction is split into 2 pairs x 2 and
    `rfactor`ed on the pairs: the rf block accumulates [16 channels][2 partials] per
    output (4 ymm registers), tensorized by `register_avx2_intrinsic`; the rfactor
    write-back (partial 0 + partial 1) and then the epilogue run on each finished tile.
    Loop order, parallel split and data stage are `schedule_conv_packed`'s
    (`register_tile`); the tile (`avx2_tile_shape`) fits AVX2's 16 ymm registers.
    AVX-512 CPUs without VNNI take this rule too (the same code, on ymm registers).

    Measured for haswell on Zen 4, 1 thread, against the plain vector loop (16 channels x
    one input channel per `vpmulld`): 3x3 conv 64 -> 64 on 56x56, pad 1, 21.8 -> 2.10 ms
    (110 GOPS); 1x1 256 -> 64 on 56x56 9.36 -> 1.08 ms (95 GOPS); for skylake-avx512 26.1
    -> 2.12 and 10.1 -> 1.47 ms. The 1x1 conv's inner loop keeps its 8 accumulators in
    registers; on the 3x3 conv LLVM unrolls the kernel window, reuses the converted input
    words across taps and reassociates the sums: ~11 spills and reloads per 72 `vpmaddwd`
    (4 columns, more spills, ran no faster). Each weight slice is sign-extended again at
    every step (a `vpmovsxbw` per 2 `vpmaddwd`): weights stored as int16 would save it,
    but that is a graph change."""
    inline_all(sch, func_name)
    acc = sch.get_sblock("conv2d_packed_acc", func_name=func_name)
    rci = sch.get_loops(acc)[-1]
    pair, _ = sch.split(rci, [2, 2])
    # the partials the last axis of the rf buffer: [..., 16 channels, 2 partials]
    rf = sch.rfactor(pair, factor_axis=len(sch.get(acc).writes[0].region))
    tile, rcb, oi = register_tile(sch, rf, avx2_tile_shape,
                                               lambda oi, pair, k: (oi, pair, k))
    epilogue_under(sch, rf, tile)  # the write-back (acc = partial 0 + partial 1)
    epilogue_under(sch, acc, tile)
    sch.decompose_reduction(rf, rcb)
    sch.tensorize(oi, register_avx2_intrinsic())


def register_tile(sch, block, shape, inner):
    """Tile the acc-shaped `block` (loops n, OC/16, row, column, 16 channels, input
    channel blocks, kernel rows, kernel columns, then the input channel loops): (n, group
    of output channel tiles, row) fused and parallel (`_tasks`), the group's tiles, a tile
    of output columns, the reduction over input channel blocks and the kernel window,
    then the tile's columns and channel blocks
    (`shape(n, blocks, rows, columns)` -> (columns, blocks)), unrolled, then
    `inner(16 channels, *input channel loops)`. Returns (the tile loop, the input channel
    block loop: where the reduction starts, the 16-channel loop)."""
    n, ob, oh, ow, oi, rcb, ry, rx, *channels = sch.get_loops(block)
    extents = [int(sch.get(loop).extent) for loop in (n, ob, oh, ow)]
    columns, blocks = shape(*extents)
    wo, wi = sch.split(ow, [None, columns])
    obo, obi = sch.split(ob, [None, blocks])
    _tasks(sch, block, n, obo, oh, (wo, rcb, ry, rx, wi, obi, *inner(oi, *channels)))
    sch.unroll(wi)
    sch.unroll(obi)
    return wo, rcb, oi


def _tasks(sch, block, n, ob, oh, inner) -> None:
    """The parallel loop of `block`: `ob` (its output channel tiles) split into the
    fewest groups that leave `_MIN_TASKS` tasks, (n, group, row) fused and parallel, then
    the group's tiles, then the loops `inner` in their order; the stages `block` reads
    are computed under the parallel loop (`_data_under`). A task then makes its input rows
    once for all the tiles of its group."""
    batch, tiles, rows = (int(sch.get(loop).extent) for loop in (n, ob, oh))
    groups = min(g for g in range(1, tiles + 1)
                 if tiles % g == 0 and (batch * g * rows >= _MIN_TASKS or g == tiles))
    obg, obr = sch.split(ob, [groups, None])
    sch.reorder(n, obg, oh, obr, *inner)
    parallel = sch.fuse(n, obg, oh)
    sch.parallel(parallel)
    _data_under(sch, block, parallel)


def _data_under(sch, block, loop) -> None:
    """The stages that `block` reads from a buffer of their own (MATERIALIZE: the bytes,
    a padded copy) computed under `loop`, the conv's parallel loop: each task makes the
    rows it reads, in the parallel region of the conv."""
    for producer in sch.get_producers(block):
        annotations = sch.get(producer).annotations
        if MATERIALIZE in annotations:
            sch.compute_at(producer, loop)
            if INTERIOR in annotations:
                split_interior(sch, producer)

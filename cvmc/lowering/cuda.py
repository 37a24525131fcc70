"""CUDA schedules of cvmc's own, applied before TVM's dlight rules (`schedule_cuda`).

conv2d, register-tiled: dlight has no rule for a convolution, and its fallback gives
each thread one output that it accumulates in global memory (a load and a store per
multiply-add; 0.3-1.2 TOPS on an H100 for ResNet-18's layers). Here every thread keeps a
tile of output channels x output pixels in registers (a `local` accumulator) while the
reduction over input channels and the kernel window runs, and writes the tile once.
Threads of a block take neighbouring pixels, so their loads of one tap fall in the same
cache lines; the weights a warp reads are shared by all its threads.

conv2d_packed (every conv with constant weights, after the layout pass), `dp4a`: the
same register tiles, accumulating 4 input channels per `dp4a.u32.s32` (u8 data x s8
weights, the packed form's bytes). With activations NCHW16c between convs a data word is
one 32-bit load. Measured on an H200, 224x224, batch 1, whole runs: ResNet-18 1.74 ms
(conv2d rule) -> 0.68 ms, MobileNet-v1 0.44 -> 0.34 ms.
"""
from __future__ import annotations

import functools

from cvmc.lowering.schedule import inline_all, largest_divisor

# A thread's tile: up to 4 output channels x 4 output columns (16 int32 accumulators),
# smaller where the outputs are few, so that at least _MIN_THREADS threads run (132 SMs x
# 128: measured on an H100, a 14x14x256 layer took 0.35 ms with 4 x 2 tiles in 6,272
# threads). A block: up to 4 x 32 threads.
_TILES = ((4, 4), (4, 2), (2, 2), (2, 1), (1, 1))
_MIN_THREADS = 16384
_CHANNEL_THREADS = 4
_PIXEL_THREADS = 32
_BLOCK_THREADS = 128
# The dp4a rule (packed convs): the same tiles, at least 32,768 threads. Measured on an
# H200 (ResNet-18 / MobileNet-v1, 224x224, whole runs): at least 8,192 threads 1.03 /
# 0.52 ms, 16,384 0.76 / 0.41 ms, 32,768 0.68 / 0.34 ms (the 56x56 layers lose 10%, the
# 28x28 and 14x14 ones gain 15-35%), 65,536 0.68 / 0.33 ms.
_PACKED_MIN_THREADS = 32768
# Where the output's last block of 16 channels is partial: whole blocks per thread.
_WHOLE_BLOCK_TILES = ((16, 4), (16, 2), (16, 1))


def schedule_conv_cuda(sch, func_name: str) -> None:
    """Schedule a conv2d kernel (NCHW data, OIHW weight, elementwise epilogue) on a GPU;
    raises ValueError where the kernel is not that shape (it is then left to dlight)."""
    root = sch.get_sblock("root", func_name=func_name)
    blocks = sch.get_child_blocks(root)
    convs = [b for b in blocks if len(sch.get_loops(b)) == 7]
    outputs = sch.get_output_blocks(root)
    if len(convs) != 1 or len(outputs) != 1:
        raise ValueError("not one 2-d convolution (4 spatial + 3 reduction loops), one output")
    conv, out = convs[0], outputs[0]
    keep = {sch.get(conv).name_hint, sch.get(out).name_hint}
    for block in blocks:  # input casts and padding, and the epilogue's inner steps
        if sch.get(block).name_hint not in keep:
            sch.compute_inline(block)
    n, o, p, q, *reduction = sch.get_loops(conv)
    batch, oc, oh, ow = (int(sch.get(loop).extent) for loop in (n, o, p, q))
    o_i, q_i = _thread_tile(batch * oc * oh * ow, oc, ow)
    o_o, o_t, o_i = sch.split(o, [None, largest_divisor(oc // o_i, _CHANNEL_THREADS), o_i])
    p_o, p_t, q_o, q_t, q_i = _pixel_threads(sch, p, q, oh, ow, q_i)
    sch.reorder(n, o_o, p_o, q_o, o_t, p_t, q_t, *reduction, o_i, q_i)
    sch.bind(sch.fuse(n, o_o, p_o, q_o), "blockIdx.x")
    thread = sch.fuse(o_t, p_t, q_t)
    sch.bind(thread, "threadIdx.x")
    # The sums live in registers; the tile's epilogue (or a plain copy) writes it out.
    if sch.get(out).name_hint == sch.get(conv).name_hint:
        out = sch.cache_write(conv, 0, "local")
    else:
        sch.set_scope(conv, 0, "local")
    sch.reverse_compute_at(out, thread)
    sch.decompose_reduction(conv, reduction[0])
    sch.unroll(o_i)
    sch.unroll(q_i)


def _pixel_threads(sch, p, q, oh: int, ow: int, q_i: int):
    """Split rows `p` and columns `q` into (p_o, p_t, q_o, q_t, q_i): up to _PIXEL_THREADS
    threads of a block on neighbouring pixels, q_i columns per thread. Rows and columns are
    split apart (not fused), so each thread's tile is a box: the write-back of its
    registers then covers exactly that tile."""
    q_t = largest_divisor(ow // q_i, _PIXEL_THREADS)
    p_t = largest_divisor(oh, max(1, _PIXEL_THREADS // q_t))
    return (*sch.split(p, [None, p_t]), *sch.split(q, [None, q_t, q_i]))


def _thread_tile(outputs: int, oc: int, ow: int, tiles=_TILES,
                 min_threads: int = _MIN_THREADS) -> tuple[int, int]:
    """(output channels, output columns) per thread: the first tile of `tiles` (each side
    a divisor of its extent) that leaves at least `min_threads` threads, else the last."""
    for a, b in tiles:
        tile = largest_divisor(oc, a), largest_divisor(ow, b)
        if outputs // (tile[0] * tile[1]) >= min_threads:
            return tile
    return tile


@functools.cache
def register_dp4a_intrinsic(data: str, scope: str) -> str:
    """Register the 4-element `data` x s8 -> s32 dot product on one `dp4a` (once per
    process), its byte operands in buffers of `scope`. u8 data (the packed conv's bytes,
    x + 128): `dp4a.u32.s32`, `cvmc_dp4a_u8s8` in `cvmc/codegen/shim.py` (CUDA's `__dp4a`
    overloads are same-sign only); s8 data (dense): `__dp4a(int, int, int)`."""
    from tvm.s_tir import TensorIntrin
    from tvm.script import tirx as T

    unsigned = data == "uint8"
    name = f"cvmc_dot_4_{'u8' if unsigned else 'i8'}i8i32_dp4a_{scope}"
    function = "cvmc_dp4a_u8s8" if unsigned else "__dp4a"

    @T.prim_func(s_tir=True)
    def dot(a: T.Buffer((4,), data, offset_factor=1, scope=scope),
            b: T.Buffer((4,), "int8", offset_factor=1, scope=scope),
            c: T.Buffer((1,), "int32", offset_factor=1, scope="local")):
        with T.sblock("root"):
            T.reads(c[0], a[0:4], b[0:4])
            T.writes(c[0])
            for k in range(4):
                with T.sblock("update"):
                    vk = T.axis.remap("R", [k])
                    c[0] = c[0] + T.cast(a[vk], "int32") * T.cast(b[vk], "int32")

    @T.prim_func(s_tir=True)
    def dp4a(a: T.Buffer((4,), data, offset_factor=1, scope=scope),
             b: T.Buffer((4,), "int8", offset_factor=1, scope=scope),
             c: T.Buffer((1,), "int32", offset_factor=1, scope="local")):
        with T.sblock("root"):
            T.reads(c[0], a[0:4], b[0:4])
            T.writes(c[0])
            c[0] = T.call_pure_extern(
                "int32", function,
                T.reinterpret(a.vload([0], f"{data}x4"), dtype="uint32" if unsigned else "int32"),
                T.reinterpret(b.vload([0], "int8x4"), dtype="int32"), c[0])

    TensorIntrin.register(name, dot, dp4a)
    return name


def schedule_conv_packed_cuda(sch, func_name: str) -> None:
    """Schedule a conv2d_packed kernel (and its epilogue) on a GPU: `__dp4a` on 4 input
    channels at a time.

    Each thread keeps a register tile of output channels x columns (as the conv2d rule);
    a thread block takes one or more blocks of 16 output channels of a patch of rows x
    columns. Under the kernel window loop the thread copies the data words its columns
    need (4 channels of a pixel, + 128, padding included) and its channels' weight words
    (the same for all the block's pixel threads, so cached) into registers."""
    inline_all(sch, func_name)
    acc = sch.get_sblock("conv2d_packed_acc", func_name=func_name)
    (out,) = sch.get_consumers(acc)
    n, ob, p, q, oi, rcb, ry, rx, rci = sch.get_loops(acc)
    batch, blocks, oh, ow, lanes = (int(sch.get(loop).extent) for loop in (n, ob, p, q, oi))
    # An NCHW output whose channels end inside a block: each thread then takes whole
    # blocks. (Split across threads, TVM cannot map a thread's channels of the block to
    # the output's `o // 16, o % 16` when the last block is partial: the epilogue of each
    # thread would read every channel of its registers, most never computed.)
    result = sch.get(out).writes[0].source.shape
    whole = len(result) == 4 and int(result[1]) % lanes != 0
    tile = _thread_tile(batch * blocks * lanes * oh * ow, lanes, ow,
                        _WHOLE_BLOCK_TILES if whole else _TILES, _PACKED_MIN_THREADS)
    o_t, o_i = sch.split(oi, [None, tile[0]])
    p_o, p_t, q_o, q_t, q_i = _pixel_threads(sch, p, q, oh, ow, tile[1])
    # Blocks of 16 output channels per thread block: enough for _BLOCK_THREADS threads
    # where the rows are short (a dense layer is a 1x1 conv on one pixel).
    per_block = lanes // int(sch.get(o_i).extent) * int(sch.get(p_t).extent) * \
        int(sch.get(q_t).extent)
    ob_o, ob_t = sch.split(ob, [None, largest_divisor(blocks, max(1, _BLOCK_THREADS // per_block))])
    sch.reorder(n, ob_o, p_o, q_o, ob_t, o_t, p_t, q_t, rcb, ry, rx, o_i, q_i, rci)
    sch.bind(sch.fuse(n, ob_o, p_o, q_o), "blockIdx.x")
    thread = sch.fuse(ob_t, o_t, p_t, q_t)
    sch.bind(thread, "threadIdx.x")
    sch.set_scope(acc, 0, "local")
    sch.reverse_compute_at(out, thread)
    # Under the kernel window loop: the tile's data words (+ 128, padding included) and
    # weight words (contiguous, 4 bytes per output channel: loaded as vectors of up to
    # 16 bytes) copied into registers.
    depth = len(sch.get_loops(acc)) - 3  # the loops down to rx
    words = sch.cache_read(acc, 0, "local")
    sch.compute_inline(sch.get_sblock("conv2d_packed_data", func_name=func_name))
    sch.compute_at(words, rx)
    *columns, channels = sch.get_loops(words)[depth:]
    for loop in columns:
        sch.unroll(loop)
    # NCHW16c data: a word's 4 bytes are contiguous, one 32-bit load
    blocked = any(len(r.source.shape) == 5 for r in sch.get(words).reads)
    (sch.vectorize if blocked else sch.unroll)(channels)
    weights = sch.cache_read(acc, 1, "local")
    sch.compute_at(weights, rx)
    outer, vector = sch.split(sch.fuse(*sch.get_loops(weights)[depth:]),
                              [None, min(16, 4 * tile[0])])
    sch.unroll(outer)
    sch.vectorize(vector)
    sch.decompose_reduction(acc, rcb)
    sch.tensorize(rci, register_dp4a_intrinsic("uint8", "local"))
    sch.unroll(o_i)
    sch.unroll(q_i)


# dense: output channels per thread block (one warp each), lanes splitting the reduction
_DENSE_ROWS = 8
_DENSE_LANES = 32
_DENSE_MIN_LANES = 4  # fewer (K under 16, or few divisors): dlight


def schedule_dense_cuda(sch, func_name: str) -> None:
    """Schedule a dense kernel (int8 data and weights, K a multiple of 4) and its epilogue
    on a GPU: `__dp4a` on 4 products at a time. Each output is one warp's: its lanes take
    interleaved 32-bit words of the data row and the weight row (coalesced loads), sum them
    with `dp4a` in a register, and TVM's cross-thread reduction adds the 32 partial sums
    (warp shuffles; exact, as integer addition). Lane 0 writes the epilogue's result.
    Raises ValueError for other dtypes or K (dlight then schedules the kernel)."""
    inline_all(sch, func_name)
    root = sch.get_sblock("root", func_name=func_name)
    dense = [b for b in sch.get_child_blocks(root) if len(sch.get_loops(b)) == 3]
    if len(dense) != 1:
        raise ValueError("not one dense block")
    (dense,) = dense
    block = sch.get(dense)
    if any(r.source.dtype != "int8" for r in block.reads
           if not r.source.same_as(block.writes[0].source)):
        raise ValueError("dense: data or weights not int8")
    m, n, k = sch.get_loops(dense)
    words = int(sch.get(k).extent) // 4
    lanes = largest_divisor(words, _DENSE_LANES)
    if words * 4 != int(sch.get(k).extent) or lanes < _DENSE_MIN_LANES:
        raise ValueError("dense: K is not a multiple of 4, or too short")
    word, _ = sch.split(k, [None, 4])
    partial = sch.rfactor(sch.split(word, [None, lanes])[1], factor_axis=0)
    # `dense` now adds the lanes' partial sums: TVM's cross-thread reduction
    m, n, lane_sum = sch.get_loops(dense)
    n_o, n_t = sch.split(n, [None, largest_divisor(int(sch.get(n).extent), _DENSE_ROWS)])
    sch.bind(sch.fuse(m, n_o), "blockIdx.x")
    sch.bind(n_t, "threadIdx.y")
    sch.bind(lane_sum, "threadIdx.x")
    sch.compute_at(partial, n_t)
    # under (block, row): the lane, the lane's words (absent where it has one) and bytes
    lane, *reduction = sch.get_loops(partial)[2:]
    sch.bind(lane, "threadIdx.x")
    sch.set_scope(partial, 0, "local")
    consumers = sch.get_consumers(dense)  # the epilogue, if any: lane 0 runs it
    if consumers:
        sch.set_scope(dense, 0, "local")
    for consumer in consumers:
        sch.reverse_compute_at(consumer, n_t)
    sch.decompose_reduction(partial, reduction[0])
    sch.tensorize(reduction[-1], register_dp4a_intrinsic("int8", "global"))

"""CUDA schedules of cvmc's own, applied before TVM's dlight rules (`schedule_cuda`).

conv2d, register-tiled: dlight has no rule for a convolution, and its fallback gives
each thread one output that it accumulates in global memory (a load and a store per
multiply-add; 0.3-1.2 TOPS on an H100 for ResNet-18's layers). Here every thread keeps a
tile of output channels x output pixels in registers (a `local` accumulator) while the
reduction over input channels and the kernel window runs, and writes the tile once.
Threads of a block take neighbouring pixels, so their loads of one tap fall in the same
cache lines; the weights a warp reads are shared by all its threads.
"""
from __future__ import annotations

from cvmc.lowering.schedule import largest_divisor

# A thread's tile: up to 4 output channels x 4 output columns (16 int32 accumulators),
# smaller where the outputs are few, so that at least _MIN_THREADS threads run (132 SMs x
# 128: measured on an H100, a 14x14x256 layer took 0.35 ms with 4 x 2 tiles in 6,272
# threads). A block: up to 4 x 32 threads.
_TILES = ((4, 4), (4, 2), (2, 2), (2, 1), (1, 1))
_MIN_THREADS = 16384
_CHANNEL_THREADS = 4
_PIXEL_THREADS = 32


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
    o_t = largest_divisor(oc // o_i, _CHANNEL_THREADS)
    q_t = largest_divisor(ow // q_i, _PIXEL_THREADS)
    p_t = largest_divisor(oh, max(1, _PIXEL_THREADS // q_t))
    # Rows and columns are split apart (not fused), so each thread's tile is a box: the
    # write-back of its registers then covers exactly that tile.
    o_o, o_t, o_i = sch.split(o, [None, o_t, o_i])
    p_o, p_t = sch.split(p, [None, p_t])
    q_o, q_t, q_i = sch.split(q, [None, q_t, q_i])
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


def _thread_tile(outputs: int, oc: int, ow: int) -> tuple[int, int]:
    """(output channels, output columns) per thread: the largest tile of _TILES (each
    side a divisor of its extent) that leaves at least _MIN_THREADS threads."""
    for a, b in _TILES:
        tile = largest_divisor(oc, a), largest_divisor(ow, b)
        if outputs // (tile[0] * tile[1]) >= _MIN_THREADS:
            return tile
    return 1, 1

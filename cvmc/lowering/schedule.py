"""Default schedules per target (correct and sane; tuning is a later concern).

CPU: inline every stage that can be inlined (except stages a lower rule marks
MATERIALIZE). A conv-style reduction block (see `_conv_axes`) gets a register tile:
output channels x a vector of output columns accumulate in registers while the reduction
loops run outside the tile, and its epilogue (bias, shift, clip, cast) is computed under
the tile. Every other block: fuse the spatial loops, parallelise the outer part and
vectorise an inner part that divides the extent.
CUDA: TVM's dlight default rules; any block they leave unbound runs in one thread of
one block (the sequential vision ops), so no loop ever stays on the host.
"""
from __future__ import annotations

from cvmc.errors import CvmcError
from cvmc.ops.te import INTERIOR, MATERIALIZE
from cvmc.passes.target import Target

_VECTOR_WIDTHS = (64, 32, 16, 8, 4)
# Conv register tile: up to 16 output channels x 16 int32 lanes (one AVX-512 register
# each) stay in registers across the reduction loops (16 x 16 measured best on Zen 4).
_TILE_CHANNELS = 16
_TILE_LANES = 16


def root_blocks(sch, func_name: str):
    """The blocks directly under function `func_name`'s root block."""
    return sch.get_child_blocks(sch.get_sblock("root", func_name=func_name))


def inline_all(sch, func_name: str) -> None:
    """Inline every non-output block into its consumer (or its producer) until none can.
    A block marked INTERIOR keeps its annotation for the schedule: its consumers are
    inlined into it rather than it into them."""
    changed = True
    while changed:
        changed = False
        root = sch.get_sblock("root", func_name=func_name)
        outputs = {sch.get(b).name_hint for b in sch.get_output_blocks(root)}
        for b in sch.get_child_blocks(root):
            annotations = sch.get(b).annotations
            if INTERIOR in annotations and MATERIALIZE not in annotations:
                consumers = sch.get_consumers(b)
                if consumers and try_schedule(
                        sch, lambda s, c=consumers[0]: s.reverse_compute_inline(c)):
                    changed = True
                    break
                continue
            if sch.get(b).name_hint in outputs or MATERIALIZE in annotations:
                continue
            if try_schedule(sch, lambda s, blk=b: s.compute_inline(blk)) or \
                    try_schedule(sch, lambda s, blk=b: s.reverse_compute_inline(blk)):
                changed = True
                break


def try_schedule(sch, action) -> bool:
    """Apply `action(sch)`; on a schedule error leave `sch` unchanged and return False."""
    from tvm.s_tir.schedule import ScheduleError

    trial = sch.copy()
    try:
        action(trial)
    except (ScheduleError, ValueError):
        return False
    action(sch)
    return True


def _spatial_prefix(sch, block) -> int:
    """How many leading block iterators are spatial (data parallel)."""
    count = 0
    for it in sch.get(block).iter_vars:
        if it.iter_type != 0:
            break
        count += 1
    return count


def _parallelize(sch, block, vectorize: bool) -> None:
    """Fuse the spatial loops; parallel outer, vectorised inner when the block is all spatial."""
    loops = sch.get_loops(block)
    spatial = _spatial_prefix(sch, block)
    if spatial == 0 or len(loops) < spatial:
        return
    fused = sch.fuse(*loops[:spatial]) if spatial > 1 else loops[0]
    extent = int(sch.get(fused).extent)
    all_spatial = spatial == len(sch.get(block).iter_vars) and len(loops) == spatial
    width = next((w for w in _VECTOR_WIDTHS if extent % w == 0 and extent > w), 0)
    if vectorize and all_spatial and width:
        outer, inner = sch.split(fused, [None, width])
        sch.parallel(outer)
        sch.vectorize(inner)
    else:
        sch.parallel(fused)


def stride_along(index, var) -> int | None:
    """How far `index` moves per step of `var` (None: not linear in it with a constant
    coefficient)."""
    from tvm.sym.pattern import detect_linear_equation

    coeff = detect_linear_equation(index, [var])
    return int(coeff[0]) if len(coeff) == 2 and hasattr(coeff[0], "value") else None


def uses(expr, var) -> bool:
    """True if `var` occurs in `expr`."""
    from tvm.tirx.analysis import undefined_vars

    return any(v.same_as(var) for v in undefined_vars(expr))


def _conv_axes(sch, block_rv) -> tuple[int, int] | None:
    """(channel axis, vector axis) of a conv-style block, else None.

    Conv-style: spatial iterators then reduction iterators; the last spatial iterator
    (the vector axis) walks the innermost dimension of some input (the activations), and
    another spatial iterator (the channel axis, tiled in registers) indexes an input that
    the vector axis does not (the weights). Dense (the vector axis indexes the weights'
    rows) and pooling or sums (no weights) keep the default schedule.
    """
    block = sch.get(block_rv)
    iters = [it.var for it in block.iter_vars]
    spatial = _spatial_prefix(sch, block_rv)
    if spatial < 2 or spatial == len(iters):
        return None
    vec = iters[spatial - 1]
    reads = [r for r in block.reads if not any(r.source.same_as(w.source) for w in block.writes)]
    if not any(uses(r.region[-1].min, vec) for r in reads):
        return None
    weights = [r for r in reads if not any(uses(d.min, vec) for d in r.region)]
    channel = next((i for i in range(spatial - 1)
                    if any(uses(d.min, iters[i]) for r in weights for d in r.region)), None)
    return None if channel is None else (channel, spatial - 1)


def largest_divisor(n: int, limit: int) -> int:
    """The largest divisor of `n` not above `limit` (tiles that divide need no guard)."""
    return max(d for d in range(1, min(n, limit) + 1) if n % d == 0)


def _tile_conv(sch, block, channel: int, vec: int) -> None:
    """Register-tile a conv-style block and compute its epilogue under the tile."""
    loops = sch.get_loops(block)
    extent = [int(sch.get(loop).extent) for loop in loops]
    co, ci = sch.split(loops[channel], [None, largest_divisor(extent[channel], _TILE_CHANNELS)])
    wo, wi = sch.split(loops[vec], [None, largest_divisor(extent[vec], _TILE_LANES)])
    outer = [{channel: co, vec: wo}.get(i, loop) for i, loop in enumerate(loops[:vec + 1])]
    reduction = loops[vec + 1:]
    sch.reorder(*outer, *reduction, ci, wi)
    # Accumulate in a tile-sized local buffer; the write-back folds into the epilogue
    # (when the conv result is itself a kernel output it stays a block of its own).
    write_back = sch.cache_write(block, 0, "local")
    try_schedule(sch, lambda s: s.compute_inline(write_back))
    fused = sch.fuse(*outer)
    sch.parallel(fused)
    epilogue_under(sch, block, fused)
    sch.unroll(ci)
    sch.vectorize(wi)
    sch.decompose_reduction(block, reduction[0])


def vectorize_under(sch, block, outer) -> None:
    """Vectorise the innermost loop of `block` below `outer`, if it has one: a tile whose
    extents are all 1 leaves none, and vectorising `outer` itself (a loop holding the
    reduction) made TVM compute every batch's result from the last one."""
    loops = sch.get_loops(block)
    position = next(i for i, loop in enumerate(loops) if sch.get(loop).same_as(sch.get(outer)))
    own = loops[position + 1:]
    if own:
        sch.vectorize(own[-1])


def epilogue_under(sch, block, loop) -> None:
    """The epilogue (`block`'s consumers) computed under `loop`, on each finished tile while
    it is in cache, vectorised below it."""
    for consumer in sch.get_consumers(block):
        sch.reverse_compute_at(consumer, loop)
        vectorize_under(sch, consumer, loop)


def schedule_cpu(sch, func_name: str, vectorize: bool = True) -> None:
    """Inline elementwise stages; register-tile conv blocks; parallel outer loop and
    vectorised inner loop for every other block (the table's default rule)."""
    inline_all(sch, func_name)
    tiled = set()
    for b in root_blocks(sch, func_name) if vectorize else []:
        axes = _conv_axes(sch, b)
        if axes and try_schedule(sch, lambda s, blk=b, ax=axes: _tile_conv(s, blk, *ax)):
            tiled.add(sch.get(b).name_hint)
    for b in root_blocks(sch, func_name):
        if MATERIALIZE in sch.get(b).annotations:
            try_schedule(sch, lambda s, blk=b: parallelize_rows(s, blk))
        elif INTERIOR in sch.get(b).annotations:
            try_schedule(sch, lambda s, blk=b: parallelize_interior(s, blk))
        elif sch.get(b).name_hint not in tiled:
            try_schedule(sch, lambda s, blk=b: _parallelize(s, blk, vectorize))


def split_interior(sch, block) -> None:
    """Partition the loop of `block`'s INTERIOR axis into the border before the interior,
    the interior and the border after it (call before fusing that loop with others; the
    axis' region must start at 0)."""
    axis, start, stop = (int(v) for v in sch.get(block).annotations[INTERIOR])
    # the loop the block binds its INTERIOR axis to (the axis' own loop at the root; after a
    # compute_at, the loop over the region a task makes)
    loops = sch.get_loops(block)
    binding = sch.get(loops[-1]).body.iter_values[axis]
    loop = next((lp for lp in loops if sch.get(lp).loop_var.same_as(binding)), None)
    if loop is None:  # the region is one column: nothing to split
        return
    extent = int(sch.get(loop).extent)
    cuts = [c for c in (start, stop) if 0 < c < extent]  # no empty part
    if cuts:  # loop_partition takes the sizes of all parts but the last (the rest)
        sch.loop_partition(loop, [b - a for a, b in zip([0, *cuts], cuts)])


def parallelize_interior(sch, block) -> None:
    """Parallel over the loops outside `block`'s INTERIOR axis; that loop split by
    `split_interior`, each part left whole with its inner loops for LLVM, which
    vectorises the interior's test-free copy."""
    axis = int(sch.get(block).annotations[INTERIOR][0])
    outer = sch.get_loops(block)[:axis]
    split_interior(sch, block)
    if outer:
        sch.parallel(sch.fuse(*outer) if len(outer) > 1 else outer[0])


def schedule_layout_transform(sch, func_name: str) -> None:
    """A layout_transform kernel: parallel over all loops but the innermost (the inner
    block: 16 channels of NCHW16c), which TVM vectorises. Measured NCHW -> NCHW16c,
    64x56x56 int8, 1 thread: 0.029 ms; the default fused-and-split vector loop 0.092 ms,
    LLVM's own vectoriser on whole rows 0.068 ms."""
    inline_all(sch, func_name)
    (block,) = root_blocks(sch, func_name)
    *outer, inner = sch.get_loops(block)
    sch.parallel(sch.fuse(*outer))
    sch.vectorize(inner)


def parallelize_rows(sch, block) -> None:
    """Parallel over all loops but the innermost, which stays whole for LLVM: TVM's
    vectoriser scalarises a bounds test (padding) into per-lane index arithmetic."""
    loops = sch.get_loops(block)
    if len(loops) > 1:
        sch.parallel(sch.fuse(*loops[:-1]))


def cuda_target(target: Target, host: dict | None = None):
    """TVM's target for the GPU of `target` (and `host`, TVM's target for the code that
    launches its kernels); the limits hold on every GPU since sm_50 (49152 bytes is the
    static shared memory a kernel may use without opting in)."""
    import tvm

    return tvm.target.Target({"kind": "cuda", "arch": target.arch,
                              "max_shared_memory_per_block": 49152,
                              "max_threads_per_block": 1024, "thread_warp_size": 32},
                             host=host)


def schedule_cuda(mod, target, reductions: bool = True):
    """Bind every loop to blocks/threads: dlight default rules, then a one-thread fallback.

    With `reductions=False` the cross-thread reduction rules are left out: dlight's
    GeneralReduction rule can emit a schedule that TVM 0.27's lowering then rejects
    (small strided/dilated convs); `rules.schedule_and_build` retries such kernels
    without them.
    """
    from tvm import s_tir
    from tvm.s_tir import dlight as dl

    rules = [dl.gpu.Matmul(), dl.gpu.GEMV()]
    if reductions:
        rules += [dl.gpu.Reduction(), dl.gpu.GeneralReduction()]
    rules = [_guarded(rule) for rule in rules]
    # dlight updates the module it is given in place: schedule a copy, so the caller's
    # unscheduled module stays as it was (`rules.schedule_and_build` may reschedule from it).
    mod = type(mod)(dict(mod.functions))
    with target:
        mod = dl.ApplyDefaultSchedule(*rules, dl.gpu.Fallback())(mod)
    for gv, func in list(mod.functions.items()):
        if has_thread_binding(func):
            continue
        sch = s_tir.Schedule(mod)
        sch.work_on(gv.name_hint)
        for b in root_blocks(sch, gv.name_hint):
            loops = sch.get_loops(b)
            inner = sch.add_unit_loop(loops[0] if loops else b)
            sch.bind(inner, "threadIdx.x")
            sch.bind(sch.add_unit_loop(inner), "blockIdx.x")
        mod = sch.mod
    for gv, func in mod.functions.items():
        if not has_thread_binding(func):
            raise CvmcError(f"cuda: kernel '{gv.name_hint}' has no loop bound to GPU threads")
    return mod


def reads_own_output(func) -> bool:
    """True if a block of `func` reads a parameter buffer that it also writes (a
    reduction accumulating in its output in global memory)."""
    from tvm import s_tir

    sch = s_tir.Schedule(func)
    todo = [sch.get_sblock("root")]
    while todo:
        rv = todo.pop()
        block = sch.get(rv)
        for w in block.writes:
            if any(w.source.same_as(p) for p in func.params) and \
                    any(r.source.same_as(w.source) for r in block.reads):
                return True
        todo += sch.get_child_blocks(rv)
    return False


def _guarded(rule):
    """`rule`, not applicable (None) where its analysis fails: dlight's read analysis
    asserts on reads it cannot model (a border-clamped or data-dependent index, as in NNEF's
    reflect-border convs and RoI pooling), and GEMV's epilogue split raises ValueError on a
    1-d epilogue (a packed conv with one output pixel); the next rule (at last Fallback)
    schedules those."""
    from tvm.s_tir.dlight.base import ScheduleRule

    class Guarded(ScheduleRule):
        def apply(self, func, target, tunable):
            try:
                return rule.apply(func, target, tunable)
            except (AssertionError, ValueError):
                return None

    return Guarded()


def has_thread_binding(func) -> bool:
    """True if some loop of `func` is bound to a GPU block index.

    TVM 0.27 exposes no TIR visitor to Python; the printed script names every binding.
    """
    return "blockIdx." in func.script()

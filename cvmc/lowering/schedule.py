"""Default schedules per target (correct and sane; tuning is a later concern).

CPU: inline every stage that can be inlined, then per remaining block fuse the spatial
loops, parallelise the outer part and vectorise an inner part that divides the extent.
CUDA: TVM's dlight default rules; any block they leave unbound runs in one thread of
one block (the sequential vision ops), so no loop ever stays on the host.
"""
from __future__ import annotations

from cvmc.errors import CvmcError

_VECTOR_WIDTHS = (64, 32, 16, 8, 4)


def _root_blocks(sch, func_name: str):
    return sch.get_child_blocks(sch.get_sblock("root", func_name=func_name))


def _inline_all(sch, func_name: str) -> None:
    """Inline every non-output block into its consumer (or its producer) until none can."""
    changed = True
    while changed:
        changed = False
        root = sch.get_sblock("root", func_name=func_name)
        outputs = {sch.get(b).name_hint for b in sch.get_output_blocks(root)}
        for b in sch.get_child_blocks(root):
            if sch.get(b).name_hint in outputs:
                continue
            if _try(sch, lambda s, blk=b: s.compute_inline(blk)) or \
                    _try(sch, lambda s, blk=b: s.reverse_compute_inline(blk)):
                changed = True
                break


def _try(sch, action) -> bool:
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


def schedule_cpu(mod, func_name: str, vectorize: bool = True):
    """Inline elementwise stages; parallel outer loop and vectorised inner loop per block."""
    from tvm import s_tir

    sch = s_tir.Schedule(mod)
    sch.work_on(func_name)
    _inline_all(sch, func_name)
    for b in _root_blocks(sch, func_name):
        _try(sch, lambda s, blk=b: _parallelize(s, blk, vectorize))
    return sch.mod


def cuda_target(arch: str) -> dict:
    """The cuda target dict; the limits hold on every GPU since sm_50 (49152 bytes is the
    static shared memory a kernel may use without opting in)."""
    return {"kind": "cuda", "arch": arch, "max_shared_memory_per_block": 49152,
            "max_threads_per_block": 1024, "thread_warp_size": 32}


def schedule_cuda(mod, target):
    """Bind every loop to blocks/threads: dlight default rules, then a one-thread fallback."""
    from tvm import s_tir
    from tvm.s_tir import dlight as dl

    with target:
        mod = dl.ApplyDefaultSchedule(dl.gpu.Matmul(), dl.gpu.GEMV(), dl.gpu.Reduction(),
                                      dl.gpu.GeneralReduction(), dl.gpu.Fallback())(mod)
    for gv, func in list(mod.functions.items()):
        if has_thread_binding(func):
            continue
        sch = s_tir.Schedule(mod)
        sch.work_on(gv.name_hint)
        for b in _root_blocks(sch, gv.name_hint):
            loops = sch.get_loops(b)
            inner = sch.add_unit_loop(loops[0] if loops else b)
            sch.bind(inner, "threadIdx.x")
            sch.bind(sch.add_unit_loop(inner), "blockIdx.x")
        mod = sch.mod
    for gv, func in mod.functions.items():
        if not has_thread_binding(func):
            raise CvmcError(f"cuda: kernel '{gv.name_hint}' has no loop bound to GPU threads")
    return mod


def has_thread_binding(func) -> bool:
    """True if some loop of `func` is bound to a GPU block index.

    TVM 0.27 exposes no TIR visitor to Python; the printed script names every binding.
    """
    return "blockIdx." in func.script()

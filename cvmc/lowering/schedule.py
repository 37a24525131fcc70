"""Default schedules per target (correct and sane; tuning is a later concern)."""
from __future__ import annotations


def _inline_all(sch, func_name: str) -> None:
    """Inline every block that can be inlined into its consumer/producer."""
    changed = True
    while changed:
        changed = False
        blocks = sch.get_child_blocks(sch.get_sblock("root", func_name=func_name))
        outputs = {sch.get(b).name_hint for b in sch.get_output_blocks(
            sch.get_sblock("root", func_name=func_name))}
        for b in blocks:
            if sch.get(b).name_hint in outputs:
                continue
            for inline in (sch.compute_inline, sch.reverse_compute_inline):
                try:
                    inline(b)
                    changed = True
                    break
                except Exception:  # noqa: BLE001 (TVM raises a generic error: not inlinable)
                    continue
            if changed:
                break


def schedule_cpu(mod, func_name: str):
    """Inline elementwise stages; parallelise the outer spatial loops of each block."""
    from tvm import s_tir

    sch = s_tir.Schedule(mod)
    sch.work_on(func_name)
    _inline_all(sch, func_name)
    for b in sch.get_child_blocks(sch.get_sblock("root", func_name=func_name)):
        iters = sch.get(b).iter_vars
        loops = sch.get_loops(b)
        spatial = 0
        for it in iters:
            if it.iter_type != 0:
                break
            spatial += 1
        if spatial and len(loops) >= spatial:
            sch.parallel(sch.fuse(*loops[:spatial]) if spatial > 1 else loops[0])
    return sch.mod


def schedule_cuda(mod, target):
    """Bind every loop to blocks/threads with TVM's dlight default rules."""
    from tvm.s_tir import dlight as dl

    with target:
        return dl.ApplyDefaultSchedule(dl.gpu.Matmul(), dl.gpu.GEMV(), dl.gpu.Reduction(),
                                       dl.gpu.GeneralReduction(), dl.gpu.Fallback())(mod)

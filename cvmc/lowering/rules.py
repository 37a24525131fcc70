"""Schedule tables: which schedule each kernel gets, by anchor op and the Target's CPU
features, and every fallback when TVM or LLVM rejects one (codegen only builds).

A backend (cvmc/codegen/targets) holds its table: `ScheduleRule` rows. A kernel's anchor
is the first op of its fused group (`cvmc.anchor` on its PrimFunc). The first row whose
anchor and required CPU features match is tried; if TVM rejects it, the next matching row
is. Adding a schedule for an op is one row in its backend's table. CUDA kernels: the rows
of the CUDA backend's table, then TVM's dlight rules for every kernel left
(`schedule_cuda`).
"""
from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from cvmc.lowering.schedule import cuda_target, schedule_cpu, schedule_cuda
from cvmc.ops.te import ANCHOR_ATTR
from cvmc.passes.target import Target


@dataclass(frozen=True)
class ScheduleRule:
    """One row: `apply(schedule, function name)` for kernels anchored on `anchor` (None:
    any) on a CPU with every feature in `features` (LLVM feature names). `facts`, where
    given, proves what `apply` needs from the graph: `facts(anchor node, proven value
    intervals)` -> attributes for the kernel's PrimFunc (`kernel_facts`), which `apply`
    reads (and raises ValueError without, passing the kernel to the next row)."""

    name: str
    anchor: str | None
    features: tuple[str, ...]
    apply: Callable[..., None]
    facts: Callable[..., dict] | None = None


def kernel_facts(anchor, intervals: Callable[[], dict], target: Target,
                 table: Sequence[ScheduleRule]) -> dict:
    """The PrimFunc attributes that the first row of `table` for the kernel anchored on
    node `anchor` proves (`ScheduleRule.facts`; `intervals()` the graph's proven value
    intervals), if that row is for the CPU of `target`; else none."""
    rows = [r for r in table if r.anchor in (None, anchor.op) and target.has(r.features)]
    if target.kind != "llvm" or not rows or rows[0].facts is None:
        return {}
    return rows[0].facts(anchor, intervals())


# When LLVM rejects a vectorised kernel, the whole module is rebuilt with this one.
SCALAR_RULE = ScheduleRule("cpu-scalar", None, (),
                           functools.partial(schedule_cpu, vectorize=False))


def schedule_llvm(mod, target: Target, table: Sequence[ScheduleRule], scalar: bool = False,
                  on_kernel: Callable[[str], None] | None = None):
    """(scheduled module, {kernel symbol: rule name}) for the CPU of `target` by the rows
    of `table` (with `scalar`, SCALAR_RULE alone)."""
    return _apply_rows(mod, lambda anchor: [SCALAR_RULE] if scalar else [
        r for r in table if r.anchor in (None, anchor) and target.has(r.features)
    ], on_kernel)


def schedule_cuda_module(mod, target: Target, table: Sequence[ScheduleRule]):
    """(scheduled module, {kernel symbol: rule name}) for the GPU of `target`: the rows of
    `table`, then dlight."""
    mod, chosen = _apply_rows(mod, lambda anchor: [r for r in table if r.anchor == anchor])
    # dlight leaves alone the functions marked scheduled
    mod = type(mod)({gv: f.with_attr("tirx.is_scheduled", True) if gv.name_hint in chosen
                     else f for gv, f in mod.functions.items()})
    mod = schedule_cuda(mod, cuda_target(target))
    return mod, {gv.name_hint: chosen.get(gv.name_hint, "cuda-dlight") for gv in mod.functions}


def schedule_and_build(mod, target: Target, table: Sequence[ScheduleRule], build: Callable,
                       on_kernel: Callable[[str], None] | None = None):
    """(scheduled module, `build(scheduled module)`, {kernel symbol: rule name}) for
    `target` by the rows of `table`, falling back where the build rejects a schedule.
    llvm: the table's rows;
    if the build fails (a kernel the vectoriser rejects), the whole module again with the
    scalar inner loop (its error propagates). cuda: the table's rows, then dlight; a
    kernel TVM then fails to lower is rescheduled by dlight without its cross-thread
    reduction rules (`_reschedule_rejected_cuda`)."""
    if target.kind == "cuda":
        scheduled, chosen = schedule_cuda_module(mod, target, table)
        try:
            return scheduled, build(scheduled), chosen
        except Exception:  # noqa: BLE001 (TVM surfaces lowering failures as assorted types)
            scheduled, rejected = _reschedule_rejected_cuda(mod, scheduled, target, build)
            chosen.update(dict.fromkeys(rejected, "cuda-dlight-no-reductions"))
            return scheduled, build(scheduled), chosen
    try:
        scheduled, chosen = schedule_llvm(mod, target, table, False, on_kernel)
        return scheduled, build(scheduled), chosen
    except Exception:  # noqa: BLE001 (TVM surfaces codegen failures as assorted types)
        scheduled, chosen = schedule_llvm(mod, target, table, True)
        return scheduled, build(scheduled), chosen


def _reschedule_rejected_cuda(mod, scheduled, target: Target, build: Callable):
    """(`scheduled` with every kernel that `build` fails to lower rescheduled by dlight
    without its cross-thread reduction rules, the names of those kernels); each kernel is
    tried alone to find them. dlight's GeneralReduction rule can emit a schedule that TVM
    0.27's lowering rejects (small strided or dilated convs)."""
    import tvm

    funcs, rejected = {}, []
    for gv, func in scheduled.functions.items():
        try:
            build(tvm.IRModule({gv: func}))
            funcs[gv] = func
        except Exception:  # noqa: BLE001 (TVM surfaces lowering failures as assorted types)
            alone = tvm.IRModule({gv: mod[gv.name_hint]})
            funcs[gv] = schedule_cuda(alone, cuda_target(target),
                                      reductions=False)[gv.name_hint]
            rejected.append(gv.name_hint)
    return tvm.IRModule(funcs), rejected


def _apply_rows(mod, rows_for: Callable[[str | None], list[ScheduleRule]],
                on_kernel: Callable[[str], None] | None = None):
    """Give each kernel the first of `rows_for(its anchor)` that TVM accepts."""
    import tvm
    from tvm import s_tir
    from tvm.s_tir.schedule import ScheduleError

    funcs, chosen = {}, {}
    for gv, func in mod.functions.items():
        anchor = str(func.attrs[ANCHOR_ATTR]) if ANCHOR_ATTR in func.attrs else None
        funcs[gv] = func
        # Each kernel is scheduled in a module of its own: a Schedule of the whole module
        # analyses every function again for each kernel (ResNet-18: 23 s, alone: 4 s).
        alone = tvm.IRModule({gv: func})
        for rule in rows_for(anchor):
            sch = s_tir.Schedule(alone)
            sch.work_on(gv.name_hint)
            try:
                rule.apply(sch, gv.name_hint)
            except (ScheduleError, ValueError):
                continue
            funcs[gv], chosen[gv.name_hint] = sch.mod[gv.name_hint], rule.name
            break
        if on_kernel:
            on_kernel(gv.name_hint)
    return tvm.IRModule(funcs), chosen

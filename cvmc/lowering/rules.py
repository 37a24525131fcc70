"""The schedule table: which schedule each kernel gets, by anchor op and the Target's CPU
features, and every fallback when TVM or LLVM rejects one (codegen only builds).

A kernel's anchor is the first op of its fused group (`cvmc.anchor` on its PrimFunc). The
first rule whose anchor and required CPU features match is tried; if TVM rejects it, the
next matching rule is. Adding a schedule for an op is one row here. CUDA kernels: the
rows of `CUDA_TABLE`, then TVM's dlight rules for every kernel left (`schedule_cuda`).
"""
from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

from cvmc.lowering.aarch64 import schedule_conv_dot
from cvmc.lowering.attention import schedule_attention
from cvmc.lowering.cuda import schedule_conv_cuda, schedule_conv_packed_cuda, schedule_dense_cuda
from cvmc.lowering.depthwise import (
    schedule_depthwise,
    schedule_depthwise_blocked,
    schedule_depthwise_float_blocked,
)
from cvmc.lowering.pool import schedule_box, schedule_max_window
from cvmc.lowering.schedule import (
    cuda_target,
    schedule_cpu,
    schedule_cuda,
    schedule_layout_transform,
)
from cvmc.lowering.x86 import schedule_conv_avx2, schedule_conv_packed
from cvmc.lowering.x86_float import schedule_conv_float
from cvmc.lowering.x86_matmul import schedule_matmul, schedule_matmul_packed
from cvmc.lowering.x86_norm import schedule_layer_norm, schedule_softmax, schedule_sum_rows
from cvmc.ops.te import ANCHOR_ATTR
from cvmc.passes.target import Target


@dataclass(frozen=True)
class ScheduleRule:
    """One row: `apply(schedule, function name)` for kernels anchored on `anchor` (None:
    any) on a CPU with every feature in `features` (LLVM feature names)."""

    name: str
    anchor: str | None
    features: tuple[str, ...]
    apply: Callable[..., None]


SCHEDULE_TABLE: list[ScheduleRule] = [
    ScheduleRule("x86-avx512-vnni", "conv2d_packed", ("avx512vnni",),
                 functools.partial(schedule_conv_packed, vnni=True)),
    # AVX2 without VNNI (haswell, znver3; AVX-512 CPUs without VNNI too, on 256-bit
    # vectors): `vpmaddwd` on int16, 2 partial sums per channel.
    ScheduleRule("x86-avx2", "conv2d_packed", ("avx2",), schedule_conv_avx2),
    # AArch64 (cvmc.lowering.aarch64) with i8mm: `usdot`, VNNI's u8 x s8 on 128-bit vectors;
    # with dotprod: `sdot` (s8 x s8) on the bytes - 128, the 128 x weights added back.
    ScheduleRule("aarch64-i8mm", "conv2d_packed", ("i8mm",),
                 functools.partial(schedule_conv_dot, i8mm=True)),
    ScheduleRule("aarch64-dotprod", "conv2d_packed", ("dotprod",),
                 functools.partial(schedule_conv_dot, i8mm=False)),
    # Any other CPU (x86-64: SSE2; AArch64: NEON): 16 output channels per int32 vector.
    ScheduleRule("cpu-packed-vector", "conv2d_packed", (),
                 functools.partial(schedule_conv_packed, vnni=False)),
    ScheduleRule("cpu-depthwise", "conv2d", (), schedule_depthwise),
    # NCHW16c depthwise convs (`block_activations`): 16 channels in the vector lanes.
    ScheduleRule("cpu-depthwise-blocked", "depthwise_conv2d_blocked", (),
                 schedule_depthwise_blocked),
    # NNEF max_pool (the simplify pass's max_window): columns in lanes, window unrolled.
    ScheduleRule("cpu-max-window", "nnef.max_window", (), schedule_max_window),
    # NNEF avg_pool (box, then its division by the window): as max_window, the taps summed
    # in row-major order in every lane.
    ScheduleRule("cpu-box", "box", (), schedule_box),
    # Float matmul (and linear, its weight transposed back at compile time): a register
    # tile of rows x 1-2 vectors of columns over the whole K loop, epilogue under it.
    ScheduleRule("x86-avx512-matmul", "matmul", ("avx512f",),
                 functools.partial(schedule_matmul, lanes=16, registers=32)),
    ScheduleRule("x86-avx2-matmul", "matmul", ("avx2", "fma"),
                 functools.partial(schedule_matmul, lanes=8, registers=16)),
    ScheduleRule("cpu-matmul", "matmul", (), functools.partial(schedule_matmul, lanes=4,
                                                                  registers=16)),
    # matmul on a constant B packed in column panels (cvmc/passes/matmul_weights.py): the
    # same tile, one panel wide, its K loop blocked so that a panel block stays in L1.
    ScheduleRule("x86-avx512-matmul-packed", "matmul_packed", ("avx512f",),
                 functools.partial(schedule_matmul_packed, lanes=16, registers=32)),
    ScheduleRule("x86-avx2-matmul-packed", "matmul_packed", ("avx2", "fma"),
                 functools.partial(schedule_matmul_packed, lanes=8, registers=16)),
    ScheduleRule("cpu-matmul-packed", "matmul_packed", (),
                 functools.partial(schedule_matmul_packed, lanes=4, registers=16)),
    # Float convs on filters packed OIHW{8|16}o (cvmc/passes/layout_float.py): a register
    # tile of FMAs, output channels in the lanes; the tile sized by the vector registers.
    ScheduleRule("x86-avx512-float-conv", "conv_packed", ("avx512f",),
                 functools.partial(schedule_conv_float, avx512=True)),
    ScheduleRule("x86-avx2-float-conv", "conv_packed", ("avx2", "fma"), schedule_conv_float),
    ScheduleRule("cpu-float-conv", "conv_packed", (), schedule_conv_float),
    # Float convs reading and/or writing NCHW{8|16}c activations (block-float-activations):
    # the same register tile, whole B-channel vectors stored.
    ScheduleRule("x86-avx512-float-conv-blocked", "conv_packed_blocked", ("avx512f",),
                 functools.partial(schedule_conv_float, avx512=True)),
    ScheduleRule("x86-avx2-float-conv-blocked", "conv_packed_blocked", ("avx2", "fma"),
                 schedule_conv_float),
    ScheduleRule("cpu-float-conv-blocked", "conv_packed_blocked", (), schedule_conv_float),
    # Float depth-wise convs on NCHW{8|16}c: B channels in the vector lanes.
    ScheduleRule("cpu-float-depthwise-blocked", "depthwise_conv_blocked", (),
                 schedule_depthwise_float_blocked),
    # NNEF's float depth-wise conv (multiplier 1; the layout pass leaves it as it is).
    ScheduleRule("cpu-float-depthwise", "conv", (), schedule_depthwise),
    # Attention scores (cvmc/ops/transformer.py): one row of q k^T, scale and softmax per
    # parallel step, the scores in a row buffer, the key axis vectorised.
    ScheduleRule("cpu-attention", "attention_scores", (), schedule_attention),
    # Float row reductions (cvmc/lowering/x86_norm.py): one row per parallel step, sums in
    # vector lanes in a fixed order; layer_norm's statistics in two passes over its row,
    # softmax's exps once each into a row buffer.
    ScheduleRule("cpu-sum-rows", "sum_reduce", (), schedule_sum_rows),
    ScheduleRule("cpu-layer-norm", "layer_norm", (), schedule_layer_norm),
    ScheduleRule("cpu-softmax", "fused_softmax", (), schedule_softmax),
    ScheduleRule("cpu-layout-transform", "layout_transform", (), schedule_layout_transform),
    ScheduleRule("cpu-float-layout-transform", "float_layout_transform", (),
                 schedule_layout_transform),
    ScheduleRule("cpu-default", None, (), functools.partial(schedule_cpu, vectorize=True)),
]
# When LLVM rejects a vectorised kernel, the whole module is rebuilt with this one.
SCALAR_RULE = ScheduleRule("cpu-scalar", None, (),
                           functools.partial(schedule_cpu, vectorize=False))


def schedule_llvm(mod, target: Target, scalar: bool = False,
                  on_kernel: Callable[[str], None] | None = None):
    """(scheduled module, {kernel symbol: rule name}) for the CPU of `target`."""
    return _apply_rows(mod, lambda anchor: [SCALAR_RULE] if scalar else [
        r for r in SCHEDULE_TABLE if r.anchor in (None, anchor) and target.has(r.features)
    ], on_kernel)


# CUDA kernels: these rows first; every kernel none of them takes gets TVM's dlight rules.
CUDA_TABLE: list[ScheduleRule] = [
    ScheduleRule("cuda-conv-dp4a", "conv2d_packed", (), schedule_conv_packed_cuda),
    ScheduleRule("cuda-dense-dp4a", "dense", (), schedule_dense_cuda),
    # Convs the layout pass leaves as they are: depthwise, grouped without whole 16-channel
    # blocks per group, a weight that is not a constant.
    ScheduleRule("cuda-conv-register-tile", "conv2d", (), schedule_conv_cuda),
]


def schedule_cuda_module(mod, target: Target):
    """(scheduled module, {kernel symbol: rule name}) for the GPU of `target`."""

    mod, chosen = _apply_rows(mod, lambda anchor: [r for r in CUDA_TABLE if r.anchor == anchor])
    # dlight leaves alone the functions marked scheduled
    mod = type(mod)({gv: f.with_attr("tirx.is_scheduled", True) if gv.name_hint in chosen
                     else f for gv, f in mod.functions.items()})
    mod = schedule_cuda(mod, cuda_target(target))
    return mod, {gv.name_hint: chosen.get(gv.name_hint, "cuda-dlight") for gv in mod.functions}


def schedule_and_build(mod, target: Target, build: Callable,
                       on_kernel: Callable[[str], None] | None = None):
    """(scheduled module, `build(scheduled module)`, {kernel symbol: rule name}) for
    `target`, falling back where the build rejects a schedule. llvm: the table's rows;
    if the build fails (a kernel the vectoriser rejects), the whole module again with the
    scalar inner loop (its error propagates). cuda: `CUDA_TABLE`'s rows, then dlight; a
    kernel TVM then fails to lower is rescheduled by dlight without its cross-thread
    reduction rules (`_reschedule_rejected_cuda`)."""
    if target.kind == "cuda":
        scheduled, chosen = schedule_cuda_module(mod, target)
        try:
            return scheduled, build(scheduled), chosen
        except Exception:  # noqa: BLE001 (TVM surfaces lowering failures as assorted types)
            scheduled, rejected = _reschedule_rejected_cuda(mod, scheduled, target, build)
            chosen.update(dict.fromkeys(rejected, "cuda-dlight-no-reductions"))
            return scheduled, build(scheduled), chosen
    try:
        scheduled, chosen = schedule_llvm(mod, target, False, on_kernel)
        return scheduled, build(scheduled), chosen
    except Exception:  # noqa: BLE001 (TVM surfaces codegen failures as assorted types)
        scheduled, chosen = schedule_llvm(mod, target, True)
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

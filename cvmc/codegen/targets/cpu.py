"""What the CPU backends (x86, AArch64) share: the LLVM pass list, the schedule rows for any
CPU (a backend's own rows come first: the first row that fits a kernel takes it), and the
build: every kernel compiled on its own by LLVM, in worker processes and through the
kernel cache (`cvmc.codegen.build.build_llvm`)."""
from __future__ import annotations

import functools
from collections.abc import Callable

from cvmc.codegen.build import Built, build_llvm, start_workers
from cvmc.codegen.cache import KernelCache, cache_folder
from cvmc.codegen.targets.base import Backend
from cvmc.lowering.attention import schedule_attention
from cvmc.lowering.depthwise import (
    schedule_depthwise,
    schedule_depthwise_blocked,
    schedule_depthwise_float_blocked,
)
from cvmc.lowering.pool import schedule_box, schedule_max_window
from cvmc.lowering.rules import ScheduleRule, schedule_llvm
from cvmc.lowering.schedule import schedule_cpu, schedule_layout_transform
from cvmc.lowering.x86 import schedule_conv_packed
from cvmc.lowering.x86_float import schedule_conv_float
from cvmc.lowering.x86_matmul import schedule_matmul, schedule_matmul_packed
from cvmc.lowering.x86_norm import schedule_layer_norm, schedule_softmax, schedule_sum_rows
from cvmc.passes import pipeline
from cvmc.passes.target import Target

CPU_PASSES = (
    pipeline.INFER_PRECISION, pipeline.PACK_CONV_WEIGHTS, pipeline.PACK_FLOAT_CONVS,
    pipeline.FUSE_TRANSFORMER, pipeline.UNTRANSPOSE_MATMUL_WEIGHTS,
    pipeline.PACK_MATMUL_WEIGHTS, pipeline.FOLD_CONSTANTS, pipeline.SIMPLIFY,
    pipeline.ELIMINATE_DEAD_CODE, pipeline.BLOCK_ACTIVATIONS,
    pipeline.BLOCK_FLOAT_ACTIVATIONS, pipeline.FUSE_KERNELS,
)

CPU_ROWS = (
    # Any CPU (x86-64: SSE2; AArch64: NEON) without a row of its own: 16 output channels
    # per int32 vector.
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
    ScheduleRule("cpu-matmul", "matmul", (), functools.partial(schedule_matmul, lanes=4,
                                                                  registers=16)),
    # matmul on a constant B packed in column panels (cvmc/passes/matmul_weights.py): the
    # same tile, one panel wide, its K loop blocked so that a panel block stays in L1.
    ScheduleRule("cpu-matmul-packed", "matmul_packed", (),
                 functools.partial(schedule_matmul_packed, lanes=4, registers=16)),
    # Float convs on filters packed OIHW{8|16}o (cvmc/passes/layout_float.py): a register
    # tile of FMAs, output channels in the lanes; the tile sized by the vector registers.
    ScheduleRule("cpu-float-conv", "conv_packed", (), schedule_conv_float),
    # Float convs reading and/or writing NCHW{8|16}c activations (block-float-activations):
    # the same register tile, whole B-channel vectors stored.
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
)


class CpuBackend(Backend):
    """A CPU backend: LLVM builds each kernel on its own (`build_llvm`)."""

    def start(self, kernels: int, jobs: int | None) -> None:
        start_workers(kernels, jobs)

    def schedule(self, mod, target: Target):
        return schedule_llvm(mod, target, self.schedules)

    def build(self, mod, target: Target, plan: dict,
              on_kernel: Callable[[str], None] | None = None, jobs: int | None = None,
              cache: bool = True) -> Built:
        folder = cache_folder() if cache else None
        return build_llvm(mod, target, self.schedules, on_kernel, plan, jobs,
                          KernelCache(folder) if folder else None)

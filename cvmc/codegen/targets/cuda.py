"""The CUDA backend (`--target cuda --arch sm_XY`): the passes a GPU graph takes (int8 convs
packed for `dp4a`, no CPU float layouts), cvmc's own schedule rows (dp4a convs and dense,
a register-tiled conv) before TVM's dlight for every other kernel, and kernels that take
their intermediate stages as scratch buffers where dlight would need global memory. Built
by nvcc: one translation unit, ahead of time (`cvmc.codegen.build.build_cuda`)."""
from __future__ import annotations

from collections.abc import Callable

from cvmc.codegen.build import Built, build_cuda, check_cuda_arch
from cvmc.codegen.targets.backend import Backend
from cvmc.lowering.cuda import schedule_conv_cuda, schedule_conv_packed_cuda, schedule_dense_cuda
from cvmc.lowering.rules import ScheduleRule, schedule_cuda_module
from cvmc.passes import pipeline
from cvmc.passes.target import Target

PASSES = (
    pipeline.INFER_PRECISION, pipeline.PACK_CONV_WEIGHTS, pipeline.FOLD_CONSTANTS,
    pipeline.SIMPLIFY, pipeline.ELIMINATE_DEAD_CODE, pipeline.BLOCK_ACTIVATIONS,
    pipeline.FUSE_KERNELS,
)

ROWS = (
    ScheduleRule("cuda-conv-dp4a", "conv2d_packed", (), schedule_conv_packed_cuda),
    ScheduleRule("cuda-dense-dp4a", "dense", (), schedule_dense_cuda),
    # Convs the layout pass leaves as they are: depthwise, grouped without whole 16-channel
    # blocks per group, a weight that is not a constant.
    ScheduleRule("cuda-conv-register-tile", "conv2d", (), schedule_conv_cuda),
)


class CudaBackend(Backend):
    """The CUDA backend: nvcc builds every kernel in one translation unit (no worker
    processes, no kernel cache)."""

    def check(self, target: Target) -> None:
        check_cuda_arch(target)

    def schedule(self, mod, target: Target):
        return schedule_cuda_module(mod, target, self.schedules)

    def build(self, mod, target: Target, plan: dict,
              on_kernel: Callable[[str], None] | None = None, jobs: int | None = None,
              cache: bool = True) -> Built:
        return build_cuda(mod, target, self.schedules, on_kernel, plan)


BACKEND = CudaBackend("cuda", "cuda", ("",), PASSES, ROWS)

"""The CUDA backend (`--target cuda --arch sm_XY`): the passes a GPU graph takes (int8 convs
packed for `dp4a`, no CPU float layouts), cvmc's own schedule rows (dp4a convs and dense,
a register-tiled conv) before TVM's dlight for every other kernel, and kernels that take
their intermediate stages as scratch buffers where dlight would need global memory. Built
by nvcc: device kernels and their host wrappers (TVM's `cuda_host` route) in one .cu
translation unit, ahead of time, with the small device-memory helpers the runtime needs
(cvmc_empty / cvmc_copy)."""
from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path

from cvmc.codegen.build import Built, kernel_signatures
from cvmc.codegen.shim import CUDA_DEVICE_HELPERS_CU, CUDA_HELPERS_CU, signature_source
from cvmc.codegen.targets.base import Backend
from cvmc.errors import CvmcError
from cvmc.lowering.cuda import schedule_conv_cuda, schedule_conv_packed_cuda, schedule_dense_cuda
from cvmc.lowering.rules import ScheduleRule, schedule_and_build, schedule_cuda_module
from cvmc.lowering.schedule import cuda_target, reads_own_output
from cvmc.passes import pipeline
from cvmc.passes.target import Target

NVCC_CANDIDATES = ("/usr/local/cuda/bin/nvcc", "nvcc")

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


def find_nvcc() -> str:
    """Path of nvcc, or a CvmcError saying how to get one."""
    for candidate in NVCC_CANDIDATES:
        found = shutil.which(candidate)
        if found:
            return found
    raise CvmcError("--target cuda needs nvcc (CUDA toolkit) on the compiling machine; "
                    "none found at /usr/local/cuda/bin/nvcc or on PATH")


def cuda_translation_unit(mod, target: Target,
                          on_kernel: Callable[[str], None] | None = None):
    """(scheduled module, one .cu source with kernels, host wrappers and memory helpers,
    {kernel: schedule rule}) for the GPU of `target`, scheduled by ROWS (then dlight)."""
    import tvm
    import tvm.backend.cuda

    device = cuda_target(target, host={"kind": "cuda_host"})
    scheduled, ex, rules = schedule_and_build(mod, target, ROWS,
                                              lambda m: tvm.compile(m, target=device))
    # A function left without thread bindings compiles to host-only code: catch it here.
    if len(ex.mod.imports) == 0:
        raise CvmcError("cuda build produced no device code")
    for gv in scheduled.functions:
        if on_kernel:
            on_kernel(gv.name_hint)
    source = CUDA_DEVICE_HELPERS_CU + tvm.backend.cuda.export_cuda_host(ex.mod) + CUDA_HELPERS_CU
    return scheduled, without_restrict(source, [gv.name_hint for gv, f in
                                                scheduled.functions.items()
                                                if reads_own_output(f)]), rules


def without_restrict(source: str, symbols: list[str]) -> str:
    """`source` with `__restrict__` dropped from the device kernels of `symbols`.

    nvcc 13.0 miscompiles a kernel that accumulates in its output buffer when its
    pointers are `__restrict__` (as TVM always declares them): a float min_reduce's
    `acc = v < acc ? x[i] : out[j]` became one load through a selected pointer, issued
    through the read-only cache (LDG.CONSTANT) and so reading a stale accumulator; on an
    H100 it returned the wrong element (tests/gpu). Without the promise nvcc keeps plain
    loads. Only these kernels (reductions left in global memory) lose it.
    """
    if not symbols:
        return source
    names = "|".join(map(re.escape, symbols))
    kernel = re.compile(rf"__global__ .*\b(?:{names})_kernel(?:_\d+)?\(")
    return "".join(line.replace(" __restrict__", "") if kernel.search(line) else line
                   for line in source.splitlines(keepends=True))


def nvcc_shared(source: str, target: Target, output: Path) -> None:
    """Compile a .cu translation unit ahead of time into a shared library for the GPU of
    `target`."""
    import tvm_ffi

    cu, cc = output.with_suffix(".cu"), target.cuda_arch
    cu.write_text(source)
    include = tvm_ffi.libinfo.find_include_path()
    libdir = Path(tvm_ffi.__file__).parent / "lib"
    # -diag-suppress 174: the generated host code has expression statements like "0;".
    cmd = [find_nvcc(), "-shared", "-O2", "-std=c++17", "-Xcompiler", "-fPIC",
           "-diag-suppress", "174",
           f"-gencode=arch=compute_{cc},code=[sm_{cc},compute_{cc}]",
           f"-I{include}", f"-I{Path(include) / 'dlpack'}", f"-L{libdir}", "-ltvm_ffi",
           "-o", str(output), str(cu)]
    proc = subprocess.run(cmd, check=False, capture_output=True, text=True)
    if proc.returncode != 0:
        raise CvmcError(f"nvcc failed for {target.arch}:\n{proc.stderr[-4000:]}")


def check_cuda_arch(target: Target) -> None:
    """Raise a CvmcError unless this machine's nvcc can build for the arch of `target`
    (checked before any work: nvcc would fail late)."""
    arch = target.arch
    nvcc = find_nvcc()
    listed = subprocess.run([nvcc, "--list-gpu-arch"], check=False, capture_output=True,
                            text=True)
    known = listed.stdout.split()
    # An nvcc too old to list its archs is left to say so itself when it compiles.
    if listed.returncode == 0 and known and f"compute_{target.cuda_arch}" not in known:
        archs = ", ".join(k.replace("compute_", "sm_") for k in known)
        raise CvmcError(f"--arch {arch}: {nvcc} cannot build for it; it builds for {archs}")


def build_cuda(mod, target: Target, on_kernel: Callable[[str], None] | None = None,
               plan: dict | None = None) -> Built:
    """Schedule (by ROWS, then dlight), generate and nvcc-compile `mod` for the CUDA GPU of
    `target` (its arch checked by check_cuda_arch first), with the signature of `plan`'s kernels when given
    (as build_llvm)."""
    from cvmc_runtime import signature_json

    arch = target.arch
    try:
        scheduled, source, rules = cuda_translation_unit(mod, target, on_kernel)
    except (CvmcError, KeyboardInterrupt):
        raise
    except Exception as e:  # noqa: BLE001 (TVM raises assorted types; none may escape raw)
        # TVM's message ends its text (after any traceback TVM adds)
        reason = (str(e).strip().splitlines() or [type(e).__name__])[-1]
        raise CvmcError(f"--arch {arch}: TVM could not generate CUDA code ({reason})") from None
    if plan is not None:
        source += signature_source(signature_json(target.describe(),
                                                  kernel_signatures(mod, plan)))
    with tempfile.TemporaryDirectory(prefix="cvmc-") as tmp:
        lib = Path(tmp) / "kernels.so"
        nvcc_shared(source, target, lib)
        tir = scheduled.script()
        return Built(lib.read_bytes(), target.describe(), "cu", rules, lambda: (tir, source))


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
        return build_cuda(mod, target, on_kernel, plan)


BACKEND = CudaBackend("cuda", "cuda", ("",), PASSES, ROWS)

"""Build an IRModule of PrimFuncs into one shared library for llvm (host CPU) or cuda.

llvm: TVM's LLVM backend, linked with the backend shim (cvmc.codegen.shim) so the library
runs with apache-tvm-ffi alone. cuda: the `cuda_host` route: device kernels and their
host wrappers become one .cu translation unit that nvcc compiles ahead of time, with the
small device-memory helpers the runtime needs (cvmc_empty / cvmc_copy).
"""
from __future__ import annotations

import atexit
import functools
import re
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from cvmc.codegen.cpu_features import needed_features, warn_if_not_host
from cvmc.codegen.shim import SHIM_C, signature_source
from cvmc.errors import CvmcError
from cvmc.lowering.rules import schedule_and_build
from cvmc.lowering.schedule import cuda_target, reads_own_output
from cvmc.passes.target import Target, host_cpu

NVCC_CANDIDATES = ("/usr/local/cuda/bin/nvcc", "nvcc")


@dataclass
class Built:
    """A built kernel library: its bytes, the target dict, scheduled TIR and source, and the
    schedule rule each kernel got."""

    library: bytes
    target: dict
    tir: str
    source: str
    source_suffix: str
    schedules: dict[str, str]


def _gcc_object(source: str, folder: Path, name: str, what: str) -> Path:
    """`source` (C) compiled by gcc into `folder/name.o`, with tvm-ffi's headers."""
    import tvm_ffi

    (folder / f"{name}.c").write_text(source)
    obj = folder / f"{name}.o"
    proc = subprocess.run(["gcc", "-O2", "-fPIC", "-pthread",
                           f"-I{tvm_ffi.libinfo.find_include_path()}", "-c",
                           str(folder / f"{name}.c"), "-o", str(obj)],
                          check=False, capture_output=True, text=True)
    if proc.returncode != 0:
        raise CvmcError(f"cannot compile {what} with gcc:\n{proc.stderr[-4000:]}")
    return obj


@functools.cache
def _shim_object() -> Path:
    """The backend shim compiled once per process (linked into every CPU library)."""
    tmp = Path(tempfile.mkdtemp(prefix="cvmc-shim-"))
    atexit.register(shutil.rmtree, tmp, True)
    return _gcc_object(SHIM_C, tmp, "shim", "the CPU backend shim")


def kernel_signatures(mod, plan: dict) -> list[dict]:
    """The `plan`'s kernels as a library signature (cvmc_runtime.library): each with its
    arguments' shapes and dtypes as its PrimFunc in `mod` declares them, and the
    precisions the compiler's overflow proof assumed."""
    precisions = {s["name"]: s.get("precision")
                  for key in ("inputs", "weights", "buffers", "outputs") for s in plan[key]}
    out = []
    for kernel in plan["kernels"]:
        buffers = mod[kernel["symbol"]].params  # TVM 0.27: each param carries its buffer
        assert len(buffers) == len(kernel["args"]), kernel["symbol"]
        out.append({"symbol": kernel["symbol"], "num_inputs": kernel["num_inputs"],
                    "args": [{"name": name, "shape": [int(d) for d in b.shape],
                              "dtype": str(b.dtype), "precision": precisions[name]}
                             for name, b in zip(kernel["args"], buffers)]})
    return out


def build_llvm(mod, target: Target, on_kernel: Callable[[str], None] | None = None,
               plan: dict | None = None) -> Built:
    """Schedule (the schedule table, `cvmc.lowering.rules`) and compile `mod` for the CPU
    of `target`; returns the linked library, holding the signature of `plan`'s kernels
    when given (a library to load with cvmc_runtime.load needs it)."""
    import tvm
    from cvmc_runtime import signature_json

    features = needed_features(target.mcpu)
    warn_if_not_host(target.mcpu, host_cpu(), features)
    scheduled, ex, rules = schedule_and_build(
        mod, target, lambda m: tvm.compile(m, target=target.describe()), on_kernel)
    built_for = {**target.describe(), "features": features}
    with tempfile.TemporaryDirectory(prefix="cvmc-") as tmp:
        addons = [_shim_object()]
        if plan is not None:
            text = signature_json(built_for, kernel_signatures(mod, plan))
            addons.append(_gcc_object(signature_source(text), Path(tmp), "signature",
                                      "the library signature"))
        lib = Path(tmp) / "kernels.so"
        ex.export_library(str(lib), addons=[str(a) for a in addons], options=["-pthread"])
        return Built(lib.read_bytes(), built_for, scheduled.script(),
                     ex.mod.inspect_source("ll"), "ll", rules)


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
    {kernel: schedule rule}) for the GPU of `target`."""
    import tvm
    import tvm.backend.cuda

    from cvmc.codegen.shim import CUDA_DEVICE_HELPERS_CU, CUDA_HELPERS_CU

    device = tvm.target.Target(cuda_target(target.arch), host={"kind": "cuda_host"})
    scheduled, ex, rules = schedule_and_build(mod, target,
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


def nvcc_shared(source: str, arch: str, output: Path) -> None:
    """Compile a .cu translation unit ahead of time into a shared library."""
    import tvm_ffi

    cu = output.with_suffix(".cu")
    cu.write_text(source)
    include = tvm_ffi.libinfo.find_include_path()
    libdir = Path(tvm_ffi.__file__).parent / "lib"
    # -diag-suppress 174: the generated host code has expression statements like "0;".
    cmd = [find_nvcc(), "-shared", "-O2", "-std=c++17", "-Xcompiler", "-fPIC",
           "-diag-suppress", "174",
           f"-gencode=arch=compute_{arch[3:]},code=[sm_{arch[3:]},compute_{arch[3:]}]",
           f"-I{include}", f"-I{Path(include) / 'dlpack'}", f"-L{libdir}", "-ltvm_ffi",
           "-o", str(output), str(cu)]
    proc = subprocess.run(cmd, check=False, capture_output=True, text=True)
    if proc.returncode != 0:
        raise CvmcError(f"nvcc failed for {arch}:\n{proc.stderr[-4000:]}")


def check_cuda_arch(target: Target) -> None:
    """Raise a CvmcError unless this machine's nvcc can build for the arch of `target`
    (checked before any work: nvcc would fail late)."""
    arch = target.arch
    nvcc = find_nvcc()
    listed = subprocess.run([nvcc, "--list-gpu-arch"], check=False, capture_output=True,
                            text=True)
    known = listed.stdout.split()
    # An nvcc too old to list its archs is left to say so itself when it compiles.
    if listed.returncode == 0 and known and f"compute_{arch[3:]}" not in known:
        archs = ", ".join(k.replace("compute_", "sm_") for k in known)
        raise CvmcError(f"--arch {arch}: {nvcc} cannot build for it; it builds for {archs}")


def build_cuda(mod, target: Target, on_kernel: Callable[[str], None] | None = None,
               plan: dict | None = None) -> Built:
    """Schedule, generate and nvcc-compile `mod` for the CUDA GPU of `target` (its arch
    checked by check_cuda_arch first), with the signature of `plan`'s kernels when given
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
        nvcc_shared(source, arch, lib)
        return Built(lib.read_bytes(), target.describe(), scheduled.script(), source, "cu",
                     rules)

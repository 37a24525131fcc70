"""What a compile is for: one `Target`, built once from `--target`, `--mcpu`, `--mtriple`
and `--arch`.

The passes, the lowering and codegen all take it: the kind ("llvm" or "cuda"), the LLVM
CPU and its features (the schedule table's rows require them), the CUDA arch (the CUDA
probe and nvcc build for it), which ops the layout pass packs and which anchors take
their epilogue in one kernel. Nothing here imports TVM until a CPU's features or the
host CPU are asked for (only compiling does).
"""
from __future__ import annotations

import functools
import re
from dataclasses import dataclass

from cvmc.errors import CvmcError
from cvmc.ops import all_ops, lookup

KINDS = ("llvm", "cuda")
# The triples cvmc cross-compiles CPU kernels for (into a C library; `--mtriple`), each
# with the CPU its --mcpu defaults to.
CROSS_TRIPLES = {"aarch64-linux-gnu": "generic"}
DEFAULT_ARCH = "sm_80"
# The oldest CUDA GPUs the kernels run on: compute capability 6.1 brought dp4a, which the
# conv and dense schedules use.
MIN_CUDA_ARCH = 61
# The LLVM triples of x86 CPUs (their features the runtime checks through /proc/cpuinfo).
X86_TRIPLES = ("x86_64", "i386", "i686")


@dataclass(frozen=True)
class Target:
    """A compile target, every fact about it computed once by `Target.make` (which checks
    the names and fills in the defaults): `kind`; for llvm the CPU `mcpu`, the cross
    triple `mtriple` ("" for the host's), the LLVM `triple` compiled for, the CPU's LLVM
    `features`, its widest vector in `vector_bits` and its vector `registers`; for cuda
    the `arch` ("sm_80") and its compute capability as a number, `cuda_arch` (80). And the
    exp the lowering builds: the vectorising polynomial on the CPU (`polynomial_exp`,
    cvmc/ops/fastmath.py), the C library's expf on the GPU."""

    kind: str
    mcpu: str = ""
    arch: str = ""
    mtriple: str = ""
    triple: str = ""
    features: frozenset[str] = frozenset()
    vector_bits: int = 0
    registers: int = 0
    cuda_arch: int = 0
    polynomial_exp: bool = False

    @classmethod
    def make(cls, kind: str = "llvm", mcpu: str | None = None, arch: str | None = None,
             mtriple: str | None = None) -> Target:
        """The target for `kind`: llvm on `mcpu` (default: the host CPU; a name LLVM does
        not know is a CvmcError), or on `mtriple`, one of CROSS_TRIPLES (default mcpu: its
        own); cuda on `arch` (default sm_80; sm_61 or newer)."""
        if kind not in KINDS:
            raise CvmcError(f"unknown target '{kind}'; expected one of {', '.join(KINDS)}")
        if mtriple and (kind != "llvm" or mtriple not in CROSS_TRIPLES):
            raise CvmcError(f"--mtriple {mtriple}: cvmc cross-compiles llvm kernels for "
                            f"{', '.join(CROSS_TRIPLES)} only")
        if kind == "cuda":
            arch = arch or DEFAULT_ARCH
            problem = cuda_arch_problem(arch)
            if problem:
                raise CvmcError(f"--arch {arch}: {problem}")
            return cls(kind, arch=arch, cuda_arch=int(arch.removeprefix("sm_")))
        mcpu = mcpu or (CROSS_TRIPLES[mtriple] if mtriple else host_cpu())
        triple = mtriple or host_triple()
        _check_cpu(mcpu, triple)
        features = llvm_features(mcpu, mtriple or "")
        bits, registers = vector_registers(triple, features)
        return cls(kind, mcpu=mcpu, mtriple=mtriple or "", triple=triple, features=features,
                   vector_bits=bits, registers=registers, polynomial_exp=True)

    def has(self, features) -> bool:
        """True if the CPU has every feature in `features` (LLVM names)."""
        return set(features) <= self.features

    @property
    def x86(self) -> bool:
        """True for an x86 CPU."""
        return self.triple.startswith(X86_TRIPLES)

    def packs(self, op: str) -> bool:
        """True if the layout pass gives `op`'s weights the packed layout on this target
        (its record's `packed_on`)."""
        return self.kind in lookup(op).packed_on

    @property
    def epilogue_anchors(self) -> frozenset[str] | None:
        """The ops that anchor a kernel with its element-wise epilogue (None: any): on
        llvm any op, on cuda those whose record's `epilogue_on` names it (a row of the
        CUDA schedule table is anchored on each; dlight, which schedules the rest, wants
        a reduction alone: tests/lowering/test_fusion_and_plan.py checks they agree)."""
        if self.kind == "llvm":
            return None
        return frozenset(d.name for d in all_ops() if self.kind in d.epilogue_on)

    def describe(self) -> dict:
        """The kind and its CPU or GPU, as TVM's target dict and the artifact's plan name
        them."""
        if self.kind == "cuda":
            return {"kind": "cuda", "arch": self.arch}
        cross = {"mtriple": self.mtriple} if self.mtriple else {}
        return {"kind": "llvm", "mcpu": self.mcpu, **cross}


def vector_registers(triple: str, features: frozenset[str]) -> tuple[int, int]:
    """(bits of the widest vector register, how many vector registers) of a CPU: x86 has
    16 of 128 bits (SSE2), 256 with AVX2, 32 of 512 with AVX-512; AArch64 32 of 128
    (NEON)."""
    if not triple.startswith(X86_TRIPLES):
        return 128, 32
    if "avx512f" in features:
        return 512, 32
    return (256 if "avx2" in features else 128), 16


def compiler_tvm():
    """`tvm`, with its compiler library loaded: the first thing compiling asks of TVM. TVM
    falls back to its runtime alone, without a word, when that library does not load,
    and its first compiler function is then missing: a CvmcError says so instead, as
    running out of memory when the process has an address-space limit (`ulimit -v`),
    which that 260 MB library is the first to hit."""
    import resource

    limit = resource.getrlimit(resource.RLIMIT_AS)[0]
    within = "" if limit == resource.RLIM_INFINITY else (
        f" within this process's address-space limit of {limit >> 20} MiB (ulimit -v); "
        "raise it")
    try:
        import tvm
    except MemoryError:
        raise CvmcError(f"out of memory loading TVM{within}") from None
    if "tvm_compiler" not in tvm.base._LOADED_LIBS:
        if within:
            raise CvmcError(f"out of memory: TVM's compiler library does not load{within}")
        raise CvmcError("TVM's compiler library (libtvm_compiler.so) does not load: this "
                        "TVM can only run models; reinstall apache-tvm")
    return tvm


@functools.cache
def host_triple() -> str:
    """The host's LLVM target triple."""
    tvm = compiler_tvm()
    return str(tvm.target.Target.from_device(tvm.cpu()).attrs["mtriple"])


@functools.cache
def host_cpu() -> str:
    """The host CPU's LLVM name (never LLVM's generic fallback)."""
    tvm = compiler_tvm()
    return str(tvm.target.Target.from_device(tvm.cpu()).attrs["mcpu"])


@functools.cache
def llvm_features(mcpu: str, mtriple: str = "") -> frozenset[str]:
    """The features LLVM enables for `mcpu` (on `mtriple`, "" for the host's)."""
    tvm = compiler_tvm()
    from tvm.target import codegen

    cross = {"mtriple": mtriple} if mtriple else {}
    return frozenset(str(f) for f in codegen.llvm_get_cpu_features(
        tvm.target.Target({"kind": "llvm", "mcpu": mcpu, **cross})))


def _check_cpu(mcpu: str, triple: str) -> None:
    """Reject a CPU name LLVM does not know for `triple` (it would silently fall back to
    generic)."""
    tvm = compiler_tvm()
    from tvm.target import codegen

    if not codegen.llvm_is_valid_cpu(mcpu, triple):
        close = [c for c in codegen.llvm_get_cpu_archlist(
                     tvm.target.Target({"kind": "llvm", "mtriple": triple})) if c[:3] == mcpu[:3]][:8]
        hint = f"; similar: {', '.join(close)}" if close else ""
        raise CvmcError(f"--mcpu {mcpu}: not a CPU LLVM knows for {triple}{hint}")


def cuda_arch_problem(arch: str) -> str | None:
    """Why `arch` names no CUDA GPU cvmc compiles for (None when it does): it must be
    sm_<major><minor>, compute capability 6.1 or newer."""
    digits = arch.removeprefix("sm_")
    if arch.startswith("sm_") and re.fullmatch(r"[1-9][0-9]+", digits) \
            and int(digits) >= MIN_CUDA_ARCH:
        return None
    return (f"expected sm_<major><minor> of compute capability 6.1 or newer (the kernels use "
            f"dp4a), e.g. sm_80 or sm_90; got '{arch}'")

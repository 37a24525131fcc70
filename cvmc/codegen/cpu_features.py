"""The CPU features an x86 kernel library needs: what the runtime checks before loading it.

LLVM enables a set of features for each `--mcpu`; generated code may use the
instruction-set extensions among them, so a library built for a newer CPU dies with
SIGILL on an older one. Every feature LLVM knows for x86 is classified here, explicitly:
- needed: an extension generated code may use, with the /proc/cpuinfo flag the runtime
  checks (cvmc_runtime.cpu.CPUINFO_FLAGS);
- never emitted: extensions LLVM selects only for their own intrinsics, which cvmc's
  kernels never call (cryptography, AMX tiles, system and privileged instructions);
- tuning: scheduling preferences, no instructions of their own.
A feature in none of these (a newer LLVM), or one Linux lists no flag for (APX, AVX10),
is refused at compile time rather than left unchecked.
"""
from __future__ import annotations

import warnings

from cvmc_runtime import CPUINFO_FLAGS, host_flags

from cvmc.errors import CvmcError, ForeignCpuWarning
from cvmc.passes.target import Target

NEVER_EMITTED = frozenset({
    "amx-avx512", "amx-bf16", "amx-complex", "amx-fp16", "amx-fp8", "amx-int8", "amx-movrs",
    "amx-tf32", "amx-tile", "avxneconvert", "avxvnniint16", "avxvnniint8", "cldemote",
    "clflushopt", "clwb", "clzero", "cmpccxadd", "enqcmd", "fsgsbase", "hreset", "invpcid",
    "kl", "lwp", "movdir64b", "movdiri", "movrs", "mwaitx", "pconfig", "pku", "prefetchi",
    "ptwrite", "rdpid", "rdpru", "rdrnd", "rdseed", "serialize", "sha512", "shstk", "sm3",
    "sm4", "tsxldtrk", "uintr", "usermsr", "waitpkg", "wbnoinvd", "widekl", "xsave",
    "xsavec", "xsaveopt", "xsaves",
})
TUNING_PREFIXES = ("fast-", "slow-", "false-deps-", "no-bypass-delay", "prefer-", "tuning-",
                   "use-", "idiv")
# 64bit-mode is the mode, not an extension; nopl, vzeroupper, ermsb, fsrm and
# branch-hint choose among instructions every x86-64 CPU has.
TUNING = frozenset({
    "64bit-mode", "allow-light-256-bit", "branch-hint", "branchfusion", "ermsb", "fsrm",
    "faster-shift-than-shuffle", "lea-sp", "lea-uses-ag", "macrofusion", "nopl",
    "pad-short-functions", "sbb-dep-breaking", "vzeroupper",
})


def classify(feature: str) -> str:
    """'needed', 'never emitted', 'tuning' or 'unknown' for one LLVM x86 feature."""
    if feature in CPUINFO_FLAGS:
        return "needed"
    if feature in NEVER_EMITTED:
        return "never emitted"
    if feature in TUNING or feature.startswith(TUNING_PREFIXES):
        return "tuning"
    return "unknown"


# AArch64 (a C library, cvmc.codegen.clib): the LLVM features of the vector and float
# arithmetic kernels may use -> (auxiliary vector entry, bit) of Linux's HWCAP flags
# (arch/arm64/include/uapi/asm/hwcap.h), which the library checks before it runs. The
# others LLVM enables for an --mcpu (atomics, cryptography, system registers) are not
# checked: cvmc's kernels do not use them.
AARCH64_HWCAPS = {
    "fp-armv8": ("AT_HWCAP", 0), "neon": ("AT_HWCAP", 1), "fullfp16": ("AT_HWCAP", 10),
    "rdm": ("AT_HWCAP", 12), "complxnum": ("AT_HWCAP", 14), "dotprod": ("AT_HWCAP", 20),
    "sve": ("AT_HWCAP", 22), "fp16fml": ("AT_HWCAP", 23), "sve2": ("AT_HWCAP2", 1),
    "i8mm": ("AT_HWCAP2", 13), "bf16": ("AT_HWCAP2", 14),
}


def needed_features(target: Target) -> list[str]:
    """The features of `target`'s CPU the runtime must find on the host, sorted; a
    CvmcError for a feature cvmc cannot classify or check. For AArch64, those of
    AARCH64_HWCAPS."""
    if not target.x86:
        if not target.mtriple:
            warnings.warn(f"--mcpu {target.mcpu}: the runtime checks CPU features on x86 only; "
                          f"an artifact built for a CPU newer than its host may crash there",
                          ForeignCpuWarning)
            return []
        return sorted(f for f in target.features if f in AARCH64_HWCAPS)
    unknown = sorted(f for f in target.features if classify(f) == "unknown")
    if unknown:
        raise CvmcError(f"--mcpu {target.mcpu}: LLVM enables {', '.join(unknown)}, which "
                        f"generated code may use but the runtime cannot check on a host (no "
                        f"/proc/cpuinfo flag cvmc knows); choose an older --mcpu")
    return sorted(f for f in target.features if classify(f) == "needed")


def warn_if_not_host(mcpu: str, host: str, needed: list[str]) -> None:
    """A warning when `mcpu` is not the host CPU `host`, naming what this host lacks."""
    if mcpu == host:
        return
    flags = host_flags()
    lacking = [f for f in needed if flags is not None and CPUINFO_FLAGS[f] not in flags]
    consequence = f"it will not run here (this CPU lacks {', '.join(lacking)})" if lacking \
        else "it runs only on CPUs with its features"
    warnings.warn(f"--mcpu {mcpu} is not this machine's CPU ({host}): {consequence}",
                  ForeignCpuWarning)

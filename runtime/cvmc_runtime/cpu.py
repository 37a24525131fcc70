"""The CPU features a kernel library needs, checked against the host before it is loaded.

The compiler records in the plan (and in the library's signature) the LLVM features of
the target CPU that generated code may use; an x86 kernel built for a CPU with more of
them dies with SIGILL on one without. This is the explicit set the runtime can check:
each LLVM feature name with the flag Linux lists for it in /proc/cpuinfo. The compiler
refuses a target with a code-generation feature outside it (cvmc/codegen/cpu_features.py
classifies every feature LLVM knows), so none is silently ignored.
"""
from __future__ import annotations

import functools
from collections.abc import Mapping

from cvmc_runtime.signature import ModelError

# LLVM feature -> /proc/cpuinfo flag (Linux's names, arch/x86/include/asm/cpufeatures.h).
CPUINFO_FLAGS = {
    "64bit": "lm", "x87": "fpu", "cmov": "cmov", "cx8": "cx8", "cx16": "cx16", "mmx": "mmx",
    "fxsr": "fxsr", "sahf": "lahf_lm", "sse": "sse", "sse2": "sse2", "sse3": "pni",
    "ssse3": "ssse3", "sse4.1": "sse4_1", "sse4.2": "sse4_2", "crc32": "sse4_2",
    "sse4a": "sse4a", "popcnt": "popcnt", "lzcnt": "abm", "bmi": "bmi1", "bmi2": "bmi2",
    "movbe": "movbe", "tbm": "tbm", "adx": "adx", "prfchw": "3dnowprefetch",
    "pclmul": "pclmulqdq", "vpclmulqdq": "vpclmulqdq", "aes": "aes", "vaes": "vaes",
    "sha": "sha_ni", "gfni": "gfni", "f16c": "f16c", "fma": "fma", "fma4": "fma4",
    "xop": "xop", "avx": "avx", "avx2": "avx2", "avxvnni": "avx_vnni", "avxifma": "avx_ifma",
    "avx512f": "avx512f", "avx512cd": "avx512cd", "avx512dq": "avx512dq",
    "avx512bw": "avx512bw", "avx512vl": "avx512vl", "avx512ifma": "avx512ifma",
    "avx512vbmi": "avx512vbmi", "avx512vbmi2": "avx512_vbmi2", "avx512vnni": "avx512_vnni",
    "avx512bitalg": "avx512_bitalg", "avx512vpopcntdq": "avx512_vpopcntdq",
    "avx512bf16": "avx512_bf16", "avx512fp16": "avx512_fp16",
    "avx512vp2intersect": "avx512_vp2intersect",
}
CPUINFO = "/proc/cpuinfo"


@functools.cache
def host_flags(path: str = CPUINFO) -> frozenset[str] | None:
    """The CPU flags Linux lists for this machine (its first processor), or None when
    they cannot be read (not Linux, no /proc)."""
    try:
        with open(path, encoding="ascii", errors="replace") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() == "flags":
                    return frozenset(value.split())
    except OSError:
        return None
    return None


def check_host_cpu(target: Mapping) -> None:
    """Raise ModelError unless this CPU has every feature `target` (a validated llvm
    target of a plan) needs."""
    needed = target["features"]
    unknown = [f for f in needed if f not in CPUINFO_FLAGS]
    if unknown:
        raise ModelError(f"built for {target['mcpu']}: needs CPU feature {unknown[0]!r:.40}, "
                         f"which this runtime cannot check; recompile the model")
    if not needed:
        return
    flags = host_flags()
    if flags is None:
        raise ModelError(f"built for {target['mcpu']}: needs {', '.join(needed)}, but this "
                         f"machine's CPU features cannot be read from {CPUINFO}")
    missing = [f for f in needed if CPUINFO_FLAGS[f] not in flags]
    if missing:
        raise ModelError(f"built for {target['mcpu']}: needs {', '.join(missing)}, which "
                         f"this CPU lacks; rebuild with --mcpu naming this CPU, or omit "
                         f"--mcpu when compiling on it")

"""The backends, one module each: x86 (cvmc/codegen/targets/x86.py), AArch64 (aarch64.py)
and CUDA (cuda.py), the CPU ones sharing cpu.py. Each holds its pass list, its schedule
table and its build (`backend.Backend`); `compile_model` runs the steps of the one
`backend(target)` picks. Adding a target is a module here, listed in BACKENDS, and its
schedules (cvmc/lowering/)."""
from __future__ import annotations

from cvmc.codegen.targets import aarch64, cuda, x86
from cvmc.codegen.targets.backend import Backend
from cvmc.errors import CvmcError
from cvmc.passes.target import Target

BACKENDS = {b.name: b for b in (x86.BACKEND, aarch64.BACKEND, cuda.BACKEND)}


def backend(target: Target) -> Backend:
    """The backend that compiles for `target` (its kind and triple)."""
    found = [b for b in BACKENDS.values() if b.compiles(target)]
    if not found:
        raise CvmcError(f"--target {target.kind}: no backend compiles for the triple "
                        f"{target.triple}; cvmc's: {', '.join(BACKENDS)}")
    return found[0]

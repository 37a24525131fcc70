"""The backends, one module each: x86 (cvmc/codegen/targets/x86.py), AArch64 (aarch64.py)
and CUDA (cuda.py), the CPU ones sharing cpu.py. Each holds its pass list, its schedule
table and its build (`base.Backend`); `compile_model` runs the steps of the one
`backend(target)` picks. Adding a target is a module here, listed in `backends`, and its
schedules (cvmc/lowering/)."""
from __future__ import annotations

import functools
from typing import TYPE_CHECKING

from cvmc.errors import CvmcError
from cvmc.passes.target import Target, compiler_tvm

if TYPE_CHECKING:
    from cvmc.codegen.targets.base import Backend


@functools.cache
def backends() -> dict[str, Backend]:
    """Every backend by name. Their modules import TVM's compiler: asked for first, so that
    a TVM that cannot compile (its compiler library does not load, as under a small
    `ulimit -v`) is one CvmcError, not an ImportError deep in TVM."""
    compiler_tvm()
    from cvmc.codegen.targets import aarch64, cuda, x86

    return {b.name: b for b in (x86.BACKEND, aarch64.BACKEND, cuda.BACKEND)}


def backend(target: Target) -> Backend:
    """The backend that compiles for `target` (its kind and triple)."""
    found = [b for b in backends().values() if b.compiles(target)]
    if not found:
        raise CvmcError(f"--target {target.kind}: no backend compiles for the triple "
                        f"{target.triple}; cvmc's: {', '.join(backends())}")
    return found[0]

"""Every op case of tests/codegen/op_cases.py built for llvm once per test run, shared by the
tests that need it (the `op_builds` fixture of tests/conftest.py).

Each case is built when a test first asks for it, inside that test (a case that does not
build fails its own tests, by its name), and kept for the rest of the run:

- `artifact(index)`: the case's one-op graph compiled by `compile_model` (the pass
  pipeline, lowering, the kernel library and the .cvmx: the real path) for the host CPU;
  `outputs(index)` runs it with the runtime (test_op_cases compares them with the
  reference);
- `library(index)`: the graph lowered as written, partitioned into kernels but without the
  other passes (an unpacked conv2d or dense as well as the packed ones the pipeline makes), built into a kernel library
  (test_buffer_bounds calls its kernels between guard pages).

Both builds take their kernels from the run's kernel cache (`CVMC_CACHE_DIR`, set by
tests/conftest.py before any xdist worker starts, so every worker shares it): a kernel the
two builds have in common (the one kernel of an element-wise, reduction or layout case)
is compiled once per run, or not at all when a developer's persistent test cache has it.
Under pytest-xdist each worker builds the cases its own tests ask for: one library of all
cases would make every worker build all of them.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tests.codegen.op_cases import CASES, OpCase
from tests.oputil import one_op_graph


@dataclass(frozen=True)
class GuardBuild:
    """A case lowered without the passes: its kernel library, the plan that calls it and
    the values of the plan's inputs and weights."""

    library: Path
    plan: dict
    values: dict


class OpCaseBuilds:
    """The op cases' builds, each made on first use and kept in `folder` for the run."""

    def __init__(self, folder: Path):
        self.folder = folder
        self._artifacts: dict[int, Path] = {}
        self._libraries: dict[int, GuardBuild] = {}

    @staticmethod
    def case(index: int) -> OpCase:
        return CASES[index]

    def graph(self, index: int):
        c = self.case(index)
        return one_op_graph(c.op, c.inputs, c.attrs, c.weights, c.out_dtype)

    def artifact(self, index: int) -> Path:
        """The case compiled for llvm through `compile_model` into a .cvmx."""
        if index not in self._artifacts:
            from cvmc.codegen import compile_model

            path = self.folder / f"case{index}.cvmx"
            compile_model(self.graph(index), path, "llvm")
            self._artifacts[index] = path
        return self._artifacts[index]

    def outputs(self, index: int) -> list[np.ndarray]:
        """The artifact's outputs on the case's inputs, run by the runtime, in output
        order."""
        import cvmc_runtime

        g, xs = self.graph(index), [arr for arr, _ in self.case(index).inputs]
        res = cvmc_runtime.load(self.artifact(index)).run(
            {n: xs[int(n[1:])] for n in g.inputs})
        return [res[o] for o in g.outputs]

    def library(self, index: int) -> GuardBuild:
        """The case lowered as written (its kernel partition, no other pass) and built for llvm."""
        if index not in self._libraries:
            from cvmc.codegen.build import build_llvm
            from cvmc.codegen.cache import KernelCache, cache_folder
            from cvmc.codegen.targets import backend
            from cvmc.lowering.lower import lower_graph
            from cvmc.passes.fusion import fuse_kernels
            from cvmc.passes.target import Target

            g, xs = self.graph(index), [arr for arr, _ in self.case(index).inputs]
            mod, _, plan = lower_graph(fuse_kernels(g, Target.make()), Target.make())
            folder = cache_folder()
            built = build_llvm(mod, Target.make(), backend(Target.make()).schedules,
                               cache=KernelCache(folder) if folder else None)
            path = self.folder / f"case{index}.so"
            path.write_bytes(built.library)
            values = {**{n: xs[int(n[1:])] for n in g.inputs}, **g.constants}
            self._libraries[index] = GuardBuild(path, plan, values)
        return self._libraries[index]


def nvcc_cached(source: str, target, output: Path) -> None:
    """`nvcc_shared(source, target, output)`, the library kept in the run's kernel cache
    folder (its `nvcc/`) by the sha256 of the source, the target's arch, nvcc's version and
    nvcc_shared's own code: a developer's rerun of the same CUDA source takes the library
    nvcc built before (minutes of nvcc for every op case), CI's empty cache runs nvcc."""
    import hashlib
    import inspect
    import os
    import shutil
    import subprocess
    import tempfile

    from cvmc.codegen.cache import cache_folder
    from cvmc.codegen.targets import cuda

    folder = cache_folder()
    if folder is None:
        cuda.nvcc_shared(source, target, output)
        return
    version = subprocess.run([cuda.find_nvcc(), "--version"], check=False,
                             capture_output=True, text=True).stdout
    key = hashlib.sha256("\0".join([source, target.arch, version, inspect.getsource(
        cuda.nvcc_shared)]).encode()).hexdigest()
    kept = folder / "nvcc" / f"{key}.so"
    if not kept.is_file():
        cuda.nvcc_shared(source, target, output)
        kept.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=kept.parent, suffix=".tmp")
        os.close(fd)
        shutil.copyfile(output, tmp)
        os.replace(tmp, kept)  # whole or absent for a concurrent reader
    else:
        shutil.copyfile(kept, output)

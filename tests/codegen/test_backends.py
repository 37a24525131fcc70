"""The backends (cvmc/codegen/targets): which one a Target gets, and that each one's pass
list ends with the kernel partition."""
from __future__ import annotations

from cvmc.codegen.targets import backend, backends
from cvmc.passes.pipeline import FUSE_KERNELS
from cvmc.passes.target import Target


def test_a_target_gets_the_backend_of_its_kind_and_triple():
    assert backend(Target.make("llvm", "znver4")).name == "x86"
    assert backend(Target.make("llvm", "x86-64")).name == "x86"
    assert backend(Target.make("llvm", mtriple="aarch64-linux-gnu")).name == "aarch64"
    assert backend(Target.make("cuda", arch="sm_90")).name == "cuda"


def test_each_backend_ends_its_passes_with_the_kernel_partition():
    """Lowering builds the kernels fuse-kernels chose, so it is every list's last pass,
    and a list names each pass once."""
    for b in backends().values():
        assert b.passes[-1] is FUSE_KERNELS
        assert len({p.name for p in b.passes}) == len(b.passes)


def test_the_cpu_backends_own_rows_come_before_the_shared_ones():
    """A row names the ISA it is for; the shared rows end with the default, which takes
    any kernel, so it must be last."""
    for name in ("x86", "aarch64"):
        rows = backends()[name].schedules
        names = [r.name for r in rows]
        assert len(set(names)) == len(names)
        own = [r for r in names if not r.startswith("cpu-")]
        assert own and all(r.startswith(f"{name}-") for r in own)
        assert names[:len(own)] == own and names[-1] == "cpu-default"

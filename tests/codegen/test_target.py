"""One Target per compile: built once from kind, --mcpu and --arch, handed to the passes,
the lowering and codegen; its CPU features choose the schedule rows, its arch the CUDA
schedules and probe."""
from __future__ import annotations

import pytest

from cvmc.cli import main
from cvmc.codegen import compile_model
from cvmc.codegen.targets import backend, cuda
from cvmc.codegen.targets.cpu import CpuBackend
from cvmc.errors import CvmcError
from cvmc.lowering import lower, rules
from cvmc.passes.fusion import fuse_kernels
from cvmc.passes.target import Target
from tests.lowering.test_fusion_and_plan import diamond
from tests.lowering.test_packed_conv import GEOMETRIES, conv_graph
from tests.oputil import compile_passes
from tests.test_cli_robustness import EXAMPLE


def _conv_rule(target: Target) -> str:
    """The schedule row the packed 3x3 conv kernel gets on `target`'s CPU."""
    graph = compile_passes(conv_graph(*GEOMETRIES["3x3 pad 1"]), target=target)
    mod, _, _ = lower.lower_graph(graph, target)
    _, chosen = backend(target).schedule(mod, target)
    (rule,) = (r for symbol, r in chosen.items() if "conv2d_packed" in symbol)
    return rule


@pytest.mark.parametrize(("mcpu", "has", "lacks", "rule"), [
    # Zen 4 has AVX-512 with VNNI (AMD's Zen 4 ISA), Haswell AVX2 only, the x86-64
    # baseline neither (SSE2).
    ("znver4", {"avx512f", "avx512vnni", "avx2"}, set(), "x86-avx512-vnni"),
    ("haswell", {"avx2"}, {"avx512f", "avx512vnni"}, "x86-avx2"),
    ("x86-64", {"sse2"}, {"avx2", "avx512vnni"}, "cpu-packed-vector"),
])
def test_the_cpus_features_choose_the_conv_schedule(mcpu, has, lacks, rule):
    target = Target.make("llvm", mcpu)
    assert has <= target.features and not lacks & target.features
    assert _conv_rule(target) == rule


def test_the_targets_kind_decides_packing_and_epilogues():
    llvm, cuda = Target.make("llvm", "znver4"), Target.make("cuda")
    assert llvm.packs("conv2d") and llvm.packs("dense")
    assert cuda.packs("conv2d") and not cuda.packs("dense") and not llvm.packs("relu")
    # CPU: every conv and dense takes its epilogue; CUDA: those with a row of cvmc's own
    assert llvm.epilogue_anchors is None
    assert cuda.epilogue_anchors == {"conv2d", "conv2d_packed", "dense"}
    assert cuda.features == frozenset() and cuda.arch == "sm_80"


def test_make_computes_the_targets_facts_once():
    # the register files as the ISA manuals give them: AVX-512 32 zmm of 512 bits, AVX2 16
    # ymm of 256, SSE2 16 xmm of 128, AArch64's NEON 32 of 128
    zen4, haswell, base = (Target.make("llvm", cpu) for cpu in ("znver4", "haswell", "x86-64"))
    arm = Target.make("llvm", "neoverse-v2", mtriple="aarch64-linux-gnu")
    assert [(t.vector_bits, t.registers) for t in (zen4, haswell, base, arm)] == \
        [(512, 32), (256, 16), (128, 16), (128, 32)]
    assert zen4.x86 and zen4.triple.startswith("x86_64") and "avx512vnni" in zen4.features
    assert not arm.x86 and arm.triple == "aarch64-linux-gnu" and {"neon", "i8mm"} <= arm.features
    assert zen4.polynomial_exp and arm.polynomial_exp  # the CPU's vectorising exp
    cuda = Target.make("cuda", arch="sm_90")
    assert cuda.cuda_arch == 90 and not cuda.polynomial_exp and Target.make("cuda").cuda_arch == 80


def test_make_checks_the_names_and_fills_the_defaults():
    assert Target.make("cuda", arch="sm_61").describe() == {"kind": "cuda", "arch": "sm_61"}
    assert Target.make("llvm", "haswell", "sm_90").describe() == {"kind": "llvm",
                                                                  "mcpu": "haswell"}
    assert Target.make().mcpu  # the host CPU's name
    for kind, mcpu, arch, message in [
        ("tpu", None, None, "unknown target 'tpu'; expected one of llvm, cuda"),
        ("llvm", "znver99", None, "--mcpu znver99: not a CPU LLVM knows"),
        ("cuda", None, "sm_60", "--arch sm_60: expected sm_<major><minor>"),
    ]:
        with pytest.raises(CvmcError) as error:
            Target.make(kind, mcpu, arch)
        assert error.value.message.startswith(message)


def _spy(monkeypatch, name: str, seen: list) -> None:
    """Record the Target each call of the CPU backends' step `name` gets (the argument
    after the graph or module), then run it."""
    real = getattr(CpuBackend, name)

    def spy(self, first, target, *args, **kwargs):
        seen.append((name, target))
        return real(self, first, target, *args, **kwargs)
    monkeypatch.setattr(CpuBackend, name, spy)


def test_one_target_is_built_and_reaches_passes_lowering_and_codegen(monkeypatch, tmp_path):
    made, seen = [], []
    real_make = Target.make.__func__
    monkeypatch.setattr(Target, "make", classmethod(
        lambda cls, *a, **k: made.append(real_make(cls, *a, **k)) or made[-1]))
    for step in ("run_passes", "lower", "build"):
        _spy(monkeypatch, step, seen)
    result = compile_model(diamond(), tmp_path / "m.cvmx", "llvm", mcpu="haswell")
    assert len(made) == 1 and made[0].mcpu == "haswell"
    assert [name for name, _ in seen] == ["run_passes", "lower", "build"]
    assert all(target is made[0] for _, target in seen)
    assert result.plan["target"]["mcpu"] == "haswell"
    # The command line builds it once too, and runs the passes once, dumping each one's
    # graph on the way.
    made.clear()
    seen.clear()
    assert main(["compile", str(EXAMPLE), "--mcpu", "haswell", "-o", str(tmp_path / "e.cvmx"),
                 "--dump-ir", str(tmp_path / "ir")]) == 0
    assert len(made) == 1
    assert [name for name, _ in seen] == ["run_passes", "lower", "build"]
    assert all(target is made[0] for _, target in seen)
    assert len(list((tmp_path / "ir").glob("*.nnef"))) == len(backend(made[0]).passes)


def test_a_target_is_not_given_with_loose_names(tmp_path):
    with pytest.raises(CvmcError, match="not beside a Target"):
        compile_model(diamond(), tmp_path / "m.cvmx", Target.make(), mcpu="haswell")


@pytest.mark.parametrize("arch", ["sm_61", "sm_80"])
def test_the_cuda_probe_and_schedules_use_the_targets_arch(monkeypatch, arch):
    """The probe for kernels that need global scratch (lowering) and the CUDA schedules
    and build (codegen) are all for the Target's arch, not a fixed one."""
    archs = []
    for module in (rules, cuda):
        real = module.cuda_target
        monkeypatch.setattr(module, "cuda_target",
                            lambda t, real=real, **host: archs.append(t.arch) or real(t, **host))
    probed = []
    real_probe = lower.needs_global_memory
    monkeypatch.setattr(lower, "needs_global_memory",
                        lambda f, t, table: probed.append(t.arch) or real_probe(f, t, table))
    target = Target.make("cuda", arch=arch)
    mod, _, _ = cuda.BACKEND.lower(fuse_kernels(diamond(), target), target)
    assert probed and set(probed) == {arch} and set(archs) == {arch}
    cuda.cuda_translation_unit(mod, target)
    assert set(archs) == {arch} and len(archs) > len(probed)


def test_building_for_another_cpu_warns_with_its_own_category(monkeypatch):
    # a host that lacks AVX-512: code for a Zen 4 will not run on it, and the warning says
    # so with the category a build farm can filter (pyproject filters it in this suite)
    from cvmc.codegen import cpu_features
    from cvmc.errors import ForeignCpuWarning

    monkeypatch.setattr(cpu_features, "host_flags", lambda: {"avx2", "fma"})
    with pytest.warns(ForeignCpuWarning, match="not this machine's CPU .*lacks avx512f"):
        cpu_features.warn_if_not_host("znver4", "znver3", ["avx512f"])

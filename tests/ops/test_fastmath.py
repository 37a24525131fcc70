"""The CPU's polynomial exp (cvmc/ops/fastmath.py): within 1 ULP of the correctly rounded
exp (NumPy's float64 exp rounded to float32) over a dense sweep of every float32 exponent
in [-104, 88.8], the right specials (NaN, infinities, overflow, subnormal results), the
same bits at 1 and 2 threads, no libm call left in the CPU kernel, and CUDA's kernel
still calling expf, a kernel lowered alone as in a whole graph."""
from __future__ import annotations

import tempfile
from pathlib import Path

import cvmc_runtime
import numpy as np
import tvm_ffi

import cvmc
from cvmc.codegen.targets import backend
from cvmc.frontend.nnef import parse_nnef
from cvmc.lowering.lower import lower_graph, lower_node
from cvmc.passes.target import Target
from tests.oputil import compile_passes, ulp_distance

SWEEP = 1 << 21


def _exp_document(n: int) -> str:
    return ("version 1.0;\ngraph G( x ) -> ( y )\n{\n"
            f"    x = external<scalar>(shape = [{n}]);\n    y = exp(x);\n}}\n")


def _sweep() -> np.ndarray:
    """SWEEP float32 values spread evenly over the bit patterns of [-104, 88.8] (so every
    binade gets its share, down to the tiny ones), plus both ends."""
    hi = np.float32(88.8).view(np.uint32).astype(np.int64)
    lo = np.float32(-104.0).view(np.uint32).astype(np.int64) & 0x7FFFFFFF
    pos = np.linspace(0, hi, SWEEP // 2).astype(np.uint32).view(np.float32)
    neg = -np.linspace(0, lo, SWEEP // 2).astype(np.uint32).view(np.float32)
    return np.concatenate([pos, neg]).astype(np.float32)


def _compiled_exp(x: np.ndarray) -> np.ndarray:
    """exp of `x` compiled for this CPU, the same bits (NaNs too) at 1 and 2 threads."""
    runs = []
    with tempfile.TemporaryDirectory(prefix="cvmc-exp-") as tmp:
        cvmc.compile(parse_nnef(_exp_document(x.size), "exp.nnef"), Path(tmp) / "m.cvmx",
                     target="llvm")
        model = cvmc_runtime.load(Path(tmp) / "m.cvmx")
        for threads in (1, 2):
            cvmc_runtime.set_num_threads(threads)
            runs.append(model.run({"x": x})["y"])
    assert runs[0].tobytes() == runs[1].tobytes(), "1 and 2 threads differ"
    return runs[0]


def test_exp_within_one_ulp_over_a_dense_sweep():
    x = _sweep()
    with np.errstate(over="ignore"):  # 88.8 overflows: inf, as exp gives
        want = np.exp(x.astype(np.float64)).astype(np.float32)
    ulps = ulp_distance(_compiled_exp(x), want)
    assert ulps.max() <= 1, f"{ulps.max()} ULP at x = {x[ulps.argmax()]!r}"


def test_exp_specials():
    x = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-30, -1e-30, 1.0, -1.0, 80.0, -80.0,
                  88.72283, 88.72284, 89.0, 1e30, -87.3, -100.0, -103.9, -103.98, -104.5,
                  -1e30], np.float32)
    with np.errstate(over="ignore"):
        want = np.exp(x.astype(np.float64)).astype(np.float32)
    got = _compiled_exp(x)
    assert np.isnan(got[0])
    assert np.array_equal(got[1:6], want[1:6])  # inf, 0, 1, 1, 1
    assert np.all(ulp_distance(got, want) <= 1)  # subnormal results: 1 ULP of 2^-149
    assert np.array_equal(np.isinf(got), np.isinf(want)) and np.all(got[-1:] == 0)


def _lowered(target: Target) -> str:
    graph = compile_passes(parse_nnef(_exp_document(64), "exp.nnef"), target=target)
    return lower_graph(graph, target)[0].script()


def test_cpu_kernel_has_no_libm_exp_and_cuda_keeps_expf():
    cpu, cuda = _lowered(Target.make("llvm", "znver3")), _lowered(Target.make("cuda"))
    assert "expf" not in cpu and "T.floor" in cpu
    assert "expf" in cuda


def test_a_kernel_lowered_alone_gets_its_targets_exp():
    """The exp choice comes with the Target: the exp node lowered on its own is the kernel
    the whole graph's lowering makes of it, for the CPU (the polynomial) and CUDA (expf)."""
    graph = parse_nnef(_exp_document(64), "exp.nnef")
    for target, libm in ((Target.make("llvm", "znver3"), False), (Target.make("cuda"), True)):
        alone = lower_node(graph.nodes[0], graph.types, "k0_exp", target)
        whole = lower_graph(compile_passes(graph, target=target), target)[0]["k0_exp"]
        assert tvm_ffi.structural_equal(alone, whole), target.kind
        assert ("expf" in alone.script()) == libm, target.kind


def test_exp_kernel_is_vectorised():
    target = Target.make("llvm", "znver3")
    graph = compile_passes(parse_nnef(_exp_document(64), "exp.nnef"), target=target)
    mod, chosen = backend(target).schedule(lower_graph(graph, target)[0], target)
    assert set(chosen.values()) == {"cpu-default"}
    assert "T.vectorized" in mod.script()

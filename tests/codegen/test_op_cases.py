"""Every op has a case; each compiles for llvm (== reference); all build for CUDA."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from cvmc.errors import CvmcError
from cvmc.ops import all_ops, lookup
from cvmc.passes.fusion import fuse_kernels
from cvmc.passes.target import Target
from tests.codegen.op_cases import CASES, case_id
from tests.oputil import assert_matches, check_op, one_op_graph, run_reference


def test_every_op_has_a_case():
    covered = {c.op for c in CASES}
    missing = [d.name for d in all_ops() if d.name not in covered]
    assert not missing, f"add a case to tests/codegen/op_cases.py for: {missing}"


def check_case(case) -> None:
    """The case compiled for llvm (.cvmx + runtime) equals the reference (a case outside
    CASES, compiled on its own: tests/test_add_an_op.py)."""
    check_op(case.op, case.inputs, **case.check_args())


@pytest.mark.parametrize("index", range(len(CASES)), ids=[case_id(c) for c in CASES])
def test_case_compiles_for_llvm_and_matches_reference(index, op_builds):
    """Built once per run (tests/codegen/op_builds.py), shared with test_buffer_bounds."""
    case = CASES[index]
    g = op_builds.graph(index)
    ref = run_reference(g, [arr for arr, _ in case.inputs])
    got = op_builds.outputs(index)
    for name, r, c, atol in zip(g.outputs, ref, got, case.tolerances()):
        assert_matches(case.op, name, r, c, case.ulp, atol)


def cuda_module_of_cases():
    """(IRModule with every case lowered for CUDA, {case index: plan})."""
    import tvm

    from cvmc.codegen.targets.cuda import BACKEND

    funcs, plans, cuda = {}, {}, Target.make("cuda")
    for index, case in enumerate(CASES):
        if "cuda" not in lookup(case.op).backends:
            continue
        g = one_op_graph(case.op, case.inputs, case.attrs, case.weights, case.out_dtype)
        mod, _, plans[index] = BACKEND.lower(fuse_kernels(g, cuda), cuda, prefix=f"c{index}_")
        funcs.update({gv.name_hint: f for gv, f in mod.functions.items()})
    return tvm.IRModule(funcs), plans


def test_cuda_refuses_the_llvm_backends_layouts():
    """Ops that only the llvm pipeline's passes write are not compiled for CUDA, one clear
    error (on an H200, dlight's build of a grouped conv_packed left whole groups unwritten)."""
    from cvmc.lowering.lower import lower_graph

    llvm_only = [c for c in CASES if lookup(c.op).backends == ("llvm",)]
    assert {c.op for c in llvm_only} == {"conv_packed", "conv_packed_blocked",
                                         "depthwise_conv_blocked", "float_layout_transform",
                                         "matmul_packed"}
    for case in llvm_only:
        g = one_op_graph(case.op, case.inputs, case.attrs, case.weights, case.out_dtype)
        with pytest.raises(CvmcError, match=f"{case.op} .*--target cuda does not compile it"):
            lower_graph(fuse_kernels(g, Target.make("cuda")), Target.make("cuda"))


def test_all_cases_build_for_cuda_in_one_nvcc_call(tmp_path):
    """Every case in one module, scheduled for CUDA, compiled ahead of time by one nvcc run."""
    from cvmc.codegen.targets.cuda import cuda_translation_unit, find_nvcc
    from tests.codegen.op_builds import nvcc_cached

    try:
        find_nvcc()
    except CvmcError as e:
        pytest.skip(e.message)
    mod, plans = cuda_module_of_cases()
    cuda = Target.make("cuda")
    _, source, _ = cuda_translation_unit(mod, cuda)
    symbols = [k["symbol"] for p in plans.values() for k in p["kernels"]]
    for symbol in symbols:
        assert f"{symbol}_kernel" in source, f"{symbol}: no device kernel generated"
    lib = tmp_path / "all_ops.so"
    nvcc_cached(source, cuda, lib)  # nvcc_shared, kept in the run's kernel cache
    data = lib.read_bytes()
    missing = [s for s in symbols if f"__tvm_ffi_{s}".encode() not in data]
    assert not missing, f"kernels missing from the library: {missing}"


@pytest.mark.parametrize("target", ["llvm", "cuda"])
def test_no_kernel_uses_floating_point(target):
    """CVM integer ops compute with integers only (cvm_precision via clz, not log2): no float
    type appears anywhere in the lowered TIR of any op."""
    from cvmc.lowering.lower import lower_graph

    for index, case in enumerate(CASES):
        if not lookup(case.op).integer_op:
            continue
        g = one_op_graph(case.op, case.inputs, case.attrs, case.weights)
        mod, _, _ = lower_graph(fuse_kernels(g, Target.make(target)), Target.make(target),
                                prefix=f"c{index}_")
        script = mod.script()
        assert "float" not in script and "bfloat" not in script, f"{case.op} uses floats"


def test_reference_of_every_case_runs_without_tvm():
    """The oracle is NumPy: every case's reference runs in a process where TVM cannot be
    imported (the GPU tests run it on a machine that has only the runtime)."""
    code = ("import sys; sys.modules['tvm'] = None\n"
            "import tests.gpu.test_cuda_run\n"  # the GPU tests collect there too
            "from tests.codegen.op_cases import CASES\n"
            "from tests.oputil import one_op_graph, run_reference\n"
            "for c in CASES:\n"
            "    g = one_op_graph(c.op, c.inputs, c.attrs, c.weights, c.out_dtype)\n"
            "    run_reference(g, [x for x, _ in c.inputs])\n")
    root = Path(__file__).resolve().parents[2]
    proc = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, check=False,
                          text=True, env={**os.environ, "PYTHONPATH": f"{root}:{root}/runtime"})
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_cuda_kernels_accumulating_in_their_output_are_not_restrict():
    """nvcc 13.0 miscompiled a float min_reduce that accumulates in its output buffer under
    `__restrict__` (stale read-only-cache loads; wrong answers on an H100): such kernels are
    emitted without it, every other kernel keeps it."""
    from cvmc.codegen.targets.cuda import BACKEND, cuda_translation_unit

    for op, restrict in (("min_reduce", False), ("broadcast_add", True)):
        case = next(c for c in CASES if c.op == op)
        g = one_op_graph(case.op, case.inputs, case.attrs, case.weights, case.out_dtype)
        cuda = Target.make("cuda")
        mod, _, _ = BACKEND.lower(fuse_kernels(g, cuda), cuda)
        _, source, _ = cuda_translation_unit(mod, cuda)
        kernels = [line for line in source.splitlines() if "__global__" in line]
        assert kernels and all(("__restrict__" in k) == restrict for k in kernels), kernels


def test_every_cuda_conv2d_kernel_gets_the_register_tile_rule():
    """cvmc's CUDA conv schedule takes every conv2d case (strided, dilated, grouped, with
    bias): none is left to dlight's one-output-per-thread fallback."""
    from cvmc.codegen.targets.cuda import BACKEND
    from cvmc.lowering.rules import schedule_cuda_module

    cases = [c for c in CASES if c.op == "conv2d"]
    assert len(cases) >= 4
    for case in cases:
        g = one_op_graph(case.op, case.inputs, case.attrs, case.weights, case.out_dtype)
        cuda = Target.make("cuda")
        mod, _, _ = BACKEND.lower(fuse_kernels(g, cuda), cuda)
        _, rules = schedule_cuda_module(mod, cuda, BACKEND.schedules)
        assert set(rules.values()) == {"cuda-conv-register-tile"}, (case.attrs, rules)

"""Every compute op has a case; each compiles for llvm (== reference); all build for CUDA."""
from __future__ import annotations

import pytest

from cvmc.errors import CvmcError
from cvmc.ops import all_ops, lookup
from tests.codegen.op_cases import CASES, case_id
from tests.oputil import check_op, one_op_graph


def test_every_compute_op_has_a_case():
    covered = {c.op for c in CASES}
    missing = [d.name for d in all_ops() if d.compute and d.name not in covered]
    assert not missing, f"add a case to tests/codegen/op_cases.py for: {missing}"


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_case_compiles_for_llvm_and_matches_reference(case):
    check_op(case.op, case.inputs, **case.check_args())


def cuda_module_of_cases():
    """(IRModule with every case lowered for CUDA, {case index: plan})."""
    import tvm

    from cvmc.lowering.lower import lower_graph

    funcs, plans = {}, {}
    for index, case in enumerate(CASES):
        g = one_op_graph(case.op, case.inputs, case.attrs, case.weights, case.out_dtype)
        mod, _, plans[index] = lower_graph(g, "cuda", prefix=f"c{index}_")
        funcs.update({gv.name_hint: f for gv, f in mod.functions.items()})
    return tvm.IRModule(funcs), plans


def test_all_cases_build_for_cuda_in_one_nvcc_call(tmp_path):
    """Every case in one module, scheduled for CUDA, compiled ahead of time by one nvcc run."""
    from cvmc.codegen.build import cuda_translation_unit, find_nvcc, nvcc_shared

    try:
        find_nvcc()
    except CvmcError as e:
        pytest.skip(e.message)
    mod, plans = cuda_module_of_cases()
    _, source = cuda_translation_unit(mod, "sm_80")
    symbols = [k["symbol"] for p in plans.values() for k in p["kernels"]]
    for symbol in symbols:
        assert f"{symbol}_kernel" in source, f"{symbol}: no device kernel generated"
    lib = tmp_path / "all_ops.so"
    nvcc_shared(source, "sm_80", lib)
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
        mod, _, _ = lower_graph(g, target, prefix=f"c{index}_")
        script = mod.script()
        assert "float" not in script and "bfloat" not in script, f"{case.op} uses floats"

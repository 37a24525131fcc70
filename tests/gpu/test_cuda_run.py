"""CUDA builds of every op case run on a GPU and equal the reference (skipped without one).

All cases share one library (one nvcc run); each case runs through the runtime's Model.
Run with `pytest tests/gpu -m gpu -s` to print per-op timings.
"""
from __future__ import annotations

import time

import pytest
from cvmc_runtime.model import Model, cuda_available

from tests.codegen.op_cases import CASES, case_id
from tests.codegen.test_op_cases import cuda_module_of_cases
from tests.oputil import assert_matches, one_op_graph, run_reference

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not cuda_available(), reason="no CUDA GPU on this machine")]


@pytest.fixture(scope="module")
def cuda_library(tmp_path_factory):
    """(loaded module holding every case's kernels, {case index: plan})."""
    import tvm_ffi

    from cvmc.codegen.build import cuda_translation_unit, nvcc_shared

    mod, plans = cuda_module_of_cases()
    _, source = cuda_translation_unit(mod, "sm_80")
    lib = tmp_path_factory.mktemp("cuda") / "all_ops.so"
    nvcc_shared(source, "sm_80", lib)
    return tvm_ffi.load_module(str(lib)), plans


@pytest.mark.parametrize("index", range(len(CASES)), ids=[case_id(c) for c in CASES])
def test_case_runs_on_gpu_like_reference(cuda_library, index):
    module, plans = cuda_library
    case = CASES[index]
    g = one_op_graph(case.op, case.inputs, case.attrs, case.weights, case.out_dtype)
    xs = [arr for arr, _ in case.inputs]
    model = Model({**plans[index], "device": "cuda"}, module,
                  {w: g.constants[w].astype(g.types[w].dtype) for w in g.constants})
    feeds = {n: xs[int(n[1:])] for n in g.inputs}
    start = time.perf_counter()
    got = model.run(feeds)
    seconds = time.perf_counter() - start
    for name, want, atol in zip(g.outputs, run_reference(g, xs), case.tolerances()):
        assert_matches(case.op, f"{name} (GPU)", want, got[name], case.ulp, atol)
    print(f"{case.op}: ok, {seconds * 1e3:.2f} ms (first run, includes copies)")

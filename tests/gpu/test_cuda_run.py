"""CUDA builds of every op case, of the dp4a convs and dense layers and of two whole
networks run on a GPU and equal the reference (skipped without one).

All op cases share one library (one nvcc run); each runs through the runtime's Model.
Run with `pytest tests/gpu -m gpu -s` to print per-op timings. On a GPU machine without
TVM, build here first with `python -m tests.gpu.prebuilt DIR` and run there with
`CVMC_GPU_PREBUILT=DIR` (see tests/gpu/prebuilt.py).
"""
from __future__ import annotations

import json
import statistics
import time

import numpy as np
import pytest
from cvmc_runtime.model import Model, cuda_available, load

from cvmc.frontend import load_graph
from cvmc.ops import lookup
from cvmc.reference import reference_run
from tests.codegen.op_cases import CASES, case_id
from tests.gpu.prebuilt import (
    NETWORKS,
    build_dp4a_case,
    build_network,
    dp4a_artifact,
    dp4a_cases,
    prebuilt_dir,
)
from tests.oputil import assert_matches, one_op_graph, rand_in_precision, run_reference

DP4A_CASES = list(dp4a_cases())

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not cuda_available(), reason="no CUDA GPU on this machine")]


@pytest.fixture(scope="module")
def cuda_library(tmp_path_factory):
    """(loaded module holding every case's kernels, {case index: plan})."""
    import tvm_ffi

    from tests.gpu.prebuilt import build_op_cases

    folder = prebuilt_dir()
    if folder is None:
        folder = tmp_path_factory.mktemp("cuda")
        build_op_cases(folder, "sm_80")  # PTX included: JIT-compiled on newer GPUs
    plans = json.loads((folder / "all_ops.json").read_text())
    return tvm_ffi.load_module(str(folder / "all_ops.so")), {int(k): v for k, v in plans.items()}


# the cases of ops CUDA compiles (the llvm backend's float layouts it refuses)
CUDA_CASES = [i for i, c in enumerate(CASES) if "cuda" in lookup(c.op).backends]


@pytest.mark.parametrize("index", CUDA_CASES, ids=[case_id(CASES[i]) for i in CUDA_CASES])
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


@pytest.mark.parametrize("index", range(len(DP4A_CASES)), ids=DP4A_CASES)
def test_dp4a_case_runs_on_gpu_like_reference(tmp_path, index):
    """conv2d through the layout pass and dense, on their `dp4a` rules, bit-exact to the
    reference."""
    graph, rule = dp4a_cases()[DP4A_CASES[index]]
    folder = prebuilt_dir()
    artifact = dp4a_artifact(folder, index) if folder else \
        build_dp4a_case(tmp_path, index, "sm_80")
    model = load(artifact)
    assert [k["schedule"] for k in model.plan["kernels"]] == [rule]
    rng = np.random.default_rng(1)
    feeds = {n: rand_in_precision(rng, graph.types[n].shape, graph.types[n].precision)
             for n in graph.inputs}
    want = reference_run(graph, feeds)
    got = model.run(feeds)
    for name in want:
        assert np.array_equal(got[name], want[name]), name


@pytest.mark.parametrize("name", NETWORKS)
def test_network_runs_on_gpu_like_reference(tmp_path, name):
    """The whole network, bit-exact to the reference interpreter, the same bits every run."""
    folder = prebuilt_dir()
    if folder is None:
        folder = tmp_path
        build_network(folder, name, 64, "sm_80")
    model = load(folder / f"{name}.cvmx")
    graph = load_graph(folder / name)
    x = np.random.default_rng(7).integers(-127, 128, graph.types["data"].shape, dtype=np.int8)
    want = reference_run(graph, {"data": x})["logits"]
    runs = [model.run({"data": x})["logits"] for _ in range(3)]
    for got in runs:
        assert np.array_equal(got, want), f"{name}: GPU logits differ from the reference"
    _, seconds = model.profile({"data": x}, repeat=50)
    print(f"{name} {list(x.shape)}: ok, median {statistics.median(seconds) * 1e3:.3f} ms "
          f"per run (copies included)")

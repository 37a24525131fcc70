"""No compiled kernel reads outside its inputs or depends on what its outputs held before.

Every case of `op_cases.CASES` is lowered and built for llvm once (the run's shared build,
tests/codegen/op_builds.py: as written, without the passes), and its kernels are
called directly (tvm-ffi, no runtime) in plan order several times, in a worker process
(tests.guard_pages). Each time, every tensor the kernels see (inputs, weights, intermediate
buffers, outputs) lies right after a PROT_NONE guard page or ends right before one, the
other readable bytes of its region are garbage, and outputs and intermediates start out as
garbage too; each run uses different garbage. A kernel that reads outside an input faults
(a padded conv whose `Select` loaded the padding taps before the input: issue 22, item 0)
or gives results that differ between the runs or from the reference interpreter (e.g.
max_pool2d's ceil_mode window, which read past the input when padding was 0: issue 9,
item 2), and so does one that reads an output before writing it.
"""
from __future__ import annotations

import pickle

import numpy as np
import pytest
from cvmc_runtime.model import ALIGNMENT

from tests.codegen.op_cases import CASES, case_id
from tests.guard_pages import PLACEMENTS, GuardWorker, guarded_empty, progress
from tests.oputil import assert_matches, run_reference

GARBAGE = ("0x7f", "0x80", "random")


def _garbage(kind: str, rng: np.random.Generator) -> np.ndarray:
    """0x7f: the largest int8/int32 values; 0x80: the most negative; or random bytes."""
    if kind == "random":
        return rng.integers(0, 256, 4096, np.uint8)
    return np.full(1, {"0x7f": 0x7F, "0x80": 0x80}[kind], np.uint8)


def _run_kernels(module, plan: dict, values: dict, placement: str, kind: str,
                 seed: int) -> dict:
    """Call every kernel of `plan` on guarded, garbage-surrounded tensors; outputs by name."""
    import tvm_ffi

    rng = np.random.default_rng(seed)
    arrays = {}
    for spec in [*plan["inputs"], *plan["weights"], *plan["buffers"], *plan["outputs"]]:
        if spec["name"] not in arrays:
            arr = guarded_empty(tuple(spec["shape"]), spec["dtype"], placement,
                                _garbage(kind, rng))
            if spec["name"] in values:
                arr[...] = values[spec["name"]]  # inside its precision: the cast is exact
            arrays[spec["name"]] = arr
    tensors = {n: tvm_ffi.from_dlpack(a, require_alignment=ALIGNMENT) for n, a in arrays.items()}
    for kernel in plan["kernels"]:
        progress(f"calling {kernel['symbol']} ({placement}, {kind} garbage)")
        module[kernel["symbol"]](*[tensors[a] for a in kernel["args"]])
    return {s["name"]: arrays[s["name"]].copy() for s in plan["outputs"]}


def run_guarded(library: str, job: str, result: str) -> None:
    """Worker side: every placement and garbage of the pickled (plan, values, seed) `job`;
    the outputs {(placement, garbage): {name: array}} pickled to `result`."""
    import cvmc_runtime

    module = cvmc_runtime.load_kernels(library)
    with open(job, "rb") as f:
        plan, values, seed = pickle.load(f)
    runs = {(p, k): _run_kernels(module, plan, values, p, k, seed)
            for p in PLACEMENTS for k in GARBAGE}
    with open(result, "wb") as f:
        pickle.dump(runs, f)


@pytest.fixture(scope="module")
def worker(tmp_path_factory):
    w = GuardWorker(tmp_path_factory.mktemp("guard") / "progress")
    yield w
    w.close()


@pytest.mark.parametrize("index", range(len(CASES)), ids=[case_id(c) for c in CASES])
def test_kernels_stay_inside_their_buffers(index, tmp_path, worker, op_builds):
    case = CASES[index]
    g = op_builds.graph(index)
    want = run_reference(g, [arr for arr, _ in case.inputs])
    build = op_builds.library(index)  # built once per run, shared with test_op_cases
    (tmp_path / "job.pkl").write_bytes(pickle.dumps((build.plan, build.values, index)))
    worker.call(f"{__name__}:run_guarded", library=str(build.library),
                job=str(tmp_path / "job.pkl"), result=str(tmp_path / "runs.pkl"))
    runs = list(pickle.loads((tmp_path / "runs.pkl").read_bytes()).values())
    for name, ref, atol in zip(g.outputs, want, case.tolerances()):
        for got in runs:  # the same bits whatever surrounds the buffers, and as the reference
            assert_matches(case.op, name, runs[0][name], got[name])
            assert_matches(case.op, name, ref, got[name], case.ulp, atol)

"""No compiled kernel reads outside its inputs or depends on what its outputs held before.

Every case of `op_cases.CASES` is lowered and built for llvm once, and its kernels are
called directly (tvm-ffi, no runtime) in plan order several times. Each time, every
tensor the kernels see (inputs, weights, intermediate buffers, outputs) lies in the
middle of a larger 64-byte aligned allocation whose bytes before and after are garbage,
and outputs and intermediates start out as garbage too; each run uses different garbage.
A kernel that reads past an input (e.g. max_pool2d's ceil_mode window, which read past
the input when padding was 0: issue 9, item 2) or reads an output before writing it gives
results that differ between the runs or from the reference interpreter.
"""
from __future__ import annotations

import numpy as np
import pytest
from cvmc_runtime.model import ALIGNMENT, aligned_empty

from cvmc.codegen.build import build_llvm
from cvmc.lowering.lower import lower_graph
from tests.codegen.op_cases import CASES, case_id
from tests.oputil import assert_matches, one_op_graph, run_reference

MARGIN = 4096  # garbage bytes before and after every tensor (a multiple of 64: alignment)


def _garbage(kind: str, size: int, rng: np.random.Generator) -> np.ndarray:
    """0x7f: the largest int8/int32 values; 0x80: the most negative; or random bytes."""
    if kind == "random":
        return rng.integers(0, 256, size, np.uint8)
    return np.full(size, {"0x7f": 0x7F, "0x80": 0x80}[kind], np.uint8)


def _in_garbage(shape, dtype, kind: str, rng: np.random.Generator) -> np.ndarray:
    """An aligned array of `shape` in the middle of a garbage-filled allocation."""
    dtype = np.dtype(dtype)
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    raw = aligned_empty((nbytes + 2 * MARGIN,), np.uint8)
    raw[:] = _garbage(kind, raw.size, rng)
    return raw[MARGIN:MARGIN + nbytes].view(dtype).reshape(shape)


def _run_kernels(module, plan: dict, values: dict, kind: str, seed: int) -> dict:
    """Call every kernel of `plan` on garbage-surrounded tensors; outputs by name."""
    import tvm_ffi

    rng = np.random.default_rng(seed)
    arrays = {}
    for spec in [*plan["inputs"], *plan["weights"], *plan["buffers"], *plan["outputs"]]:
        if spec["name"] not in arrays:
            arr = _in_garbage(tuple(spec["shape"]), spec["dtype"], kind, rng)
            if spec["name"] in values:
                arr[...] = values[spec["name"]]  # inside its precision: the cast is exact
            arrays[spec["name"]] = arr
    tensors = {n: tvm_ffi.from_dlpack(a, require_alignment=ALIGNMENT) for n, a in arrays.items()}
    for kernel in plan["kernels"]:
        module[kernel["symbol"]](*[tensors[a] for a in kernel["args"]])
    return {s["name"]: arrays[s["name"]].copy() for s in plan["outputs"]}


@pytest.mark.parametrize("index", range(len(CASES)), ids=[case_id(c) for c in CASES])
def test_kernels_stay_inside_their_buffers(index, tmp_path):
    import tvm_ffi

    case = CASES[index]
    g = one_op_graph(case.op, case.inputs, case.attrs, case.weights, case.out_dtype)
    xs = [arr for arr, _ in case.inputs]
    want = run_reference(g, xs)
    mod, _, plan = lower_graph(g, "llvm")
    (tmp_path / "kernels.so").write_bytes(build_llvm(mod).library)
    module = tvm_ffi.load_module(str(tmp_path / "kernels.so"))
    values = {**{n: xs[int(n[1:])] for n in g.inputs}, **g.constants}
    runs = [_run_kernels(module, plan, values, kind, seed=index)
            for kind in ("0x7f", "0x80", "random")]
    for name, ref, atol in zip(g.outputs, want, case.tolerances()):
        for got in runs:  # the same bits whatever surrounds the buffers, and as the reference
            assert_matches(case.op, name, runs[0][name], got[name])
            assert_matches(case.op, name, ref, got[name], case.ulp, atol)

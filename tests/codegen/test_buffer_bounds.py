"""No compiled kernel reads outside its inputs or depends on what its outputs held before.

Every case of `op_cases.CASES` is compiled for llvm once and run twice. Each time, every
tensor the kernels see (inputs, weights, intermediate buffers, outputs) lives in the middle
of a larger 64-byte aligned allocation whose bytes before and after are garbage, and
outputs and intermediates start out as garbage too; the two runs use different garbage.
A kernel that reads past an input (e.g. max_pool2d's ceil_mode window, which used to read
past the input when padding was 0: issue 9, item 2) or reads an output before writing it
gives results that differ between the runs or from the reference interpreter.
"""
from __future__ import annotations

import tempfile
from pathlib import Path

import cvmc_runtime
import numpy as np
import pytest
from cvmc_runtime.model import aligned_empty

from cvmc.codegen import compile_model
from tests.codegen.op_cases import CASES, case_id
from tests.oputil import one_op_graph, run_reference

MARGIN = 4096  # garbage bytes before and after every tensor (a multiple of 64: alignment)


def _garbage(kind: str, size: int) -> np.ndarray:
    if kind == "ones":
        return np.full(size, 0x7F, np.uint8)  # large positive int8/int32 values
    return np.random.default_rng(size).integers(0, 256, size, np.uint8)


def _surround_with_garbage(model, kind: str) -> None:
    """Move every tensor of `model` into the middle of a garbage-filled allocation."""
    import tvm_ffi

    buffers = model._buf
    for name, arr in list(buffers.host.items()):
        raw = aligned_empty((arr.nbytes + 2 * MARGIN,), np.uint8)
        raw[:] = _garbage(kind, raw.size)
        view = raw[MARGIN:MARGIN + arr.nbytes].view(arr.dtype).reshape(arr.shape)
        if any(s["name"] == name for s in model.plan["weights"]):
            view[...] = arr  # weights keep their data; everything else starts as garbage
        buffers.host[name] = view
        buffers.tensors[name] = tvm_ffi.from_dlpack(view, require_alignment=64)


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_kernels_stay_inside_their_buffers(case):
    g = one_op_graph(case.op, case.inputs, case.attrs, case.weights)
    xs = [arr for arr, _ in case.inputs]
    want = run_reference(g, xs)
    feeds = {n: xs[int(n[1:])] for n in g.inputs}
    with tempfile.TemporaryDirectory(prefix="cvmc-bounds-") as tmp:
        compile_model(g, Path(tmp) / "op.cvmx", "llvm")
        models = [cvmc_runtime.load(Path(tmp) / "op.cvmx") for _ in range(2)]
    runs = []
    for model, kind in zip(models, ("ones", "random")):
        _surround_with_garbage(model, kind)
        runs.append(model.run(feeds))
    for name, ref in zip(g.outputs, want):
        assert np.array_equal(runs[0][name], runs[1][name]), \
            f"{case.op} output {name}: depends on memory outside its buffers"
        assert np.array_equal(runs[0][name], ref), f"{case.op} output {name} != reference"

"""Whole compiled models read nothing outside their arena and tensors (issue 22, item 0).

A float model (a depth-wise stride-2 pad-1 conv, then a padded 3x3 conv: MobileNet-v2's
faulting pattern) and an integer one of the same shape are compiled for llvm and run by
the runtime in a worker process (tests.guard_pages) whose `cvmc_runtime.model.aligned_empty`
places every allocation, the arena included, right after a PROT_NONE guard page and then
right before one. The arena holds one buffer (the first conv's output, which the second
conv reads), so a read before or after it faults. Inputs and weights are small integers,
so even the float sums are exact: results must equal the reference interpreter bit for
bit.
"""
from __future__ import annotations

import pickle

import numpy as np
import pytest

import cvmc
from tests.guard_pages import PLACEMENTS, GuardWorker, guarded_empty, progress


def run_model(artifact: str, feeds: str, result: str) -> None:
    """Worker side: run `artifact` on the pickled `feeds` with every allocation of the
    runtime guarded, in each placement; the outputs {placement: {name: array}} pickled."""
    import cvmc_runtime
    from cvmc_runtime import model as runtime_model

    with open(feeds, "rb") as f:
        values = pickle.load(f)
    plain = runtime_model.aligned_empty
    garbage = np.random.default_rng(0).integers(0, 256, 4096, np.uint8)
    runs = {}
    try:
        for placement in PLACEMENTS:
            runtime_model.aligned_empty = \
                lambda shape, dtype, p=placement: guarded_empty(shape, dtype, p, garbage)
            progress(f"running {artifact} ({placement})")
            runs[placement] = cvmc_runtime.load(artifact).run(values)
    finally:
        runtime_model.aligned_empty = plain
    with open(result, "wb") as f:
        pickle.dump(runs, f)


def _float_model(rng: np.random.Generator):
    b = cvmc.GraphBuilder("guarded_float")
    x = b.input("x", [1, 4, 9, 16], "float32")
    w1 = b.constant(rng.integers(-3, 4, (4, 1, 3, 3)).astype(np.float32))
    w2 = b.constant(rng.integers(-3, 4, (3, 4, 3, 3)).astype(np.float32))
    h = b.nnef_conv(x, w1, groups=0, padding=[(1, 1), (1, 1)], stride=[2, 2])
    y = b.nnef_conv(h, w2, padding=[(1, 1), (1, 1)])
    return b.build([y]), {"x": rng.integers(-8, 9, (1, 4, 9, 16)).astype(np.float32)}


def _integer_model(rng: np.random.Generator):
    b = cvmc.GraphBuilder("guarded_int")
    x = b.input("x", [1, 4, 9, 16], "int32", precision=8)
    w1 = b.constant(rng.integers(-127, 128, (4, 1, 3, 3)), precision=8)
    w2 = b.constant(rng.integers(-127, 128, (3, 4, 3, 3)), precision=8)
    h = b.conv2d(x, w1, padding=[1, 1], stride=[2, 2], groups=4)
    h = b.cvm_right_shift(h, precision=8, shift_bit=6)
    y = b.conv2d(h, w2, padding=[1, 1])
    return b.build([y]), {"x": rng.integers(-127, 128, (1, 4, 9, 16)).astype(np.int32)}


@pytest.fixture(scope="module")
def worker(tmp_path_factory):
    w = GuardWorker(tmp_path_factory.mktemp("guard") / "progress")
    yield w
    w.close()


@pytest.mark.parametrize("make", [_float_model, _integer_model], ids=["float", "integer"])
def test_models_stay_inside_a_guarded_arena(make, tmp_path, worker):
    g, feeds = make(np.random.default_rng(7))
    cvmc.compile(g, tmp_path / "m.cvmx", target="llvm")
    (tmp_path / "feeds.pkl").write_bytes(pickle.dumps(feeds))
    worker.call(f"{__name__}:run_model", artifact=str(tmp_path / "m.cvmx"),
                feeds=str(tmp_path / "feeds.pkl"), result=str(tmp_path / "runs.pkl"))
    runs = pickle.loads((tmp_path / "runs.pkl").read_bytes())
    want = cvmc.reference_run(g, feeds)
    for placement in PLACEMENTS:
        for name, ref in want.items():
            got = runs[placement][name]
            assert got.dtype == ref.dtype and np.array_equal(got, ref), (placement, name)

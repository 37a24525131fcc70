"""The runtime refuses a plan whose dataflow is incomplete or whose weights leave their
declared precision, before any kernel runs (issue 9, items 1 and 6)."""
from __future__ import annotations

import copy

import numpy as np
import pytest
from cvmc_runtime import ModelError
from cvmc_runtime.plan import check_weights, validate_plan


def _spec(name, shape=(4,), dtype="int8", precision=8):
    return {"name": name, "shape": list(shape), "dtype": dtype, "precision": precision}


TARGET = {"kind": "llvm", "mcpu": "x86-64", "features": []}
# x -> k0 -> t -> k1 -> y, with weight w read by k1.
PLAN = {
    "device": "cpu", "target": TARGET,
    "inputs": [_spec("x")], "weights": [_spec("w")], "buffers": [_spec("t")],
    "outputs": [_spec("y")],
    "kernels": [{"symbol": "k0", "args": ["x", "t"], "num_inputs": 1},
                {"symbol": "k1", "args": ["t", "w", "y"], "num_inputs": 2}],
}


def _edited(edit) -> dict:
    plan = copy.deepcopy(PLAN)
    edit(plan)
    return plan


def test_the_valid_plan_passes():
    validate_plan(PLAN)


@pytest.mark.parametrize("edit, message", [
    (lambda p: p.update(kernels=[]), "output 'y' is never written"),
    (lambda p: p["kernels"].pop(), "output 'y' is never written"),
    (lambda p: p["kernels"].reverse(), "reads 't' before anything writes it"),
    (lambda p: p["kernels"][0].update(args=["x", "w"]), "overwrite the input or weight 'w'"),
    (lambda p: p["kernels"][0].update(args=["t", "x"]), "reads 't' before"),
    (lambda p: p["kernels"][1].update(num_inputs=7), "num_inputs must be an integer"),
    (lambda p: p["kernels"][1].pop("num_inputs"), "num_inputs must be an integer"),
    (lambda p: p["kernels"][1].update(num_inputs=3), "reads 'y' before"),
])
def test_incomplete_dataflow_is_refused(edit, message):
    with pytest.raises(ModelError, match=message):
        validate_plan(_edited(edit))


def test_outputs_that_are_inputs_or_weights_need_no_kernel():
    plan = _edited(lambda p: p.update(outputs=[_spec("x"), _spec("w")], kernels=[],
                                      buffers=[]))
    validate_plan(plan)


@pytest.mark.parametrize("key", ["inputs", "weights", "buffers", "outputs"])
@pytest.mark.parametrize("dtype, precision", [("int8", 9), ("int8", 32), ("int8", 0),
                                              ("int32", 33), ("int32", 0), ("int8", True)])
def test_precisions_must_fit_their_dtype(key, dtype, precision):
    """Issue 29, item 2: a plan (and signature) giving an int8 tensor precision 9 stored
    the input 200 as -56; every precision the plan types fits its dtype's width."""
    plan = _edited(lambda p: p[key][0].update(dtype=dtype, precision=precision))
    with pytest.raises(ModelError, match="a precision in 1..8 for int8, 1..32 for int32"):
        validate_plan(plan)
    validate_plan(_edited(lambda p: p[key][0].update(dtype=dtype, precision=min(
        max(int(precision), 1), 8 if dtype == "int8" else 32))))


@pytest.mark.parametrize("value, index", [(127, None), (-127, None), (128, 2), (-128, 1)])
def test_weights_outside_their_precision_are_refused(value, index):
    w = np.array([0, 0, 0, 0], np.int32)
    w[index if index is not None else 3] = value
    plan = _edited(lambda p: p["weights"][0].update(dtype="int32"))
    if index is None:
        check_weights(plan, {"w": w})
        return
    with pytest.raises(ModelError, match=f"value {value} at index \\[{index}\\] is outside"):
        check_weights(plan, {"w": w})


# ---- bounded reading (issue 9, item 7) -----------------------------------------------------
def _artifact_with(tmp_path, **members: bytes):
    """The example compiled, then members replaced (written deflated, like the compiler)."""
    import zipfile
    from pathlib import Path

    from cvmc.cli import main

    src = tmp_path / "m.cvmx"
    assert main(["compile", str(Path(__file__).resolve().parents[2] / "examples" / "small_cnn"),
                 "-o", str(src)]) == 0
    with zipfile.ZipFile(src) as z:
        blobs = {n: z.read(n) for n in z.namelist()}
    blobs.update({k.replace("__", "/"): v for k, v in members.items()})
    out = tmp_path / "edited.cvmx"
    with zipfile.ZipFile(out, "w", compression=zipfile.ZIP_DEFLATED) as z:
        for name, blob in blobs.items():
            z.writestr(name, blob)
    return out


def test_a_huge_plan_member_fails_before_it_is_read(tmp_path):
    import time

    import cvmc_runtime
    path = _artifact_with(tmp_path, **{"plan.json": b"{}" + b" " * (80 << 20)})
    start = time.perf_counter()
    with pytest.raises(ModelError, match="member 'plan.json' declares 83886082 bytes"):
        cvmc_runtime.load(path)
    assert time.perf_counter() - start < 1


def test_weight_members_larger_than_declared_and_unused_members(tmp_path):
    import io

    import cvmc_runtime
    big = io.BytesIO()
    np.save(big, np.zeros(1 << 20, np.int8))
    with pytest.raises(ModelError, match="member 'weights/0.npy' declares"):
        cvmc_runtime.load(_artifact_with(tmp_path, **{"weights__0.npy": big.getvalue()}))
    # A member the plan does not name is never read, however large it claims to be.
    model = cvmc_runtime.load(_artifact_with(tmp_path, **{"weights__99.npy": b"\0" * (50 << 20)}))
    assert [s.name for s in model.outputs] == ["logits"]


# ---- the arena (issue 11: one allocation per model, offsets by liveness) --------------------
def _chain_plan() -> dict:
    """x -> k0 -> a -> k1 -> b -> k2 -> c -> k3 -> y, buffers of 250 int32 (1000 bytes)."""
    plan = {"device": "cpu", "target": TARGET, "inputs": [_spec("x", (250,), "int32")],
            "weights": [], "outputs": [_spec("y", (250,), "int32")],
            "buffers": [_spec(n, (250,), "int32") for n in "abc"],
            "kernels": [{"symbol": f"k{i}", "args": [src, dst], "num_inputs": 1}
                        for i, (src, dst) in enumerate(zip("xabc", "abcy"))]}
    return plan


def test_arena_offsets_by_liveness():
    from cvmc.lowering.lower import plan_arena

    plan = _chain_plan()
    arena = plan_arena(plan)
    # By hand: a lives in kernels 0-1, b in 1-2, c in 2-3. a takes offset 0; b overlaps a in
    # time, so it goes after a, rounded up to 64 bytes: 1024; c overlaps b but not a, so it
    # reuses offset 0. The arena ends at b's end: 1024 + 1000 = 2024 bytes (3000 without
    # reuse).
    assert arena == {"bytes": 2024, "offsets": {"a": 0, "b": 1024, "c": 0}}
    plan["arena"] = arena
    validate_plan(plan)


@pytest.mark.parametrize("offsets, bytes_, words", [
    ({"a": 0, "b": 0, "c": 1024}, 2024, "buffers 'a' and 'b' overlap while both are live"),
    ({"a": 0, "b": 1000, "c": 0}, 2024, "offset that is a multiple of 64"),
    ({"a": 0, "b": 1024, "c": 0}, 2000, "inside the arena's 2000"),
    ({"a": 0, "b": 1024, "c": 0}, 4096, "4096 bytes, but its buffers end at byte 2024"),
    ({"a": 0, "b": 1024}, 2024, "buffer 'c' needs an offset"),
])
def test_bad_arenas_are_refused(offsets, bytes_, words):
    plan = _chain_plan()
    plan["arena"] = {"bytes": bytes_, "offsets": offsets}
    with pytest.raises(ModelError, match=words):
        validate_plan(plan)


@pytest.mark.parametrize("dtype, precision", [("int8", 9), ("int8", 0), ("int32", 33),
                                              ("int32", None)])
def test_a_tensor_spec_ties_its_precision_to_its_dtype(dtype, precision):
    """check_inputs takes TensorSpecs from anyone: int8 with precision 9 clipped 300 to 255
    and stored it as -1."""
    from cvmc_runtime import TensorSpec
    with pytest.raises(ModelError, match=f"an {dtype} needs a precision in 1.."):
        TensorSpec("x", (2,), dtype, precision)
    TensorSpec("x", (2,), dtype, 8)

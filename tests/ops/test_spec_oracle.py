"""An independent audit of every CVM op against the formal spec (`tests.spec_oracles`).

Hypothesis draws small inputs (extremes +-(2^(p-1)-1), negative axes and indices, every
attribute branch) from each CVM op's `Spec`, named by its test record in
tests/codegen/op_cases.py; cvmc's reference interpreter, its inferred precisions and (on a
few examples per op) the compiled llvm kernels must agree bit-exactly with the oracle.
"""
from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cvmc.errors import CvmcError
from tests.codegen.op_cases import specs
from tests.oputil import check_op, one_op_graph, run_reference
from tests.spec_oracles import Case, Rejected, gen_nms

SPECS = specs()  # at collection; the checks read specs() as they run (a toy op's record)


def _expected(op: str, case: Case) -> list[np.ndarray] | None:
    """The oracle's outputs, or None when cvmc must reject the case."""
    try:
        return specs()[op].oracle(case)
    except Rejected:
        return None


def _assert_equal(op: str, got: list[np.ndarray], want: list[np.ndarray]) -> None:
    assert len(got) == len(want), op
    for i, (g, w) in enumerate(zip(got, want)):
        assert g.shape == w.shape, f"{op} output {i}: shape {g.shape}, spec {w.shape}"
        assert np.array_equal(g, w), f"{op} output {i}:\n{g}\nspec:\n{w}"


def _audit(op: str, case: Case, run: Callable) -> None:
    """Compare cvmc (reference or compiled) and its inferred precisions with the spec."""
    want = _expected(op, case)
    if want is None:
        with pytest.raises(CvmcError):
            one_op_graph(op, case.inputs, case.attrs)
        return
    g = one_op_graph(op, case.inputs, case.attrs)
    _assert_equal(op, run(g, case), want)
    got_p = [g.types[o].precision for o in g.outputs]
    assert got_p == specs()[op].precision(case, want), f"{op}: precision {got_p}"


def _reference(g, case: Case) -> list[np.ndarray]:
    return run_reference(g, [x for x, _ in case.inputs])


def test_every_cvm_op_is_audited():
    from cvmc.ops import all_ops
    # Every op of the spec's set (ops from CVM-Runtime or cvmc itself are tested elsewhere).
    assert {d.name for d in all_ops() if "cvm" in d.seeds} == set(specs())


@pytest.mark.parametrize("op", sorted(SPECS))
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_reference_matches_spec(op, data):
    _audit(op, specs()[op].gen(data.draw), _reference)


@pytest.mark.parametrize("op", sorted(SPECS))
@settings(max_examples=3, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_compiled_matches_spec(op, data):
    case = specs()[op].gen(data.draw)
    _audit(op, case, lambda g, c: check_op(op, c.inputs, c.attrs))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_nms_reference_matches_spec_at_iou_boundaries(data):
    # thresholds sit at an occurring OLR, where a rare pair decides the output: more examples
    _audit("non_max_suppression", gen_nms(data.draw), _reference)


def z(*shape: int) -> np.ndarray:
    """Zeros of `shape`."""
    return np.zeros(shape, dtype=np.int64)


# Attribute and operand ranges the spec states (max_attr = 4096, exclusive): values just
# outside are rejected with a message naming the attribute or operand ...
OUT_OF_RANGE = [
    ("cvm_clip", [(z(2), 8)], {"precision": 33}, "'precision'"),
    ("cvm_clip", [(z(2), 8)], {"precision": 0}, "'precision'"),
    ("cvm_right_shift", [(z(2), 8)], {"precision": 8, "shift_bit": 33}, "'shift_bit'"),
    ("cvm_right_shift", [(z(2), 8)], {"precision": 8, "shift_bit": 0}, "'shift_bit'"),
    ("cvm_left_shift", [(z(2), 8)], {"precision": 8, "shift_bit": 25}, "shift_bit"),
    ("clip", [(z(2), 8)], {"a_min": 3, "a_max": 3}, "'a_min'"),
    ("conv2d", [(z(1, 2, 3, 3), 9), (z(2, 2, 1, 1), 8)], {}, "data precision"),
    ("conv2d", [(z(1, 2, 3, 3), 8), (z(3, 1, 1, 1), 8)], {"groups": 2}, "groups"),
    ("conv2d", [(z(1, 4, 3, 3), 8), (z(2, 1, 1, 1), 8)], {"groups": 2}, "channels"),
    ("conv2d", [(z(1, 2, 3, 3), 8), (z(2, 2, 1, 1), 8)], {"stride": [4096, 1]}, "'stride'"),
    ("conv2d", [(z(1, 2, 3, 3), 8), (z(2, 2, 1, 1), 8)], {"dilation": [1, 0]}, "'dilation'"),
    ("conv2d", [(z(1, 2, 3, 3), 8), (z(2, 2, 1, 1), 8)], {"padding": [-1, 0]}, "'padding'"),
    ("dense", [(z(1, 2), 8), (z(2, 2), 9)], {}, "weight precision"),
    ("max_pool2d", [(z(1, 1, 3, 3), 8)], {"pool_size": [1, 2], "padding": 1}, "pool_size"),
    ("max_pool2d", [(z(1, 1, 3, 3), 8)], {"pool_size": [6, 2], "padding": 1}, "pool_size"),
    ("upsampling", [(z(1, 1, 2, 2), 8)], {"scale": 4096}, "'scale'"),
    ("upsampling", [(z(1, 1, 2, 2), 8)], {"scale": 0}, "'scale'"),
    ("sum", [(z(2, 3), 8)], {"axes": [0, -2]}, "'axes'"),
    ("max", [(z(2, 3), 8)], {"axes": [2]}, "axis 2"),
    ("tile", [(z(2, 3), 8)], {"reps": [4096]}, "'reps'"),
    ("repeat", [(z(2, 3), 8)], {"repeats": 0}, "'repeats'"),
    ("transpose", [(z(2, 3), 8)], {"axes": [0, 0]}, "'axes'"),
    ("expand_dims", [(z(2, 3), 8)], {"axis": 3}, "'axis'"),
    ("expand_dims", [(z(2, 3), 8)], {"axis": -4}, "'axis'"),
    ("expand_dims", [(z(2, 3), 8)], {"axis": 0, "num_newaxis": 4096}, "'num_newaxis'"),
    ("squeeze", [(z(2, 1), 8)], {"axes": [0]}, "length 2"),
    ("slice", [(z(4), 8)], {"begin": [0], "end": [4], "strides": [0]}, "'strides'"),
    ("slice_like", [(z(2, 3), 8), (z(3, 3), 8)], {}, "shape_like"),
    ("take", [(z(2, 3), 8), (z(2), 8)], {"axis": -3}, "'axis'"),
    ("where", [(z(3), 8), (z(2, 3), 8), (z(2, 3), 8)], {}, "condition"),
    ("get_valid_count", [(z(1, 2, 1), 8)], {}, "K"),
    ("get_valid_count", [(z(1, 2, 32), 8)], {}, "K"),  # SPEC_EXCEPTIONS get_valid_count-K
    ("non_max_suppression", [(z(1, 2, 5), 8), (z(1), 8)], {"iou_threshold": 50}, "(B, N, 6)"),
    ("non_max_suppression", [(z(1, 2, 6), 8), (z(1), 8)], {"iou_threshold": 0},
     "'iou_threshold'"),
]

# ... and the values at the edges of those ranges are accepted.
AT_THE_EDGE = [
    ("cvm_right_shift", [(z(2), 32)], {"precision": 32, "shift_bit": 32}),
    ("cvm_right_shift", [(z(2), 32)], {"precision": 1, "shift_bit": 1}),
    ("cvm_left_shift", [(z(2), 8)], {"precision": 32, "shift_bit": 24}),
    ("conv2d", [(z(1, 2, 3, 3), 8), (z(2, 2, 1, 1), 8)], {"stride": [4095, 4095]}),
    ("conv2d", [(z(1, 2, 3, 3), 8), (z(2, 1, 1, 1), 8)], {"groups": 2}),
    ("max_pool2d", [(z(1, 1, 3, 3), 8)], {"pool_size": [5, 2], "padding": 1}),
    ("upsampling", [(z(1, 1, 1, 1), 8)], {"scale": 4095}),
    ("expand_dims", [(z(2, 3), 8)], {"axis": -3, "num_newaxis": 4}),
    ("get_valid_count", [(z(1, 2, 2), 8)], {}),
    ("get_valid_count", [(z(1, 2, 31), 8)], {}),
]


@pytest.mark.parametrize("op, inputs, attrs, names", OUT_OF_RANGE)
def test_spec_ranges_are_enforced(op, inputs, attrs, names):
    with pytest.raises(CvmcError) as err:
        one_op_graph(op, inputs, attrs)
    assert err.value.message.startswith(op) and names in err.value.message, err.value.message


@pytest.mark.parametrize("op, inputs, attrs", AT_THE_EDGE)
def test_spec_range_edges_are_accepted(op, inputs, attrs):
    one_op_graph(op, inputs, attrs)


@pytest.mark.slow
@pytest.mark.parametrize("op", sorted(SPECS))
@settings(max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_reference_matches_spec_many_examples(op, data):
    _audit(op, specs()[op].gen(data.draw), _reference)

"""The "How to add an op" recipe, done: one registry entry and one test record make a toy
integer op (toy_double, y = 2x with precision p_x + 1) that every per-op table picks up:
compiled vs reference (tests/codegen/test_op_cases.py), the formal spec's oracle
(tests/ops/test_spec_oracle.py) and the CVM-Runtime JSON round trip
(tests/frontend/test_cvm_json.py). The op and its record are removed afterwards."""
from __future__ import annotations

from pathlib import Path

import pytest

import tests.spec_oracles as so
from cvmc.ops import registry
from cvmc.ops.registry import Fusion, check_registry, op
from tests.codegen import op_cases, test_op_cases
from tests.codegen.op_cases import CASES, OpCase, exports, rand, specs
from tests.frontend import test_cvm_json
from tests.ops import test_spec_oracle


def _register_toy_double():
    """Step 1, the registry entry (as an op module would declare it)."""
    d = op("toy_double", family="toy", inputs=("x",), fusion=Fusion.ELEMWISE,
           precision_rule="p_x + 1")
    d.shape(lambda ins, a: ins[0].shape)
    d.precision(lambda ins, a: ins[0].precision + 1)  # |2x| <= 2 (2^(p-1) - 1) < 2^p - 1
    d.reference(lambda xs, a: 2 * xs[0])

    @d.lower
    def _(xs, a):
        from cvmc.ops.te import elementwise
        return elementwise(xs[0], lambda v: v * 2, "toy_double")

    check_registry()
    return d


# Step 2, the test record: a case, the spec's formula (y[i] = 2 x[i], precision p_x + 1,
# so inputs of up to 31 bits) and the node of the CVM-Runtime JSON round trip.
RECORD = OpCase("toy_double", [rand((3, 5), 8, 1)],
                spec=so.Spec(lambda draw: so.gen_unary(draw, p=(1, 31)),
                             so.unary(lambda x: 2 * x),
                             lambda c, ys: [c.p(0) + 1]),
                export=(["x"], {}))


@pytest.fixture
def toy_double():
    d = _register_toy_double()
    CASES.append(RECORD)
    try:
        yield d
    finally:
        CASES.remove(RECORD)
        del registry._REGISTRY["toy_double"]


def test_one_entry_and_one_record_reach_every_per_op_table(toy_double, tmp_path: Path):
    assert specs()["toy_double"] is RECORD.spec and exports()["toy_double"] == RECORD.export
    test_op_cases.test_every_op_has_a_case()
    test_op_cases.check_case(RECORD)
    test_spec_oracle.test_every_cvm_op_is_audited()
    test_spec_oracle.test_reference_matches_spec("toy_double")
    test_spec_oracle.test_compiled_matches_spec("toy_double")
    test_cvm_json.test_round_trip_covers_every_cvm_runtime_op()
    test_cvm_json.test_round_trip_every_cvm_op(tmp_path)
    assert "toy_double" in {n.op for n in test_cvm_json._all_ops_graph().nodes}


def test_a_wrong_rule_is_caught(toy_double):
    # The tables can fail: a reference rule of 3x // 2 (inside precision p_x + 1) disagrees
    # with the spec's formula.
    toy_double.rules["reference"] = lambda xs, a: 3 * xs[0] // 2
    with pytest.raises(AssertionError, match="toy_double output 0"):
        test_spec_oracle.test_reference_matches_spec("toy_double")


def test_the_toy_op_is_gone_afterwards():
    assert registry.lookup("toy_double") is None
    assert all(c.op != "toy_double" for c in op_cases.CASES)

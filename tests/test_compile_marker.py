"""The `compile` marker (tests/compile_marker.py) finds what compiles by the calls written in
the test files, through helpers and fixtures, and leaves the rest out."""
from __future__ import annotations

from pathlib import Path

import pytest

from tests.compile_marker import compiles

TESTS = Path(__file__).resolve().parent


@pytest.mark.parametrize("path, name", [
    ("codegen/test_op_cases.py", "check_case"),  # tests.oputil.check_op -> compile_model
    ("codegen/test_op_cases.py", "test_no_kernel_uses_floating_point"),  # lower_graph
    ("conftest.py", "op_builds"),  # the class it makes compiles
    ("test_add_an_op.py", "test_one_entry_and_one_record_reach_every_per_op_table"),
    ("test_cli_robustness.py", "test_output_into_missing_folder_or_onto_folder"),  # "compile"
    ("codegen/test_compile_cache.py", "test_workers_start_from_a_script_without_main_guard"),
    ("lowering/test_fusion_and_plan.py", "test_cpu_schedule_parallel_and_vectorised"),
    ("test_benchmarks.py", "test_smallest_workload_gives_a_verified_row"),  # bench.run_...
])
def test_compiling_tests_are_found(path, name):
    assert compiles(str(TESTS / path), name)


@pytest.mark.parametrize("path, name", [
    ("codegen/test_op_cases.py", "test_every_op_has_a_case"),
    ("codegen/test_op_cases.py", "test_reference_of_every_case_runs_without_tvm"),
    ("test_add_an_op.py", "test_a_wrong_rule_is_caught"),
    ("ops/test_spec_oracle.py", "test_reference_matches_spec"),
    ("test_registry.py", "test_every_registered_op_is_complete"),
])
def test_the_rest_is_left_out(path, name):
    assert not compiles(str(TESTS / path), name)


def test_the_marker_is_applied(request):
    # this test compiles nothing: collected without the marker; a test that compiles
    # through a fixture only (op_builds) is marked
    assert request.node.get_closest_marker("compile") is None
    here = [item for item in request.session.items if item.path == request.node.path]
    marked = [item.name for item in here if item.get_closest_marker("compile") is not None]
    # (under -m "not compile" the one that compiles is deselected: not in the session)
    assert marked == [item.name for item in here
                      if item.name == "test_compiling_through_a_fixture"]


def test_compiling_through_a_fixture(op_builds):
    """Marked: it uses op_builds (nothing is built here)."""

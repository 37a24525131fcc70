"""The text generated from the op records (NNEF declarations, the docs' op table), and
the records' packing and epilogue facts against the Target's (cvmc.passes.target).

Oracle for the declarations: Khronos' stdlib (`cvmc/frontend/stdlib.nnef`, the spec's
text verbatim), parsed by the frontend's fragment reader. Every primitive it declares
that has an entry must be declared the same from the entry: parameters (names, types,
defaults), results, genericity.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from cvmc.frontend.fragments import khronos_stdlib, parse_fragments, stdlib
from cvmc.ops.describe import nnef_declaration, nnef_declarations, nnef_name, nnef_ops, op_table

ROOT = Path(__file__).resolve().parents[2]
SPEC = khronos_stdlib()
RECORDS = parse_fragments(nnef_declarations(), "<op records>")
# Khronos' declarations without an op: graph inputs and weights, not nodes
NOT_OPS = {"external", "variable", "constant"}
# cvmc's own NNEF-typed ops (written by its passes), which the spec does not declare
OWN = {"max_window", "select_max", "select_min", "select_clamp"}


def _signature(f):
    return (f.generic, f.generic_default, [(p.name, p.type, p.default) for p in f.params],
            f.results)


def test_every_spec_primitive_is_declared_by_a_record():
    primitives = {n for n, f in SPEC.items() if f.body is None} - NOT_OPS
    assert primitives <= set(RECORDS)
    assert set(RECORDS) - primitives == OWN


@pytest.mark.parametrize("name", sorted(n for n in RECORDS if n in SPEC))
def test_record_declaration_agrees_with_the_spec(name):
    assert _signature(RECORDS[name]) == _signature(SPEC[name])


def test_a_declaration_in_full():
    """Hand-written from spec 4.3.1 (conv): an optional bias defaulting to 0.0, then the
    attributes with their defaults."""
    conv = next(d for d in nnef_ops() if nnef_name(d) == "conv")
    assert nnef_declaration(conv) == (
        "fragment conv( input: tensor<scalar>, filter: tensor<scalar>, bias: tensor<scalar> = "
        "0.0, border: string = 'constant', padding: (integer,integer)[] = [], stride: "
        "integer[] = [], dilation: integer[] = [], groups: integer = 1 ) -> "
        "( output: tensor<scalar> );")


def test_documents_are_read_with_the_records_declarations_and_khronos_compounds():
    lib = stdlib()
    assert {n for n, f in lib.items() if f.source.filename == "<op records>"} == set(RECORDS)
    assert lib["max_pool"].body is not None and lib["max_pool"] is SPEC["max_pool"]
    assert lib["external"] is SPEC["external"]


def test_docs_op_table_is_what_the_records_give():
    """docs/ops.md is generated: rerun `cvmc ops --markdown > docs/ops.md` after changing
    an op's record."""
    assert (ROOT / "docs" / "ops.md").read_text() == op_table()


def test_each_target_packs_and_anchors_the_ops_its_kernels_want():
    """What the records give each Target (cvmc.passes.target reads them): llvm packs the
    int8 conv and dense weights and any op takes an epilogue; cuda packs conv2d only
    (dense keeps its own dp4a rule) and only the ops a CUDA schedule row is anchored on
    take an epilogue."""
    from cvmc.ops import all_ops
    from cvmc.passes.target import Target

    llvm, cuda = Target("llvm"), Target("cuda")
    assert {d.name for d in all_ops() if llvm.packs(d.name)} == {"conv2d", "dense"}
    assert {d.name for d in all_ops() if cuda.packs(d.name)} == {"conv2d"}
    assert llvm.epilogue_anchors is None
    assert cuda.epilogue_anchors == {"conv2d", "conv2d_packed", "dense"}

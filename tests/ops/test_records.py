"""The registry's self-check of the record facts beside the rules: packing and epilogue
targets among the op's backends, and a multiply-add op's own GOPS rule."""
from __future__ import annotations

import pytest

from cvmc.ops import registry
from cvmc.ops.registry import OpDef


def _complete(d: OpDef) -> OpDef:
    for rule in ("shape", "reference", "lower"):
        d.rules[rule] = lambda *args: None
    return d


def test_self_check_rejects_packing_on_a_target_the_op_does_not_compile_on(monkeypatch):
    d = _complete(OpDef("packed_demo", family="test", inputs=("x",), types="? -> ?",
                        backends=("llvm",), packed_on=("cuda",)))
    monkeypatch.setitem(registry._REGISTRY, "packed_demo", d)
    with pytest.raises(RuntimeError, match="packed_demo: packed_on / epilogue_on"):
        registry.check_registry()


def test_self_check_rejects_a_multiply_add_op_without_its_gops_rule(monkeypatch):
    d = _complete(OpDef("mac_demo", family="test", inputs=("x",), types="? -> ?",
                        multiply_add=True))
    monkeypatch.setitem(registry._REGISTRY, "mac_demo", d)
    with pytest.raises(RuntimeError, match="mac_demo: multiply_add needs its own arith"):
        registry.check_registry()
    d.arith(lambda ins, outs, a: 0)
    registry.check_registry()


def test_the_multiply_add_ops_are_the_convolutions_and_matrix_products():
    """Hand-listed: the layers `cvmc check` totals MACs of."""
    assert {d.name for d in registry.all_ops() if d.multiply_add} == {
        "conv2d", "conv", "deconv", "conv2d_packed", "onednn.convolution", "cinn.conv",
        "dense", "matmul", "matmul_packed", "cinn.dot"}

"""The registry's attribute handling and self-check, on a private (unregistered) entry."""
import pytest

import cvmc.ops
from cvmc.errors import OpRuleError
from cvmc.ops.registry import Attr, OpDef, all_ops, lookup

DEMO = OpDef("demo", family="test", inputs=("data", "bias?"), attrs=(
    Attr("padding", "ints", (0, 0), lo=0, hi=4096, length=2, scalar_ok=True),
    Attr("axis", "int?", None, aliases=("dim",)),
    Attr("keepdims", "bool", False),
    Attr("shift_bit", "int", lo=1, hi=32),
))


def test_defaults_and_aliases():
    a = DEMO.normalize_attrs({"shift_bit": 3, "dim": -1})
    assert a == {"shift_bit": 3, "axis": -1, "padding": (0, 0), "keepdims": False}
    assert a.padding == (0, 0)


def test_scalar_broadcast_for_pairs():
    assert DEMO.normalize_attrs({"shift_bit": 1, "padding": 2}).padding == (2, 2)


@pytest.mark.parametrize("given, message", [
    ({}, r"missing required attribute 'shift_bit: integer'"),
    ({"shift_bit": 0}, r"'shift_bit' must be in \[1, 32\], got 0"),
    ({"shift_bit": 33}, r"'shift_bit' must be in \[1, 32\], got 33"),
    ({"shift_bit": True}, r"'shift_bit' must be an integer, got true"),
    ({"shift_bit": 1, "keepdims": 1}, r"'keepdims' must be a logical"),
    ({"shift_bit": 1, "padding": [1, 2, 3]}, r"'padding' must have 2 elements"),
    ({"shift_bit": 1, "padding": [1, -1]}, r"'padding' must be in \[0, 4096\], got -1"),
    ({"shift_bit": 1, "shiftbit": 2}, r"unknown attribute 'shiftbit'; did you mean 'shift_bit'"),
    ({"shift_bit": 1, "axis": 0, "dim": 1}, r"attribute 'axis' given twice"),
])
def test_attribute_errors(given, message):
    with pytest.raises(OpRuleError, match=message):
        DEMO.normalize_attrs(given)


@pytest.mark.parametrize("n, ok", [(0, False), (1, True), (2, True), (3, False)])
def test_arity_with_optional_input(n, ok):
    if ok:
        DEMO.check_arity(n)
    else:
        with pytest.raises(OpRuleError, match=r"expects 1 to 2 input tensors"):
            DEMO.check_arity(n)


def test_every_registered_op_is_complete():
    # check_registry ran at import; this re-states its contract per entry.
    assert all_ops(), "no ops registered"
    for d in all_ops():
        assert not d.missing_rules(), d.name
        assert lookup(d.name) is d
        for alias in d.aliases:
            assert lookup(alias) is d


def test_self_check_rejects_incomplete_entry(monkeypatch):
    from cvmc.ops import registry
    broken = OpDef("broken_demo", family="test", inputs=("data",), precision_rule="p_x")
    monkeypatch.setitem(registry._REGISTRY, "broken_demo", broken)
    with pytest.raises(RuntimeError, match="broken_demo: missing shape, precision, reference"):
        registry.check_registry()
    assert cvmc.ops  # the real registry stays importable


def test_self_check_rejects_a_typed_entry_with_a_shape_rule_only(monkeypatch):
    # no check-only mode: cvmc runs and compiles every op it accepts
    from cvmc.ops import registry
    shape_only = OpDef("shape_only_demo", family="test", inputs=("x",), types="? -> ?")
    shape_only.shape(lambda ins, a: ins[0].shape)
    monkeypatch.setitem(registry._REGISTRY, "shape_only_demo", shape_only)
    with pytest.raises(RuntimeError, match="shape_only_demo: missing reference, lower"):
        registry.check_registry()


def test_self_check_rejects_a_cvm_spelling_that_is_not_an_alias(monkeypatch):
    # export writes cvm_name; the import must read it back, so it must be an alias
    from cvmc.ops import registry
    d = OpDef("spelling_demo", family="test", inputs=("x",), types="? -> ?",
              attrs=(Attr("axes", "ints", (), cvm_name="axis"),))
    for rule in ("shape", "reference", "lower"):
        d.rules[rule] = lambda *args: None
    monkeypatch.setitem(registry._REGISTRY, "spelling_demo", d)
    with pytest.raises(RuntimeError, match="spelling_demo: a CVM-Runtime spelling"):
        registry.check_registry()

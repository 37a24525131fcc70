"""Every integer entering cvmc is checked against int32 and its precision before any
narrowing (issue 9, item 3): a uint64 2^64-1 used to read as -1, an int64 -2^63 passed an
8-bit precision check, and 2^40+5 got precision 42 and computed as 5."""
from __future__ import annotations

import numpy as np
import pytest
from cvmc_runtime import ModelError
from cvmc_runtime.signature import TensorSpec, check_input

import cvmc
from cvmc.cli import main
from cvmc.errors import CvmcError
from cvmc.frontend.tensorfile import write_tensor
from cvmc.ir import Graph, Node, TensorType
from cvmc.ops.common import data_precision
from cvmc.ops.infer import retype

WIDE = [
    (np.array([0, 2**64 - 1], np.uint64), 8, "value 18446744073709551615 at index [1]"),
    (np.array([-2**63, 1], np.int64), 8, "value -9223372036854775808 at index [0]"),
    (np.array([2**40 + 5, 0], np.int64), None, "value 1099511627781 at index [0]"),
    (np.array([0, -2**31], np.int64), None, "value -2147483648 at index [1]"),  # |v| > 2^31-1
    (np.array([0, 128], np.int32), 8, "value 128 at index [1] does not fit precision 8"),
]


def _model(tmp_path, data: np.ndarray, precision: int | None):
    # broadcast_max keeps the widest precision (an add of a 32-bit w would overflow)
    decl = "" if precision is None else f", precision = {precision}"
    (tmp_path / "graph.nnef").write_text(f"""version 1.0;
graph G( x ) -> ( y )
{{
    x = external<integer>(shape = [2], precision = 8);
    w = variable<integer>(shape = [2], label = "w"{decl});
    y = broadcast_max(x, w);
}}
""")
    write_tensor(tmp_path / "w.dat", data)
    return tmp_path / "graph.nnef"


@pytest.mark.parametrize("data, precision, words", WIDE)
def test_dat_values_outside_int32_or_precision_are_refused(tmp_path, data, precision, words):
    path = _model(tmp_path, data, precision)
    with pytest.raises(CvmcError) as e:
        cvmc.load_graph(path)
    assert words in e.value.render() and "graph.nnef:5:" in e.value.render()


@pytest.mark.parametrize("data, precision, words", WIDE[:3])  # the three repros
def test_cvmc_check_reports_one_error(tmp_path, capsys, data, precision, words):
    path = _model(tmp_path, data, precision)
    assert main(["check", str(path)]) == 1
    out = capsys.readouterr()
    errors = [line for line in (out.out + out.err).splitlines() if "error:" in line]
    assert "Traceback" not in out.err and len(errors) == 1
    assert "graph.nnef:5:" in errors[0] and "w.dat" in errors[0] and words in errors[0]


def test_bool_data_is_checked_against_its_precision(tmp_path):
    """True is 1, which precision 1 (|v| <= 0) cannot hold."""
    path = _model(tmp_path, np.array([False, True]), 1)
    with pytest.raises(CvmcError, match=r"value 1 at index \[1\] does not fit precision 1"):
        cvmc.load_graph(path)


def test_values_inside_int32_load_as_int32(tmp_path):
    path = _model(tmp_path, np.array([2**31 - 1, -(2**31 - 1)], np.int64), None)
    w = cvmc.load_graph(path).constants["w"]
    assert w.dtype == np.int32 and w.tolist() == [2**31 - 1, -(2**31 - 1)]
    assert data_precision(w) == 32


@pytest.mark.parametrize("literal, words", [
    ("[300, 1]", "value 300 at index [0] does not fit precision 8"),
    ("[2147483648, 0]", "value 2147483648 at index [0] does not fit int32"),
    ("[0, -2147483648]", "value -2147483648 at index [1] does not fit int32"),
    (f"[{2**63 - 1}, 0]", f"value {2**63 - 1} at index [0] does not fit int32"),
])
def test_literal_constants_are_checked(tmp_path, literal, words):
    (tmp_path / "graph.nnef").write_text(f"""version 1.0;
graph G( x ) -> ( y )
{{
    x = external<integer>(shape = [2], precision = 8);
    w = constant<integer>(shape = [2], value = {literal}, precision = 8);
    y = elemwise_add(x, w);
}}
""")
    with pytest.raises(CvmcError, match=words.replace("[", r"\[").replace("]", r"\]")):
        cvmc.load_graph(tmp_path / "graph.nnef")


@pytest.mark.parametrize("data, precision, words", WIDE)
def test_graphs_built_in_python_are_checked_too(data, precision, words):
    types = {"w": TensorType((2,), "int32", precision), "y": TensorType((2,), "int32")}
    g = Graph("g", [], ["y"], [Node("relu", ("w",), ("y",), {})], types, {"w": data})
    with pytest.raises(CvmcError, match="weight 'w': " + words.replace("[", r"\[")
                       .replace("]", r"\]")):
        retype(g)


@pytest.mark.parametrize("value", [np.uint64(2**64 - 1), np.int64(-2**63), np.int64(2**40 + 5)])
def test_runtime_inputs_outside_int32_are_refused(value):
    spec = TensorSpec("x", (2,), "int32", 32)
    with pytest.raises(ModelError, match="outside precision 32"):
        check_input(spec, np.array([0, value], dtype=np.asarray(value).dtype))


@pytest.mark.parametrize("literal", [2**31, -(2**31), 2**40 + 5, 2**63 - 1])
def test_integer_literals_outside_int32_are_refused(tmp_path, literal):
    (tmp_path / "graph.nnef").write_text(f"""version 1.0;
graph G( x ) -> ( y )
{{
    x = external<integer>(shape = [2], precision = 8);
    y = broadcast_add(x, {literal});
}}
""")
    with pytest.raises(CvmcError) as e:
        cvmc.load_graph(tmp_path / "graph.nnef")
    assert f"integer literal {literal} does not fit int32" in str(e.value)
    assert "graph.nnef:5:" in str(e.value)


def test_cvm_params_int32_minimum_is_refused(tmp_path):
    """-2^31 fits the int32 storage of a CVM-Runtime params file but no CVM precision."""
    from tests.frontend.test_cvm_json import _dense_doc, _write, pack_array, pack_params

    params = pack_params({"w": pack_array((2, 3), [1, 1, 1, 2, 0, -1]),
                          "b": pack_array((2,), [0, -2**31])})
    with pytest.raises(CvmcError, match=r"m.params'?: weight 'b': value -2147483648 at index "
                                        r"\[1\] does not fit int32"):
        cvmc.load_graph(_write(tmp_path, _dense_doc(), params))


@pytest.mark.parametrize("data, precision, words", WIDE)
def test_typing_checks_weights_whose_types_are_all_declared(data, precision, words):
    """Every precision declared: typing (what the reference relies on) still refuses."""
    types = {"w": TensorType((2,), "int32", precision or 32),
             "y": TensorType((2,), "int32", precision or 32)}
    g = Graph("g", [], ["y"], [Node("relu", ("w",), ("y",), {})], types, {"w": data})
    with pytest.raises(CvmcError, match="weight 'w': " + words.replace("[", r"\[")
                       .replace("]", r"\]")):
        retype(g)

"""The NNEF corpus (Khronos NNEF-Tools and tract documents): valid documents parse and
shape-check; invalid ones are rejected at the offending line. A differential test runs
the Khronos parser (`nnef`, an independent implementation) on the same texts."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from cvmc.errors import CvmcError
from cvmc.frontend.nnef import load_nnef, parse_nnef
from tests.shared import HAVE_SHARED, SHARED, requires_shared

nnef = pytest.importorskip("nnef")

CORPUS = SHARED / "data" / "nnef-corpus"
VALID = sorted((CORPUS / "valid").iterdir()) if HAVE_SHARED else []

# Line of the first error (the Khronos parser's line, MANIFEST.txt), except where noted.
INVALID = {
    "khr_old_alexnet_comp_shape_of.nnef": (12, "'shape_of' is deprecated"),
    "khr_old_alexnet_comp_variable_in_fragment.nnef":
        (12, "operation 'variable' is not allowed inside fragments"),
    "khr_parser_empty_body.nnef": (1, "unexpected '}'"),
    "khr_parser_empty_document.nnef": (1, "not an NNEF document: it must begin with 'version"),
    "khr_parser_empty_input_not_declared.nnef": (4, "undeclared identifier 'input'"),
    # cvmc points at the output's name in the graph header (Khronos: the closing brace)
    "khr_parser_empty_output_not_declared.nnef": (2, "graph output 'output' is not assigned"),
    "khr_parser_external_not_input.nnef": (5, "'external' must be graph inputs"),
    "khr_parser_input_not_external.nnef": (4, "can only be assigned by 'external'"),
    "khr_parser_non_variable_update.nnef": (5, "first argument of 'update' must be a variable"),
    "tract_cmp_operators.nnef": (6, "KHR_enable_operator_expressions"),
    "tract_conv_bias.nnef": (6, "KHR_enable_operator_expressions"),
    "tract_qmul": (3, "unknown extension 'tract_registry'"),
    "tract_softmax_quant_bad_axes": (6, "softmax 'output': max_reduce: axes"),
    "tract_variable_in_fragment.nnef": (3, "need 'extension KHR_enable_fragment_definitions;'"),
}

# Documents where cvmc deliberately differs from the Khronos parser's shape inference.
KHRONOS_SKIP = {
    # the Khronos parser needs the custom fragment lowered (`lowered=['op']`) to infer shapes
    "khr_parser_custom_fragment.nnef",
}


def _text_and_quant(path: Path) -> tuple[str, str | None]:
    graph = path / "graph.nnef" if path.is_dir() else path
    quant = path / "graph.quant" if path.is_dir() else None
    return graph.read_text(), quant.read_text() if quant and quant.exists() else None


@requires_shared
@pytest.mark.parametrize("path", VALID, ids=lambda p: p.name)
def test_valid_document_checks(path, shuffle_op):
    g = load_nnef(path, None)
    assert g.outputs and all(o in g.types for o in g.outputs)
    assert all(n.span is not None for n in g.nodes)


@requires_shared
@pytest.mark.parametrize("name", sorted(INVALID))
def test_invalid_document_rejected_at_line(name):
    line, words = INVALID[name]
    with pytest.raises(CvmcError) as e:
        load_nnef(CORPUS / "invalid" / name, None)
    assert e.value.span is not None and e.value.span.line == line, str(e.value)
    assert words in e.value.message


@requires_shared
def test_corpus_invalid_list_is_complete():
    assert {p.name for p in (CORPUS / "invalid").iterdir()} == set(INVALID)


def _khronos_shapes(text: str, quant: str | None) -> dict[str, tuple[int, ...]]:
    g = nnef.parse_string(text, quant)
    nnef.infer_shapes(g, custom_shapes={"shuffle": lambda shape, *a, **k: shape})
    return {name: tuple(t.shape) for name, t in g.tensors.items()}


@requires_shared
@pytest.mark.parametrize("path", [p for p in VALID if p.name not in KHRONOS_SKIP],
                         ids=lambda p: p.name)
def test_shapes_agree_with_khronos(path, shuffle_op):
    text, quant = _text_and_quant(path)
    expected = _khronos_shapes(text, quant)
    g = parse_nnef(text, path.name)
    named = {n: s for n, s in expected.items() if n in g.types}
    # every tensor the document names (its lvalues) must be among the compared ones
    assert set(g.inputs) | set(g.outputs) <= set(named)
    got = {n: g.types[n].shape for n in named}
    assert got == named


# Own cases: (document, accepted by both?)
OWN = [
    ("graph G(x) -> (y) { x = external(shape = [2, 3]); y = relu(x); }", True),
    (("graph G(x) -> (y) { x = external(shape = [2, 3]); "
     "y = transpose(x, axes = [1, 0]); }"), True),
    # CVM's transpose rejects a partial permutation; NNEF's accepts it (the rest stays)
    (("graph G(x) -> (y) { x = external(shape = [2, 3, 4, 5]); "
      "y = transpose(x, axes = [1, 0]); }"), True),
    ("graph G(x) -> (y) { x = external(shape = [2, 3]); y = relu(z); }", False),
    ("graph G(x) -> (y) { x = external(shape = [2, 3]); y = relu(x); y = relu(x); }", False),
    ("graph G(x) -> (y) { x = external(shape = [2, 3]); y = relu(x) }", False),
    ("graph G(x) -> (y) { x = external(shape = [2, 3]); y = softmax(x, axes = [5]); }", False),
    (("graph G(x, w) -> (y) { x = external(shape = [2, 3]); w = external(shape = [3, 2]);"
     " y = add(x, w); }"), False),
    (("extension KHR_enable_operator_expressions;\ngraph G(x) -> (y) "
     "{ x = external(shape = [2, 3]); y = x * 2.0 + x; }"), True),
]


@pytest.mark.parametrize("body,ok", OWN)
def test_own_cases_agree_with_khronos(body, ok):
    text = "version 1.0;\n" + body
    try:
        expected = _khronos_shapes(text, None)
    except nnef.Error:
        expected = None
    assert (expected is not None) == ok
    if not ok:
        with pytest.raises(CvmcError):
            parse_nnef(text)
        return
    g = parse_nnef(text)
    assert {n: g.types[n].shape for n in g.outputs} == {n: expected[n] for n in g.outputs}


def test_weights_load_from_dat_files(tmp_path):
    from cvmc.frontend.tensorfile import write_tensor
    (tmp_path / "graph.nnef").write_text(
        "version 1.0;\ngraph G(x) -> (y) {\n  x = external<integer>(shape = [2], precision = 8);"
        "\n  w = variable<integer>(shape = [2], label = 'w');\n  y = elemwise_add(x, w);\n}\n")
    write_tensor(tmp_path / "w.dat", np.array([3, -4], dtype=np.int32))
    g = load_nnef(tmp_path, None)
    assert np.array_equal(g.constants["w"], [3, -4]) and g.labels == {"w": "w"}
    write_tensor(tmp_path / "w.dat", np.array([3, -4, 5], dtype=np.int32))
    with pytest.raises(CvmcError, match=r":4:7: error: variable 'w': data file 'w.dat' has "
                                        r"shape \[3\], but the variable declares \[2\]"):
        load_nnef(tmp_path, None)


def test_a_name_shared_by_a_cvm_op_takes_the_nnef_reading_on_scalar_tensors():
    """relu / abs / max on scalar tensors are NNEF's (stdlib fragment or nnef. entry), on
    integer tensors CVM's; a CVM-only op on a scalar tensor is an error naming the rule."""
    g = parse_nnef("version 1.0;\ngraph G(x, i) -> (y, j, a, b) { x = external(shape = [2]); "
                   "i = external<integer>(shape = [2], precision = 8); y = relu(x); j = relu(i);"
                   " a = abs(x); b = abs(i); }")
    ops = {n.outputs[0]: n.op for n in g.nodes}
    # typed: j and b have precision 8, stored as int8
    assert [g.types[v].dtype for v in ("y", "j", "a", "b")] == ["float32", "int8"] * 2
    assert (ops["j"], ops["a"], ops["b"]) == ("relu", "nnef.abs", "abs")
    assert ops["y"] == "select"  # relu(x) = max(x, 0.0) = select(x > 0.0, x, 0.0)
    with pytest.raises(CvmcError, match="cvm_clip.*tensor<integer>"):
        parse_nnef("version 1.0;\ngraph G(x) -> (y) { x = external(shape = [2]); "
                   "y = cvm_clip(x, precision = 8); }")


@requires_shared
@pytest.mark.parametrize("path", VALID, ids=lambda p: p.name)
def test_printed_corpus_document_parses_back_equal(path, shuffle_op):
    from cvmc.frontend.printer import print_graph
    g = load_nnef(path, None)
    again = parse_nnef(print_graph(g), "printed.nnef")
    assert again == g and again.labels == g.labels


# Valid corpus documents published without their .dat files: NNEF makes the data optional
# (spec 5.1), so `check` validates them with a warning (issue 22, item 10).
WITHOUT_DATA = {
    "khr_example_alexnet.nnef", "khr_example_googlenet.nnef", "khr_example_resnet.nnef",
    "khr_op_batch_norm.nnef", "khr_op_conv1d.nnef", "khr_op_conv2d_nobias.nnef",
    "khr_op_conv2d_padded.nnef", "khr_op_conv2d_strided.nnef", "khr_op_deconv2d.nnef",
    "khr_op_linear.nnef", "khr_op_prelu.nnef", "khr_op_separable_conv2d.nnef",
    "khr_parser_variable_update.nnef", "khr_sample_ext_custom_shuffle.nnef",
}


@requires_shared
@pytest.mark.parametrize("path", VALID, ids=lambda p: p.name)
def test_cli_check_accepts_every_valid_document(path, shuffle_op, capsys):
    from cvmc.cli import main
    assert main(["check", str(path)]) == 0, capsys.readouterr().err
    err = capsys.readouterr().err
    assert ("weight data file" in err and "not found" in err) == (path.name in WITHOUT_DATA)
    assert len(err.splitlines()) == (path.name in WITHOUT_DATA)  # one warning line


_INT_WEIGHT = ("version 1.0;\ngraph G(x) -> (y) {\n"
               "  x = external<integer>(shape = [2], precision = 8);\n"
               "  w = variable<integer>(shape = [2], label = 'w');\n"
               "  y = elemwise_add(x, w);\n}\n")


@pytest.mark.parametrize("declared", ["", ", precision = 4"])
def test_missing_data_is_a_warning_in_check_and_a_located_error_to_run(tmp_path, capsys,
                                                                       declared):
    from cvmc.cli import main
    doc = tmp_path / "g.nnef"
    doc.write_text(_INT_WEIGHT.replace("label = 'w'", f"label = 'w'{declared}"))
    assert main(["check", str(doc)]) == 0
    err = capsys.readouterr().err
    assert err.startswith("warning: ") and "'w.dat'" in err and len(err.splitlines()) == 1
    np.save(tmp_path / "x.npy", np.array([1, 2], np.int32))
    assert main(["run", "--reference", str(doc), "--input", f"x={tmp_path / 'x.npy'}"]) == 1
    err = capsys.readouterr().err
    assert f"{doc}:4:7: error: weight 'w': its data file 'w.dat' was not found" in err


def test_corrupt_data_stays_an_error_in_check(tmp_path, capsys):
    from cvmc.cli import main
    (tmp_path / "graph.nnef").write_text(_INT_WEIGHT)
    (tmp_path / "w.dat").write_bytes(b"\x4e\xef" + bytes(20))  # a truncated header
    assert main(["check", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert ":4:7: error:" in err and "w.dat" in err and len(err.splitlines()) <= 3

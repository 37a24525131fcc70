"""graph.quant parsing: the spec's example, every value form, syntax errors with line:col."""
from __future__ import annotations

import pytest

from cvmc.errors import CvmcError
from cvmc.frontend.quant import parse_quant


def test_spec_example() -> None:
    text = ('"filter1": linear_quantize(min = -2.0, max = 2.5, bits = 8);\n'
            '"bias1": linear_quantize(min = -3.0, max = 0.75, bits = 8);\n')
    assert parse_quant(text, "graph.quant") == {
        "filter1": ("linear_quantize", {"min": -2.0, "max": 2.5, "bits": 8}),
        "bias1": ("linear_quantize", {"min": -3.0, "max": 0.75, "bits": 8}),
    }


def test_value_forms_comments_and_quotes() -> None:
    text = ("# header comment\n"
            "'conv1': cvm_precision_spec(precision = 8);  # trailing\n"
            '"x": custom(a = [1, -2, [3]], t = (1, "s"), yes = true, no = false,\n'
            "           e = 1.5e-3, n = -7, s = 'txt', empty = []);\n"
            '"z": nothing();\n')
    got = parse_quant(text, "graph.quant")
    assert got["conv1"] == ("cvm_precision_spec", {"precision": 8})
    assert got["x"] == ("custom", {"a": [1, -2, [3]], "t": (1, "s"), "yes": True, "no": False,
                                   "e": 1.5e-3, "n": -7, "s": "txt", "empty": []})
    assert got["z"] == ("nothing", {})
    assert isinstance(got["x"][1]["n"], int) and isinstance(got["x"][1]["e"], float)
    assert parse_quant("", "q") == {} and parse_quant("# only\n", "q") == {}


@pytest.mark.parametrize("text,line,col,words", [
    ('"a": f(x = );', 1, 12, "expected a literal value"),
    ('"a": f(x = 1);\n"b" f();', 2, 5, "expected ':', found 'f'"),
    ('"a": f(x = 1)', 1, 14, "expected ';', found 'end of file'"),
    ('"a": f();\nb: g();', 2, 1, "expected a quoted tensor name"),
    ('"a": f(x = 1, x = 2);', 1, 15, "attribute 'x' of f given twice"),
    ('"a": f();\n# c\n"a": g();', 3, 1, 'tensor "a" has a second quantization entry'),
    ('"a": f(x = @);', 1, 12, "unexpected character '@'"),
    ('"a": f(x = [1, 2);', 1, 17, "expected ',', found ')'"),
    ('"a": f(x = --1);', 1, 12, "expected a literal value"),
    ('"a": f(1);', 1, 8, "expected an identifier"),
    ('"a": 3(x = 1);', 1, 6, "expected an identifier"),
    ('"a\n": f();', 1, 1, "unexpected character"),
])
def test_syntax_errors_are_located(text: str, line: int, col: int, words: str) -> None:
    with pytest.raises(CvmcError) as e:
        parse_quant(text, "graph.quant")
    err = e.value
    assert (err.span.file, err.span.line, err.span.col) == ("graph.quant", line, col)
    assert words in err.message
    assert err.source_line == text.split("\n")[line - 1]
    assert err.render().endswith("\n  " + " " * (col - 1) + "^")


@pytest.mark.parametrize("newline", ["\n", "\r\n", "\r"])
def test_bom_and_line_endings(newline) -> None:
    text = "\ufeff" + newline.join(['"a": cvm_precision_spec(precision = 8);',
                                    '"b": cvm_precision_spec(precision = );', ""])
    with pytest.raises(CvmcError) as e:
        parse_quant(text, "graph.quant")
    assert e.value.span.line == 2, str(e.value)
    ok = "\ufeff" + '"a": cvm_precision_spec(precision = 8);' + newline
    assert parse_quant(ok, "graph.quant") == {"a": ("cvm_precision_spec", {"precision": 8})}


@pytest.mark.parametrize("entry, words", [
    ('"nope": cvm_precision_spec(precision = 8);', "entry for 'nope', but the graph has no"),
    ('"x": cvm_precision_spec(precision = 7);', "precision 7 disagrees with the precision 8"),
    ('"x": cvm_precision_spec(precision = "a");', "takes one argument 'precision' in 1..32"),
])
def test_semantic_errors_are_located_at_their_entry(entry, words) -> None:
    from cvmc.frontend.nnef import parse_nnef

    graph = ("version 1.0;\ngraph G( x ) -> ( y )\n{\n"
             "    x = external<integer>(shape = [2], precision = 8);\n    y = relu(x);\n}\n")
    quant = '"y": linear_quantize(min = 0.0, max = 1.0, bits = 8);\n' + entry + "\n"
    with pytest.raises(CvmcError) as e:
        parse_nnef(graph, "graph.nnef", quant_text=quant, quant_name="graph.quant")
    assert str(e.value).startswith("graph.quant:2:1: error:") and words in str(e.value)

"""Negative tests: every user mistake is a CvmcError with its message, line and column.

Each case is a document whose offending line is preceded by `# expected-error: TEXT`;
the error must be reported on the next line, at the column of the first `^` in that
comment's line (or any column when the comment has none), and contain TEXT.
"""
from __future__ import annotations

import re

import pytest

from cvmc.cli import main
from cvmc.errors import CvmcError
from cvmc.frontend.nnef import parse_nnef
from cvmc.ops import lookup

HEAD = "version 1.0;\ngraph G(x) -> (y)\n{\n    x = external<integer>(shape = [1, 4, 8, 8]);\n"

CASES = {
    "missing_semicolon": HEAD + "# expected-error: missing ';' after ')'\n"
                                "    y = relu(x)\n    z = relu(y);\n}\n",
    "unterminated_string": HEAD + "# expected-error: unterminated string literal\n"
                                  "    y = relu(x, name = 'abc);\n}\n",
    "bad_token": HEAD + "# expected-error: unexpected character '$'\n    y = relu($x);\n}\n",
    "undeclared": HEAD + "# expected-error: undeclared identifier 'q'\n    y = relu(q);\n}\n",
    "reassigned": HEAD + "    y = relu(x);\n# expected-error: identifier 'y' is already "
                         "assigned\n    y = relu(x);\n}\n",
    "unknown_op": HEAD + "# expected-error: unknown operation 'rleu'; did you mean 'relu'?\n"
                         "    y = rleu(x);\n}\n",
    "unknown_attr": HEAD + "# expected-error: cvm_right_shift 'y': unknown attribute "
                           "'shift_bits'; did you mean 'shift_bit'?\n"
                           "    y = cvm_right_shift(x, precision = 8, shift_bits = 1);\n}\n",
    "attr_type": HEAD + "# expected-error: cvm_right_shift 'y': attribute 'precision' must be "
                        "an integer, got 'eight'\n"
                        "    y = cvm_right_shift(x, precision = 'eight', shift_bit = 1);\n}\n",
    "missing_attr": HEAD + "# expected-error: cvm_right_shift 'y': missing required attribute "
                           "'shift_bit\n    y = cvm_right_shift(x, precision = 8);\n}\n",
    "broadcast_mismatch": "version 1.0;\ngraph G(x, w) -> (y)\n{\n"
                          "    x = external<integer>(shape = [2, 3], precision = 8);\n"
                          "    w = external<integer>(shape = [3, 2], precision = 8);\n"
                          "# expected-error: elemwise_add 'y':\n    y = elemwise_add(x, w);\n}\n",
    "conv_channels": "version 1.0;\ngraph G(x) -> (y)\n{\n"
                     "    x = external<integer>(shape = [1, 3, 8, 8], precision = 8);\n"
                     "    w = variable<integer>(shape = [4, 2, 3, 3], label = 'w');\n"
                     "# expected-error: conv2d 'y':\n"
                     "    y = conv2d(x, w, padding = [1, 1], stride = [1, 1], "
                     "dilation = [1, 1], groups = 1);\n}\n",
    "axis_out_of_range": HEAD + "# expected-error: sum 'y':\n"
                                "    y = sum(x, axes = [7]);\n}\n",
    "huge_volume": "version 1.0;\ngraph G(x) -> (x)\n{\n# expected-error: tensor 'x': shape "
                   "[65536, 65536] has 4294967296 elements, more than 1073741824\n"
                   "    x = external<integer>(shape = [65536, 65536], precision = 8);\n}\n",
    "huge_constant": "version 1.0;\ngraph G(x) -> (c)\n{\n    x = external<integer>(shape = [1], "
                     "precision = 8);\n# expected-error: constant 'c': 1073741824 elements is "
                     "more than a literal constant may hold (16777216)\n"
                     "    c = constant<integer>(shape = [16777216, 64], value = [0]);\n}\n",
    "zero_dim": "version 1.0;\ngraph G(x) -> (x)\n{\n# expected-error: tensor 'x': dimension 0 "
                "in shape [0, 2] is outside 1..16777216\n"
                "    x = external<integer>(shape = [0, 2], precision = 8);\n}\n",
    "bad_version": "# expected-error: unsupported NNEF version 2.0\nversion 2.0;\n"
                   "graph G(x) -> (x) { x = external(shape = [1]); }\n",
    "bad_precision": "version 1.0;\ngraph G(x) -> (x)\n{\n# expected-error: precision must be "
                     "in 1..32\n    x = external<integer>(shape = [2], precision = 40);\n}\n",
    "precision_on_scalar": "version 1.0;\ngraph G(x) -> (x)\n{\n# expected-error: applies to "
                           "external<integer> only\n"
                           "    x = external<scalar>(shape = [2], precision = 8);\n}\n",
    "fragment_unknown_arg": "version 1.0;\nextension KHR_enable_fragment_definitions;\n"
                            "fragment f(a: tensor<integer>, gain: integer = 1) -> "
                            "(b: tensor<integer>) { b = relu(a); }\n"
                            "graph G(x) -> (y)\n{\n    x = external<integer>(shape = [2]);\n"
                            "# expected-error: f: unknown argument 'gian'; did you mean 'gain'?\n"
                            "    y = f(x, gian = 2);\n}\n",
    "output_count": "version 1.0;\ngraph G(x) -> (y)\n{\n    x = external(shape = [4, 2]);\n"
                    "# expected-error: split returns 2 tensors but the left-hand side names 3\n"
                    "    [y, z, w] = split(x, axis = 0, ratios = [1, 1]);\n}\n",
    "expression_in_flat": HEAD + "# expected-error: operator expressions need\n"
                                 "    y = x + x;\n}\n",
    # NNEF conformance (issue 9, item 13), each rule of spec chapter 3 cvmc used to skip:
    "keyword_identifier": HEAD + "# expected-error: 'tensor' is a keyword and cannot be used "
                                 "as an identifier\n    tensor = relu(x);\n    y = relu(x);\n}\n",
    "positional_attribute": HEAD + "# expected-error: cvm_clip 'y': 1 positional argument(s) "
                                   "after its tensor inputs; attribute values must be named\n"
                                   "    y = cvm_clip(x, 4);\n}\n",
    "logical_for_numeric": "version 1.0;\ngraph G(x) -> (y)\n{\n"
                           "    x = external<logical>(shape = [2]);\n"
                           "# expected-error: relu: argument 'x' must be a tensor<scalar>, got "
                           "tensor 'x' (a tensor<logical>)\n    y = relu(x);\n}\n",
    "logical_for_cvm_op": "version 1.0;\ngraph G(x) -> (y)\n{\n"
                          "    x = external<logical>(shape = [2]);\n"
                          "# expected-error: cvm_clip 'y': input 'data' must be a "
                          "tensor<integer>, got a tensor<logical>\n"
                          "    y = cvm_clip(x, precision = 4);\n}\n",
    "label_characters": HEAD + "# expected-error: variable label 'a b' has characters other "
                               "than letters\n"
                               "    w = variable<integer>(shape = [1], label = 'a b');\n"
                               "    y = relu(x);\n}\n",
    "positional_shape": "version 1.0;\ngraph G(x) -> (x)\n{\n# expected-error: external: "
                        "attribute 'shape' given as a positional argument; only tensor "
                        "arguments may be positional\n    x = external<integer>([2]);\n}\n",
    "positional_variable": HEAD + "# expected-error: variable: attribute 'shape' given as a "
                                  "positional argument\n"
                                  "    w = variable<integer>([2], label = 'w');\n"
                                  "    y = relu(x);\n}\n",
    "positional_fragment_attribute": "version 1.0;\nextension KHR_enable_fragment_definitions;\n"
                                     "fragment f(a: tensor<integer>, gain: integer = 1) -> "
                                     "(b: tensor<integer>) { b = relu(a); }\n"
                                     "graph G(x) -> (y)\n{\n"
                                     "    x = external<integer>(shape = [2]);\n"
                                     "# expected-error: f: attribute 'gain' given as a "
                                     "positional argument\n    y = f(x, 2);\n}\n",
    # Spec 3.3.2: no 'external' (nor 'variable') in a fragment, invoked or not, generic
    # invocation ('external<scalar>') included (issue 22, item 11).
    "external_in_fragment": "version 1.0;\nextension KHR_enable_fragment_definitions;\n"
                            "fragment f(a: tensor<scalar>) -> (b: tensor<scalar>)\n{\n"
                            "    t = relu(a);\n"
                            "# expected-error: operation 'external' is not allowed inside "
                            "fragments\n    b = external<scalar>(shape = [2]);\n}\n"
                            "graph G(x) -> (x) { x = external(shape = [2]); }\n",
    "variable_in_fragment": "version 1.0;\nextension KHR_enable_fragment_definitions;\n"
                            "fragment f(a: tensor<integer>) -> (b: tensor<integer>)\n{\n"
                            "# expected-error: operation 'variable' is not allowed inside "
                            "fragments\n"
                            "    b = variable < integer > (shape = [2], label = 'w');\n}\n"
                            "graph G(x) -> (x) { x = external(shape = [2]); }\n",
    "no_outputs": "version 1.0;\n# expected-error: unexpected ')'; expected an identifier\n"
                  "graph G(x) -> ()\n{\n    x = external<integer>(shape = [2]);\n}\n",
}

# Ops the cases above need (written by other helpers): skip a case until its op exists.
NEEDS = {"unknown_attr": "cvm_right_shift", "attr_type": "cvm_right_shift",
         "missing_attr": "cvm_right_shift", "broadcast_mismatch": "elemwise_add",
         "conv_channels": "conv2d", "axis_out_of_range": "sum", "output_count": "split"}


def expected_error(text: str) -> tuple[int, str]:
    """(line, message) from the `# expected-error:` comment (the error is on the next line)."""
    for n, line in enumerate(text.splitlines(), 1):
        m = re.match(r"# expected-error: (.*)", line)
        if m:
            return n + 1, m.group(1)
    raise AssertionError("case without expected-error comment")


@pytest.mark.parametrize("name", sorted(CASES))
def test_error_message_and_location(name):
    if name in NEEDS and lookup(NEEDS[name]) is None:
        pytest.skip(f"needs op {NEEDS[name]}")
    text = CASES[name]
    line, words = expected_error(text)
    with pytest.raises(CvmcError) as e:
        parse_nnef(text, "bad.nnef")
    err = e.value
    assert err.span is not None and (err.span.file, err.span.line) == ("bad.nnef", line), \
        str(err)
    assert words in err.message, err.message
    assert err.source_line == text.splitlines()[line - 1]


def test_error_columns():
    """Columns point at the offending token, not just the line."""
    cases = [(HEAD + "    y = relu(q);\n}\n", 5, 14),       # the identifier
             (HEAD + "    y = rleu(x);\n}\n", 5, 9),         # the invocation
             (HEAD + "    y = relu(x)\n    z = relu(y);\n}\n", 5, 16),  # after the ')'
             (HEAD + "    y = relu(x) z = relu(y);\n}\n", 5, 17),  # the unexpected token
             (HEAD + "    y = relu(x, n = 'abc);\n}\n", 5, 21)]  # the opening quote
    for text, line, col in cases:
        with pytest.raises(CvmcError) as e:
            parse_nnef(text)
        assert (e.value.span.line, e.value.span.col) == (line, col), str(e.value)


def test_cli_check_reports_error_without_traceback(tmp_path, capsys):
    bad = tmp_path / "bad.nnef"
    bad.write_text(HEAD + "    y = rleu(x);\n}\n")
    assert main(["check", str(bad)]) == 1
    err = capsys.readouterr().err
    assert err.splitlines() == [
        f"{bad}:5:9: error: unknown operation 'rleu'; did you mean 'relu'?",
        "      y = rleu(x);",
        "          ^"]
    assert "Traceback" not in err


def test_cli_check_prints_shapes(tmp_path, capsys):
    good = tmp_path / "good.nnef"
    good.write_text(HEAD.replace("shape", "precision = 8, shape") + "    y = relu(x);\n}\n")
    assert main(["check", str(good)]) == 0
    out = capsys.readouterr().out
    assert "[1, 4, 8, 8]" in out and "relu" in out


QUANT_DOC = ("version 1.0;\ngraph G(x) -> (y)\n{\n    x = external<integer>(shape = [2]{p});\n"
             "    y = relu(x);\n}\n")


def test_graph_quant_sets_precision():
    g = parse_nnef(QUANT_DOC.replace("{p}", ""), quant_text='"x": cvm_precision_spec(precision = 6);')
    assert g.types["x"].precision == 6
    assert g.quant["x"] == {"fragment": "cvm_precision_spec", "attrs": {"precision": 6}}


def test_graph_quant_must_agree_with_inline_precision():
    with pytest.raises(CvmcError, match="precision 6 disagrees with the precision 8"):
        parse_nnef(QUANT_DOC.replace("{p}", ", precision = 8"),
                   quant_text='"x": cvm_precision_spec(precision = 6);')
    with pytest.raises(CvmcError, match="no such tensor"):
        parse_nnef(QUANT_DOC.replace("{p}", ""), quant_text='"q": cvm_precision_spec(precision = 6);')


@pytest.mark.parametrize("newline", ["\n", "\r\n", "\r"])
def test_bom_and_every_line_ending_locate_errors(newline):
    """A UTF-8 BOM is accepted; CR LF and a lone CR end lines like LF (issue 9, item 11)."""
    text = "\ufeff" + CASES["unknown_op"].replace("\n", newline)
    with pytest.raises(CvmcError) as e:
        parse_nnef(text, "bad.nnef")
    assert (e.value.span.line, e.value.span.col) == (6, 9), str(e.value)
    ok = "\ufeff" + HEAD.replace("\n", newline) + "    y = relu(x);" + newline + "}" + newline
    assert [n.op for n in parse_nnef(ok, "ok.nnef").nodes] == ["relu"]


def test_integer_arithmetic_suggests_the_cvm_op():
    from cvmc.ops.infer import retype

    text = ("version 1.0;\nextension KHR_enable_operator_expressions;\ngraph G(x) -> (y)\n{\n"
            "    x = external<integer>(shape = [2], precision = 8);\n    y = x + x;\n}\n")
    with pytest.raises(CvmcError, match="on integer tensors use elemwise_add .* or "
                                        "broadcast_add") as e:
        retype(parse_nnef(text, "add.nnef"))
    assert e.value.span.line == 6


# NNEF 3.2 "Fragment declarations": each rule, on line 3 of a document, at the column of the
# parameter or result that breaks it (the whole declaration for the generic rules).
T, I = "tensor<integer>", "integer"
DECLARATION_CASES = [
    (f"fragment f( a: {T}, a: {T} ) -> ( b: {T} )", 33, "'a' names two parameters or results"),
    (f"fragment f( a: {T} ) -> ( a: {T} )", 39, "'a' names two parameters or results"),
    (f"fragment f( k: {I}, a: {T} ) -> ( b: {T} )", 25,
     "tensor parameter 'a' follows an attribute: tensor parameters come first"),
    (f"fragment f( a: {T} ) -> ( b: {I} )", 39, "result 'b' must be a tensor, not integer"),
    (f"fragment f( a: {T} ) -> ( b: {T}[], c: {I}[] )", 61,
     "result 'c' must be a tensor, not integer[]"),
    (f"fragment f( a: ({T}, {I}) ) -> ( b: {T} )", 13,
     "type (tensor<integer>, integer) of 'a' mixes tensors and attributes in a tuple"),
    (f"fragment f( a: {T}, k: {I} = 'x' ) -> ( b: {T} )", 33,
     "the default value of 'k' must be a value of type integer, got 'x'"),
    (f"fragment f( a: {T}, k: {I}[] = [1, 2.5] ) -> ( b: {T} )", 33,
     "the default value of 'k' must be an array of a value of type integer"),
    (f"fragment f<?>( a: {T} ) -> ( b: {T} )", 1,
     "fragment 'f' is declared generic but no parameter or result has the type '?'"),
    ("fragment f( a: tensor<?> ) -> ( b: tensor<?> )", 1,
     "fragment 'f' uses the generic type '?' but is not declared generic"),
]


@pytest.mark.parametrize("declaration,col,words", DECLARATION_CASES)
def test_fragment_declaration_rules(declaration: str, col: int, words: str) -> None:
    text = ("version 1.0;\nextension KHR_enable_fragment_definitions;\n" + declaration +
            ";\ngraph G( x ) -> ( x ) { x = external<integer>(shape = [2]); }\n")
    with pytest.raises(CvmcError) as e:
        parse_nnef(text, "decl.nnef")
    assert str(e.value).startswith(f"decl.nnef:3:{col}: error: "), str(e.value)
    assert words in e.value.message


def test_valid_fragment_declarations_still_pass() -> None:
    """Generic fragments, tensor defaults and attribute tuples are fine (the standard
    library, checked by the same rules, has tensor-array results)."""
    text = ("version 1.0;\nextension KHR_enable_fragment_definitions;\n"
            f"fragment f<? = integer>( a: tensor<?>, b: {T} = 0, k: ({I}, {I}) = (1, 2) ) "
            f"-> ( c: tensor<?> ) {{ c = relu(a); }}\n"
            "graph G( x ) -> ( y ) { x = external<integer>(shape = [2]); y = f(x); }\n")
    assert [n.op for n in parse_nnef(text, "ok.nnef").nodes] == ["relu"]

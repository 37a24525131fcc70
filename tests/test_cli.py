"""`cvmc ops`, `cvmc check` and `cvmc run --reference` through the CLI entry point."""
from pathlib import Path

import numpy as np
import pytest

from cvmc.cli import main
from cvmc.ops import all_ops

EXAMPLE = str(Path(__file__).parents[1] / "examples" / "small_cnn")


def write(tmp_path, text, name="g.nnef"):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_ops_lists_every_op_with_its_precision_rule(capsys):
    assert main(["ops"]) == 0
    out = capsys.readouterr().out
    for d in all_ops():
        aliases = f" (also: {', '.join(d.aliases)})" if d.aliases else ""
        assert f"\n{d.name}{aliases}  op set {', '.join(d.seeds)}, family {d.family}" \
            in "\n" + out
        if not d.integer_op:
            assert f"types:      {d.types}\n" in out
        if d.precision_rule:  # CVM ops, and typed ops that compute on integers too
            assert f"precision:  {d.precision_rule}\n" in out
    assert "\nbroadcast_greater  op set cvm-runtime, family broadcast" in out
    assert "\nnnef.reshape  op set nnef, family nnef" in out


def test_check_prints_signature_and_precisions(capsys):
    assert main(["check", EXAMPLE]) == 0
    out = capsys.readouterr().out
    assert "inputs:  data: [1, 3, 16, 16]" in out
    # conv2d: 8 + 8 + bitlen(3*3*3 = 27) = 21; with bias (12 bits): max(21, 12) + 1 = 22
    assert any(line.split()[:5] == ["c1", "conv2d", "[1,", "8,", "16,"]
               and line.split()[6:8] == ["int32", "22"] for line in out.splitlines())


def test_check_rejects_precision_over_32_with_the_chain(tmp_path, capsys):
    doc = write(tmp_path, """version 1.0;
graph g( x ) -> ( z )
{
    x = external<integer>(shape = [4], precision = 20);
    y = broadcast_mul(x, x);
    z = elemwise_add(y, y);
}
""")
    assert main(["check", doc]) == 1
    err = capsys.readouterr().err
    # broadcast_mul: 20 + 20 = 40 > 32
    assert "g.nnef:5:9: error: broadcast_mul 'y': precision of 'y' would be 40 bits" in err
    assert "grown by broadcast_mul 'y' (40) <- 'x' (20)" in err


RELU = """version 1.0;
graph g( x ) -> ( y )
{
    x = external<integer>(shape = [2, 2], precision = 4);
    y = relu(x);
}
"""


@pytest.mark.parametrize("value, args, message", [
    (np.array([[1, 2], [3, 4]], np.float32), [],
     "input 'x': expected an integer array, got dtype float32"),
    (np.zeros((2, 3), np.int32), [], r"input 'x': expected shape [2, 2], got [2, 3]"),
    (np.array([[1, 2], [-8, 4]], np.int32), [],
     "input 'x': value -8 at index [1, 0] is outside precision 4 (|v| <= 7)"),
])
def test_reference_run_rejects_bad_inputs(tmp_path, capsys, value, args, message):
    np.save(tmp_path / "x.npy", value)
    doc = write(tmp_path, RELU)
    assert main(["run", "--reference", doc, "--input", f"x={tmp_path / 'x.npy'}", *args]) == 1
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_reference_run_names_and_saturate(tmp_path, capsys):
    np.save(tmp_path / "x.npy", np.array([[1, -20], [30, 4]], np.int64))
    doc = write(tmp_path, RELU)
    assert main(["run", "--reference", doc, "--input", f"q={tmp_path / 'x.npy'}"]) == 1
    assert "unknown input 'q'; the model's inputs are: x" in capsys.readouterr().err
    assert main(["run", "--reference", doc]) == 1
    assert "missing input 'x'" in capsys.readouterr().err
    out_dir = tmp_path / "out"
    assert main(["run", "--reference", doc, "--input", f"x={tmp_path / 'x.npy'}",
                 "--saturate", "--output-dir", str(out_dir)]) == 0
    # saturate clips to +-7 (precision 4), then relu
    assert np.array_equal(np.load(out_dir / "y.npy"), [[1, 0], [7, 4]])
    assert "y: shape [2, 2] int8 min 0 max 7" in capsys.readouterr().out


def test_unreadable_input_file_is_one_clear_error(tmp_path, capsys):
    doc = write(tmp_path, RELU)
    (tmp_path / "x.npy").write_bytes(b"not numpy")
    assert main(["run", "--reference", doc, "--input", f"x={tmp_path / 'x.npy'}"]) == 1
    assert "--input x: cannot read" in capsys.readouterr().err
    assert main(["run", "--reference", doc, "--input", "x"]) == 1
    assert "--input expects NAME=FILE.npy, got 'x'" in capsys.readouterr().err


# NNEF arithmetic on integer tensors: the frontend types it (integers may stand for
# scalars in the dialect), the precision rules refuse it. Each command, and the Python API,
# must refuse it with one message (issue 22, item 9).
@pytest.mark.parametrize("expr, op", [
    ("add(x, x)", "add 'y'"), ("x + x", "add 'y'"), ("mul(x, 2)", "mul 'y'"),
    ("exp(x)", "exp 'y'"), ("gt(x, x)", "gt 'y'"), ("sum_reduce(x, axes = [0])", "sum_reduce 'y'"),
    ("select(gt(x, x), x, x)", "gt 'y__1'"), ("sigmoid(x)", "neg 'y__1'"),
])
def test_every_command_refuses_integer_nnef_arithmetic_alike(tmp_path, capsys, expr, op):
    import cvmc
    doc = write(tmp_path, "version 1.0;\nextension KHR_enable_operator_expressions;\n"
                          "graph g( x ) -> ( y )\n{\n    x = external<integer>(shape = [4], "
                          f"precision = 8);\n    y = {expr};\n}}\n")
    np.save(tmp_path / "x.npy", np.array([1, 2, 3, 4], np.int8))
    assert main(["check", doc]) == 1
    want = capsys.readouterr().err
    assert f"error: {op}: input 'x' must be a tensor<scalar>, got a " \
        f"tensor<integer>" in want.splitlines()[0], want
    for argv in (["compile", doc, "-o", str(tmp_path / "m.cvmx")],
                 ["run", "--reference", doc, "--input", f"x={tmp_path / 'x.npy'}",
                  "--output-dir", str(tmp_path / "out")],
                 ["export", doc, "-o", str(tmp_path / "exported")]):
        assert main(argv) == 1, argv
        assert capsys.readouterr().err == want, argv
    assert sorted(p.name for p in tmp_path.iterdir()) == ["g.nnef", "x.npy"]
    with pytest.raises(cvmc.CvmcError) as error:
        cvmc.load_graph(doc)  # a loaded graph is typed: loading refuses it
    assert error.value.render() + "\n" == want


def test_check_totals_parameters_and_multiply_adds(capsys):
    assert main(["check", EXAMPLE]) == 0
    rows = {line.split()[0]: line.split() for line in capsys.readouterr().out.splitlines()
            if line.startswith(" ")}
    # c1: conv of 3 -> 8 channels, 3x3, on 16x16 (same size): weights 8*3*3*3 = 216 and a
    # bias of 8; 8*16*16 outputs of 27 multiply-adds each. logits: dense 512 -> 10 + bias.
    assert rows["c1"][-2:] == [str(216 + 8), str(8 * 16 * 16 * 27)]
    assert rows["logits"][-2:] == [str(5120 + 10), str(5120)]
    assert rows["r1"][-2:] == ["-", "-"]  # relu: no weights, no multiply-adds


def test_check_prints_the_totals_line(capsys):
    assert main(["check", EXAMPLE]) == 0
    out = capsys.readouterr().out
    # int8 weights 216 + 5120 bytes, int32 biases (8 + 10) * 4 bytes
    assert (f"parameters: {216 + 8 + 5120 + 10:,} in 4 weight tensors "
            f"({216 + 5120 + 18 * 4:,} bytes); MACs: {8 * 16 * 16 * 27 + 5120:,}") in out


def test_version_names_cvmc_and_what_it_runs_with(capsys):
    from importlib.metadata import version

    with pytest.raises(SystemExit) as stop:
        main(["--version"])
    assert stop.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"cvmc {version('cvmc')} (") and out.count("\n") == 1
    assert f"apache-tvm {version('apache-tvm')}" in out

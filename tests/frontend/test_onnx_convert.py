"""`cvmc convert`: ONNX models converted to NNEF by the Khronos NNEF-Tools, then checked.

Oracles: the ONNX models themselves and ONNX Runtime (signatures, output shapes, which
pixels a nearest Resize picks), the Khronos `nnef` parser (shapes of every tensor the
converted document names, attributes, the .dat weights), hand-derived names. The
round trip through cvmc's compiler is compared with ONNX Runtime at the end.
"""
from __future__ import annotations

import os
import re
import sys

import numpy as np
import pytest

from cvmc.cli import main
from cvmc.errors import CvmcError
from cvmc.frontend import load_graph

if os.environ.get("CI"):  # CI installs the dev extra, which has the convert extra: run them
    import nnef_tools  # noqa: F401
pytest.importorskip("nnef_tools", reason="needs the convert extra: pip install 'cvmc[convert]'")
onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
nnef = pytest.importorskip("nnef")

from onnx import TensorProto, helper, numpy_helper

from cvmc.frontend.onnx_convert import MISSING, convert_onnx
from tests.onnx_models import MODELS, random_inputs, unsupported


def _save(model, path):
    onnx.save(model, path)
    return path


def _ort(model, feeds):
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return dict(zip([o.name for o in session.get_outputs()], session.run(None, feeds)))


def _model(nodes, inputs, outputs, inits=(), opset=13, name="g"):
    """A one-off float32 ONNX model; `inputs`/`outputs` map names to shapes (None: any)."""
    def info(items):
        return [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in items.items()]
    model = helper.make_model(helper.make_graph(nodes, name, info(inputs), info(outputs),
                                                list(inits)),
                              opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return model


def _convert(tmp_path, model, **kw):
    return convert_onnx(_save(model, tmp_path / "m.onnx"), tmp_path / "nnef", **kw)


def _khronos(folder):
    """The Khronos parser's view of a converted folder (its own fragments lowered)."""
    text = (folder / "graph.nnef").read_text()
    fragments = re.findall(r"^fragment\s+(\w+)", text, re.MULTILINE)
    graph = nnef.load_graph(str(folder), lowered=fragments)
    nnef.infer_shapes(graph)
    return graph


# ---- the models of tests/onnx_models.py -----------------------------------------------------
@pytest.mark.parametrize("name", sorted(MODELS))
def test_model_converts_and_checks(tmp_path, name):
    model = MODELS[name]()
    want = _ort(model, random_inputs(model))
    graph = load_graph(_convert(tmp_path, model))
    assert graph.inputs == [i.name for i in model.graph.input]
    assert graph.outputs == list(want)
    assert {n: list(graph.types[n].shape) for n in graph.outputs} == \
        {n: list(v.shape) for n, v in want.items()}
    assert all(graph.types[n].dtype == "float32" for n in [*graph.inputs, *graph.outputs])


@pytest.mark.parametrize("name", sorted(MODELS))
def test_model_shapes_and_weights_agree_with_khronos(tmp_path, name):
    model = MODELS[name]()
    folder = _convert(tmp_path, model)
    khronos = _khronos(folder)
    graph = load_graph(folder)
    named = {n: tuple(t.shape) for n, t in khronos.tensors.items() if n in graph.types}
    assert set(graph.inputs) | set(graph.outputs) | set(graph.labels) <= set(named)
    assert {n: graph.types[n].shape for n in named} == named
    # every weight cvmc reads is, bit for bit, the Khronos parser's and an ONNX initializer
    inits = [numpy_helper.to_array(t).reshape(-1) for t in model.graph.initializer]
    # LSTM gate blocks: ONNX (i, o, f, c) reordered to the converter's (i, f, c, o)
    lstm = [n.input[1:4] for n in model.graph.node if n.op_type == "LSTM"]
    for t in model.graph.initializer:
        if any(t.name in names for names in lstm):
            a = numpy_helper.to_array(t)
            parts = np.split(a, 8 if a.ndim == 2 else 4, axis=1)
            order = [0, 2, 3, 1, 4, 6, 7, 5][:len(parts)]
            inits.append(np.concatenate([parts[g] for g in order], axis=1).reshape(-1))
    for weight in graph.labels:
        data = graph.constants[weight]
        assert np.array_equal(data, khronos.tensors[weight].data)
        assert any(i.dtype == data.dtype and np.array_equal(i, data.reshape(-1)) for i in inits)


def test_cli_convert_prints_a_summary(tmp_path, capsys):
    onnx_file = _save(MODELS["cnn"](), tmp_path / "cnn.onnx")
    assert main(["convert", str(onnx_file), "-o", str(tmp_path / "out")]) == 0
    out = capsys.readouterr().out
    assert out.count("\n") == 1 and "inputs data [1, 3, 16, 16]" in out
    assert "outputs prob [1, 10]" in out and "checked" in out
    assert main(["check", str(tmp_path / "out")]) == 0


# ---- what cvmc adjusts before conversion ----------------------------------------------------
def test_reduce_sum_with_axes_input_and_reduce_all(tmp_path):
    axes = numpy_helper.from_array(np.array([-1], np.int64), "axes")
    model = _model([helper.make_node("ReduceSum", ["x", "axes"], ["s"], keepdims=0),
                    helper.make_node("ReduceMax", ["x"], ["m"], keepdims=0)],
                   {"x": [2, 3]}, {"s": [2], "m": []}, [axes])
    khronos = _khronos(_convert(tmp_path, model))
    ops = {op.name: op.attribs["axes"] for op in khronos.operations if "axes" in op.attribs}
    # before cvmc's fix: refused ('axes' is not defined) and squeeze(axes = [-1])
    assert ops == {"sum_reduce": [1], "max_reduce": [0, 1], "squeeze": [0, 1]}


@pytest.mark.parametrize("opset,axes", [(13, [2]), (11, [1])])
def test_softmax_default_axis_is_the_opsets(tmp_path, opset, axes):
    shape = [2, 3, 4] if opset == 13 else [2, 3, 1]  # opset 11 flattens the axes from 1 on
    model = _model([helper.make_node("Softmax", ["x"], ["y"])], {"x": shape}, {"y": shape},
                   opset=opset)
    khronos = _khronos(_convert(tmp_path, model))
    assert [op.attribs["axes"] for op in khronos.operations if op.name == "softmax"] == [axes]


def test_flattened_softmax_of_old_opsets_is_refused(tmp_path):
    model = _model([helper.make_node("Softmax", ["x"], ["y"], axis=1)], {"x": [2, 3, 4]},
                   {"y": [2, 3, 4]}, opset=11)
    with pytest.raises(CvmcError, match=r"m.onnx: Softmax 'y' \(opset 11\) normalizes the "
                                        r"dimensions 1.. .* opset >= 13"):
        _convert(tmp_path, model)


MODES = ["half_pixel", "pytorch_half_pixel", "asymmetric", "align_corners"]
ROUNDINGS = ["round_prefer_floor", "round_prefer_ceil", "floor", "ceil"]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("rounding", ROUNDINGS)
@pytest.mark.parametrize("size_in,size_out", [(4, 8), (4, 12), (8, 4), (9, 3), (3, 6)])
def test_nearest_resize_converts_iff_onnx_picks_nnefs_pixels(tmp_path, mode, rounding,
                                                            size_in, size_out):
    scales = numpy_helper.from_array(np.array([1, 1, 1, size_out / size_in], np.float32), "s")
    node = helper.make_node("Resize", ["x", "", "s"], ["y"], mode="nearest",
                            coordinate_transformation_mode=mode, nearest_mode=rounding)
    model = _model([node], {"x": [1, 1, 1, size_in]}, {"y": [1, 1, 1, size_out]}, [scales])
    picked = _ort(model, {"x": np.arange(size_in, dtype=np.float32).reshape(1, 1, 1, -1)})["y"]
    f = max(size_out, size_in) // min(size_out, size_in)
    nnef_picks = [i // f if size_out > size_in else i * f for i in range(size_out)]
    same = picked.reshape(-1).tolist() == nnef_picks
    if same:
        assert load_graph(_convert(tmp_path, model)).types["y"].shape == (1, 1, 1, size_out)
    else:
        with pytest.raises(CvmcError, match=f"Resize 'y': nearest resizing of dimension 3 "
                                            f"from {size_in} to {size_out}"):
            _convert(tmp_path, model)


@pytest.mark.parametrize("op,attrs,message", [
    ("Elu", {"alpha": 0.5}, "Elu 'y': alpha = 0.5, but NNEF-Tools ignores alpha and assumes 1.0"),
    ("Selu", {"gamma": 2.0}, "Selu 'y': gamma = 2.0, but NNEF-Tools ignores gamma"),
])
def test_attributes_the_converter_ignores_are_refused(tmp_path, op, attrs, message):
    model = _model([helper.make_node(op, ["x"], ["y"], **attrs)], {"x": [2]}, {"y": [2]})
    with pytest.raises(CvmcError, match=re.escape(message)):
        _convert(tmp_path, model)


def test_default_attributes_spelled_out_convert(tmp_path):
    model = _model([helper.make_node("Elu", ["x"], ["y"], alpha=1.0)], {"x": [2]}, {"y": [2]})
    assert load_graph(_convert(tmp_path, model)).outputs == ["y"]


def test_round_converts_with_a_warning(tmp_path):
    model = _model([helper.make_node("Round", ["x"], ["y"])], {"x": [2]}, {"y": [2]})
    ties = _ort(model, {"x": np.array([0.5, 2.5], np.float32)})["y"]
    assert ties.tolist() == [0.0, 2.0]  # ONNX: halves to even; NNEF: floor(x + 0.5) = 1, 3
    with pytest.warns(UserWarning, match="Round 'y': ONNX rounds halves to even"):
        assert load_graph(_convert(tmp_path, model)).outputs == ["y"]


def test_variadic_max_is_refused(tmp_path):
    model = _model([helper.make_node("Max", ["a", "b", "c"], ["y"])],
                   {"a": [2], "b": [2], "c": [2]}, {"y": [2]})
    with pytest.raises(CvmcError, match="Max 'y' has 3 inputs; NNEF-Tools converts it with "
                                        "exactly two"):
        _convert(tmp_path, model)


def test_names_become_nnef_identifiers(tmp_path):
    # '0' starts with a digit, 'graph' is a keyword, 'in.1' becomes 'in_1' (the converter's
    # own renaming), which the output 'in_1' already is
    model = _model([helper.make_node("Relu", ["0"], ["graph"]),
                    helper.make_node("Relu", ["in.1"], ["in_1"])],
                   {"0": [2], "in.1": [2]}, {"graph": [2], "in_1": [2]})
    graph = load_graph(_convert(tmp_path, model))
    assert (graph.inputs, graph.outputs) == (["_0", "in_1"], ["graph_", "in_1_2"])


def test_dynamic_input_needs_input_shape(tmp_path):
    model = _model([helper.make_node("Relu", ["x"], ["y"])], {"x": ["N", 3]}, {"y": ["N", 3]})
    with pytest.raises(CvmcError, match=r"input 'x' has the dynamic shape \[N, 3\]: give it "
                                        r"with --input-shape x=D1,D2,..."):
        _convert(tmp_path, model)
    graph = load_graph(_convert(tmp_path, model, input_shapes={"x": [5, 3]}))
    assert graph.types["y"].shape == (5, 3)


def test_input_without_shape(tmp_path):
    model = _model([helper.make_node("Relu", ["x"], ["y"])], {"x": None}, {"y": None})
    with pytest.raises(CvmcError, match="input 'x' declares no shape"):
        _convert(tmp_path, model, input_shapes={"x": [2]})


@pytest.mark.parametrize("shapes,message", [
    ({"z": [5, 3]}, "--input-shape z: the model has no input 'z' (inputs: x)"),
    ({"x": [5, 4]}, r"--input-shape x: [5, 4] does not fit the model's shape [N, 3]"),
    ({"x": [5]}, r"--input-shape x: [5] does not fit"),
    ({"x": [1 << 25, 3]}, "every dimension must be 1..16777216"),
])
def test_bad_input_shapes(tmp_path, shapes, message):
    model = _model([helper.make_node("Relu", ["x"], ["y"])], {"x": ["N", 3]}, {"y": ["N", 3]})
    with pytest.raises(CvmcError, match=re.escape(message)):
        _convert(tmp_path, model, input_shapes=shapes)


# ---- errors ---------------------------------------------------------------------------------
def test_missing_file(tmp_path):
    with pytest.raises(CvmcError, match="nope.onnx: no such file"):
        convert_onnx(tmp_path / "nope.onnx", tmp_path / "out")


@pytest.mark.parametrize("content", [b"\xff\xfe garbage \x00\x01" * 10, b"",
                                     b"version 1.0; graph G() -> () {}"])
def test_not_an_onnx_file(tmp_path, content):
    (tmp_path / "m.onnx").write_bytes(content)
    with pytest.raises(CvmcError, match="m.onnx: not an ONNX model"):
        convert_onnx(tmp_path / "m.onnx", tmp_path / "out")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx"]


def test_op_the_converter_cannot_convert(tmp_path):
    with pytest.raises(CvmcError) as e:
        _convert(tmp_path, unsupported())
    assert str(e.value) == (f"error: {tmp_path / 'm.onnx'}: NNEF-Tools cannot convert this "
                            f"model: Found 1 operator(s) that cannot be converted\n"
                            f"  Conversion of operator 'TopK' is not implemented")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx"]  # no temporary folder left


def test_op_of_another_domain(tmp_path):
    model = _model([helper.make_node("Relu", ["x"], ["y"], domain="com.example")],
                   {"x": [2]}, {"y": [2]})
    model.opset_import.append(helper.make_opsetid("com.example", 1))
    with pytest.raises(CvmcError, match="node 'y' is the op 'Relu' of domain 'com.example'"):
        _convert(tmp_path, model)


def test_without_nnef_tools(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "nnef_tools", None)  # import fails as if not installed
    with pytest.raises(CvmcError, match=re.escape(MISSING)):
        _convert(tmp_path, MODELS["mlp"]())
    assert "pip install 'cvmc[convert]'" in MISSING


def test_cli_errors_are_one_message(tmp_path, capsys):
    (tmp_path / "bad.onnx").write_bytes(b"\x08\x07garbage")
    assert main(["convert", str(tmp_path / "bad.onnx"), "-o", str(tmp_path / "o")]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"error: {tmp_path / 'bad.onnx'}: not an ONNX model")
    assert "Traceback" not in err and err.count("\n") == 1
    with pytest.raises(SystemExit) as e:
        main(["convert", str(tmp_path / "bad.onnx"), "-o", "o", "--input-shape", "x=2,0"])
    assert e.value.code == 2
    assert main(["check", str(tmp_path / "bad.onnx")]) == 1
    assert "convert it to NNEF first with `cvmc convert" in capsys.readouterr().err


def _int_overflow_model():
    """Converts, but cvmc refuses the result: an int64 weight that does not fit int32."""
    big = numpy_helper.from_array(np.array([1 << 40, 1], np.int64), "k")
    model = _model([helper.make_node("Add", ["x", "k"], ["y"])], {}, {}, [big])
    model.graph.input.append(helper.make_tensor_value_info("x", TensorProto.INT64, [2]))
    model.graph.output.append(helper.make_tensor_value_info("y", TensorProto.INT64, [2]))
    return model


def test_cli_convert_keeps_a_result_cvmc_refuses(tmp_path, capsys):
    onnx_file = _save(_int_overflow_model(), tmp_path / "big.onnx")
    assert main(["convert", str(onnx_file), "-o", str(tmp_path / "out")]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"wrote {tmp_path / 'out'}, but cvmc refuses what NNEF-Tools made "
                          f"of {onnx_file}:\n{tmp_path / 'out' / 'graph.nnef'}:")
    assert "value 1099511627776 at index [0] does not fit int32" in err
    assert (tmp_path / "out" / "graph.nnef").is_file()


def test_cli_compile_converts_onnx_first(tmp_path, capsys):
    out = str(tmp_path / "m.cvmx")
    onnx_file = _save(_int_overflow_model(), tmp_path / "big.onnx")
    assert main(["compile", str(onnx_file), "-o", out]) == 1
    err = capsys.readouterr().err
    assert f"(in the NNEF that NNEF-Tools made of {onnx_file}; `cvmc convert {onnx_file} " \
           f"-o DIR` keeps it)" in err and "variable1 = variable<integer>" in err
    assert main(["compile", str(_save(unsupported(), tmp_path / "u.onnx")), "-o", out]) == 1
    assert "u.onnx: NNEF-Tools cannot convert this model" in capsys.readouterr().err
    assert main(["compile", str(onnx_file), "--quant", "q", "-o", out]) == 1
    assert "--quant/--params do not apply to ONNX models" in capsys.readouterr().err
    assert main(["compile", str(tmp_path / "g.nnef"), "--input-shape", "x=1", "-o", out]) == 1
    assert "--input-shape applies to ONNX models" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["big.onnx", "u.onnx"]


# ---- the destination folder -------------------------------------------------------------------
def test_destination_rules(tmp_path):
    onnx_file = _save(MODELS["mlp"](), tmp_path / "m.onnx")
    out = tmp_path / "out"
    out.mkdir()  # an empty folder is fine
    assert convert_onnx(onnx_file, out) == out and (out / "graph.nnef").is_file()
    with pytest.raises(CvmcError, match="folder is not empty"):
        convert_onnx(onnx_file, out)
    (tmp_path / "file").write_text("x")
    with pytest.raises(CvmcError, match="exists and is not a folder"):
        convert_onnx(onnx_file, tmp_path / "file")
    other = tmp_path / "other"
    other.mkdir()
    (other / "keep.txt").write_text("mine")
    with pytest.raises(CvmcError, match="--force replaces only a model folder"):
        convert_onnx(onnx_file, other, force=True)
    assert (other / "keep.txt").read_text() == "mine"
    nested = convert_onnx(onnx_file, tmp_path / "a" / "b")  # parents are created
    assert (nested / "graph.nnef").is_file()


def test_force_replaces_a_model_folder_and_a_failure_keeps_it(tmp_path):
    out = tmp_path / "out"
    convert_onnx(_save(MODELS["mlp"](), tmp_path / "mlp.onnx"), out)
    (out / "stale.dat").write_bytes(b"old")
    convert_onnx(_save(MODELS["cnn"](), tmp_path / "cnn.onnx"), out, force=True)
    assert not (out / "stale.dat").exists() and load_graph(out).outputs == ["prob"]
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    with pytest.raises(CvmcError, match="TopK"):
        convert_onnx(_save(unsupported(), tmp_path / "u.onnx"), out, force=True)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cnn.onnx", "mlp.onnx", "out", "u.onnx"]


# ---- the round trip: convert, compile with cvmc, compare with ONNX Runtime -------------------
@pytest.mark.parametrize("name", sorted(MODELS))
def test_compiled_model_matches_onnx_runtime(tmp_path, name, capsys):
    import cvmc_runtime

    import cvmc
    model = MODELS[name]()
    feeds = random_inputs(model)
    want = _ort(model, feeds)
    onnx_file = _save(model, tmp_path / f"{name}.onnx")
    rc = main(["compile", str(onnx_file), "--target", "llvm", "-o", str(tmp_path / "m.cvmx")])
    err = capsys.readouterr().err
    assert rc == 0, err
    got = cvmc_runtime.load(tmp_path / "m.cvmx").run(feeds)
    ref = cvmc.reference_run(load_graph(convert_onnx(onnx_file, tmp_path / "nnef")), feeds)
    for out, value in want.items():
        # float32 end to end: a few float32 ULPs per op, accumulated over small reductions
        np.testing.assert_allclose(got[out], value, rtol=1e-4, atol=1e-5, err_msg=out)
        np.testing.assert_allclose(ref[out], value, rtol=1e-4, atol=1e-5, err_msg=out)


@pytest.mark.parametrize("attr, value", [("direction", "reverse"), ("clip", 3.0)])
def test_lstm_variants_the_converter_does_not_model_are_refused(tmp_path, attr, value):
    """The converter's lstm_step fragment runs forward, unclipped: anything else would be
    another model."""
    model = MODELS["lstm"]()
    lstm_node = next(n for n in model.graph.node if n.op_type == "LSTM")
    lstm_node.attribute.append(helper.make_attribute(attr, value))
    with pytest.raises(CvmcError, match=f"LSTM 'lstm': .*{attr}"):
        convert_onnx(_save(model, tmp_path / "m.onnx"), tmp_path / "out")


def test_compile_never_writes_over_the_model(tmp_path, capsys):
    onnx_file = _save(MODELS["mlp"](), tmp_path / "m.onnx")
    nnef_file = convert_onnx(onnx_file, tmp_path / "nnef") / "graph.nnef"
    (tmp_path / "link.onnx").symlink_to(onnx_file)
    before = {p: p.read_bytes() for p in (onnx_file, nnef_file)}
    for model, out in ((onnx_file, onnx_file), (nnef_file, nnef_file),
                       (onnx_file, tmp_path / "link.onnx")):
        assert main(["compile", str(model), "--target", "llvm", "-o", str(out)]) == 1
        assert capsys.readouterr().err == (f"error: -o {out}: is the model {model}, which "
                                           f"the artifact would replace; write it elsewhere\n")
    assert {p: p.read_bytes() for p in before} == before

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


@pytest.mark.parametrize("command", [["run"], ["bench"], ["run", "--reference"]])
def test_running_an_onnx_model_points_to_compile_or_convert(tmp_path, capsys, command):
    onnx_file = _save(MODELS["mlp"](), tmp_path / "m.onnx")
    assert main([*command, str(onnx_file)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"error: {onnx_file}: an ONNX model" in err
    assert "convert it to NNEF first with `cvmc convert" in err if "--reference" in command \
        else f"compile it first with `cvmc compile {onnx_file} --target llvm" in err


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


@pytest.mark.parametrize("attr, value", [("input_forget", 1), ("clip", 3.0)])
def test_lstm_variants_the_converter_does_not_model_are_refused(tmp_path, attr, value):
    """The converter's lstm_step fragment is unclipped, its gates uncoupled: anything else
    would be another model (reverse runs are unrolled, tests/frontend/test_onnx_coverage.py)."""
    model = MODELS["lstm"]()
    lstm_node = next(n for n in model.graph.node if n.op_type == "LSTM")
    lstm_node.attribute.append(helper.make_attribute(attr, value))
    with pytest.raises(CvmcError, match=f"LSTM 'lstm': .*{attr}"):
        convert_onnx(_save(model, tmp_path / "m.onnx"), tmp_path / "out")


# ---- issue 22: what the model declares is checked before anything is read ------------------
def _reference(folder, feeds):
    """cvmc's reference interpreter on a converted folder."""
    import cvmc
    return cvmc.reference_run(load_graph(folder), feeds)


def _external(name, dims, location, offset=None, length=None, data_type=TensorProto.FLOAT):
    """A tensor whose data lies in the file `location` (the model's folder)."""
    tensor = TensorProto(name=name, dims=dims, data_type=data_type,
                         data_location=TensorProto.EXTERNAL)
    for key, value in (("location", location), ("offset", offset), ("length", length)):
        if value is not None:
            tensor.external_data.add(key=key, value=str(value))
    return tensor


def _add_model(weight):
    """y = x + weight, x of the weight's shape."""
    dims = list(weight.dims)
    return _model([helper.make_node("Add", ["x", weight.name], ["y"])], {"x": dims},
                  {"y": dims}, [weight])


def test_external_data_converts_and_matches_onnx_runtime(tmp_path):
    model = MODELS["mlp"]()
    feeds = random_inputs(model)
    want = _ort(model, feeds)
    onnx.save(model, tmp_path / "m.onnx", save_as_external_data=True, location="w.bin",
              size_threshold=0)
    assert not any(t.raw_data for t in onnx.load(tmp_path / "m.onnx",
                                                 load_external_data=False).graph.initializer)
    got = _reference(convert_onnx(tmp_path / "m.onnx", tmp_path / "nnef"), feeds)
    np.testing.assert_allclose(got["y"], want["y"], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("dims,length,message", [
    ([1, 4], 3 << 30, "declares 16 bytes ([1, 4] float32), its external data 3221225472"),
    ([805306368, 1], 3 << 30, "more than the 2147483648 bytes"),
    ([1 << 62, 1 << 62], None, "more than the 2147483648 bytes"),
    ([1 << 62, 0], None, "declares 0 bytes ([4611686018427387904, 0] float32), its external"),
])
def test_external_data_is_bounded_before_it_is_read(tmp_path, dims, length, message):
    import time
    with open(tmp_path / "w.bin", "wb") as f:
        f.truncate(3 << 30)  # sparse: no disk used
    model = _add_model(_external("w", dims, "w.bin", length=length))
    _save(model, tmp_path / "m.onnx")
    start = time.monotonic()
    with pytest.raises(CvmcError) as e:
        convert_onnx(tmp_path / "m.onnx", tmp_path / "out")
    assert time.monotonic() - start < 5
    assert str(e.value).startswith(f"error: {tmp_path / 'm.onnx'}: ")
    assert "initializer 'w'" in str(e.value) and message in str(e.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx", "w.bin"]


def test_external_data_of_a_constant_node_is_bounded(tmp_path):
    with open(tmp_path / "w.bin", "wb") as f:
        f.truncate(3 << 30)
    value = _external("c", [2], "w.bin")  # no length: the rest of the file, 3 GiB
    model = _model([helper.make_node("Constant", [], ["c"], value=value),
                    helper.make_node("Add", ["x", "c"], ["y"])], {"x": [2]}, {"y": [2]})
    with pytest.raises(CvmcError, match=r"attribute 'value' of node 'c' declares 8 bytes"):
        _convert(tmp_path, model)


@pytest.mark.parametrize("location,offset,length,message", [
    ("../w.bin", None, None, "must be a relative path inside the model's folder"),
    ("/tmp/w.bin", None, None, "must be a relative path inside the model's folder"),
    ("link.bin", None, None, "leads out of the model's folder"),
    ("inner.bin", None, None, "'inner.bin' is a symbolic link, which onnx does not read"),
    ("none.bin", None, None, "no such file"),
    ("w.bin", 8, 16, "offset 8 + length 16 lies beyond the end of"),
    ("w.bin", "-4", None, "offset '-4' must be an integer >= 0"),
    ("w.bin", None, "1e3", "length '1e3' must be an integer >= 0"),
    ("w.bin", None, 12, "declares 16 bytes ([1, 4] float32), its external data 12"),
])
def test_external_data_location_and_range(tmp_path, location, offset, length, message):
    (tmp_path / "m").mkdir()
    (tmp_path / "w.bin").write_bytes(bytes(16))
    (tmp_path / "m" / "w.bin").write_bytes(bytes(16))
    (tmp_path / "m" / "link.bin").symlink_to(tmp_path / "w.bin")
    (tmp_path / "m" / "inner.bin").symlink_to("w.bin")
    model = _add_model(_external("w", [1, 4], location, offset, length))
    with pytest.raises(CvmcError, match=re.escape(message)):
        convert_onnx(_save(model, tmp_path / "m" / "m.onnx"), tmp_path / "out")


def _inline(dims, data_type, raw_data=None, float_data=()):
    """A tensor whose data need not fit its dims (onnx.helper would check that)."""
    tensor = TensorProto(name="w", dims=dims, data_type=data_type, float_data=float_data)
    if raw_data is not None:
        tensor.raw_data = raw_data
    return tensor


@pytest.mark.parametrize("tensor,message", [
    (_inline([805306368, 1], TensorProto.FLOAT, raw_data=bytes(16)), "more than the 2147483648"),
    (_inline([1 << 20, 4], TensorProto.FLOAT, raw_data=bytes(16)), "its raw data holds 16"),
    (_inline([2, 4], TensorProto.FLOAT, float_data=[1.0] * 4), "its data holds 4"),
    (_inline([1, 4], TensorProto.INT64, raw_data=bytes(16)), "its raw data holds 16"),
    (_inline([1, 4], TensorProto.FLOAT), "its data holds 0"),
], ids=["huge", "raw", "float_data", "int64", "empty"])
def test_inline_data_must_fit_the_dims(tmp_path, tensor, message):
    with pytest.raises(CvmcError, match=r"initializer 'w' declares .*" + message):
        _convert(tmp_path, _add_model(tensor))


def test_whole_model_is_bounded(tmp_path, monkeypatch):
    from cvmc.frontend import onnx_convert
    (tmp_path / "w.bin").write_bytes(bytes(64))
    weights = [_external(f"w{k}", [4, 4], "w.bin") for k in range(2)]  # 2 x 64 bytes
    model = _model([helper.make_node("Add", ["x", "w0"], ["s"]),
                    helper.make_node("Add", ["s", "w1"], ["y"])], {"x": [4, 4]}, {"y": [4, 4]},
                   weights)
    size = len(model.SerializeToString())
    monkeypatch.setattr(onnx_convert, "MAX_ONNX_BYTES", size + 100)
    with pytest.raises(CvmcError, match=f"more than the {size + 100} bytes"):
        _convert(tmp_path, model)
    monkeypatch.setattr(onnx_convert, "MAX_ONNX_BYTES", size + 128)
    assert load_graph(_convert(tmp_path, model)).outputs == ["y"]


# ---- issue 22: the opset --------------------------------------------------------------------
@pytest.mark.parametrize("opset", [1, 6, 29, 99])
def test_unsupported_opsets_are_refused(tmp_path, opset):
    model = _model([helper.make_node("Relu", ["x"], ["y"])], {"x": [2]}, {"y": [2]},
                   opset=opset)
    with pytest.raises(CvmcError) as e:
        _convert(tmp_path, model)
    assert str(e.value) == (f"error: {tmp_path / 'm.onnx'}: declares opset {opset} of the "
                            f"ONNX domain; cvmc converts opsets 7..28")


@pytest.mark.parametrize("opset", [7, 11, 28])
def test_supported_opsets_convert(tmp_path, opset):
    model = _model([helper.make_node("Relu", ["x"], ["y"])], {"x": [2]}, {"y": [2]},
                   opset=opset)
    x = np.array([-1.0, 2.0], np.float32)
    got = _reference(_convert(tmp_path, model), {"x": x})
    assert np.array_equal(got["y"], _ort(model, {"x": x})["y"])


def test_another_domain_declared_but_unused_converts(tmp_path):
    model = _model([helper.make_node("Relu", ["x"], ["y"])], {"x": [2]}, {"y": [2]})
    model.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    assert load_graph(_convert(tmp_path, model)).outputs == ["y"]


def test_opset_10_resize_is_asymmetric(tmp_path):
    """Resize-10 has no coordinate mode: ONNX Runtime resizes it asymmetrically (the
    converter's default is opset 11's half_pixel)."""
    nearest = numpy_helper.from_array(np.array([1, 1, 3, 3], np.float32), "s3")
    linear = numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32), "s2")
    model = _model([helper.make_node("Resize", ["x", "s3"], ["n"], mode="nearest"),
                    helper.make_node("Resize", ["x", "s2"], ["l"], mode="linear")],
                   {"x": [1, 1, 3, 3]}, {"n": [1, 1, 9, 9], "l": [1, 1, 6, 6]},
                   [nearest, linear], opset=10)
    feeds = {"x": np.arange(9, dtype=np.float32).reshape(1, 1, 3, 3)}
    want, got = _ort(model, feeds), _reference(_convert(tmp_path, model), feeds)
    assert np.array_equal(got["n"], want["n"])
    np.testing.assert_allclose(got["l"], want["l"], rtol=1e-6)


@pytest.mark.parametrize("axis,shape", [(-1, [6, 4]), (2, [6, 4]), (0, [1, 24]), (-3, [1, 24]),
                                        (1, [2, 12])])
def test_flatten_any_axis(tmp_path, axis, shape):
    """The converter writes reshape(shape = [0] * axis + [-1]): right for axis 1 only."""
    model = _model([helper.make_node("Flatten", ["x"], ["y"], axis=axis)], {"x": [2, 3, 4]},
                   {"y": shape})
    feeds = {"x": np.arange(24, dtype=np.float32).reshape(2, 3, 4)}
    got = _reference(_convert(tmp_path, model), feeds)
    assert np.array_equal(got["y"], _ort(model, feeds)["y"])


@pytest.mark.parametrize("opset,attrs", [(13, {}), (18, {"num_outputs": 3}), (11, {"axis": -1})])
def test_split_into_equal_parts(tmp_path, opset, attrs):
    attrs.setdefault("axis", 2)
    model = _model([helper.make_node("Split", ["x"], ["a", "b", "c"], **attrs)], {"x": [1, 2, 6]},
                   {"a": [1, 2, 2], "b": [1, 2, 2], "c": [1, 2, 2]}, opset=opset)
    feeds = {"x": np.arange(12, dtype=np.float32).reshape(1, 2, 6)}
    want, got = _ort(model, feeds), _reference(_convert(tmp_path, model), feeds)
    assert all(np.array_equal(got[k], want[k]) for k in "abc")


@pytest.mark.parametrize("node,shape", [
    (helper.make_node("Clip", ["x"], ["y"], min=-1.0, max=2.0), [2, 3]),
    (helper.make_node("Clip", ["x"], ["y"], max=2.0), [2, 3]),
    (helper.make_node("Clip", ["x"], ["y"], min=-1.0), [2, 3]),
    (helper.make_node("Slice", ["x"], ["y"], starts=[1], ends=[3], axes=[1]), [2, 2]),
    (helper.make_node("Slice", ["x"], ["y"], starts=[1, 0], ends=[2, -1]), [1, 2]),
], ids=["clip", "clip-max", "clip-min", "slice", "slice-no-axes"])
def test_attributes_older_opsets_take_as_inputs(tmp_path, node, shape):
    model = _model([node], {"x": [2, 3]}, {"y": shape}, opset=9)
    feeds = {"x": np.array([[-3, -0.5, 0], [1, 2.5, 4]], np.float32)}
    got = _reference(_convert(tmp_path, model), feeds)
    assert np.array_equal(got["y"], _ort(model, feeds)["y"])


def _bn(opset, params_shape=(2,), **attrs):
    """BatchNormalization of a [1, 2, 2] input (spatial = 0: statistics per channel and
    position, of shape [2, 2])."""
    params = [numpy_helper.from_array(np.ones(params_shape, np.float32), n) for n in "sbmv"]
    return _model([helper.make_node("BatchNormalization", ["x", *"sbmv"], ["y"], **attrs)],
                  {"x": [1, 2, 2]}, {"y": [1, 2, 2]}, params, opset=opset)


def _resize18(**attrs):
    scales = numpy_helper.from_array(np.array([2, 2], np.float32), "s")
    return _model([helper.make_node("Resize", ["x", "", "s"], ["y"], mode="nearest",
                                    **attrs)], {"x": [1, 1, 2, 2]}, {"y": [1, 1, 4, 4]},
                  [scales], opset=18)


def _pad18():
    pads = numpy_helper.from_array(np.array([1, 1], np.int64), "p")
    axes = numpy_helper.from_array(np.array([1], np.int64), "a")
    return _model([helper.make_node("Pad", ["x", "p", "", "a"], ["y"])], {"x": [2, 2]},
                  {"y": [2, 4]}, [pads, axes], opset=18)


@pytest.mark.parametrize("model,message", [
    (_bn(14, training_mode=1), "BatchNormalization 'y': training_mode = 1, but NNEF-Tools"),
    (_bn(7, (2, 2), spatial=0), "BatchNormalization 'y': spatial = 0, but NNEF-Tools"),
    (_model([helper.make_node("Reshape", ["x", "s"], ["y"], allowzero=1)], {"x": [2, 2]},
            {"y": [4]}, [numpy_helper.from_array(np.array([0, -1], np.int64), "s")], opset=14),
     "Reshape 'y': allowzero = 1, but NNEF-Tools"),
    (_resize18(antialias=1), "Resize 'y': antialias = 1, but NNEF-Tools"),
    (_resize18(axes=[2, 3]), "Resize 'y': axes = [2, 3], but NNEF-Tools"),
    (_pad18(), "Pad 'y': its input 'axes' (opset 18) is ignored by NNEF-Tools"),
], ids=["bn-training", "bn-spatial", "reshape-allowzero", "resize-antialias", "resize-axes",
        "pad-axes"])
def test_attributes_of_newer_opsets_the_converter_ignores(tmp_path, model, message):
    with pytest.raises(CvmcError, match=re.escape(message)):
        _convert(tmp_path, model)


# ---- issue 22: --force never deletes the source ------------------------------------------
def test_force_refuses_the_source_folder_and_its_ancestors(tmp_path, capsys):
    models = tmp_path / "models"
    convert_onnx(_save(MODELS["mlp"](), tmp_path / "mlp.onnx"), models)  # a model folder
    (models / "sub").mkdir()
    source = _save(MODELS["cnn"](), models / "sub" / "cnn.onnx")
    for dest in (models / "sub", models, tmp_path):
        (dest / "graph.nnef").touch()
        with pytest.raises(CvmcError, match=f"-o {dest}: holds the source model {source}"):
            convert_onnx(source, dest, force=True)
        assert main(["convert", str(source), "-o", str(dest), "--force"]) == 1
        assert capsys.readouterr().err.count("\n") == 1
    assert onnx.load(source).graph.name == "cnn"
    link = tmp_path / "link.onnx"
    link.symlink_to(source)  # the model a link names is protected too
    with pytest.raises(CvmcError, match="holds the source model"):
        convert_onnx(link, models, force=True)


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


# ---- issue 22: -1 and 0 dimensions are symbolic -------------------------------------------
def _conv_dynamic(dim):
    """Conv 3x3 (3 -> 4 channels, 'same' padding) + Relu; the input [dim, 3, dim, dim]."""
    rng = np.random.default_rng(9)
    weights = [numpy_helper.from_array(rng.normal(0, 0.3, shape).astype(np.float32), name)
               for name, shape in (("w", [4, 3, 3, 3]), ("b", [4]))]
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], kernel_shape=[3, 3],
                              pads=[1, 1, 1, 1]), helper.make_node("Relu", ["c"], ["y"])]
    return _model(nodes, {"x": [dim, 3, dim, dim]}, {"y": [dim, 4, dim, dim]}, weights)


@pytest.mark.parametrize("dim", [-1, 0])
def test_negative_and_zero_dims_are_symbolic(tmp_path, dim):
    model = _conv_dynamic(dim)
    with pytest.raises(CvmcError, match=re.escape(f"input 'x' has the dynamic shape "
                                                  f"[{dim}, 3, {dim}, {dim}]: give it")):
        _convert(tmp_path, model)
    with pytest.raises(CvmcError, match="does not fit the model's shape"):
        _convert(tmp_path, model, input_shapes={"x": [1, 4, 8, 8]})
    feeds = {"x": np.random.default_rng(0).standard_normal([2, 3, 5, 7]).astype(np.float32)}
    got = _reference(_convert(tmp_path, model, input_shapes={"x": [2, 3, 5, 7]}), feeds)
    # ONNX Runtime runs no model with a 0 dimension: its -1 twin is the oracle
    np.testing.assert_allclose(got["y"], _ort(_conv_dynamic(-1), feeds)["y"], rtol=1e-4,
                               atol=1e-5)


def test_paddle_style_input_compiles_and_runs(tmp_path, capsys):
    import cvmc_runtime
    model = _conv_dynamic(-1)
    onnx_file = _save(model, tmp_path / "m.onnx")
    rc = main(["compile", str(onnx_file), "--input-shape", "x=1,3,48,192", "--target", "llvm",
               "-o", str(tmp_path / "m.cvmx")])
    assert rc == 0, capsys.readouterr().err
    feeds = {"x": np.random.default_rng(1).standard_normal([1, 3, 48, 192]).astype(np.float32)}
    got = cvmc_runtime.load(tmp_path / "m.cvmx").run(feeds)
    np.testing.assert_allclose(got["y"], _ort(model, feeds)["y"], rtol=1e-4, atol=1e-5)

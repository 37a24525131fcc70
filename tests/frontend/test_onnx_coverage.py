"""ONNX ops NNEF-Tools 1.0.11 lacks, rewritten by `cvmc/frontend/onnx_rewrite.py` before it
converts: LayerNormalization, HardSigmoid / HardSwish, GRU, LSTM whose Y is used (and the
LSTM variants its `lstm_loop` does not express), and shapes computed in the graph.

Oracle: ONNX Runtime on the same model. Every variant runs through cvmc's reference
interpreter; one model per op family is also compiled for llvm and run. Bounds as in
`test_onnx_convert.py`: float32 end to end, a few ULPs per op.
"""
from __future__ import annotations

import os
import re

import numpy as np
import pytest

from cvmc.errors import CvmcError
from cvmc.frontend import load_graph

if os.environ.get("CI"):  # CI installs the dev extra, which has the convert extra: run them
    import nnef_tools  # noqa: F401
pytest.importorskip("nnef_tools", reason="needs the convert extra: pip install 'cvmc[convert]'")
onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

from onnx import TensorProto, helper, numpy_helper

from cvmc.frontend.onnx_convert import convert_onnx

RTOL, ATOL = 1e-4, 1e-5
S, B, I, H = 3, 2, 4, 5  # steps, batch, input size, hidden size of the recurrent models


def _weight(name, shape, seed):
    return numpy_helper.from_array(
        np.random.default_rng(seed).normal(0, 0.4, shape).astype(np.float32), name)


def _int64(name, values):
    return numpy_helper.from_array(np.array(values, np.int64), name)


def _model(nodes, inputs, outputs, inits=(), opset=17):
    """A float32 model; `inputs` / `outputs` map names to shapes (strings: symbolic dims)."""
    def info(items):
        return [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in items.items()]
    model = helper.make_model(helper.make_graph(nodes, "g", info(inputs), info(outputs),
                                                list(inits)),
                              opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return model


def _feeds(model, shapes=None):
    rng = np.random.default_rng(0)
    inits = {t.name for t in model.graph.initializer}
    return {i.name: 2 * rng.standard_normal((shapes or {}).get(i.name) or [
        d.dim_value for d in i.type.tensor_type.shape.dim]).astype(np.float32)
        for i in model.graph.input if i.name not in inits}


def _ort(model, feeds):
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return dict(zip([o.name for o in session.get_outputs()], session.run(None, feeds)))


def _convert(tmp_path, model, shapes=None):
    onnx.save(model, tmp_path / "m.onnx")
    return convert_onnx(tmp_path / "m.onnx", tmp_path / "nnef", input_shapes=shapes)


def _check(tmp_path, model, shapes=None, compile=False):
    """Convert `model`; its reference run (and compiled run) matches ONNX Runtime."""
    import cvmc

    feeds = _feeds(model, shapes)
    want = _ort(model, feeds)
    graph = load_graph(_convert(tmp_path, model, shapes))
    runs = {"reference": cvmc.reference_run(graph, feeds)}
    if compile:
        import cvmc_runtime
        cvmc.compile(graph, tmp_path / "m.cvmx", target="llvm")
        runs["compiled"] = cvmc_runtime.load(tmp_path / "m.cvmx").run(feeds)
    assert graph.outputs == list(want)
    for how, got in runs.items():
        for name, value in want.items():
            np.testing.assert_allclose(got[name], value, rtol=RTOL, atol=ATOL,
                                       err_msg=f"{how} {name}")
    return graph


def _document_ops(tmp_path):
    """The ops of the converted NNEF document's graph body, in order."""
    text = (tmp_path / "nnef" / "graph.nnef").read_text()
    return re.findall(r"= (\w+)[<(]", text[text.index("graph "):])


# ---- LayerNormalization ------------------------------------------------------------------
def _layer_norm(axis=-1, bias=True, opset=17, shape=(2, 3, 8), **attrs):
    normalized = list(shape[axis:])
    inits = [_weight("scale", normalized, 1), *([_weight("bias", normalized, 2)] * bias)]
    node = helper.make_node("LayerNormalization", ["x", "scale", *(["bias"] * bias)], ["y"],
                            name="ln", axis=axis, **attrs)
    return _model([node], {"x": list(shape)}, {"y": list(shape)}, inits, opset)


@pytest.mark.parametrize("axis, bias, opset, attrs", [
    (-1, True, 17, {}), (1, True, 17, {"epsilon": 0.1}), (-2, False, 17, {}),
    (2, True, 18, {}), (0, True, 17, {"stash_type": 1})])
def test_layer_normalization(tmp_path, axis, bias, opset, attrs):
    _check(tmp_path, _layer_norm(axis, bias, opset, **attrs))


def test_layer_normalization_is_the_plain_decomposition(tmp_path):
    """The op sequence a later fusion pass matches: in the NNEF document, and in cvmc's
    graph (mean_reduce and sqrt expanded by cvmc's standard library fragments)."""
    graph = _check(tmp_path, _layer_norm(), compile=True)
    assert _document_ops(tmp_path) == [
        "external", "variable", "variable", "mean_reduce", "sub", "mul", "mean_reduce", "add",
        "sqrt", "div", "unsqueeze", "mul", "unsqueeze", "add"]
    assert [(n.op, n.attrs.get("normalize")) for n in graph.nodes if n.op != "unsqueeze"] == [
        ("sum_reduce", True), ("sub", None), ("mul", None), ("sum_reduce", True), ("add", None),
        ("pow", None), ("div", None), ("mul", None), ("add", None)]


@pytest.mark.parametrize("change, message", [
    ({"stash_type": 0}, "LayerNormalization 'ln': stash_type = 0"),
    ({"outputs": ["y", "mean"]}, "LayerNormalization 'ln': its output Mean")])
def test_layer_normalization_refusals(tmp_path, change, message):
    model = _layer_norm(**{k: v for k, v in change.items() if k != "outputs"})
    if "outputs" in change:
        model.graph.node[0].output.append("mean")
        model.graph.output.append(helper.make_tensor_value_info("mean", TensorProto.FLOAT, None))
    with pytest.raises(CvmcError, match=message):
        _convert(tmp_path, model)


def test_layer_normalization_with_an_unused_mean_output(tmp_path):
    model = _layer_norm()
    model.graph.node[0].output.extend(["mean", "inv_std"])
    _check(tmp_path, model)


# ---- HardSigmoid, HardSwish --------------------------------------------------------------
@pytest.mark.parametrize("opset", [9, 14, 17])
def test_hard_sigmoid_and_hard_swish(tmp_path, opset):
    nodes = [helper.make_node("HardSigmoid", ["x"], ["a"], alpha=0.3, beta=0.4),
             helper.make_node("HardSigmoid", ["x"], ["b"])]
    outputs = {"a": [2, 16], "b": [2, 16]}
    if opset >= 14:
        nodes.append(helper.make_node("HardSwish", ["x"], ["c"]))
        outputs["c"] = [2, 16]
    _check(tmp_path, _model(nodes, {"x": [2, 16]}, outputs, opset=opset), compile=opset == 17)


# ---- GRU ---------------------------------------------------------------------------------
def _rnn(op, direction="forward", initial=True, outputs=("Y", "Y_h"), seq_lens=None,
         batch=B, opset=17, **attrs):
    """A GRU or LSTM node over x [S, batch, I] with constant weights; `outputs` names
    which outputs the graph has (the others are left unnamed)."""
    dirs = 2 if direction == "bidirectional" else 1
    gates = 3 if op == "GRU" else 4
    inits = [_weight("W", [dirs, gates * H, I], 3), _weight("R", [dirs, gates * H, H], 4),
             _weight("B", [dirs, 2 * gates * H], 5)]
    inputs = {"x": [S, batch, I]}
    names = ["x", "W", "R", "B", "", "", ""][:6 + (op == "LSTM")]
    if seq_lens is not None:
        inits.append(numpy_helper.from_array(np.array(seq_lens, np.int32), "lens"))
        names[4] = "lens"
    if initial:
        names[5:] = ["h0", "c0"][:len(names) - 5]
        inputs.update({n: [dirs, batch, H] for n in names[5:]})
    all_outputs = {"Y": [S, dirs, batch, H], "Y_h": [dirs, batch, H], "Y_c": [dirs, batch, H]}
    node = helper.make_node(op, names, [o if o in outputs else "" for o in all_outputs][
        :2 + (op == "LSTM")], name="rnn", hidden_size=H, direction=direction, **attrs)
    while node.input and not node.input[-1]:
        node.input.pop()
    return _model([node], inputs, {o: all_outputs[o] for o in outputs}, inits, opset)


@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
@pytest.mark.parametrize("linear_before_reset", [0, 1])
def test_gru(tmp_path, direction, linear_before_reset):
    model = _rnn("GRU", direction, linear_before_reset=linear_before_reset)
    _check(tmp_path, model, compile=direction == "bidirectional")


@pytest.mark.parametrize("kw", [
    {"initial": False}, {"outputs": ("Y_h",)}, {"outputs": ("Y",)}, {"seq_lens": [S] * B},
    {"activations": ["Relu", "Sigmoid"]}, {"opset": 9, "direction": "reverse"}])
def test_gru_variants(tmp_path, kw):
    _check(tmp_path, _rnn("GRU", **kw))


def test_gru_with_a_symbolic_batch_takes_input_shape(tmp_path):
    """The input shapes are set before the unrolling, which needs the batch size."""
    model = _rnn("GRU", batch="N", initial=False)
    _check(tmp_path, model, shapes={"x": [S, 3, I]})


@pytest.mark.parametrize("op, kw, message", [
    ("GRU", {"clip": 2.0}, "GRU 'rnn': attribute 'clip'"),
    ("GRU", {"activation_alpha": [0.5]}, "GRU 'rnn': attribute 'activation_alpha'"),
    ("GRU", {"layout": 1}, "GRU 'rnn': layout = 1"),
    ("GRU", {"activations": ["HardSigmoid", "Tanh"]}, "GRU 'rnn': activations"),
    ("GRU", {"activations": ["Sigmoid", "Tanh"], "direction": "bidirectional"},
     "GRU 'rnn': activations"),
    ("GRU", {"seq_lens": [S, S - 1]}, "GRU 'rnn': sequence_lens \\[3, 2\\]"),
    ("LSTM", {"direction": "reverse", "clip": 2.0}, "LSTM 'rnn': attribute 'clip'"),
    ("LSTM", {"outputs": ("Y",), "input_forget": 1}, "LSTM 'rnn': input_forget = 1"),
])
def test_recurrent_refusals(tmp_path, op, kw, message):
    with pytest.raises(CvmcError, match=message):
        _convert(tmp_path, _rnn(op, **kw))


def test_recurrent_weights_must_be_constants(tmp_path):
    model = _rnn("GRU")
    w = model.graph.initializer[0]
    model.graph.input.append(helper.make_tensor_value_info("W", TensorProto.FLOAT, w.dims))
    del model.graph.initializer[0]
    with pytest.raises(CvmcError, match="GRU 'rnn': its input 1 \\('W'\\) must be a constant"):
        _convert(tmp_path, model)


def test_lstm_peepholes_are_refused(tmp_path):
    model = _rnn("LSTM", outputs=("Y",))
    model.graph.node[0].input.append("P")
    model.graph.initializer.append(_weight("P", [1, 3 * H], 6))
    with pytest.raises(CvmcError, match="LSTM 'rnn': peephole weights"):
        _convert(tmp_path, model)


# ---- LSTM the converter's lstm_loop cannot express -------------------------------------------
@pytest.mark.parametrize("kw", [
    {"outputs": ("Y", "Y_h", "Y_c")}, {"outputs": ("Y",), "direction": "reverse"},
    {"outputs": ("Y", "Y_c"), "direction": "bidirectional"},
    {"outputs": ("Y_h",), "initial": False}, {"outputs": ("Y_h",), "seq_lens": [S] * B},
    {"outputs": ("Y",), "activations": ["Sigmoid", "Relu", "Tanh"]}])
def test_lstm_unrolled(tmp_path, kw):
    _check(tmp_path, _rnn("LSTM", **kw), compile=kw["outputs"] == ("Y", "Y_h", "Y_c"))


def test_lstm_with_y_consumed_by_another_node(tmp_path):
    """Y feeding a node (as torch's nn.LSTM exports), not a graph output."""
    model = _rnn("LSTM", outputs=("Y", "Y_h"))
    model.graph.node.append(helper.make_node("Relu", ["Y"], ["r"]))
    del model.graph.output[0]
    model.graph.output.append(helper.make_tensor_value_info("r", TensorProto.FLOAT, None))
    _check(tmp_path, model)
    assert "lstm" not in (tmp_path / "nnef" / "graph.nnef").read_text()


def test_lstm_the_converter_expresses_stays_its_loop(tmp_path):
    _check(tmp_path, _rnn("LSTM", outputs=("Y_h", "Y_c")))
    assert "lstm_loop(" in (tmp_path / "nnef" / "graph.nnef").read_text()


# ---- shapes computed in the graph ---------------------------------------------------------
def _view(opset=13):
    """`x.view(x.size(0), -1)` as torch's TorchScript exporter writes it."""
    nodes = [helper.make_node("Relu", ["x"], ["r"]),
             helper.make_node("Shape", ["r"], ["shape"]),
             helper.make_node("Constant", [], ["zero"], value=numpy_helper.from_array(
                 np.array(0, np.int64))),
             helper.make_node("Gather", ["shape", "zero"], ["n"], axis=0),
             helper.make_node("Unsqueeze", ["n", "axes"], ["n1"]),
             helper.make_node("Concat", ["n1", "minus_one"], ["target"], axis=0),
             helper.make_node("Reshape", ["r", "target"], ["y"])]
    return _model(nodes, {"x": ["N", 3, 4, 4]}, {"y": ["N", 48]},
                  [_int64("axes", [0]), _int64("minus_one", [-1])], opset)


def test_dynamic_reshape_converts_without_onnxsim(tmp_path):
    _check(tmp_path, _view(), shapes={"x": [2, 3, 4, 4]}, compile=True)
    assert _document_ops(tmp_path) == ["external", "relu", "reshape"]


def test_shape_slices_size_constant_of_shape_and_range_fold(tmp_path):
    """Shape's start / end (opset 15), Size, ConstantOfShape and Range (of constants)."""
    nodes = [helper.make_node("Shape", ["x"], ["lead"], end=1),
             helper.make_node("Shape", ["x"], ["tail"], start=-2),
             helper.make_node("ReduceProd", ["tail"], ["rest"], keepdims=1),
             helper.make_node("Concat", ["lead", "rest"], ["target"], axis=0),
             helper.make_node("Reshape", ["x", "target"], ["flat"]),
             helper.make_node("Size", ["x"], ["size"]),
             helper.make_node("Cast", ["size"], ["size_f"], to=TensorProto.FLOAT),
             helper.make_node("Shape", ["flat"], ["flat_shape"]),
             helper.make_node("ConstantOfShape", ["flat_shape"], ["ones"],
                              value=numpy_helper.from_array(np.array([1.0], np.float32))),
             helper.make_node("Range", ["start", "limit", "delta"], ["ramp"]),
             helper.make_node("Add", ["flat", "ones"], ["a"]),
             helper.make_node("Mul", ["a", "ramp"], ["b"]),
             helper.make_node("Div", ["b", "size_f"], ["y"])]
    inits = [numpy_helper.from_array(np.array(v, np.float32), n)
             for n, v in (("start", 0.0), ("limit", 12.0), ("delta", 1.0))]
    _check(tmp_path, _model(nodes, {"x": [2, 3, 4]}, {"y": [2, 12]}, inits, opset=15))


@pytest.mark.parametrize("target, message", [
    ([2, -1], None), ([0, -1], "Reshape 'reshape': allowzero = 1")])
def test_reshape_allowzero_without_a_zero(tmp_path, target, message):
    """torch's dynamo exporter writes allowzero = 1; with no 0 in the shape it means nothing."""
    model = _model([helper.make_node("Reshape", ["x", "target"], ["y"], name="reshape",
                                     allowzero=1)],
                   {"x": [2, 3, 4]}, {"y": [2, 12]}, [_int64("target", target)], opset=14)
    if message is None:
        _check(tmp_path, model)
    else:
        with pytest.raises(CvmcError, match=message):
            _convert(tmp_path, model)

"""cvmc.GraphBuilder: the README example, the text round trip, the method scheme, and
mistakes raised at the call."""
from __future__ import annotations

import inspect
from pathlib import Path

import numpy as np
import pytest

import cvmc
from cvmc.cli import main as cli_main
from cvmc.frontend.fragments import stdlib
from cvmc.frontend.nnef import parse_nnef
from cvmc.ops import all_ops
from tests.ops.test_cinn import SPEC_PRIMITIVES
from tests.shared import run_doc_example

ROOT = Path(__file__).resolve().parents[1]


def test_readme_builder_example_runs(tmp_path):
    scope = run_doc_example("# Python GraphBuilder (CINN primitives)", tmp_path,
                               "docs/builder.md")
    assert (tmp_path / "net.cvmx").is_file()
    # z by hand: relu(sum over a channel / 32 * 0.25 summed over the 3 channels + 0.5)
    x = scope["feeds"]["x"].astype(np.float64)
    z = max(x.sum(axis=(0, 2, 3)).sum() / 32 * 0.25 + 0.5, 0.0)
    assert np.allclose(scope["got"]["z"], z, rtol=1e-5)
    # k by hand: cvm_right_shift(i * i, 7) rounds: (v + 64) >> 7, clipped to precision 8
    i = scope["feeds"]["i"]
    assert scope["got"]["k"].tolist() == np.clip((i * i + 64) >> 7, -127, 127).tolist()


def every_cinn_op_graph() -> cvmc.ir.Graph:
    """One graph calling every CINN primitive (and a CVM op and an NNEF fragment)."""
    b = cvmc.GraphBuilder("all_cinn")
    x = b.input("x", [2, 3, 4], "float32")
    i = b.input("i", [2, 3], "int32", precision=8)
    p = b.input("p", [3], "int8")
    flag = b.input("flag", [3], "bool")
    outs = [b.const_scalar(3), b.const_scalar(True, name="yes")]
    for name in ("abs", "acos", "acosh", "asin", "asinh", "atan", "atanh", "ceil", "cos",
                 "cosh", "erf", "exp", "floor", "identity", "is_finite", "is_inf", "is_nan",
                 "log", "log10", "log2", "negative", "round", "rsqrt", "sign", "sin", "sinh",
                 "sqrt", "tan", "tanh", "trunc"):
        outs.append(getattr(b, name)(x))
    outs += [b.bitwise_not(p), b.logical_not(flag)]
    for name in ("add", "sub", "mul", "div", "floor_div", "floor_mod", "mod", "max", "min",
                 "power"):
        outs.append(getattr(b, name)(x, b.const_scalar(1.5)))
    for name in ("bitwise_and", "bitwise_or", "bitwise_xor", "left_shift", "right_shift"):
        outs.append(getattr(b, name)(p, b.const_scalar(2)))
    outs += [getattr(b, n)(flag, True) for n in ("logical_and", "logical_or", "logical_xor")]
    outs += [b.dot(i, b.constant(np.arange(6).reshape(3, 2), name="w")),
             b.compare(x, 0.5, "kGt"), b.select(flag, p, -1),
             b.reduce(x, "sum", [0, 2]), b.reduce(i, "kMax", [], keep_dim=True),
             *b.bn_mean_variance(x, name=["bn_sum", "bn_sq"]),
             *b.bn_grad_bias_scale(x, x, b.constant(np.zeros(3, np.float32))),
             b.broadcast_to(p, [2, 3]), b.concat([i, i], axis=1), b.reshape(x, [-1, 4]),
             b.reverse(x, [0, 2]), b.slice(x, [2], [1], [3]), b.transpose(x, [1, 0]),
             b.cvm_right_shift(b.mul(i, i), precision=8, shift_bit=7), b.softmax(x),
             b.conv(b.input("img", [1, 2, 5, 5], "float32"),
                    b.constant(np.ones((3, 2, 3, 3), np.float32), name="filt"),
                    paddings=[1, 1], padding_algorithm="SAME", strides=[2, 2])]
    return b.build(outputs=outs)


def test_builder_graph_prints_and_parses_back_equal(tmp_path, capsys):
    g = every_cinn_op_graph()
    text = cvmc.print_graph(g)
    assert parse_nnef(text, "printed.nnef") == g
    ops = {n.op for n in g.nodes}
    assert {f"cinn.{p}" for p in SPEC_PRIMITIVES} <= ops
    (tmp_path / "graph.nnef").write_text(text)
    assert cli_main(["check", str(tmp_path / "graph.nnef")]) == 0
    out = capsys.readouterr().out
    assert "cinn.bn_mean_variance" in out and "cinn.conv" in out


def test_builder_graph_runs_on_the_reference(tmp_path):
    b = cvmc.GraphBuilder("g")
    x = b.input("x", [3], "int32", precision=8)
    y = b.input("y", [3], "int32", precision=4)
    q = b.floor_div(x, y, name="q")
    r = b.floor_mod(x, y, name="r")
    g = b.build([q, r])
    out = cvmc.reference_run(g, {"x": np.array([7, -7, 5]), "y": np.array([2, 2, 0])})
    assert out["q"].tolist() == [3, -4, 0] and out["r"].tolist() == [1, 1, 0]
    cvmc.compile(g, tmp_path / "g.cvmx", target="llvm")


def test_methods_cover_the_spec_and_every_text_name():
    b = cvmc.GraphBuilder()
    for p in SPEC_PRIMITIVES:
        method = getattr(b, p)
        assert method.__doc__ and callable(method)
    assert b.pow == b.power
    # every other text-callable op: registry names (no nnef.) and stdlib compound fragments
    text_names = {d.name.removeprefix("nnef.") for d in all_ops() if "cinn" not in d.seeds}
    text_names |= {n for n, f in stdlib().items() if f.body is not None}
    text_names -= {"external", "variable", "constant", "update"}
    for name in text_names:
        method = f"nnef_{name}" if name in SPEC_PRIMITIVES else name.replace(".", "_")
        assert method in dir(b) and getattr(b, method).__doc__, method
    assert "nnef_max" in dir(b) and "nnef_relu" not in dir(b) and "relu" in dir(b)
    assert "lambda_" in inspect.signature(b.selu).parameters  # NNEF's `lambda` attribute


def test_spec_argument_names():
    sig = {n: list(inspect.signature(getattr(cvmc.GraphBuilder, n)).parameters)[1:]
           for n in ("broadcast_to", "concat", "conv", "reduce", "reshape", "reverse",
                     "select", "slice", "transpose", "bn_mean_variance", "bn_grad_bias_scale",
                     "const_scalar")}
    assert sig["broadcast_to"] == ["var", "out_shape", "broadcast_axes", "name"]
    assert sig["concat"] == ["input_vars", "axis", "name"]
    assert sig["conv"] == ["lhs", "rhs", "strides", "paddings", "dilations", "groups",
                           "conv_type", "data_format", "padding_algorithm", "output_shape",
                           "name"]
    assert sig["reduce"] == ["input", "kind", "dim", "keep_dim", "name"]
    assert sig["slice"] == ["input", "axes", "starts", "ends", "name"]
    assert sig["transpose"] == ["input", "axis", "name"]
    assert sig["bn_grad_bias_scale"] == ["input", "grad", "save_mean", "name"]
    assert sig["const_scalar"] == ["value", "name"]
    assert list(inspect.signature(cvmc.GraphBuilder().cvm_right_shift).parameters) == [
        "data", "precision", "shift_bit", "name"]


def test_text_names_resolve_as_in_text():
    b = cvmc.GraphBuilder()
    f = b.input("f", [2, 3], "float32")
    i = b.input("i", [2, 3], "int32", precision=8)
    assert b.relu(i).dtype == "int32" and b.relu(f).dtype == "float32"
    assert b.nnef_max(i, axes=[1]).shape == (2,)          # CVM's reduce max
    assert b.nnef_max(f, 0.5).shape == (2, 3)              # NNEF's binary max
    g = b.build([b.relu(i, name="r")])
    assert g.nodes[-1].op == "relu"


def test_inputs_and_constants():
    b = cvmc.GraphBuilder()
    assert b.input("a", [2], "int8").precision == 8
    assert b.input("c", [2], "int32", precision=20).precision == 20
    w = b.constant(np.array([1.5, 2.0]))                    # float64 -> float32
    assert w.dtype == "float32"
    k = b.constant(np.array([[3, -100]]), precision=9)
    assert k.dtype == "int32" and k.precision == 9
    assert b.constant(np.array([3, -100])).precision == 8   # inferred from the data
    assert b.constant(np.array([True])).dtype == "bool"
    g = b.build([w, k])
    assert g.constants[w.name].dtype == np.float32 and g.types[k.name].precision == 9


@pytest.mark.parametrize("call, message", [
    (lambda b: b.input("y", [2], "int32"), r"input 'y': an integer input needs precision="),
    (lambda b: b.input("y", [2], "int8", precision=9), r"int8 input has precision 1..8"),
    (lambda b: b.input("y", [2], "float64"), r"dtype must be one of float32, int32, int8, bool"),
    (lambda b: b.input("x", [2], "float32"), r"tensor name 'x' is already used"),
    (lambda b: b.input("for", [2], "float32"), r"'for' is not an NNEF identifier"),
    (lambda b: b.input("y", [0], "float32"), r"dimension 0 in shape \[0\] is outside"),
    (lambda b: b.constant(np.array([np.inf])), r"not a finite float32"),
    (lambda b: b.constant(np.array([2**40])), r"value 1099511627776 at index \[0\] does not"),
    (lambda b: b.constant(np.array([1.0]), precision=8), r"precision applies to integer"),
    (lambda b: b.add(b.input("y", [3], "float32"), b.input("z", [2], "float32")),
     r"cinn.add: x shape \(3,\) and y shape \(2,\) do not broadcast"),
    (lambda b: b.exp(b.input("y", [3], "int32", precision=4)),
     r"cinn.exp 'exp__1': input 'y' must be a tensor<scalar>, got a tensor<integer>"),
    (lambda b: b.mul(b.input("y", [3], "int32", precision=20), b.const_scalar(2**20)),
     r"cinn.mul 'mul__\d+': precision of 'mul__\d+' would be 42 bits by its rule p_x \+ p_y,"),
    (lambda b: b.reduce(b.input("y", [3], "float32"), "mean"),
     r"cinn.reduce: attribute 'kind' must be 'sum' or 'prod' or 'max' or 'min'"),
    (lambda b: b.conv(b.input("y", [1, 2, 3, 3], "float32"), b.input("z", [1, 3, 1, 1],
                                                                    "float32")),
     r"cinn.conv: x has 2 channels and the filter 1 x 3"),
    (lambda b: b.add(np.zeros(3), 1.0), r"wrap it with b.constant\(array\)"),
    (lambda b: b.add(cvmc.GraphBuilder().input("y", [1], "float32"), 1.0),
     r"is not a Var of this GraphBuilder"),
    (lambda b: b.softmax(b.input("y", [3], "float32"), axes=[4]),
     r"^error: softmax 'softmax': max_reduce: axes must be in range"),
    (lambda b: b.identity(b.input("y", [1], "float32"), name="x"), r"'x' is already used"),
])
def test_mistakes_raise_at_the_call(call, message):
    b = cvmc.GraphBuilder()
    b.input("x", [2], "float32")
    with pytest.raises(cvmc.CvmcError, match=message) as info:
        call(b)
    assert info.value.span is None  # raised at the Python call, not at a text location


def test_a_rejected_call_leaves_the_graph_unchanged():
    b = cvmc.GraphBuilder()
    x = b.input("x", [3], "int32", precision=30)
    with pytest.raises(cvmc.CvmcError, match="precision"):
        b.mul(x, 5, name="m")                      # 30 + 4 bits
    assert b.add(x, 1, name="m").name == "m"       # the name was not taken
    g = b.build([b.identity(x)])
    assert [n.op for n in g.nodes] == ["cinn.add", "cinn.identity"]
    assert parse_nnef(cvmc.print_graph(g)) == g


def test_build_checks_its_outputs():
    b = cvmc.GraphBuilder()
    x = b.input("x", [3], "float32")
    with pytest.raises(cvmc.CvmcError, match="'x' is listed twice"):
        b.build([x, x])
    with pytest.raises(cvmc.CvmcError, match="at least one output"):
        b.build([])
    with pytest.raises(cvmc.CvmcError, match="is not a Var of this GraphBuilder"):
        b.build(["x"])


def test_a_namespaced_op_is_a_method_with_an_underscore():
    """`onednn.convolution` is `b.onednn_convolution`: the same node as the text makes."""
    b = cvmc.GraphBuilder("n")
    x = b.input("x", [1, 4, 4, 1], "float32")
    w = b.constant(np.full((1, 1, 1, 2), 2.0, np.float32), name="w")
    y = b.onednn_convolution(x, w, strides=[1, 1], pads_begin=[0, 0], pads_end=[0, 0],
                             dilations=[1, 1])
    g = b.build(outputs=[y])
    assert g.nodes[-1].op == "onednn.convolution"
    arr = np.arange(16, dtype=np.float32).reshape(1, 4, 4, 1)
    out = cvmc.reference_run(g, {"x": arr})[g.outputs[0]]
    assert np.array_equal(out, np.concatenate([arr * 2, arr * 2], axis=3))  # by hand: 2x


# One valid call of every method with an optional tensor input: (the tensor inputs by name:
# (shape, dtype, precision) for the graph input first, then constants), attributes.
_F, _I = ("float32", None), ("int32", 4)
OPTIONAL_INPUT_CALLS = {
    "conv2d": ({"data": ((1, 2, 4, 4), "int32", 8), "weight": ((3, 2, 1, 1), *_I),
                "bias": ((3,), *_I)}, {}),
    "dense": ({"data": ((2, 3), "int32", 8), "weight": ((4, 3), *_I), "bias": ((4,), *_I)}, {}),
    "conv2d_packed": ({"data": ((1, 4, 3, 3), "int32", 8),
                       "weight": ((1, 1, 1, 1, 16, 4), *_I), "compensation": ((2,), *_I),
                       "bias": ((2,), *_I)}, {"channels": 2}),
    "conv_packed": ({"input": ((1, 2, 4, 4), *_F), "filter": ((1, 2, 1, 1, 8), *_F),
                     "bias": ((1, 3), *_F)}, {"channels": 3}),
    "conv_packed_blocked": ({"input": ((1, 1, 4, 4, 8), *_F), "filter": ((1, 2, 1, 1, 8), *_F),
                             "bias": ((1, 8), *_F)},
                            {"channels": 8, "data_layout": "NCHW8c", "out_layout": "NCHW8c"}),
    "depthwise_conv_blocked": ({"input": ((1, 1, 4, 4, 8), *_F),
                                "filter": ((1, 1, 3, 3, 8), *_F), "bias": ((1, 8), *_F)},
                               {"padding": [(1, 1), (1, 1)]}),
    "depthwise_conv2d_blocked": ({"data": ((1, 1, 4, 4, 16), "int32", 8),
                                  "weight": ((1, 1, 3, 3, 16), *_I),
                                  "bias": ((16,), *_I)}, {"padding": [1, 1]}),
    "nnef_conv": ({"input": ((1, 2, 4, 4), *_F), "filter": ((3, 2, 1, 1), *_F),
                   "bias": ((1, 3), *_F)}, {}),
    "deconv": ({"input": ((1, 3, 4, 4), *_F), "filter": ((3, 2, 1, 1), *_F),
                "bias": ((1, 2), *_F)}, {}),
    "onednn_convolution": ({"src": ((1, 4, 4, 1), *_F), "weights": ((1, 1, 1, 2), *_F),
                            "bias": ((2,), *_F)},
                           {"strides": [1, 1], "pads_begin": [0, 0], "pads_end": [0, 0],
                            "dilations": [1, 1]}),
    "linear": ({"input": ((2, 3), *_F), "filter": ((4, 3), *_F), "bias": ((1, 4), *_F)}, {}),
    "separable_conv": ({"input": ((1, 2, 4, 4), *_F), "plane_filter": ((2, 1, 3, 3), *_F),
                        "point_filter": ((3, 2, 1, 1), *_F), "bias": ((1, 3), *_F)}, {}),
    "separable_deconv": ({"input": ((1, 3, 4, 4), *_F), "plane_filter": ((2, 1, 3, 3), *_F),
                          "point_filter": ((3, 2, 1, 1), *_F), "bias": ((1, 2), *_F)}, {}),
    "attention_scores": ({"q": ((1, 2, 3, 4), *_F), "k": ((1, 2, 4, 3), *_F),
                          "mask": ((1, 1, 3, 3), *_F)}, {}),
}


def _optional_input_methods() -> set[str]:
    """Builder methods of every registry op and standard library fragment that has an
    optional tensor input (read from the registry and the library, not the builder)."""
    from cvmc.builder import _text_methods
    from cvmc.frontend.fragments import NO_DEFAULT
    method = {text: m for m, text in _text_methods().items()}
    ops = {d.name.removeprefix("nnef.") for d in all_ops()
           if any(i.endswith("?") for i in d.inputs)}
    fragments = {n for n, f in stdlib().items()
                 if any(p.type[0] == "tensor" and p.default is not NO_DEFAULT
                        for p in f.params)}
    return {method[t] for t in ops | fragments}


def test_the_optional_input_table_covers_the_registry():
    assert set(OPTIONAL_INPUT_CALLS) == _optional_input_methods()


def _build(method: str, how: str) -> str:
    """The printed graph of one call of `method`: tensor inputs positional, by keyword
    ('keyword': all, 'bias': the last one only), the last left out ('none') or given as
    None by keyword ('bias=None')."""
    tensors, attrs = OPTIONAL_INPUT_CALLS[method]
    b = cvmc.GraphBuilder("g")
    rng = np.random.default_rng(0)
    vars_ = {}
    for k, (slot, (shape, dtype, p)) in enumerate(tensors.items()):
        if k == 0:
            vars_[slot] = b.input("x", list(shape), dtype, precision=p)
        else:
            data = rng.integers(-3, 4, shape)
            vars_[slot] = b.constant(data.astype(np.float32) if p is None else data,
                                     name=slot, precision=p)
    values, last = list(vars_.values()), list(vars_)[-1]
    call = getattr(b, method)
    y = {"positional": lambda: call(*values, **attrs),
         "keyword": lambda: call(**vars_, **attrs),
         last: lambda: call(*values[:-1], **{last: values[-1]}, **attrs),
         "none": lambda: call(*values[:-1], **attrs),
         f"{last}=None": lambda: call(*values[:-1], **{last: None}, **attrs)}[how]()
    return cvmc.print_graph(b.build([y]))


@pytest.mark.parametrize("method", sorted(OPTIONAL_INPUT_CALLS))
def test_every_tensor_input_is_accepted_by_its_keyword(method):
    """`b.onednn_convolution(x, w, bias=b)` is `b.onednn_convolution(x, w, b)` (the
    positional call is the oracle); `bias=None` leaves it out, as leaving it off does."""
    last = list(OPTIONAL_INPUT_CALLS[method][0])[-1]
    assert last in inspect.signature(getattr(cvmc.GraphBuilder(), method)).parameters
    positional = _build(method, "positional")
    assert _build(method, last) == positional
    assert _build(method, "keyword") == positional
    assert _build(method, f"{last}=None") == _build(method, "none")


# Numbers that become float32 constants (issue 22, item 16): float32 must hold a Python int
# exactly, or the call is refused naming the op, the input, the value and the float32 it
# would round to (NumPy's rounding: the oracle); a NumPy float32 value asks for it. A Python
# float rounds to the nearest float32, as a decimal literal in text does.
def _nearest(v) -> str:
    return repr(float(np.float32(v)))


def _inputs(b):
    return (b.input("x", [2], "float32"), b.input("i", [2], "int32", precision=8),
            b.input("m", [1, 2], "float32"))


@pytest.mark.parametrize("call, v, where", [
    (lambda b, x, i, m: b.add(x, 2**40 + 1), 2**40 + 1, "cinn.add: input 'y'"),
    (lambda b, x, i, m: b.mul(2**24 + 1, x), 2**24 + 1, "cinn.mul: input 'x'"),
    (lambda b, x, i, m: b.nnef_add(x, 2**60 + 1), 2**60 + 1, "add: input 'y'"),
    (lambda b, x, i, m: b.select(b.compare(x, x, "eq"), x, 2**25 + 1), 2**25 + 1,
     "cinn.select: input 'false_value'"),
    (lambda b, x, i, m: b.concat([x, 2**26 + 3]), 2**26 + 3, "cinn.concat: input 'input_vars'"),
    (lambda b, x, i, m: b.linear(m, b.constant(np.ones((2, 2), np.float32)), bias=2**30 + 1),
     2**30 + 1, "linear 'linear': add: input 'y'"),
    (lambda b, x, i, m: b.clamp(x, 0.5, 16777217), 16777217, "clamp 'clamp': "),
])
def test_ints_float32_cannot_hold_are_refused(call, v, where):
    b = cvmc.GraphBuilder()
    with pytest.raises(cvmc.CvmcError) as error:
        call(b, *_inputs(b))
    message = error.value.message
    assert message.startswith(where), message
    assert f"{v!r} is not a float32 value: it rounds to {_nearest(v)}" in message, message
    assert f"pass np.float32({v!r}) to accept that" in message, message


def test_floats_round_to_the_nearest_float32_and_exact_values_are_taken_as_given():
    b = cvmc.GraphBuilder()
    x, i, _ = _inputs(b)
    asked = [np.float32(2**40 + 1), np.float32(0.1), 2**40, 0.5, 16777216, 0.1, 1 / 3,
             float(2**40 + 1)]
    outs = [b.add(x, v) for v in asked]
    outs += [b.add(x, b.const_scalar(0.7)),
             b.add(x, b.constant(np.array([2**40 + 1, 0.1], np.float32))),
             b.add(x, b.constant(np.array([0.1, 2.0**40 + 1]))),  # float64: rounded
             b.add(i, 20000001)]                                 # an integer input: int32
    g = b.build(outs)
    got = cvmc.reference_run(g, {"x": np.zeros(2, np.float32), "i": np.zeros(2, np.int8),
                                 "m": np.zeros((1, 2), np.float32)})
    want = [np.float32(v) for v in asked] + [np.float32(0.7)]
    for name, w in zip(g.outputs, want):
        assert got[name].dtype == np.float32 and np.array_equal(got[name], [w, w])
    assert np.array_equal(got[g.outputs[-3]], np.array([2**40 + 1, 0.1], np.float32))
    assert np.array_equal(got[g.outputs[-2]], np.array([0.1, 2.0**40 + 1]).astype(np.float32))
    assert np.array_equal(got[g.outputs[-1]], [20000001, 20000001])


@pytest.mark.parametrize("call, message", [
    (lambda b, x, i, m: b.add(i, 2**31), "integer literal 2147483648 does not fit int32"),
    (lambda b, x, i, m: b.const_scalar(-2**40), "value -1099511627776 does not fit int32"),
    (lambda b, x, i, m: b.constant(np.array([0, 2**31])), "value 2147483648 at index [1]"),
    (lambda b, x, i, m: b.constant(np.array([9]), precision=4), "value 9 at index [0]"),
])
def test_integer_constants_beyond_their_precision_are_refused(call, message):
    b = cvmc.GraphBuilder()
    with pytest.raises(cvmc.CvmcError) as error:
        call(b, *_inputs(b))
    assert message in error.value.message, error.value.message

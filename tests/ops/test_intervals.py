"""Proven value intervals (`cvmc.ops.infer.intervals`): for random graphs of CVM ops over
an input and weights, fed data inside the input's precision (extremes included), every
value the reference interpreter computes lies inside its inferred interval; and hand
cases whose intervals are computed here from the ops' definitions."""
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from cvmc.cli import main
from cvmc.errors import CvmcError, OpRuleError
from cvmc.ir import Graph, Node, TensorType
from cvmc.ops import all_ops, lookup
from cvmc.ops.infer import intervals, retype
from cvmc.reference import reference_run

SHAPE = (1, 2, 4, 4)


def unary_steps(draw, p):
    """(op, attrs) applicable to one tensor of precision p."""
    prec = draw(st.integers(1, 16))
    shift = draw(st.integers(1, 12))
    lo = draw(st.integers(-300, 300))
    return draw(st.sampled_from([
        ("relu", {}), ("abs", {}), ("negative", {}),
        ("cvm_clip", {"precision": prec}),
        ("cvm_right_shift", {"precision": prec, "shift_bit": shift}),
        ("cvm_left_shift", {"precision": prec, "shift_bit": min(shift, max(1, 32 - p))}),
        ("clip", {"a_min": lo, "a_max": lo + draw(st.integers(1, 300))}),
        ("max", {"axes": [draw(st.integers(0, 3))], "keepdims": True}),
        ("sum", {"axes": [draw(st.integers(0, 3))], "keepdims": True}),
        ("transpose", {"axes": [0, 1, 3, 2]}),
        ("flatten", {}),
        ("reshape", {"target_shape": [1, 2, 16]}),
        ("slice", {"begin": [0, 0, 1, 0], "end": [1, 2, 3, 4]}),
        ("max_pool2d", {"pool_size": [2, 2], "padding": [1, 1]}),
        ("layout_transform", {"src_layout": "NCHW", "dst_layout": "NCHW4c"}),
        ("upsampling", {"scale": 2}),
    ]))


BINARY = ["broadcast_add", "broadcast_sub", "broadcast_mul", "broadcast_max", "elemwise_add",
          "elemwise_sub", "concatenate"]


@st.composite
def graphs(draw):
    """A random DAG over one input and two weights (one a lookup table); each step reads
    one or two earlier values (or the table through cvm_lut)."""
    p_in = draw(st.integers(2, 12))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    w_lo = draw(st.integers(-200, 200))
    w = rng.integers(w_lo, w_lo + draw(st.integers(0, 100)) + 1, SHAPE)
    table = rng.integers(draw(st.integers(-50, 0)), draw(st.integers(0, 50)) + 1, (16,))
    types = {"x": TensorType(SHAPE, "int32", p_in), "w": TensorType(SHAPE, "int32"),
             "table": TensorType((16,), "int32")}
    nodes: list[Node] = []
    for k in range(draw(st.integers(1, 6))):
        names = list(types)
        a = draw(st.sampled_from(names))
        kind = draw(st.sampled_from(["unary", "binary", "lut"]))
        if kind == "binary":
            op, attrs = draw(st.sampled_from(BINARY)), {}
            args = (a, draw(st.sampled_from(names)))
        elif kind == "lut":
            op, attrs, args = "cvm_lut", {}, (a, "table")
        else:
            op, attrs = unary_steps(draw, types[a].precision or 9)
            args = (a,)
        opdef = lookup(op)
        try:
            ins = [types[i].with_precision(types[i].precision or 9) for i in args]
            norm = opdef.normalize_attrs(attrs)
            (shape,) = opdef.infer_shapes(ins, norm)
            (prec,) = opdef.infer_precisions(ins, norm)
        except OpRuleError:
            continue  # not applicable here (shapes differ, left shift too wide, ...)
        if not 1 <= prec <= 32:
            continue
        out = f"v{k}"
        nodes.append(Node(op, args, (out,), dict(norm)))
        types[out] = TensorType(shape, "int32", prec)
    outs = [n.name for n in nodes] or ["x"]
    return Graph("g", ["x"], outs, nodes, types, constants={"w": w, "table": table})


@st.composite
def input_data(draw, p):
    bound = (1 << (p - 1)) - 1
    kind = draw(st.sampled_from(["random", "max", "min", "alternate", "narrow"]))
    if kind == "random":
        return np.random.default_rng(draw(st.integers(0, 2**32 - 1))).integers(
            -bound, bound + 1, SHAPE)
    if kind == "narrow":  # one sign only: the padding zeros of a layout are then outside
        v = draw(st.integers(-bound, bound))
        return np.full(SHAPE, v)
    if kind == "alternate":
        return np.where(np.arange(32).reshape(SHAPE) % 2 == 0, bound, -bound)
    return np.full(SHAPE, bound if kind == "max" else -bound)


@settings(max_examples=200, deadline=None)
@given(data=st.data())
def test_values_stay_inside_inferred_intervals(data):
    graph = data.draw(graphs())
    try:
        graph = retype(graph)
    except CvmcError:
        return
    proven = intervals(graph)
    x = data.draw(input_data(graph.types["x"].precision))
    for name, value in reference_run(graph, {"x": x}).items():
        lo, hi = proven[name]
        assert lo <= value.min() and value.max() <= hi, (name, proven[name])


def node(op, ins, out, attrs=None):
    """A Node with its attributes normalized (defaults filled in)."""
    return Node(op, ins, (out,), dict(lookup(op).normalize_attrs(attrs or {})))


def run_one(op, x_precision, attrs=None, constants=None, shape=(4,)):
    """The proven interval of `op` applied to input x (of `x_precision`) and the weights
    `constants` (name -> data, in that order)."""
    constants = constants or {}
    types = {"x": TensorType(shape, "int32", x_precision)}
    types.update({k: TensorType(v.shape, "int32") for k, v in constants.items()})
    types["y"] = TensorType(shape, "int32")
    nodes = [node(op, ("x", *constants), "y", attrs)]
    graph = retype(Graph("g", ["x"], ["y"], nodes, types, constants=constants))
    return intervals(graph)["y"]


def test_hand_computed_intervals():
    assert run_one("relu", 8) == (0, 127)
    assert run_one("clip", 8, {"a_min": -5, "a_max": 300}) == (-5, 127)
    assert run_one("cvm_clip", 32, {"precision": 4}) == (-7, 7)
    # cvm_right_shift by 2 rounds x / 4: 127 -> 32, -127 -> -32 (floor(-127 / 2) = -64,
    # floor((-64 + 1) / 2) = -32)
    assert run_one("cvm_right_shift", 8, {"precision": 8, "shift_bit": 2}) == (-32, 32)
    assert run_one("negative", 3) == (-3, 3)
    table = np.array([-3, 9, 4, 0])
    assert run_one("cvm_lut", 3, constants={"table": table}) == (-3, 9)
    w = np.array([2, 5, 3, 4])
    # x in [-7, 7] plus w in [2, 5]: [-5, 12]; times w: [-35, 35]; max with w: [2, 7]
    assert run_one("elemwise_add", 4, constants={"w": w}) == (-5, 12)
    assert run_one("broadcast_mul", 4, constants={"w": w}) == (-35, 35)
    assert run_one("broadcast_max", 4, constants={"w": w}) == (2, 7)
    # an op without an interval rule: its precision's interval (8 + 8 + 1 bits)
    assert run_one("broadcast_div", 8, constants={"w": w}) == (-127, 127)


def test_relu_chain_through_layout_and_pool():
    """relu -> max pool -> layout blocking keeps [0, 127]; a negative input's blocking
    pads zeros, so 0 joins the interval."""
    shape = (1, 3, 4, 4)
    types = {"x": TensorType(shape, "int32", 8)}
    block = {"src_layout": "NCHW", "dst_layout": "NCHW4c"}
    nodes = [node("relu", ("x",), "r"),
             node("max_pool2d", ("r",), "p", {"pool_size": [2, 2]}),
             node("layout_transform", ("p",), "b", block),
             node("clip", ("x",), "c", {"a_min": -9, "a_max": -2}),
             node("layout_transform", ("c",), "cb", block)]
    types.update({n.name: TensorType((0,), "int32") for n in nodes})
    graph = retype(Graph("g", ["x"], ["b", "cb"], nodes, types))
    found = intervals(graph)
    assert found["b"] == (0, 127)
    assert found["cb"] == (-9, 0)
    y = reference_run(graph, {"x": np.full(shape, -5)})
    assert y["cb"].min() == -5 and y["cb"].max() == 0  # the padded fourth channel


def test_ops_lists_interval_rules(capsys):
    assert main(["ops"]) == 0
    out = capsys.readouterr().out
    ruled = [d for d in all_ops() if d.interval_rule]
    assert {"relu", "clip", "cvm_lut", "cvm_right_shift", "max_pool2d", "layout_transform",
            "concatenate"} <= {d.name for d in ruled}
    for d in ruled:
        assert f"interval:   {d.interval_rule}\n" in out

"""Property: for random graphs of CVM ops fed data inside the declared input precision
(extremes included), every intermediate value lies inside its inferred precision.

Every value is made a graph output, so the bound is checked here for each tensor (the
interpreter additionally asserts it after each op before narrowing to the storage dtype).
"""
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from cvmc.errors import CvmcError, OpRuleError
from cvmc.ir import Graph, Node, TensorType
from cvmc.ops import lookup
from cvmc.ops.infer import retype
from cvmc.reference import reference_run

SHAPE = (2, 3, 4)


def unary_steps(draw, p):
    """(op, attrs) applicable to one tensor of precision p."""
    prec = draw(st.integers(1, 32))
    shift = draw(st.integers(1, 32))
    lo = draw(st.integers(-(2**20), 2**20))
    return draw(st.sampled_from([
        ("relu", {}), ("abs", {}), ("negative", {}), ("cvm_precision", {}),
        ("cvm_clip", {"precision": prec}),
        ("cvm_right_shift", {"precision": prec, "shift_bit": shift}),
        ("cvm_left_shift", {"precision": prec, "shift_bit": min(shift, max(1, 32 - p))}),
        ("clip", {"a_min": lo, "a_max": lo + draw(st.integers(1, 2**20))}),
        ("sum", {"axes": [draw(st.integers(0, 2))], "keepdims": True}),
        ("max", {"axes": [draw(st.integers(0, 2))], "keepdims": True}),
    ]))


BINARY = ["broadcast_add", "broadcast_sub", "broadcast_mul", "broadcast_div", "broadcast_max",
          "elemwise_add", "elemwise_sub"]


@st.composite
def graphs(draw):
    """A random DAG over one input; each step reads one or two earlier values."""
    p_in = draw(st.integers(1, 16))
    types = {"x": TensorType(SHAPE, "int32", p_in)}
    nodes: list[Node] = []
    for k in range(draw(st.integers(1, 6))):
        names = list(types)
        a = draw(st.sampled_from(names))
        if draw(st.booleans()):
            op, attrs = draw(st.sampled_from(BINARY)), {}
            args = (a, draw(st.sampled_from(names)))
        else:
            op, attrs = unary_steps(draw, types[a].precision)
            args = (a,)
        opdef = lookup(op)
        try:
            norm = opdef.normalize_attrs(attrs)
            (shape,) = opdef.infer_shapes([types[i] for i in args], norm)
            (prec,) = opdef.infer_precisions([types[i] for i in args], norm)
        except OpRuleError:
            continue  # not applicable here (shapes differ, left shift too wide, ...)
        if not 1 <= prec <= 32:
            continue  # the graph would be rejected; soundness concerns accepted graphs
        out = f"v{k}"
        nodes.append(Node(op, args, (out,), dict(norm)))
        types[out] = TensorType(shape, "int32", prec)
    outs = [n.name for n in nodes] or ["x"]
    return Graph("g", ["x"], outs, nodes, types)


@st.composite
def input_data(draw, p):
    bound = (1 << (p - 1)) - 1
    kind = draw(st.sampled_from(["random", "max", "min", "alternate"]))
    if kind == "random":
        seed = draw(st.integers(0, 2**32 - 1))
        return np.random.default_rng(seed).integers(-bound, bound + 1, SHAPE)
    if kind == "alternate":
        return np.where(np.arange(24).reshape(SHAPE) % 2 == 0, bound, -bound)
    return np.full(SHAPE, bound if kind == "max" else -bound)


@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_values_stay_inside_inferred_precisions(data):
    graph = data.draw(graphs())
    try:
        graph = retype(graph)
    except CvmcError:
        return
    x = data.draw(input_data(graph.types["x"].precision))
    outputs = reference_run(graph, {"x": x})
    for name, value in outputs.items():
        p = graph.types[name].precision
        bound = (1 << (p - 1)) - 1
        assert np.abs(value.astype(np.int64)).max() <= bound, (name, p)

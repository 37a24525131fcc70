"""Constant folding and dead-code elimination on small hand-built graphs."""
import numpy as np
import pytest

from cvmc.ir import Graph, Node, TensorType
from cvmc.ops.infer import retype
from cvmc.passes.simplify import eliminate_dead_code, fold_constants
from tests.oputil import compile_passes


def graph():
    t = TensorType((3,), "int32", None)
    types = {n: t for n in ("x", "w", "a", "b", "dead")}
    types["x"] = TensorType((3,), "int32", 8)
    nodes = [Node("relu", ("w",), ("a",)), Node("relu", ("x",), ("b",)),
             Node("relu", ("x",), ("dead",))]
    return Graph("g", ["x"], ["a", "b"], nodes, types, {"w": np.array([-5, 0, 7])},
                 labels={"w": "w"})


def test_fold_constants_evaluates_weight_only_nodes():
    g = fold_constants(retype(graph()))
    assert [n.name for n in g.nodes] == ["b", "dead"]
    assert np.array_equal(g.constants["a"], [0, 0, 7])  # relu by hand
    assert g.constants["a"].dtype == np.int8


def test_fold_constants_evaluates_nodes_without_inputs():
    t = TensorType((), "float32")
    g = Graph("g", [], ["c", "d"], [Node("cinn.const_scalar", (), ("c",), {"value": 0.1}),
                                    Node("cinn.const_scalar", (), ("d",), {"value": -3})],
              {"c": t, "d": TensorType((), "int32")})
    g = fold_constants(retype(g))
    assert not g.nodes
    assert g.constants["c"] == np.float32(0.1) and g.constants["c"].dtype == np.float32
    assert g.constants["d"] == -3 and g.constants["d"].dtype == np.int8  # precision 3


def test_dead_code_removes_unused_nodes_and_weights():
    g = eliminate_dead_code(fold_constants(retype(graph())))
    assert [n.name for n in g.nodes] == ["b"]
    assert "dead" not in g.types and "w" not in g.constants and "w" not in g.labels
    assert g.inputs == ["x"]
    g.verify()


def test_pipeline_stop_after():
    g = compile_passes(retype(graph()), stop_after="infer-precision")
    assert len(g.nodes) == 3 and g.types["b"].precision == 8


def test_folding_a_float_subgraph_keeps_its_fraction():
    """Constant folding evaluates as the reference does (float64 rounded to float32): it
    once cast every constant operand to int64, so 0.75 * 2.5 folded to 0."""
    from cvmc.frontend.nnef import parse_nnef
    from cvmc.passes.simplify import fold_constants

    g = parse_nnef("version 1.0;\ngraph G(x) -> (y) { x = external(shape = [2]); "
                   "c = mul(0.75, 2.5); y = add(x, c); }")
    folded = fold_constants(retype(g))
    assert [n.op for n in folded.nodes] == ["add"]
    c = folded.constants["c"]
    assert c.dtype == np.float32 and c == np.float32(1.875)


def test_fold_constants_keeps_float_and_bool_weights():
    """Weight-only float nodes fold with the values the reference interpreter sees (float32
    as float64, rounded once; not truncated to integers) and bool results stay bool."""
    f = TensorType((2,), "float32")
    types = {"v": f, "e": TensorType((), "float32"), "s": f, "r": f, "c": TensorType((2,), "bool")}
    nodes = [Node("add", ("v", "e"), ("s",)), Node("pow", ("s", "e"), ("r",)),
             Node("gt", ("v", "s"), ("c",))]
    g = Graph("g", [], ["r", "c"], nodes, types,
              {"v": np.array([0.5, 2.25], np.float32), "e": np.array(0.25, np.float32)})
    g = fold_constants(retype(g))
    assert not g.nodes
    want = (np.array([0.5, 2.25]) + 0.25) ** 0.25  # float64, then rounded once
    assert g.constants["r"].dtype == np.float32
    assert np.array_equal(g.constants["r"], want.astype(np.float32))
    assert g.constants["c"].dtype == np.bool_ and not g.constants["c"].any()


# ---- simplify_float: the stdlib's max / min / clamp / max_pool as single ops -------------
_FLOAT_DOC = """version 1.0;
graph G( x ) -> ( y, z )
{{
    x = external(shape = [1, 3, 9, 12]);
    r = relu(x);
    c = clamp(r, 0.0, 6.0);
    y = max_pool(c, size = [1, 1, 3, 3], stride = [1, 1, 2, 2],
                 padding = [(0, 0), (0, 0), (1, 1), (1, 1)], border = '{border}');
    z = min(x, 2.0);
}}"""


def _specials(shape, seed):
    """Random small floats with NaN, infinities and zeros of both signs mixed in."""
    rng = np.random.default_rng(seed)
    x = rng.integers(-4, 9, shape).astype(np.float32)
    levels = np.array([np.nan, np.inf, -np.inf, -0.0, 0.0, 6.0], np.float32)
    spots = rng.random(shape) < 0.3
    x[spots] = rng.choice(levels, int(spots.sum()))
    return x


@pytest.mark.parametrize("border", ["ignore", "constant"])
def test_relu_clamp_max_pool_compile_to_three_kernels_of_the_same_bits(border, tmp_path):
    """relu and clamp fuse into one kernel (they were 3 unfused select kernels), max_pool is
    one max_window kernel on its own schedule row (it was argmax_pool + sample), min one
    kernel; the outputs keep the bits of the stdlib's expansion run by the reference
    interpreter (the document as written: comparisons, selects, argmax_pool, sample)."""
    import cvmc_runtime

    from cvmc.codegen import compile_model
    from cvmc.frontend.nnef import parse_nnef
    from cvmc.reference import reference_run

    graph = parse_nnef(_FLOAT_DOC.format(border=border))
    assert {"select", "argmax_pool", "sample"} <= {n.op for n in graph.nodes}
    plan = compile_model(graph, tmp_path / "m.cvmx").plan
    assert [(k["ops"], k["schedule"]) for k in plan["kernels"]] == [
        (["nnef.select_max", "nnef.select_clamp"], "cpu-default"),
        (["nnef.max_window"], "cpu-max-window"),
        (["nnef.select_min"], "cpu-default")]
    x = _specials((1, 3, 9, 12), 5)
    want = reference_run(graph, {"x": x})
    got = cvmc_runtime.load(tmp_path / "m.cvmx").run({"x": x})
    for name in ("y", "z"):
        same = want[name].view(np.int32) == got[name].view(np.int32)
        assert (same | (np.isnan(want[name]) & np.isnan(got[name]))).all(), name


def test_rewrite_keeps_values_used_elsewhere():
    """A comparison read twice, a max_pool index that is an output and a select of
    different constants (0 and -0) stay as they are."""
    from cvmc.frontend.nnef import parse_nnef
    from cvmc.passes.simplify import simplify_float

    g = retype(parse_nnef("""version 1.0;
graph G( x ) -> ( a, b, m, k, c )
{
    x = external(shape = [1, 1, 4, 4]);
    t = gt(x, 1.0);
    a = select(t, x, 1.0);
    b = select(t, 2.0, x);
    m, k = max_pool_with_index(x, size = [1, 1, 2, 2]);
    v = gt(x, 0.0);
    c = select(v, x, -0.0);
}"""))
    assert [n.op for n in simplify_float(g).nodes] == [n.op for n in g.nodes]


def test_max_window_reference_is_the_fragment_and_a_plain_max_elsewhere():
    """max_window's reference (argmax_pool then sample) against NumPy's max over the
    window on data without NaN or zeros (where every reading of max agrees), with the
    'ignore' border as -inf and the 'constant' border as 0."""
    from cvmc.ops import lookup

    x = np.random.default_rng(3).uniform(-5, -1, (2, 3, 6, 7))  # negative: the 0 border wins
    attrs = {"size": [1, 1, 3, 2], "stride": [1, 1, 2, 1],
             "padding": [(0, 0), (0, 0), (1, 1), (0, 1)], "dilation": []}
    op = lookup("nnef.max_window")
    for border, fill in (("ignore", -np.inf), ("constant", 0.0)):
        a = op.normalize_attrs({**attrs, "border": border})
        padded = np.pad(x, [(0, 0), (0, 0), (1, 1), (0, 1)], constant_values=fill)
        want = np.full((2, 3, 3, 7), -np.inf)
        for i in range(3):
            for j in range(3):
                for k in range(2):
                    want[:, :, i] = np.maximum(want[:, :, i], padded[:, :, 2 * i + j, k:k + 7])
        assert np.array_equal(op.run_reference([x], a)[0], want), border


def test_relu6_is_an_epilogue_of_a_float_conv(tmp_path):
    """relu then clamp (relu6) after an out-elementwise float conv join its kernel; on
    integer-valued data the conv is exact, so the result equals the reference bit for bit."""
    import cvmc_runtime

    from cvmc.codegen import compile_model
    from cvmc.frontend.nnef import parse_nnef
    from cvmc.reference import reference_run

    graph = parse_nnef("""version 1.0;
graph G( x, w ) -> ( y )
{
    x = external(shape = [1, 4, 6, 6]);
    w = external(shape = [4, 4, 3, 3]);
    c = cinn.conv(x, w, paddings = [1, 1]);
    r = relu(c);
    y = clamp(r, 0.0, 6.0);
}""")
    plan = compile_model(graph, tmp_path / "m.cvmx").plan
    assert [k["ops"] for k in plan["kernels"]] == [
        ["cinn.conv", "nnef.select_max", "nnef.select_clamp"]]
    rng = np.random.default_rng(7)
    feeds = {"x": rng.integers(-2, 3, (1, 4, 6, 6)).astype(np.float32),
             "w": rng.integers(-1, 2, (4, 4, 3, 3)).astype(np.float32)}
    want = reference_run(graph, feeds)["y"]
    got = cvmc_runtime.load(tmp_path / "m.cvmx").run(feeds)["y"]
    assert np.array_equal(want.view(np.int32), got.view(np.int32))
    assert 0 < np.count_nonzero(want) < want.size and want.max() == 6.0  # both ends clip

"""Float activations blocked NCHW{B}c (`block_float_activations`, cvmc/passes/layout_float.py):
the blocked ops against the reference interpreter on random data (padding channels, stride
2, 5x5, blocks of 8 and 16), the pass's rewrite (which ops, how many layout transforms, the
graph's edges), the rewritten graphs' values and the same bits at 1 and 2 threads."""
from __future__ import annotations

import numpy as np
import pytest

import cvmc
from cvmc.codegen import compile_model
from cvmc.frontend.nnef import parse_nnef
from cvmc.passes.fusion import kernel_groups
from cvmc.passes.target import Target
from tests.nnefutil import (
    random_inputs,
    run_both,
    same_digests_at_1_and_2_threads,
    with_random_weights,
)
from tests.oputil import compile_passes, sum_bound

ZNVER3 = Target.make("llvm", "znver3")


def _blocked(x: np.ndarray, block: int, fill: float = 0.0) -> np.ndarray:
    """NCHW -> NCHW{block}c by hand, padding channels set to `fill`."""
    n, c, h, w = x.shape
    padded = np.full((n, -(-c // block) * block, h, w), fill, np.float32)
    padded[:, :c] = x
    return padded.reshape(n, -1, block, h, w).transpose(0, 1, 3, 4, 2).copy()


def _plain(y: np.ndarray, channels: int) -> np.ndarray:
    """NCHW{B}c -> NCHW, the first `channels` channels."""
    n, cb, h, w, block = y.shape
    return y.transpose(0, 1, 4, 2, 3).reshape(n, cb * block, h, w)[:, :channels]


def _packed(w: np.ndarray, block: int) -> np.ndarray:
    """OIHW -> OIHW{block}o by hand, padding output channels zero."""
    o = w.shape[0]
    w = np.pad(w, ((0, -o % block), (0, 0), (0, 0), (0, 0)))
    return w.reshape(-1, block, *w.shape[1:]).transpose(0, 2, 3, 4, 1).copy()


def _compile_one(op: str, x: np.ndarray, w: np.ndarray, bias: np.ndarray, attrs: dict):
    """(reference, compiled) output of one `op` node on input x, constant filter and bias;
    and the same for |x|, |w|, |bias| by the reference (the terms' magnitudes)."""
    def graph(xv, wv, bv):
        b = cvmc.GraphBuilder("g")
        xi = b.input("x", list(xv.shape), "float32")
        y = getattr(b, op)(xi, b.constant(wv, name="w"), b.constant(bv, name="b"), **attrs)
        return b.build([y])
    g = graph(x, w, bias)
    want, got = run_both(g, {"x": x})
    magnitude = cvmc.reference_run(graph(np.nan_to_num(np.abs(x)), np.abs(w), np.abs(bias)),
                                   {"x": np.nan_to_num(np.abs(x))})
    key = g.outputs[0]
    return want[key], got[key], magnitude[key]


def _integers(rng, shape) -> np.ndarray:
    return rng.integers(-3, 4, shape).astype(np.float32)


# (C, OC, K, stride, data blocked, result blocked, block)
CONV_CASES = [
    (12, 16, 3, 1, True, True, 8),    # 12 channels: a half-padded input block
    (12, 12, 5, 2, True, False, 8),   # 5x5 stride 2, 12 output channels written NCHW
    (3, 16, 3, 2, False, True, 8),    # a stem: NCHW data, blocked result
    (20, 32, 3, 1, True, True, 16),   # AVX-512's blocks (any CPU runs them)
    (16, 4, 1, 1, True, False, 8),    # squeeze-excite: 1x1 to 4 channels on 1x1 maps
]


@pytest.mark.parametrize("c, oc, k, stride, data, out, block", CONV_CASES)
def test_conv_packed_blocked_against_the_reference(c, oc, k, stride, data, out, block):
    """Within conv's bound (K = C * KH * KW + 1) of the reference, whose values are conv's
    on NCHW data; NaN in the data's padding channels reaches no result (the reduction reads
    the real channels only); exact on integer-valued data."""
    rng = np.random.default_rng(c * oc + k)
    size = 1 if k == 1 and oc == 4 else 9
    x = rng.standard_normal((1, c, size, size + 2)).astype(np.float32)
    w = rng.standard_normal((oc, c, k, k)).astype(np.float32)
    bias = rng.standard_normal((1, oc)).astype(np.float32)
    attrs = {"channels": oc, "padding": [(k // 2, k // 2)] * 2, "stride": [stride] * 2,
             "data_layout": f"NCHW{block}c" if data else "NCHW",
             "out_layout": f"NCHW{block}c" if out else "NCHW"}
    xin = _blocked(x, block, fill=np.nan) if data else x
    want, got, magnitude = _compile_one("conv_packed_blocked", xin, _packed(w, block), bias,
                                        attrs)
    if out:
        assert got.shape == (1, oc // block, *got.shape[2:4], block)
    assert not np.isnan(got).any() and not np.isnan(want).any()
    bound = sum_bound(magnitude.astype(np.float64), c * k * k + 1)
    assert np.all(np.abs(got.astype(np.float64) - want) <= bound)
    x, w, bias = _integers(rng, x.shape), _integers(rng, w.shape), _integers(rng, bias.shape)
    xin = _blocked(x, block, fill=np.nan) if data else x
    want, got, _ = _compile_one("conv_packed_blocked", xin, _packed(w, block), bias, attrs)
    assert np.array_equal(want, got)


# (C, K, stride, block)
DEPTHWISE_CASES = [(12, 3, 1, 8), (12, 3, 2, 8), (24, 5, 1, 8), (24, 5, 2, 8),
                   (20, 3, 2, 16)]


@pytest.mark.parametrize("c, k, stride, block", DEPTHWISE_CASES)
def test_depthwise_conv_blocked_against_the_reference(c, k, stride, block):
    """Each channel within conv's bound (K = KH * KW + 1) of the reference (NNEF's
    depth-wise conv on NCHW data); padding channels (NaN data) stay in their lanes; exact on
    integer-valued data."""
    rng = np.random.default_rng(100 + c * k + stride)
    x = rng.standard_normal((1, c, 11, 13)).astype(np.float32)
    w = rng.standard_normal((c, 1, k, k)).astype(np.float32)
    bias = rng.standard_normal((1, -(-c // block) * block)).astype(np.float32)
    attrs = {"padding": [(k // 2, k // 2)] * 2, "stride": [stride] * 2}
    want, got, magnitude = _compile_one("depthwise_conv_blocked", _blocked(x, block, np.nan),
                                        _packed(w, block), bias, attrs)
    want, got, magnitude = (_plain(v, c) for v in (want, got, magnitude))
    assert not np.isnan(got).any()
    bound = sum_bound(magnitude.astype(np.float64), k * k + 1)
    assert np.all(np.abs(got.astype(np.float64) - want) <= bound)
    x, w = _integers(rng, x.shape), _integers(rng, w.shape)
    want, got, _ = _compile_one("depthwise_conv_blocked", _blocked(x, block, np.nan),
                                _packed(w, block), bias.round(), attrs)
    assert np.array_equal(_plain(want, c), _plain(got, c))


# A MobileNet-v2 block and an EfficientNet squeeze-excite: 1x1 expand + relu6, depth-wise
# 3x3 stride 1 + relu6, 1x1 project + residual add; global sum, 1x1 to 4 channels, SiLU,
# 1x1 back, sigmoid, scale; a max pool and an average pool; the last conv's result a graph
# output. `x` is passed straight out too.
DOCUMENT = """version 1.0;
graph G( x ) -> ( y, x, p, q )
{
    x = external<scalar>(shape = [1, 8, 10, 12]);
    w0 = variable<scalar>(shape = [16, 8, 3, 3], label = "w0");
    b0 = variable<scalar>(shape = [1, 16], label = "b0");
    we = variable<scalar>(shape = [32, 16, 1, 1], label = "we");
    wd = variable<scalar>(shape = [32, 1, 3, 3], label = "wd");
    bd = variable<scalar>(shape = [1, 32], label = "bd");
    wp = variable<scalar>(shape = [16, 32, 1, 1], label = "wp");
    ws = variable<scalar>(shape = [4, 16, 1, 1], label = "ws");
    wx = variable<scalar>(shape = [16, 4, 1, 1], label = "wx");
    wq = variable<scalar>(shape = [8, 16, 1, 1], label = "wq");
    s = variable<scalar>(shape = [1, 16], label = "s");
    c0 = conv(x, w0, b0, padding = [(1, 1), (1, 1)]);
    h0 = relu(c0);
    ce = conv(h0, we, 0.0);
    e = clamp(ce, 0.0, 6.0);
    cd = conv(e, wd, bd, groups = 0, padding = [(1, 1), (1, 1)]);
    d = clamp(cd, 0.0, 6.0);
    cp = conv(d, wp, 0.0);
    r = add(cp, h0);
    m = sum_reduce(r, axes = [2, 3]);
    t = conv(m, ws, 0.0);
    st = sigmoid(t);
    u = mul(t, st);
    cx = conv(u, wx, 0.0);
    v = sigmoid(cx);
    g = mul(r, v);
    k = mul(g, s);
    p = max_pool(k, size = [1, 1, 3, 3], padding = [(0, 0), (0, 0), (1, 1), (1, 1)],
                 stride = [1, 1, 2, 2], border = 'ignore');
    q = avg_pool(k, size = [1, 1, 2, 2], stride = [1, 1, 2, 2], border = 'constant');
    y = conv(p, wq, 0.0);
}
"""


def _graph():
    return with_random_weights(parse_nnef(DOCUMENT, "g.nnef"))


def test_the_pass_keeps_the_chain_blocked():
    """Convs read or write NCHW8c, the depth-wise one is depthwise_conv_blocked, the pools,
    the sum and the scale run blocked; transforms: none for x (the stem conv reads NCHW),
    one back for each of the graph's outputs p and q, one in for the excitation (its convs
    on 1x1 maps write NCHW; the squeeze's 4 channels are not whole blocks anyway)."""
    g = compile_passes(_graph(), target=ZNVER3)
    ops = [n.op for n in g.nodes]
    assert "conv" not in ops and ops.count("conv_packed") == 1  # cx: NCHW in and out
    assert ops.count("conv_packed_blocked") == 5 and ops.count("depthwise_conv_blocked") == 1
    transforms = {(n.inputs[0], n.attrs["dst_layout"]) for n in g.nodes
                  if n.op == "float_layout_transform"}
    assert transforms == {("p_nchw8c", "NCHW"), ("q_nchw8c", "NCHW"), ("v", "NCHW8c")}
    layouts = {n.outputs[0]: (n.attrs["data_layout"], n.attrs["out_layout"])
               for n in g.nodes if n.op == "conv_packed_blocked"}
    assert layouts["c0"] == ("NCHW", "NCHW8c") and layouts["t"] == ("NCHW8c", "NCHW")
    assert "cx" not in layouts  # squeeze-excite's 1x1 maps stay NCHW
    assert layouts["y"] == ("NCHW8c", "NCHW")  # a graph output: written NCHW directly
    assert list(g.outputs) == ["y", "x", "p", "q"] and g.types["p"].shape == (1, 16, 5, 6)
    # the epilogues stay in their conv's kernel
    groups = [grp.ops for grp in kernel_groups(g)]
    assert ["depthwise_conv_blocked", "nnef.select_clamp"] in groups
    assert ["conv_packed_blocked", "add"] in groups


def test_kxk_convs_read_nchw():
    """A 3x3 conv reads NCHW data (blocked, its tile was no faster: DenseNet-121 0.9x), so
    a chain of them stays NCHW throughout: no blocked op, no transform."""
    doc = """version 1.0;
graph G( x ) -> ( y )
{
    x = external<scalar>(shape = [1, 8, 6, 6]);
    w = variable<scalar>(shape = [8, 8, 3, 3], label = "w");
    c1 = conv(x, w, 0.0, padding = [(1, 1), (1, 1)]);
    h1 = relu(c1);
    y = conv(h1, w, 0.0, padding = [(1, 1), (1, 1)]);
}
"""
    after = compile_passes(with_random_weights(parse_nnef(doc, "g.nnef")), target=ZNVER3)
    assert [n.op for n in after.nodes if "conv" in n.op] == ["conv_packed", "conv_packed"]
    assert not [n for n in after.nodes if "layout_transform" in n.op]


def test_avx512_blocks_of_16():
    g = compile_passes(_graph(), target=Target.make("llvm", "skylake-avx512"))
    shapes = [g.types[n.outputs[0]].shape for n in g.nodes if n.op == "depthwise_conv_blocked"]
    assert shapes == [(1, 2, 10, 12, 16)]


def test_a_plain_chain_needs_no_transform():
    """conv 3x3 -> relu -> conv 1x1 -> relu -> conv 1x1: the two inner activations blocked,
    the last conv writes the NCHW output: no layout transform at all; compiled, exact on
    integer-valued data."""
    doc = """version 1.0;
graph G( x ) -> ( y )
{
    x = external<scalar>(shape = [1, 8, 6, 6]);
    w = variable<scalar>(shape = [8, 8, 3, 3], label = "w");
    v = variable<scalar>(shape = [8, 8, 1, 1], label = "v");
    c1 = conv(x, w, 0.0, padding = [(1, 1), (1, 1)]);
    h1 = relu(c1);
    c2 = conv(h1, v, 0.0);
    h2 = relu(c2);
    y = conv(h2, v, 0.0);
}
"""
    g = with_random_weights(parse_nnef(doc, "g.nnef"))
    after = compile_passes(g, target=ZNVER3)
    layouts = [(n.attrs["data_layout"], n.attrs["out_layout"])
               for n in after.nodes if n.op == "conv_packed_blocked"]
    assert layouts == [("NCHW", "NCHW8c"), ("NCHW8c", "NCHW8c"), ("NCHW8c", "NCHW")]
    assert not [n for n in after.nodes if "layout_transform" in n.op]
    # small integers: every float32 sum of products is exact, so are the kernels'
    rng = np.random.default_rng(7)
    g = g.replace(constants={**g.constants,
                             "w": rng.integers(-2, 3, (8, 8, 3, 3)).astype(np.float32),
                             "v": rng.integers(-2, 3, (8, 8, 1, 1)).astype(np.float32)})
    feeds = {"x": rng.integers(-3, 4, (1, 8, 6, 6)).astype(np.float32)}
    want, got = run_both(g, feeds)
    assert np.array_equal(want["y"], got["y"])


def test_rewritten_graph_has_the_reference_values():
    """The reference interpreter gives the rewritten graph the values of the graph as
    written exactly (the blocked ops' references are the NCHW ops' on the unblocked data)."""
    g = _graph()
    feeds = random_inputs(g)
    want = cvmc.reference_run(g, feeds)
    got = cvmc.reference_run(compile_passes(g, target=ZNVER3), feeds)
    for key in want:
        assert np.array_equal(want[key], got[key]), key


def test_compiled_close_to_the_reference():
    """Compiled vs reference on random data: close (each op's bound is tested above; the
    sigmoids here are not sums), the input passed straight out unchanged."""
    g = _graph()
    feeds = random_inputs(g)
    want, got = run_both(g, feeds)
    assert np.array_equal(got["x"], feeds["x"])
    for key in want:
        assert not np.isnan(want[key]).any(), key
        assert np.allclose(want[key], got[key], rtol=1e-4, atol=1e-5), key


def test_kernels_get_their_rules(tmp_path):
    plan = compile_model(_graph(), tmp_path / "m.cvmx", "llvm", "znver3").plan
    rules = {(k["ops"][0], k["schedule"]) for k in plan["kernels"]}
    assert ("conv_packed_blocked", "x86-avx2-float-conv-blocked") in rules
    assert ("depthwise_conv_blocked", "cpu-float-depthwise-blocked") in rules
    assert ("float_layout_transform", "cpu-float-layout-transform") in rules
    assert not [r for r in rules if r[1] == "cpu-scalar"]


def test_same_bits_at_1_and_2_threads(tmp_path):
    assert same_digests_at_1_and_2_threads(_graph(), tmp_path)


def test_blocked_pools_exact(tmp_path):
    """A stem (conv, relu, 3x3 stride-2 max pool with 'ignore' padding) and a 2x2 average
    pool, blocked: on integer-valued data every value is exact, so compiled equals the
    reference; the max pool takes its own row on the blocked layout."""
    doc = """version 1.0;
graph G( x ) -> ( p, q )
{
    x = external<scalar>(shape = [1, 3, 13, 14]);
    w = variable<scalar>(shape = [16, 3, 3, 3], label = "w");
    v = variable<scalar>(shape = [8, 16, 1, 1], label = "v");
    c = conv(x, w, 0.0, padding = [(1, 1), (1, 1)]);
    h = relu(c);
    m = max_pool(h, size = [1, 1, 3, 3], padding = [(0, 0), (0, 0), (1, 1), (1, 1)],
                 stride = [1, 1, 2, 2], border = 'ignore');
    a = avg_pool(m, size = [1, 1, 2, 2], stride = [1, 1, 2, 2], border = 'constant');
    p = conv(m, v, 0.0);
    q = conv(a, v, 0.0);
}
"""
    rng = np.random.default_rng(11)
    g = parse_nnef(doc, "g.nnef")
    g = g.replace(constants={**g.constants,
                             "w": rng.integers(-2, 3, (16, 3, 3, 3)).astype(np.float32),
                             "v": rng.integers(-2, 3, (8, 16, 1, 1)).astype(np.float32)})
    after = compile_passes(g, target=ZNVER3)
    pools = [n for n in after.nodes if n.op in ("nnef.max_window", "box")]
    assert [len(after.types[n.outputs[0]].shape) for n in pools] == [5, 5]
    assert not [n for n in after.nodes if n.op == "float_layout_transform"]
    feeds = {"x": rng.integers(-3, 4, (1, 3, 13, 14)).astype(np.float32)}
    want, got = run_both(g, feeds)
    for key in want:
        assert np.array_equal(want[key], got[key]), key
    plan = compile_model(g, tmp_path / "m.cvmx", "llvm", "znver3").plan
    assert [k["schedule"] for k in plan["kernels"] if k["ops"][0] == "nnef.max_window"] == \
        ["cpu-max-window"]

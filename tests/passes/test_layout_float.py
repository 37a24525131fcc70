"""The float layout pass (`cvmc/passes/layout_float.py`): which convs it packs, that the
packed graph computes what the plain one does (reference interpreter and compiled kernels,
bounded, bit-exact on integer-valued data, the same bits at 1 and 2 threads), and that the
conv's epilogue (bias, relu, clip, residual add) runs in its kernel."""
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

# A ResNet-style block: conv + bias + relu, conv + residual add + relu, min/max clip; a
# depth-wise conv (multiplier 1: left to its own rule), a 'reflect' conv (left as it is)
# and a 3-D conv (left as it is).
DOCUMENT = """version 1.0;
graph G( x, v ) -> ( y, d, r, z )
{
    x = external<scalar>(shape = [1, 8, 10, 12]);
    v = external<scalar>(shape = [1, 2, 4, 5, 6]);
    w1 = variable<scalar>(shape = [12, 8, 3, 3], label = "w1");
    b1 = variable<scalar>(shape = [1, 12], label = "b1");
    w2 = variable<scalar>(shape = [8, 12, 3, 3], label = "w2");
    wd = variable<scalar>(shape = [8, 1, 3, 3], label = "wd");
    wr = variable<scalar>(shape = [4, 8, 1, 1], label = "wr");
    w3 = variable<scalar>(shape = [3, 2, 2, 2, 2], label = "w3");
    c1 = conv(x, w1, b1, padding = [(1, 1), (1, 1)]);
    h = relu(c1);
    c2 = conv(h, w2, 0.0, padding = [(1, 1), (1, 1)]);
    s = add(c2, x);
    y = relu(s);
    cd = conv(x, wd, 0.0, groups = 0, padding = [(1, 1), (1, 1)]);
    d = clamp(cd, 0.0, 6.0);
    r = conv(x, wr, 0.0, border = 'reflect');
    z = conv(v, w3, 0.0);
}
"""


def _graph(integer_valued: bool = False):
    g = with_random_weights(parse_nnef(DOCUMENT, "g.nnef"))
    if integer_valued:  # small integers: every float32 sum of products is exact
        rng = np.random.default_rng(3)
        g = g.replace(constants={k: rng.integers(-3, 4, v.shape).astype(np.float32)
                                 for k, v in g.constants.items()})
    return g


def _ops(graph) -> list[str]:
    return [n.op for n in graph.nodes]


@pytest.mark.parametrize("mcpu, block", [("znver3", 8), ("skylake-avx512", 16)])
def test_packs_plain_2d_convs_only(mcpu, block):
    """Two convs become conv_packed on a filter packed OIHW{8|16}o (16 with AVX-512); the
    depth-wise, 'reflect' and 3-D convs stay conv."""
    g = compile_passes(_graph(), target=Target.make("llvm", mcpu))
    packed = [n for n in g.nodes if n.op == "conv_packed"]
    assert len(packed) == 2 and _ops(g).count("conv") == 3
    assert [g.types[n.inputs[1]].shape for n in packed] == \
        [(-(-12 // block), 8, 3, 3, block), (1, 12, 3, 3, block)]
    assert all(n.inputs[1] in g.constants for n in packed)  # packed at compile time


def test_cuda_keeps_conv():
    g = compile_passes(_graph(), target=Target.make("cuda"))
    assert "conv_packed" not in _ops(g)


def test_packed_graph_has_the_reference_values():
    """The reference interpreter gives the packed graph the plain graph's values exactly
    (conv_packed's reference is conv's on the unpacked filter)."""
    g = _graph()
    feeds = random_inputs(g)
    want = cvmc.reference_run(g, feeds)
    got = cvmc.reference_run(compile_passes(g, target=Target.make("llvm", "znver3")), feeds)
    for key in want:
        assert np.array_equal(want[key], got[key]), key


def test_epilogues_run_in_the_conv_kernel():
    """bias + relu (select(x > 0, x, 0), one select_max after the simplify pass), residual
    add + relu, and a clamp (one select_clamp): each in its conv's kernel."""
    g = compile_passes(_graph(), target=Target.make("llvm", "znver3"))
    groups = [grp.ops for grp in kernel_groups(g) if grp.ops[0] == "conv_packed"]
    assert groups == [["conv_packed", "nnef.select_max"],
                      ["conv_packed", "add", "nnef.select_max"]], groups
    # the depth-wise conv (not packed) takes its clamp: max(min(x, 6), 0)
    assert ["conv", "nnef.select_clamp"] in [grp.ops for grp in kernel_groups(g)]


def test_compiled_within_bound_and_exact_on_integers():
    """Compiled vs reference: within conv's sum bound (K = C * 9 + 1 terms per conv, carried
    through the second conv as an input error times its filter's magnitude), and equal on
    integer-valued data."""
    g = _graph()
    feeds = random_inputs(g)
    want, got = run_both(g, feeds)
    # loose but independent: both convs' terms, as if every term were the largest
    bound = sum_bound(np.abs(want["y"]).max() + 50.0 * np.ones_like(want["y"]), 12 * 9 + 1)
    assert np.all(np.abs(got["y"].astype(np.float64) - want["y"]) <= 20 * bound)
    gi = _graph(integer_valued=True)
    feeds = {k: np.round(v) for k, v in random_inputs(gi).items()}
    want, got = run_both(gi, feeds)
    for key in want:
        assert np.array_equal(want[key], got[key]), key


@pytest.mark.parametrize("mcpu, rule", [("znver3", "x86-avx2-float-conv"),
                                        ("x86-64", "cpu-float-conv")])
def test_kernels_get_their_rules(tmp_path, mcpu, rule):
    """Packed convs take the float conv row for the CPU, the depth-wise conv (7 columns at
    stride 1 on the 7x7 plane below, 10x12 above) its row: nothing falls back to the
    scalar rebuild."""
    doc = DOCUMENT.replace("[1, 8, 10, 12]", "[1, 8, 7, 7]")
    plan = compile_model(with_random_weights(parse_nnef(doc, "g.nnef")), tmp_path / "m.cvmx",
                         "llvm", mcpu).plan
    rules = [(k["ops"][0], k["schedule"]) for k in plan["kernels"]]
    assert [r for r in rules if r[0] == "conv_packed"] == [("conv_packed", rule)] * 2
    assert ("conv", "cpu-float-depthwise") in rules


def test_same_bits_at_1_and_2_threads(tmp_path):
    assert same_digests_at_1_and_2_threads(_graph(), tmp_path)

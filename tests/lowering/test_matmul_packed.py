"""Float matmul on a constant B packed at compile time into column panels (matmul_packed,
cvmc/passes/matmul_weights.py) and its K-blocked register tile (cvmc/lowering/x86_matmul.py):
within matmul's bound of the reference, the same bits at 1 and 2 threads and as the unblocked
tile's sums, the weight packed in the graph (no transpose or packing kernel at run time)."""
from __future__ import annotations

import numpy as np
import pytest

import cvmc
from cvmc.passes.target import Target
from tests.nnefutil import compile_and_run
from tests.oputil import compile_passes, sum_bound

# (A shape, B shape as written, transposeB, epilogue): K > 256 is K-blocked where there are
# 8 panels or more (`_MIN_PANELS`)
CASES = {
    # ViT-B/16's 197 rows (prime: a masked last row tile); K = 263 (prime: a partial last K
    # block of 256); 136 columns: 9 panels of 16, the last one half padding
    "prime-rows-odd-k": ((197, 263), (263, 136), False, "bias-relu"),
    # batched weights, 2 x 5 panels, K = 520 in 4 blocks of 130
    "batched-k-blocked": ((2, 31, 520), (2, 520, 72), False, "residual"),
    # B's batch broadcast over A's, 3 panels: not K-blocked, row blocks in parallel
    "broadcast-batch": ((3, 17, 40), (1, 40, 40), False, None),
    # a linear layer's transposed weight (150 outputs: 10 panels, the last 6 wide), K = 300
    "transposed-weight": ((29, 300), (150, 300), True, "bias-relu"),
}


def _graph(name: str):
    sa, sb, tb, epilogue = CASES[name]
    rng = np.random.default_rng(11)
    b = cvmc.GraphBuilder(name.replace("-", "_"))
    a = b.input("a", list(sa), "float32")
    w = b.constant(rng.standard_normal(sb).astype(np.float32), name="w")
    y = b.matmul(a, w, transposeB=tb)
    n = sb[-2] if tb else sb[-1]
    out = (*sa[:-1], n)
    if epilogue == "bias-relu":
        bias = b.constant(rng.standard_normal((1,) * (len(sa) - 1) + (n,)).astype(np.float32),
                          name="bias")
        y = b.relu(b.add(y, bias))
    elif epilogue == "residual":
        y = b.add(y, b.input("r", list(out), "float32"))
    return b.build(outputs=[y])



def _feeds(graph) -> dict:
    rng = np.random.default_rng(5)
    return {i: rng.standard_normal(graph.types[i].shape).astype(np.float32)
            for i in graph.inputs}


@pytest.mark.parametrize("mcpu,rule", [("znver3", "x86-avx2-matmul-packed"),
                                       ("x86-64", "cpu-matmul-packed")])
@pytest.mark.parametrize("name", CASES)
def test_packed_matmul_within_bound_and_thread_count_free(name, mcpu, rule):
    graph = _graph(name)
    feeds = _feeds(graph)
    want = next(iter(cvmc.reference_run(graph, feeds).values()))
    one, result = compile_and_run(graph, mcpu, feeds, 1)
    two, _ = compile_and_run(graph, mcpu, feeds, 2)
    assert np.array_equal(one, two), "1 and 2 threads differ"
    sa, _, tb, epilogue = CASES[name]
    w = np.abs(graph.constants["w"])
    magnitude = np.matmul(np.abs(feeds["a"]), np.swapaxes(w, -1, -2) if tb else w)
    if epilogue:  # the bias or residual: one more term
        magnitude = magnitude + np.abs(graph.constants["bias"] if "bias" in graph.constants
                                       else feeds["r"])
    assert np.all(np.abs(one - want) <= sum_bound(magnitude, sa[-1] + bool(epilogue)))
    # one kernel: the matmul with its epilogue, on the packed row
    assert [k["schedule"] for k in result.plan["kernels"]] == [rule]


def test_k_blocked_sums_are_the_unblocked_tiles_bits():
    """Each element's K-blocked sum runs k = 0, 1, ... carried over from block to block:
    the same bits as the unpacked tile's one K loop (B an input: not packed)."""
    rng = np.random.default_rng(9)
    a = rng.standard_normal((197, 520)).astype(np.float32)
    w = rng.standard_normal((520, 144)).astype(np.float32)
    results = {}
    for packed in (True, False):
        b = cvmc.GraphBuilder("mm")
        x = b.input("a", [197, 520], "float32")
        wv = b.constant(w, name="w") if packed else b.input("w", [520, 144], "float32")
        graph = b.build(outputs=[b.matmul(x, wv)])
        feeds = {"a": a} if packed else {"a": a, "w": w}
        results[packed], result = compile_and_run(graph, "znver3", feeds, 2)
        assert [k["schedule"] for k in result.plan["kernels"]] == \
            ["x86-avx2-matmul-packed" if packed else "x86-avx2-matmul"]
    assert np.array_equal(results[True], results[False])


@pytest.mark.parametrize("mcpu,cols", [("znver3", 16), ("skylake-avx512", 32)])
def test_weight_packed_at_compile_time(mcpu, cols):
    """The graph after the passes holds B packed (P, K, cols), built here with NumPy from
    the transposed weight, and no transpose, pad or reshape: nothing repacks at run time;
    the passes run again change nothing."""
    graph = _graph("transposed-weight")
    w = graph.constants["w"]  # (150, 300): N x K
    target = Target.make("llvm", mcpu)
    graph = compile_passes(graph, target=target)
    assert [n.op for n in graph.nodes] == ["matmul_packed", "cinn.add", "nnef.select_max"]
    again = compile_passes(graph, target=target)
    assert again.nodes == graph.nodes and again.constants.keys() == graph.constants.keys()
    packed = graph.constants[graph.nodes[0].inputs[1]]
    panels = -(-150 // cols)
    want = np.zeros((300, panels * cols), np.float32)
    want[:, :150] = w.T
    assert np.array_equal(packed, want.reshape(300, panels, cols).transpose(1, 0, 2))

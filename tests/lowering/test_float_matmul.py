"""Float matmul kernels: constant transposed weights are transposed back at compile time,
the register-tiled rows of the schedule table take matmul (batched, transposeA, a fused bias
and relu epilogue), and the results stay within matmul's bound of the reference, with the
same bits at 1 and 2 threads."""
from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import pytest

import cvmc
from cvmc.passes.target import Target
from tests.nnefutil import compile_and_run
from tests.oputil import compile_passes, sum_bound

# (A shape, B shape, transposeA, transposeB, B constant, epilogue)
CASES = {
    "linear-bias-relu": ((12, 40), (32, 40), False, True, True, True),
    "linear-odd-rows": ((5, 24), (48, 24), False, True, True, True),
    # 13 rows: no divisor fills the 6-row tile, so two full tiles and a masked last one
    "prime-rows": ((13, 24), (24, 32), False, False, True, True),
    "batched-activations": ((2, 4, 9, 16), (2, 4, 16, 24), False, False, False, False),
    "broadcast-batch-transposeA": ((3, 10, 6), (1, 10, 16), True, False, True, True),
    "columns-not-whole-vectors": ((7, 8), (8, 5), False, False, True, True),
    "transposeB-activations": ((6, 8), (16, 8), False, True, False, False),
}


def _graph(name: str):
    sa, sb, ta, tb, const_b, epilogue = CASES[name]
    rng = np.random.default_rng(7)
    b = cvmc.GraphBuilder(name.replace("-", "_"))
    a = b.input("a", list(sa), "float32")
    w = b.constant(rng.standard_normal(sb).astype(np.float32), name="w") if const_b \
        else b.input("w", list(sb), "float32")
    y = b.matmul(a, w, transposeA=ta, transposeB=tb)
    if epilogue:
        n = sb[-2] if tb else sb[-1]
        bias = b.constant(rng.standard_normal((1, n)).astype(np.float32), name="bias")
        y = b.relu(b.add(y, bias))
    return b.build(outputs=[y])



@pytest.mark.parametrize("mcpu,rule", [("znver3", "x86-avx2-matmul"),
                                       ("x86-64", "cpu-matmul")])
@pytest.mark.parametrize("name", CASES)
def test_matmul_within_bound_and_thread_count_free(name, mcpu, rule):
    """A constant B (A not transposed) is packed: the packed row
    (tests/lowering/test_matmul_packed.py); any other takes the row of `rule` where it fits."""
    graph = _graph(name)
    rng = np.random.default_rng(3)
    feeds = {i: rng.standard_normal(graph.types[i].shape).astype(np.float32)
             for i in graph.inputs}
    want = next(iter(cvmc.reference_run(graph, feeds).values()))
    one, result = compile_and_run(graph, mcpu, feeds, 1)
    two, _ = compile_and_run(graph, mcpu, feeds, 2)
    assert np.array_equal(one, two), "1 and 2 threads differ"
    sa, sb, ta, tb, const_b, epilogue = CASES[name]
    # docs/float.md's bound: K products and (with the epilogue) the bias, summed
    a = np.abs(feeds["a"])
    w = np.abs(feeds["w"] if "w" in feeds else graph.constants["w"])
    magnitude = np.matmul(np.swapaxes(a, -1, -2) if ta else a, np.swapaxes(w, -1, -2) if tb else w)
    if epilogue:
        magnitude = magnitude + np.abs(graph.constants["bias"])
    terms = (sa[-2] if ta else sa[-1]) + epilogue
    assert np.all(np.abs(one - want) <= sum_bound(magnitude, terms))
    rules = {k["schedule"] for k in result.plan["kernels"]}
    packed = const_b and not ta
    # the tile needs whole vectors of output columns and B's rows along them
    fits = (sb[-2] if tb else sb[-1]) % 4 == 0 and (const_b or not tb)
    assert (f"{rule}-packed" in rules) == packed, rules
    assert (rule in rules) == (fits and not packed), rules


def test_constant_transposed_weight_is_transposed_at_compile_time():
    graph = _graph("linear-bias-relu")
    w = graph.constants["w"]
    graph = compile_passes(graph, target=Target.make("llvm", "znver3"))
    (mm,) = [n for n in graph.nodes if n.op.startswith("matmul")]
    # transposed back, then packed into 2 panels of 16 columns (matmul_packed)
    packed = graph.constants[mm.inputs[1]]
    assert mm.op == "matmul_packed" and packed.shape == (2, 40, 16)
    assert np.array_equal(packed[1], w.T[:, 16:])
    assert not any(n.op == "nnef.transpose" for n in graph.nodes)


def test_avx512_row_takes_matmul_on_an_avx512_cpu():
    """Built (not run: this machine may lack AVX-512) for an AVX-512 CPU: its row."""
    with tempfile.TemporaryDirectory(prefix="cvmc-mm-") as tmp:
        result = cvmc.compile(_graph("linear-bias-relu"), Path(tmp) / "m.cvmx", target="llvm",
                              mcpu="skylake-avx512")
    assert [k["schedule"] for k in result.plan["kernels"] if "matmul_packed" in k["ops"]] == \
        ["x86-avx512-matmul-packed"]

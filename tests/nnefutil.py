"""Helpers for whole NNEF documents: random weights and inputs by declared type, compile for
llvm and run beside the reference, and the accuracy bounds of compound fragments.

The bounds are the per-op bounds (docs/float.md "Float accuracy") carried through each fragment by
hand; u = 2^-24, a transcendental function's 4 ULP is at most 8 u relative, and
`tests.oputil.sum_bound(magnitude, n)` is gamma(n + 2) * magnitude for n roundings.
"""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import cvmc_runtime
import numpy as np

import cvmc
from cvmc.ir import Graph
from cvmc.ops import lookup
from cvmc.ops.nnef_math import np_broadcast
from cvmc.ops.registry import Attrs
from tests.oputil import U, sum_bound

SEED = 10
# roundings (u each) a libm result (tanh, pow: their entries' ulp) may be off by
TRANSCENDENTAL = 2 * max(lookup("tanh").ulp, lookup("pow").ulp)


def random_value(t, rng: np.random.Generator, weight: bool) -> np.ndarray:
    """Random data of a tensor type: float inputs normal; float weights in [0.5, 1.5) (so
    variances, scales and logarithms stay in their domains) divided by the volume of the
    trailing axes (a filter's fan-in: activations stay near 1 through deep networks);
    integers in [-20, 20] (indices inside and outside their range); logical values half
    true."""
    if t.dtype == "float32":
        if not weight:
            return rng.standard_normal(t.shape).astype(np.float32)
        return ((0.5 + rng.random(t.shape)) / np.prod(t.shape[1:])).astype(np.float32)
    if t.dtype == "bool":
        return rng.random(t.shape) < 0.5
    bound = min(20, (1 << ((t.precision or 32) - 1)) - 1)
    return rng.integers(-bound, bound + 1, t.shape)


def with_random_weights(graph: Graph, seed: int = SEED) -> Graph:
    """The graph with data for every variable that has none (as if its .dat files had been
    written from a fixed seed), and integer inputs without a declared precision declared
    precision 32 (any int32 value, as a `graph.quant` entry would declare)."""
    rng = np.random.default_rng(seed)
    constants = dict(graph.constants)
    for name in graph.labels:
        if name not in constants:
            constants[name] = random_value(graph.types[name], rng, weight=True)
    types = {n: t.with_precision(32) if n in graph.inputs and t.is_integer and
             t.precision is None else t for n, t in graph.types.items()}
    return graph.replace(constants=constants, types=types)


def random_inputs(graph: Graph, seed: int = SEED) -> dict[str, np.ndarray]:
    """Random values for every graph input, by its declared type."""
    rng = np.random.default_rng(seed + 1)
    return {n: random_value(graph.types[n], rng, weight=False) for n in graph.inputs}


def run_both(graph: Graph, feeds: dict[str, np.ndarray]
             ) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """(reference outputs, outputs of the graph compiled for llvm and run by the runtime)."""
    want = cvmc.reference_run(graph, feeds)
    with tempfile.TemporaryDirectory(prefix="cvmc-nnef-") as tmp:
        path = Path(tmp) / "model.cvmx"
        cvmc.compile(graph, path, target="llvm")
        got = cvmc_runtime.load(path).run(feeds)
    return want, got


def gamma(n: int) -> float:
    """n u / (1 - n u): the relative error of n roundings (Higham, lemma 3.1)."""
    return n * U / (1 - n * U)


def _volume(x: np.ndarray, axes) -> int:
    return int(np.prod([x.shape[a] for a in axes]))


def _sum_error(node, v, e):
    """sum_reduce: the terms' errors, gamma(K) of the computed terms' magnitudes (recursive
    summation), the normalization's and the reference's rounding."""
    (x,), (ex,) = v, e
    axes, k = tuple(node.attrs["axes"]), _volume(v[0], node.attrs["axes"])
    scale = k if node.attrs["normalize"] else 1
    total = (np.sum(ex, axis=axes, keepdims=True)
             + gamma(k) * np.sum(np.abs(x) + ex, axis=axes, keepdims=True)) / scale
    return total, 1 if node.attrs["normalize"] else 0


def _matmul_error(node, v, e):
    """matmul: the operands' errors through the products, gamma(K) of the computed
    products' magnitudes (each rounded, then summed), the reference's rounding."""
    op = lookup("matmul")
    (a, b), (ea, eb) = [np.abs(t) for t in v], e
    attrs = Attrs(node.attrs)
    k = a.shape[-2] if node.attrs["transposeA"] else a.shape[-1]
    products = [op.run_reference(p, attrs)[0] for p in ([a, eb], [ea, b], [ea, eb])]
    return sum(products) + gamma(k) * op.run_reference([a + ea, b + eb], attrs)[0], 0


def _moved_error(node, v, e):
    """Data movement moves the errors with the values."""
    return lookup(node.op).run_reference(e, Attrs(node.attrs))[0], 0


def _elementwise_error(node, v, e):
    """add, sub, mul, div, pow by a constant (NNEF broadcasting, first order) and tanh
    (1-Lipschitz), with the roundings of each (libm's 4 ULP for tanh and pow)."""
    x = [np.abs(t) for t in np_broadcast(v)]
    ex = np_broadcast(e)
    if node.op in ("add", "sub"):
        return ex[0] + ex[1], 1
    if node.op == "mul":
        return x[1] * ex[0] + x[0] * ex[1] + ex[0] * ex[1], 1
    if node.op == "div":
        return (ex[0] + x[0] / x[1] * ex[1]) / (x[1] - ex[1]), 1
    if node.op == "pow":  # x^p by a constant p: |p| x^(p - 1) e at the worse end
        assert not ex[1].any(), "pow: a computed exponent"
        p, low = v[1], np.maximum(x[0] - ex[0], 0)
        slope = np.maximum(low ** (p - 1), (x[0] + ex[0]) ** (p - 1))
        return np.abs(p) * slope * ex[0], TRANSCENDENTAL
    assert node.op == "tanh", node.op
    return ex[0], TRANSCENDENTAL


def _select_error(node, v, e):
    """select(c, a, b) whose condition compares the branches (max, min, relu, clamp): a
    flipped condition picks the other branch, which is then within e_a + e_b."""
    ea, eb = np_broadcast(e)[1:]
    return ea + eb, 0


def _linear_error(node, v, e):
    """conv, deconv, box, debox, multilinear_upsample: sums of K terms, linear in each
    input with nonnegative magnitudes: the errors through the op on magnitudes, and
    gamma(K) of the op on the computed values' magnitudes."""
    op, attrs = lookup(node.op), Attrs(node.attrs)
    x = [np.abs(t) for t in v]
    k = _LINEAR_TERMS[node.op]([t.shape for t in v], node.attrs)
    # the data's errors through the weights; the weights' and bias's own (computed weights)
    if len(v) == 1:
        through = op.run_reference([e[0]], attrs)[0]
    else:
        zero_bias = [np.zeros_like(t) for t in e[2:]]
        through = op.run_reference([e[0], x[1] + e[1], *e[2:]], attrs)[0] + \
            op.run_reference([x[0], e[1], *zero_bias], attrs)[0]
    own = op.run_reference([a + b for a, b in zip(x, e)], attrs)[0]
    return through + gamma(k) * own, 0


_LINEAR_TERMS = {
    # filter [O, C / G, ...]: C / G * taps, + bias; deconv [C, O / G, ...]: at most C * taps
    "conv": lambda s, a: int(np.prod(s[1][1:])) + 1,
    "deconv": lambda s, a: s[1][0] * int(np.prod(s[1][2:])) + 1,
    "box": lambda s, a: int(np.prod(a["size"])) + 1,
    "debox": lambda s, a: int(np.prod(a["size"])) + 1,
    "multilinear_upsample": lambda s, a: 2 ** (len(s[0]) - 2) + 2 * (len(s[0]) - 2) - 1,
}


def _sample_error(node, v, e):
    """sample at argmax_pool's indices (max_pool): within the largest error in the window,
    which sampling the errors at their own argmax gives."""
    window = Attrs(node.attrs)
    index = lookup("argmax_pool").run_reference([e[0]], window)[0]
    return lookup("sample").run_reference([e[0], index], window)[0], 0


def _no_error(node, v, e):
    """Logical and index results (compares, argmax_pool): no value error of their own."""
    return 0.0, 0


_ERROR_RULES = {"sum_reduce": _sum_error, "matmul": _matmul_error, "select": _select_error,
                "sample": _sample_error,
                # shuffle: the corpus's custom op (tests/frontend/conftest.py)
                **{op: _moved_error for op in ("nnef.reshape", "concat", "copy", "shuffle")},
                **{op: _elementwise_error for op in ("add", "sub", "mul", "div", "pow", "tanh")},
                **{op: _linear_error for op in _LINEAR_TERMS},
                **{op: _no_error for op in ("lt", "gt", "argmax_pool")}}


def running_bound(graph: Graph, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """|compiled - reference| bounds of the outputs by running error analysis (Higham,
    3.3) over the reference's values: every op adds its inputs' errors as they propagate
    and its own roundings (the kernel's beyond those a rule bounds itself, and the
    reference's: u of the result each); twice that, for the second-order terms. Ops:
    `_ERROR_RULES`."""
    every = [o for n in graph.nodes for o in n.outputs]
    values = {**{k: np.asarray(v, np.float64) for k, v in {**graph.constants, **feeds}.items()},
              **{k: v.astype(np.float64) for k, v in
                 cvmc.reference_run(graph.replace(outputs=every), feeds).items()}}
    error = {k: np.zeros_like(v) for k, v in values.items()}
    for node in graph.nodes:
        ins = [values[i] for i in node.inputs]
        propagated, roundings = _ERROR_RULES[node.op](node, ins, [error[i] for i in node.inputs])
        out = np.abs(values[node.outputs[0]])
        error[node.outputs[0]] = propagated + (1 + roundings) * U * out
    return {o: 2 * error[o] for o in graph.outputs}


def relative(ref: np.ndarray, n: int) -> np.ndarray:
    """A bound of n roundings relative to the reference value: gamma(n + 2) * |ref|."""
    return sum_bound(np.abs(ref.astype(np.float64)), n)


def mean_bound(x: np.ndarray, axes: tuple[int, ...]) -> np.ndarray:
    """mean_reduce (sum_reduce normalized) over K elements: gamma(K + 2) * mean(|x|)."""
    k = int(np.prod([x.shape[a] for a in axes]))
    return sum_bound(np.mean(np.abs(x.astype(np.float64)), axis=axes, keepdims=True), k)


def moments_bound(x: np.ndarray, axes: tuple[int, ...], mean: np.ndarray) -> np.ndarray:
    """The variance of moments: its terms (x - mean)^2 come from a mean off by at most
    delta (`mean_bound`) and pow (8 u), then a normalized sum: gamma(K + 12) * mean((|d| +
    delta)^2) + 2 delta mean(|d|) + delta^2, d = x - mean."""
    k = int(np.prod([x.shape[a] for a in axes]))
    delta = mean_bound(x, axes)
    d = np.abs(x.astype(np.float64) - mean)
    return (sum_bound(np.mean((d + delta) ** 2, axis=axes, keepdims=True), k + 10)
            + 2 * delta * np.mean(d, axis=axes, keepdims=True) + delta**2)


def softmax_bound(y: np.ndarray, k: int) -> np.ndarray:
    """softmax over K elements: the max and x - max are exact, exp is within 8 u, the sum of
    K positive terms within gamma(K + 2 + 8), the division one more: relative to |y|."""
    return relative(y, k + 2 * TRANSCENDENTAL + 4)


def ulp_bound(y: np.ndarray, n: float) -> np.ndarray:
    """n u relative to |y| plus n u absolute: a bound for chains whose absolute error does
    not shrink with their result (exp(x) - 1, log(1 + e))."""
    return n * U * (1 + np.abs(y.astype(np.float64)))


_DIGESTS = """
import hashlib, sys
import numpy as np
import cvmc_runtime
model = cvmc_runtime.load(sys.argv[1])
feeds = dict(np.load(sys.argv[2]))
for _ in range(int(sys.argv[3])):
    out = model.run(feeds)
    print(hashlib.sha256(b"".join(v.tobytes() for v in out.values())).hexdigest())
"""


def run_digests(artifact: Path, feeds_npz: Path, threads: int, runs: int = 10) -> set[str]:
    """Digests of `runs` runs of an artifact in a fresh process with TVM_NUM_THREADS set."""
    env = {**os.environ, "TVM_NUM_THREADS": str(threads)}
    proc = subprocess.run([sys.executable, "-c", _DIGESTS, str(artifact), str(feeds_npz),
                           str(runs)], capture_output=True, text=True, env=env, timeout=300,
                          check=False)
    assert proc.returncode == 0, proc.stderr
    return set(proc.stdout.split())


def compile_and_run(graph: Graph, mcpu: str, feeds: dict, threads: int):
    """(first output, compile result) of `graph` built for llvm `mcpu` and run on
    `threads` threads."""
    with tempfile.TemporaryDirectory(prefix="cvmc-run-") as tmp:
        result = cvmc.compile(graph, Path(tmp) / "m.cvmx", target="llvm", mcpu=mcpu)
        model = cvmc_runtime.load(Path(tmp) / "m.cvmx")
    cvmc_runtime.set_num_threads(threads)
    return next(iter(model.run(feeds).values())), result


def run_at_1_and_2_threads(graph: Graph, feeds: dict, output: str = "y") -> list[np.ndarray]:
    """The compiled graph's `output` at 1 and at 2 threads (asserted the same bits)."""
    runs = []
    with tempfile.TemporaryDirectory(prefix="cvmc-threads-") as tmp:
        cvmc.compile(graph, Path(tmp) / "m.cvmx", target="llvm")
        model = cvmc_runtime.load(Path(tmp) / "m.cvmx")
        for threads in (1, 2):
            cvmc_runtime.set_num_threads(threads)
            runs.append(model.run(feeds)[output])
    assert runs[0].tobytes() == runs[1].tobytes(), "1 and 2 threads differ"
    return runs


def same_digests_at_1_and_2_threads(graph: Graph, tmp: Path) -> bool:
    """Whether `graph` compiled for this CPU gives one output digest over 3 runs at 1
    thread and the same over 3 runs at 2, each in a fresh process, on random inputs."""
    cvmc.compile(graph, tmp / "m.cvmx", target="llvm")
    np.savez(tmp / "feeds.npz", **random_inputs(graph))
    one = run_digests(tmp / "m.cvmx", tmp / "feeds.npz", 1, runs=3)
    return len(one) == 1 and one == run_digests(tmp / "m.cvmx", tmp / "feeds.npz", 2, runs=3)

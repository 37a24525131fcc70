"""The float row-reduction and window schedules (cvmc/lowering/x86_norm.py, pool.py):
sum_reduce / mean_reduce (cpu-sum-rows), layer_norm (cpu-layer-norm), fused_softmax
(cpu-softmax) and average pooling (box, cpu-box) take their rules, stay within their
stated bounds of the reference interpreter on random data (rows that are not a multiple of
the vector width, prime rows, 1-element axes, softmax inputs of +-80 and -inf entries) and
give the same bits at 1 and 2 threads; attention's exps (vectorised) at large magnitudes
with a -inf mask."""
from __future__ import annotations

import numpy as np
import pytest

import cvmc
from cvmc.codegen.targets import backend
from cvmc.frontend.nnef import parse_nnef
from cvmc.lowering.lower import lower_graph
from cvmc.passes.target import Target
from tests.nnefutil import mean_bound, random_inputs, run_at_1_and_2_threads, softmax_bound
from tests.oputil import compile_passes, sum_bound
from tests.passes.test_transformer import (
    MASKED,
    _attention_bound,
    _document,
    _fused,
    _layer_norm_bound,
)

U = 2.0**-24
TARGET = Target.make("llvm", "znver3")


def _doc(shape, body: str) -> str:
    return ("version 1.0;\ngraph G( x ) -> ( y )\n{\n"
            f"    x = external<scalar>(shape = {list(shape)});\n    {body}\n}}\n")


def _rules(text: str) -> set[str]:
    """The schedule rules the kernels of document `text` get on a znver3."""
    graph = compile_passes(parse_nnef(text, "doc.nnef"), target=TARGET)
    return set(backend(TARGET).schedule(lower_graph(graph, TARGET)[0], TARGET)[1].values())


def _run(text: str, feeds: dict) -> tuple[np.ndarray, np.ndarray]:
    """(reference "y", compiled "y"), the compiled one the same bits at 1 and 2 threads."""
    graph = parse_nnef(text, "doc.nnef")
    runs = run_at_1_and_2_threads(graph, feeds)
    return cvmc.reference_run(graph, feeds)["y"].astype(np.float64), runs[0]


def _random(shape, scale: float = 4.0, seed: int = 7) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return (rng.standard_normal(shape) * scale + 1.0).astype(np.float32)


# (shape, axes): 14 x 14 = 196 (7 lanes), 7 x 5 (7), 13 (prime: no lanes), a 1-element
# axis, the whole tensor, 56 x 56 (8 lanes)
@pytest.mark.parametrize("shape,axes", [((1, 32, 14, 14), (2, 3)), ((2, 3, 5, 7), (2, 3)),
                                        ((3, 13), (1,)), ((4, 1), (1,)), ((2, 6), (0, 1)),
                                        ((1, 3, 56, 56), (2, 3))])
def test_mean_over_innermost_axes(shape, axes):
    text = _doc(shape, f"y = mean_reduce(x, axes = {list(axes)});")
    assert _rules(text) == {"cpu-sum-rows"}
    x = _random(shape)
    want, got = _run(text, {"x": x})
    assert np.all(np.abs(got - want) <= mean_bound(x, axes) + 2 * U * np.abs(want))


@pytest.mark.parametrize("shape,axes", [((2, 5, 6, 9), (1,)), ((1, 7, 3, 13), (1, 2)),
                                        ((3, 1, 4), (1,))])
def test_sum_over_outer_axes(shape, axes):
    text = _doc(shape, f"y = sum_reduce(x, axes = {list(axes)});")
    assert _rules(text) == {"cpu-sum-rows"}
    x = _random(shape)
    want, got = _run(text, {"x": x})
    terms = int(np.prod([shape[a] for a in axes]))
    magnitude = np.sum(np.abs(x.astype(np.float64)), axis=axes, keepdims=True)
    assert np.all(np.abs(got - want) <= sum_bound(magnitude, terms))


def test_sum_on_integer_valued_data_is_exact():
    # every partial sum is an integer below 2^24: any order gives the reference's bits
    x = np.random.default_rng(3).integers(-1000, 1000, (2, 16, 9, 9)).astype(np.float32)
    want, got = _run(_doc(x.shape, "y = sum_reduce(x, axes = [2, 3]);"), {"x": x})
    assert np.array_equal(got, want)


@pytest.mark.parametrize("shape", [(3, 77), (2, 4, 1), (2, 13), (5, 64), (2, 3, 197)])
def test_softmax_rows_within_bound_at_large_magnitudes(shape):
    text = _doc(shape, f"y = softmax(x, axes = [{len(shape) - 1}]);")
    assert _rules(text) == {"cpu-softmax"}
    x = np.random.default_rng(5).uniform(-80, 80, shape).astype(np.float32)
    want, got = _run(text, {"x": x})
    assert np.all(np.abs(got - want) <= softmax_bound(want, shape[-1]))


def test_softmax_with_masked_entries():
    x = np.random.default_rng(6).uniform(-80, 80, (4, 24)).astype(np.float32)
    x[:, 5::3] = -np.inf  # masked out: exactly 0, the others as without them
    text = _doc(x.shape, "y = softmax(x, axes = [1]);")
    want, got = _run(text, {"x": x})
    assert np.all(got[:, 5::3] == 0)
    assert np.all(np.abs(got - want) <= softmax_bound(want, x.shape[1]))


@pytest.mark.parametrize("shape,axes", [((1, 197, 768), "2"), ((2, 3, 7), "2"),
                                        ((3, 4, 6), "1, 2"), ((2, 5, 1), "2")])
def test_layer_norm_rows_within_bound(shape, axes):
    text = _document(shape, axes)
    assert _rules(text) == {"cpu-layer-norm"}
    rng = np.random.default_rng(2)
    scale_shape = [1] * (len(shape) - 1) + [shape[-1]]
    feeds = {"x": (rng.standard_normal(shape) * 4 + 1.5).astype(np.float32),
             "g": rng.standard_normal(scale_shape).astype(np.float32),
             "b": rng.standard_normal(scale_shape).astype(np.float32)}
    want, got = _run(text, feeds)
    r = tuple(int(a) for a in axes.split(","))
    n = (want - feeds["b"]) / feeds["g"]
    bound = np.abs(feeds["g"]) * _layer_norm_bound(feeds["x"], r, 1e-5, n) \
        + 4 * U * (np.abs(want) + np.abs(feeds["b"]))
    assert np.all(np.abs(got - want) <= bound)


# (shape, size, stride, padding): 2x2 stride 2 (DenseNet's transitions), 3x3 padded on
# 13 columns (a prime: one lane), 3x3 stride 1 on 16 columns
@pytest.mark.parametrize("shape,size,stride,pad", [
    ((1, 8, 12, 12), 2, 2, 0), ((2, 3, 9, 13), 3, 1, 1), ((1, 4, 6, 16), 3, 1, 0)])
def test_average_pool_columns_in_lanes(shape, size, stride, pad):
    text = _doc(shape, f"y = avg_pool(x, size = [1, 1, {size}, {size}], stride = [1, 1, "
                       f"{stride}, {stride}], padding = [(0, 0), (0, 0), ({pad}, {pad}), "
                       f"({pad}, {pad})], border = 'constant');")
    assert _rules(text) == {"cpu-box"}
    x = _random(shape)
    want, got = _run(text, {"x": x})
    # box's bound (docs/float.md): K = the window's taps + 1 (normalized), S = avg of |x|
    magnitude, _ = _run(text, {"x": np.abs(x)})
    assert np.all(np.abs(got - want) <= sum_bound(magnitude.astype(np.float64), size * size + 1))


def test_average_pool_ignore_border_keeps_the_default_rule():
    text = _doc((1, 2, 6, 6), "y = avg_pool(x, size = [1, 1, 3, 3], padding = [(0, 0), "
                              "(0, 0), (1, 1), (1, 1)], border = 'ignore');")
    assert _rules(text) == {"cpu-default"}


def test_attention_exps_at_large_magnitudes_with_a_causal_mask():
    # the exported attention chain with a -inf mask, scores of up to about +-80: the
    # vectorised exps of the cpu-attention kernel within attention_scores' bound
    source = parse_nnef(MASKED, "att.nnef")
    (node,) = [n for n in _fused(MASKED).nodes if n.op == "attention_scores"]
    feeds = {n: (v * 12).astype(np.float32) for n, v in random_inputs(source).items()}
    feeds["m"] = np.triu(np.full((1, 1, 16, 16), -np.inf, np.float32), 1)
    want, got = _run(MASKED, feeds)
    q = np.transpose(feeds["q"], (1, 2, 0, 3))
    k = np.transpose(feeds["k"], (1, 2, 3, 0))
    scores = np.abs(np.matmul(q * np.float32(node.attrs["q_scale"]),
                              k * np.float32(node.attrs["k_scale"])) * node.attrs["scale"])
    assert scores.max() > 60
    assert np.all(np.abs(got - want) <= _attention_bound(q, k, want, node.attrs))
    masked = np.broadcast_to(feeds["m"] < 0, got.shape)
    assert np.all(got[masked] == 0)

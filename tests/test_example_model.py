"""The bundled example model (examples/small_cnn): loads, passes precision inference,
and its reference run equals an independent NumPy computation of the same network."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

import cvmc
from cvmc.ops.infer import retype

MODEL = Path(__file__).resolve().parents[1] / "examples" / "small_cnn"


def _generator():
    spec = importlib.util.spec_from_file_location("make_weights", MODEL / "make_weights.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _numpy_small_cnn(x: np.ndarray, w: dict[str, np.ndarray]) -> np.ndarray:
    """The network written out in plain int64 NumPy, one spec formula per layer."""
    x = x.astype(np.int64)
    w1, b1 = w["conv1_weight"].astype(np.int64), w["conv1_bias"].astype(np.int64)
    xp = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
    conv = sum(np.einsum("nchw,oc->nohw", xp[:, :, i:i + 16, j:j + 16], w1[:, :, i, j])
               for i in range(3) for j in range(3)) + b1[None, :, None, None]
    shifted = np.clip((conv // 2 ** 8 + 1) // 2, -(2**15 - 1), 2**15 - 1)  # shift_bit 9
    act = np.maximum(np.clip(shifted, -127, 127), 0)
    pooled = act.reshape(1, 8, 8, 2, 8, 2).max(axis=(3, 5))
    flat = pooled.reshape(1, 512)
    return flat @ w["fc_weight"].astype(np.int64).T + w["fc_bias"].astype(np.int64)


@pytest.fixture(scope="module")
def graph():
    return cvmc.load_graph(MODEL)


def test_weights_files_match_the_generator(graph):
    expected = _generator().weights()
    by_label = {label: graph.constants[name] for name, label in graph.labels.items()}
    assert by_label.keys() == expected.keys()
    for label, array in expected.items():
        assert np.array_equal(by_label[label], array), label


def test_precisions_are_inferred_and_in_range(graph):
    typed = retype(graph)
    precs = {name: typed.types[name].precision for name in typed.values()}
    assert all(1 <= p <= 32 for p in precs.values()), precs
    by_op = {n.op: typed.types[n.outputs[0]].precision for n in typed.nodes}
    # conv: 8 + 8 + bitlen(3*3*3 = 27) = 21, bias (12 bits) -> max(21, 12) + 1 = 22;
    # dense: 8 + 8 + bitlen(512) = 26, bias (16 bits) -> 27.
    assert by_op == {"conv2d": 22, "cvm_right_shift": 16, "cvm_clip": 8, "relu": 8,
                     "max_pool2d": 8, "flatten": 8, "dense": 27}


def test_reference_run_matches_numpy(graph):
    x = np.random.default_rng(7).integers(-127, 128, (1, 3, 16, 16)).astype(np.int8)
    out = cvmc.reference_run(graph, {"data": x})
    expected = _numpy_small_cnn(x, _generator().weights())
    assert out["logits"].shape == (1, 10)
    assert np.array_equal(out["logits"], expected)
    # The activations are meaningful: the logits differ (not all saturated to one value).
    assert len(set(out["logits"].ravel().tolist())) == 10

"""Tiny models for the float boundary and `cvmc eval`: a quantized dense layer (an NNEF
folder with a hand-written quantization.json) and a float one, with their NumPy oracles."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

import cvmc

# The quantized model: x int8 [2, 4] (precision 8, scale 10) -> y = x . W^T (scale 40).
W = np.array([[1, 2, 3, 4], [-4, -3, -2, -1], [5, 0, -5, 1]], np.int64)
X_SCALE, Y_SCALE = 10.0, 40.0
QUANTIZATION = {"inputs": {"x": {"scale": X_SCALE, "precision": 8}},
                "outputs": {"y": {"scale": Y_SCALE}}}
GRAPH = f"""version 1.0;

graph q( x ) -> ( y )
{{
    x = external<integer>(shape = [2, 4], precision = 8);
    w = constant<integer>(shape = [3, 4], value = {W.ravel().tolist()}, precision = 8);
    y = dense(x, w);
}}
"""
# The float model: x float32 [3, 4] -> x . WF (batch 3, not 2: each artifact is cut into
# its own batches); WF is near W^T / 7, so that the two mostly agree.
WF = (W.T / 7.0 + np.array([[0.3, -0.2, 0.1], [-0.4, 0.2, 0.3], [0.1, 0.5, -0.3],
                            [0.2, -0.1, -0.4]])).astype(np.float32)


def write_quantized(folder: Path, quantization: object = QUANTIZATION) -> Path:
    """The quantized model as an NNEF folder, with `quantization` as its quantization.json
    (None: without one)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "graph.nnef").write_text(GRAPH)
    if quantization is not None:
        (folder / "quantization.json").write_text(json.dumps(quantization))
    return folder


def float_graph():
    """The float model, built in Python."""
    b = cvmc.GraphBuilder("f")
    y = b.dot(b.input("x", [3, 4], "float32"), b.constant(WF, name="wf"), name="y")
    return b.build([y])


def rule(x: np.ndarray, scale: float, precision: int) -> np.ndarray:
    """The quantization rule written out independently: round half away from zero of x *
    scale in float64, clipped to +-(2^(p-1) - 1)."""
    v = np.asarray(x, np.float64) * scale
    bound = 2 ** (precision - 1) - 1
    return np.clip(np.sign(v) * np.floor(np.abs(v) + 0.5), -bound, bound).astype(np.int64)


def quantized_logits(x: np.ndarray) -> np.ndarray:
    """The integer outputs of the quantized model for float samples x [n, 4]."""
    return rule(x, X_SCALE, 8) @ W.T


def float_logits(x: np.ndarray) -> np.ndarray:
    """The float model's outputs (float32 products summed in float64: only the argmax of
    these is used, on data without near ties)."""
    return np.asarray(x, np.float32).astype(np.float64) @ WF.astype(np.float64)

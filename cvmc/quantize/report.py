"""`--report`: how far each layer of the integer model is from the float one.

For every float layer output that the integer model holds under the same name, the
integer tensor is dequantized (integer / scale, `cvmc_runtime.dequantize`, plus its offset
where it has one) and compared
with the float tensor over the samples: SQNR = 10 log10(sum f^2 / sum (f - d)^2) in dB,
and the largest |f - d|.
"""
from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
from cvmc_runtime import dequantize, quantize

from cvmc.quantize import Quantized
from cvmc.quantize.layers import run_float
from cvmc.reference import evaluate, stored


def run_integer(q: Quantized, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Every value of the integer graph on real inputs (quantized by the one rule)."""
    g = q.graph
    env = {n: stored(quantize(n, feeds[n], *q.inputs[n]), g.types[n]) for n in g.inputs}
    env.update({k: stored(v, g.types[k]) for k, v in g.constants.items()})
    for node in g.nodes:
        env.update(zip(node.outputs, evaluate(node, [env[i] for i in node.inputs], g.types)))
    return env


def layer_report(q: Quantized, samples: dict[str, np.ndarray], count: int,
                 advance: Callable[[], None] | None = None) -> list[dict]:
    """One row per compared layer, in graph order: name, op, sqnr_db, max_abs_error
    (`advance` is called after each sample: a progress bar's)."""
    layers = q.source
    names = [(n.name, n.op) for n in layers.graph.nodes if n.name in q.scales
             and n.name in q.graph.types]
    signal = dict.fromkeys((n for n, _ in names), 0.0)
    noise, worst = dict(signal), dict(signal)
    for k in range(count):
        feeds = {n: samples[n][k] for n in layers.graph.inputs}
        fenv, ienv = run_float(layers, feeds), run_integer(q, feeds)
        for name, _ in names:
            f = fenv[name].astype(np.float64)
            d = dequantize(ienv[name], q.scales[name]) + q.offsets.get(name, 0.0)
            signal[name] += float(np.square(f).sum())
            noise[name] += float(np.square(f - d).sum())
            worst[name] = max(worst[name], float(np.abs(f - d).max(initial=0.0)))
        if advance is not None:
            advance()
    return [{"layer": name, "op": op,
             "sqnr_db": (math.inf if noise[name] == 0 else
                         10 * math.log10(signal[name] / noise[name]) if signal[name] else
                         -math.inf),
             "max_abs_error": worst[name]} for name, op in names]

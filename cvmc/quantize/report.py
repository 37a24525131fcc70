"""`--report`: how far each layer of the integer model is from the float one, and how much
quantizing that layer alone costs the model's outputs.

For every float layer output that the integer model holds under the same name, the
integer tensor is dequantized (integer / scale, `cvmc_runtime.dequantize`, plus its offset
where it has one) and compared
with the float tensor over the samples: SQNR = 10 log10(sum f^2 / sum (f - d)^2) in dB,
and the largest |f - d|.

A layer's sensitivity is the SQNR of the model's outputs (all of them, summed over the
first `sensitivity` samples) when only that layer's output is quantized: the float layers
run with that one tensor replaced by `fake_quantize` of it, at the scale, precision and
offset the integer model gave it, and every other tensor float. Only the layers that read
the replaced tensor (directly or not) run again: at most one float run per layer and sample.
"""
from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
from cvmc_runtime import dequantize, quantize

from cvmc.quantize import Quantized
from cvmc.quantize.layers import Layers, run_float, run_layer
from cvmc.reference import evaluate, stored

MOST_SENSITIVE = 5  # the table marks this many layers, the lowest sensitivity SQNRs


def run_integer(q: Quantized, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Every value of the integer graph on real inputs (quantized by the one rule)."""
    g = q.graph
    env = {n: stored(quantize(n, feeds[n], *q.inputs[n]), g.types[n]) for n in g.inputs}
    env.update({k: stored(v, g.types[k]) for k, v in g.constants.items()})
    for node in g.nodes:
        env.update(zip(node.outputs, evaluate(node, [env[i] for i in node.inputs], g.types)))
    return env


def fake_quantize(q: Quantized, name: str, x: np.ndarray) -> np.ndarray:
    """The real that the integer model's tensor `name` stands for where the float one is x:
    clip(round((x - offset) * scale), +-(2^(p-1) - 1)) / scale + offset."""
    offset = q.offsets.get(name, 0.0)
    scale, precision = q.scales[name], q.graph.types[name].precision
    return dequantize(quantize(name, np.asarray(x, np.float64) - offset, scale, precision),
                      scale).astype(np.float64) + offset


def _rerun(layers: Layers, env: dict[str, np.ndarray], name: str,
           value: np.ndarray) -> dict[str, np.ndarray]:
    """The float model's outputs with `name` replaced by `value` (`env`: the float run),
    running again only the layers that read it (directly or not)."""
    env = dict(env)
    env[name] = stored(value, layers.graph.types[name])
    changed = {name}
    for node in layers.graph.nodes:
        if changed.intersection(node.inputs):
            run_layer(layers, node, env)
            changed.update(node.outputs)
    return {o: env[o] for o in layers.graph.outputs}


def _sqnr(signal: float, noise: float) -> float:
    """10 log10(signal / noise) in dB: +inf where nothing differs, -inf on a zero signal."""
    if noise == 0:
        return math.inf
    return 10 * math.log10(signal / noise) if signal else -math.inf


def layer_report(q: Quantized, samples: dict[str, np.ndarray], count: int,
                 advance: Callable[[], None] | None = None, sensitivity: int = 8) -> list[dict]:
    """One row per compared layer, in graph order: name, op, precision and dtype (of its
    integer tensor), sqnr_db, max_abs_error, sensitivity_db (over the first `sensitivity`
    samples) and sensitivity_rank (1: the lowest sensitivity_db; ties in graph order)
    (`advance` is called after each sample: a progress bar's)."""
    layers = q.source
    names = [(n.name, n.op) for n in layers.graph.nodes if n.name in q.scales
             and n.name in q.graph.types]
    signal = dict.fromkeys((n for n, _ in names), 0.0)
    noise, worst, hurt = dict(signal), dict(signal), dict(signal)
    out_signal = 0.0
    for k in range(count):
        feeds = {n: samples[n][k] for n in layers.graph.inputs}
        fenv, ienv = run_float(layers, feeds), run_integer(q, feeds)
        for name, _ in names:
            f = fenv[name].astype(np.float64)
            d = dequantize(ienv[name], q.scales[name]) + q.offsets.get(name, 0.0)
            signal[name] += float(np.square(f).sum())
            noise[name] += float(np.square(f - d).sum())
            worst[name] = max(worst[name], float(np.abs(f - d).max(initial=0.0)))
        if k < sensitivity:
            outs = {o: fenv[o].astype(np.float64) for o in layers.graph.outputs}
            out_signal += sum(float(np.square(v).sum()) for v in outs.values())
            for name, _ in names:
                moved = _rerun(layers, fenv, name, fake_quantize(q, name, fenv[name]))
                hurt[name] += sum(float(np.square(outs[o] - moved[o].astype(np.float64)).sum())
                                  for o in outs)
        if advance is not None:
            advance()
    order = sorted(range(len(names)), key=lambda i: _sqnr(out_signal, hurt[names[i][0]]))
    rank = {names[i][0]: r + 1 for r, i in enumerate(order)}
    types = q.graph.types
    return [{"layer": name, "op": op, "precision": types[name].precision,
             "dtype": types[name].dtype, "sqnr_db": _sqnr(signal[name], noise[name]),
             "max_abs_error": worst[name], "sensitivity_db": _sqnr(out_signal, hurt[name]),
             "sensitivity_rank": rank[name]} for name, op in names]

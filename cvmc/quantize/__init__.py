"""`cvmc quantize`: a float model to a deterministic CVM integer model (docs/quantize.md).

The passes, in order, run by `cvmc.passes.pipeline.run_passes` (each one's graph is what
`--dump-ir` writes): group-layers (compound fragments back to layers, those no rule covers
split again), fold-batch-norm, fuse-elementwise, then quantize: a dry run at unit
thresholds (every refusal before any sample runs), calibration on the float layers, then
the integer CVM ops (`rewrite.py`, each typed as it is built: the proof that int32 never
overflows), then infer-precision (the compile pipeline's check that the graph is typed).
"""
from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
from cvmc_runtime import scale_entry

from cvmc.ir import Graph
from cvmc.ops.infer import require_typed
from cvmc.passes.pipeline import Pass, run_passes
from cvmc.quantize.calibrate import METHODS, Stats, calibrate, check_samples
from cvmc.quantize.fixedpoint import FixedPointError
from cvmc.quantize.layers import Layers, fold_batch_norm, fuse_elementwise, group_layers
from cvmc.quantize.rewrite import Options, Rewriter, split_unruled

__all__ = ["METHODS", "Options", "Quantized", "quantize_graph"]


@dataclass
class Quantized:
    """The integer graph, the float layers it came from, and the scales that join them."""

    graph: Graph
    source: Layers  # the float model's layers as written (the report compares with them)
    layers: Layers  # after the float rewrites: what was calibrated and quantized
    # float value name -> scale of the integer value of that name (an output's per slice an
    # array, `cvmc_runtime.sliced_scale`)
    scales: dict[str, float | np.ndarray]
    inputs: dict[str, tuple[float, int]]  # input -> (scale, precision)
    # float value name -> the real of its integer 0, where not 0 (a shifted clamp)
    offsets: dict[str, float] = field(default_factory=dict)

    def manifest(self) -> dict:
        """quantization.json: real ~= integer / scale."""
        return {"inputs": {n: {"scale": s, "precision": p} for n, (s, p) in self.inputs.items()},
                "outputs": {n: scale_entry(self.scales[n]) for n in self.graph.outputs}}


def quantize_graph(graph: Graph, samples: dict[str, np.ndarray] | None, options: Options,
                   method: str = "absmax", percentile: float = 99.99, lam: float = 10.0,
                   max_samples: int | None = None,
                   after_pass: Callable[[int, str, Graph], None] | None = None,
                   rewriter: Callable[[Layers, dict, Options], Rewriter] = Rewriter,
                   calibrator: Callable[[Layers, dict, int], dict[str, Stats]] = calibrate
                   ) -> Quantized:
    """Quantize a checked float graph, calibrated on `samples` ({input: [N, *shape]}) by
    `calibrator` (`calibrate`'s signature), or with no samples by a `rewriter` that knows
    the scales (a QDQ model, qdq.py)."""
    source = calibrated = None  # the layers as written, and as calibrated and quantized
    found: tuple = ()  # the scales, inputs and offsets the quantize pass found

    def group(layers: Layers) -> Layers:
        nonlocal source, samples
        source = split_unruled(group_layers(layers.graph))
        if samples is not None:
            samples = check_samples(source, samples)
        return source

    def quantize(layers: Layers) -> Layers:
        nonlocal calibrated, found
        calibrated = layers
        thresholds = {}
        if samples is not None:
            # The integer graph at unit thresholds, dropped: every refusal that does not
            # depend on the calibrated ranges (a layer no rule covers, asymmetric padding, a
            # filter that is not a weight) comes before any sample runs.
            try:
                rewriter(layers, defaultdict(lambda: 1.0), options).run()
            except FixedPointError:
                pass  # a scale ratio at unit thresholds: the calibrated ranges decide
            count = min(next(iter(samples.values())).shape[0], max_samples or 1 << 62)
            stats = calibrator(layers, samples, count)
            thresholds = {n: s.threshold(method, percentile, lam, options.bits)
                          for n, s in stats.items()}
            for name in layers.graph.outputs:  # range beyond the calibrated one, where asked
                thresholds[name] *= 2.0 ** options.output_range_bits
        int_graph, *found = rewriter(layers, thresholds, options).run()
        return Layers(int_graph)

    passes = [Pass("group-layers", group),
              Pass("fold-batch-norm", fold_batch_norm),
              Pass("fuse-elementwise", fuse_elementwise),
              Pass("quantize", quantize),
              # GraphBuilder typed every node as the quantize pass made it
              Pass("infer-precision", lambda layers: Layers(require_typed(layers.graph)))]
    dump = None if after_pass is None else \
        (lambda index, name, layers: after_pass(index, name, layers.graph))
    # The passes hand on Layers, not a Graph: a layer node is a fragment call (`sigmoid`,
    # `batch_normalization`) that no op rule covers, and the values of its body are typed
    # but defined only in the body. Each result is checked as the graph of its primitives;
    # infer-precision checks the integer graph's types against the op rules.
    int_graph = run_passes(Layers(graph), passes, after_pass=dump,
                           check=lambda layers: layers.primitives().verify()).graph
    return Quantized(int_graph, source, calibrated, *found)

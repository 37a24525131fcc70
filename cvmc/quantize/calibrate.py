"""Calibration: every float tensor's statistics over all samples, and its threshold.

`calibrate` runs the float layers on the reference interpreter, one sample at a time
(seconds for MNIST-sized nets, about 1 s per sample for a ResNet-18): the oracle.
`calibration_graph` is the same layers as one graph whose outputs are every calibrated
value, in batches where the graph takes them, which `cvmc quantize` compiles and runs
(cvmc.cli.quantize, `--calib-on llvm`: quantize does not import the code generator) and
feeds to `add_batch` / `add_sample`. Unlike MRT (the last batch wins), every sample
counts: absmax is the maximum over all of them, mean and std are over all their values,
the percentile over a fixed-size even subsample of each sample.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace

import numpy as np

from cvmc.errors import CvmcError
from cvmc.ir import Graph
from cvmc.ops.infer import retype
from cvmc.quantize.layers import Layers, run_float, unsupported

METHODS = ("absmax", "percentile", "lambda", "mse")
_KEEP = 1 << 16  # values kept per tensor per sample for the percentile and mse, at most
_KEEP_ALL = 1 << 22  # and per tensor over all samples (16 MB of float32)
_BINS = 4096  # the mse search's histogram of |x| over [0, absmax]
_CANDIDATES = 256  # mse's thresholds: absmax * k / 256, k = 1..256


@dataclass
class Stats:
    """Running statistics of one tensor's values."""

    absmax: float = 0.0
    count: int = 0
    total: float = 0.0
    squares: float = 0.0
    kept: list[np.ndarray] = field(default_factory=list)
    keep: int = _KEEP  # values kept of each sample (an even subsample)

    @staticmethod
    def of(names: list[str], count: int) -> dict[str, Stats]:
        """Empty statistics of `names` for `count` samples: each keeps at most
        min(2^16, 2^22 / count) values of a sample."""
        keep = max(1, min(_KEEP, _KEEP_ALL // max(count, 1)))
        return {name: Stats(keep=keep) for name in names}

    def add(self, v: np.ndarray) -> None:
        """Take in one sample's values (a NaN makes absmax NaN)."""
        a = np.abs(v.reshape(-1)) if v.size else np.zeros(1, np.float32)
        w = a.astype(np.float64)
        peak = float(w.max())
        if not peak <= self.absmax:  # larger, or NaN
            self.absmax = peak
        self.count += w.size
        self.total += float(w.sum())
        self.squares += float(np.einsum("i,i->", w, w))  # not BLAS: its threads would spin
        # float32 (the float model's values), a copy: a view would keep all of `a` alive
        self.kept.append(a[::max(1, -(-a.size // self.keep))].astype(np.float32))

    def threshold(self, method: str, percentile: float, lam: float, bits: int = 8) -> float:
        """The real value mapped to the largest integer: by absmax, the percentile of |x|,
        MRT's |mean| + lambda * std of |x| (never above absmax), or the least quantization
        error at `bits` (mse)."""
        if method == "absmax":
            t = self.absmax
        elif method == "percentile":
            t = float(np.percentile(np.concatenate(self.kept), percentile))
        elif method == "mse":
            t = self.least_error(bits)
        else:
            mean = self.total / self.count
            std = np.sqrt(max(self.squares / self.count - mean * mean, 0.0))
            t = min(self.absmax, abs(mean) + lam * std)
        # A tensor that is zero on every sample still needs a scale: any one will do.
        return t if t > 0 else (self.absmax if self.absmax > 0 else 1.0)


    def least_error(self, bits: int) -> float:
        """The candidate threshold t = absmax k / 256 (k = 1..256) whose `bits`-bit grid
        (step t / (2^(bits-1) - 1), values beyond t clipped to it) gives the least summed
        squared error over the kept values of |x|, each counted at its bin's centre in a
        4096-bin histogram over [0, absmax]."""
        if not self.absmax > 0:
            return self.absmax
        counts, edges = np.histogram(np.concatenate(self.kept), bins=_BINS,
                                     range=(0.0, self.absmax))
        centres = (edges[:-1] + edges[1:]) / 2
        top = (1 << (bits - 1)) - 1
        t = self.absmax * np.arange(1, _CANDIDATES + 1)[:, None] / _CANDIDATES
        step = t / top
        grid = np.minimum(np.floor(centres / step + 0.5), top) * step  # clipped at t
        error = (counts * np.square(centres - grid)).sum(axis=1)
        return float(t[int(np.argmin(error)), 0])


def check_shape(name: str, data: np.ndarray, shape) -> np.ndarray:
    """Samples of input `name` as [N, *shape] reals. A file holds them as [N, *shape] or,
    where the input's first dimension is 1 (its batch), as [N, *shape[1:]] (the form `cvmc
    eval --data` reads). A None or named dim of `shape` takes any size."""
    def fits(dims) -> bool:
        return len(dims) == len(shape) and all(
            not isinstance(d, int) or d == n for d, n in zip(shape, dims))
    if data.dtype.kind in "fiu" and data.ndim >= 1:
        if fits(data.shape[1:]):
            return data
        if shape and shape[0] == 1 and fits((1, *data.shape[1:])):
            return data[:, None]
    rows = f" (the batch of 1 may be left out: [N, {', '.join(map(str, shape[1:]))}])" \
        if shape and shape[0] == 1 else ""
    raise CvmcError(f"--calib {name}: expected samples of shape [N, {', '.join(map(str, shape))}"
                    f"] with real values, got {list(data.shape)} {data.dtype}{rows}")


def check_samples(layers: Layers, samples: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The samples, each [N, *input shape] (`check_shape`), after checking names, shapes,
    values and that every input has N of them (one error each)."""
    g = layers.graph
    missing = [n for n in g.inputs if n not in samples]
    if missing:
        raise CvmcError(f"--calib: no samples for input '{missing[0]}' (inputs: "
                        f"{', '.join(g.inputs)})")
    extra = [n for n in samples if n not in g.inputs]
    if extra:
        raise CvmcError(f"--calib {extra[0]}: the model has no input '{extra[0]}' (inputs: "
                        f"{', '.join(g.inputs)})")
    counts = set()
    samples = {name: check_shape(name, data, g.types[name].shape)
               for name, data in samples.items()}
    for name, data in samples.items():
        if data.shape[0] == 0:
            raise CvmcError(f"--calib {name}: holds no samples (shape {list(data.shape)})")
        bad = np.argwhere(~np.isfinite(data))
        if bad.size:
            raise CvmcError(f"--calib {name}: value at index {bad[0].tolist()} is "
                            f"{data[tuple(bad[0])]}; calibration samples must be finite")
        counts.add(data.shape[0])
    if len(counts) > 1:
        raise CvmcError(f"--calib: the inputs hold different numbers of samples "
                        f"({', '.join(f'{n}: {samples[n].shape[0]}' for n in samples)})")
    return samples


def calibrate(layers: Layers, samples: dict[str, np.ndarray], count: int,
              advance: Callable[[], None] | None = None) -> dict[str, Stats]:
    """Statistics of every input and layer output (each of a split's) over the first
    `count` samples, run on the reference interpreter; a layer output that is not finite
    (the float model overflows float32) is an error. `advance` is called after each sample
    (a progress bar's)."""
    g = layers.graph
    stats = Stats.of(calibrated_names(layers), count)
    for k in range(count):
        add_sample(layers, stats, run_float(layers, {n: samples[n][k] for n in g.inputs}), k)
        if advance is not None:
            advance()
    return stats


def calibrated_names(layers: Layers) -> list[str]:
    """The values calibration keeps statistics of: the inputs and every layer output."""
    g = layers.graph
    return [*g.inputs, *(o for n in g.nodes for o in n.outputs)]


def add_sample(layers: Layers, stats: dict[str, Stats], env: dict[str, np.ndarray],
               k: int) -> None:
    """Take in calibration sample k's values (`env`: at least every name of `stats`)."""
    for name, s in stats.items():
        s.add(env[name])
        if not np.isfinite(s.absmax):
            bad = env[name][~np.isfinite(env[name])]
            node = next(n for n in layers.graph.nodes if name in n.outputs)  # inputs are finite
            raise unsupported(node, f"its float output holds {bad[0]} on calibration "
                                    f"sample {k}: no scale covers a value that is not "
                                    f"finite (float32 overflowed, or a weight is not)")


def calibration_graph(layers: Layers, batch: int | None) -> Graph | None:
    """The float layers as one graph of primitives whose outputs are every layer output
    calibration keeps: what a compiled calibration runs. With a `batch`, its inputs' first
    dimension (a batch of 1) becomes `batch`, and it is None where the graph does not take
    that: an input whose first dimension is not 1, or a value whose type does not follow
    it (a reshape to a fixed batch, a reduction over the batch)."""
    g = layers.graph
    outputs = [n for n in calibrated_names(layers) if n not in g.inputs]
    nodes = [n for layer in g.nodes for n in layers.bodies.get(layer.name, [layer])]
    types = dict(g.types)
    for name in g.inputs if batch is not None else ():
        if g.types[name].shape[:1] != (1,):
            return None
        types[name] = replace(g.types[name], shape=(batch, *g.types[name].shape[1:]))
    try:
        graph = retype(g.replace(nodes=nodes, outputs=outputs, types=types, kernels=[]))
    except CvmcError:
        if batch is None:
            raise
        return None
    if batch is not None and any(g.types[n].shape[:1] != (1,) or graph.types[n].shape !=
                                 (batch, *g.types[n].shape[1:]) for n in outputs):
        return None
    return graph


def add_batch(layers: Layers, stats: dict[str, Stats], env: dict[str, np.ndarray],
              first: int, count: int) -> None:
    """Take in `count` samples from a batch of values (`env`: every name of `stats`, its
    rows the samples first, first + 1, ...), one at a time as `calibrate` does."""
    for row in range(count):
        add_sample(layers, stats, {n: v[row:row + 1] for n, v in env.items()}, first + row)

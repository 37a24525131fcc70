"""The quantize pass of a model already quantized (docs/quantize.md, "Models already
quantized"): the ONNX frontend (`cvmc.frontend.onnx_qdq`) gives the float graph and each
tensor's ONNX grid, and `QdqRewriter` applies the calibrated model's rules with the ONNX
grids in place of calibrated thresholds:
- a tensor whose ONNX integers q - z fit the CVM precision (|q - z| <= 2^(B-1) - 1, or one
  more: s8 with zero point 0 loses only -128) keeps scale 1/s: the ONNX grid exactly;
- a wider one (u8, or s8 with a zero point: up to 255 steps on one side) gets the scale
  that maps the larger end of its real range [(qmin - z) s, (qmax - z) s] to 2^(B-1) - 1:
  CVM is symmetric and conv2d / dense take 8-bit data, so one bit of its grid is lost;
- a range with one end at 0 (a u8 tensor with zero point 0: ORT drops the Relu or Clip
  before such a QuantizeLinear) is a clamp to that range in the float model, relu in CVM;
  other ranges are not clamped on their smaller side (the requantization saturates the
  larger);
- 8-bit weights with zero point 0 whose largest |q| is 127 (what ORT writes, per tensor or
  per channel) map exactly; int32 biases at s_x s_w too, when x keeps its grid.
"""
from __future__ import annotations

import numpy as np

from cvmc.errors import CvmcError
from cvmc.frontend.onnx_qdq import Grid
from cvmc.ops.common import prec_max
from cvmc.quantize.fixedpoint import plan_requant
from cvmc.quantize.rewrite import Options, QTensor, Rewriter


class QdqRewriter(Rewriter):
    """The quantize pass with each tensor's scale from its ONNX grid, weights on the ONNX
    weight grids, and the fixed-point error of every requantization recorded."""

    sliced_outputs = False  # a concat output at its ONNX grid, as the model quantizes it

    def __init__(self, layers, grids: dict[str, Grid], weight_scales: np.ndarray,
                 origin: dict[str, str], options: Options):
        super().__init__(layers, {}, options)
        self.grids, self.wscales, self.origin = grids, weight_scales, origin
        self.worst_relative = 0.0  # largest |m / 2^s - r| / r of any multiplier
        self.worst_units = 0.0  # largest fixed-point error bound, in output units

    def scale(self, name: str, bits: int) -> float:
        """1 / s where the ONNX grid fits `bits` bits (s8 zero point 0 losing -128), else
        the scale of the grid's larger end at 2^(bits-1) - 1."""
        grid = self.grids.get(name)
        if grid is None:
            raise CvmcError(f"tensor '{name}' has no QuantizeLinear scale: the model must "
                            f"quantize the output of every conv, matmul, add, concat, pool "
                            f"and lookup table")
        if grid.span <= prec_max(bits) + 1:
            return 1.0 / grid.scale
        return prec_max(bits) / (grid.span * grid.scale)

    def layer(self, node) -> None:
        """Rewriter.layer; its errors name the ONNX node the layer came from."""
        try:
            super().layer(node)
        except CvmcError as e:
            if self.origin.get(node.name) is None:
                raise
            raise CvmcError(f"{self.origin[node.name]}: {e.message}") from None

    def threshold_of(self, name: str) -> float:
        """The largest |real| of a tensor's ONNX grid, or a weight's absmax."""
        if name in self.g.constants:
            return super().threshold_of(name)
        return prec_max(8) / self.scale(name, 8)

    def requant(self, t: QTensor, scale, bits: int) -> QTensor:
        """Rewriter.requant, recording the multiplier's error (fixedpoint.py's bound)."""
        ratio = np.asarray(scale, np.float64) / np.asarray(t.scale, np.float64)
        if not (ratio.size == 1 and float(ratio.reshape(-1)[0]) == 1.0
                and t.precision <= bits):
            plan = plan_requant(ratio, t.precision, bits)
            r = ratio * 2.0 ** plan.pre_shift
            rel = np.abs(plan.multiplier / 2.0 ** plan.shift - r) / r
            self.worst_relative = max(self.worst_relative, float(rel.max()))
            self.worst_units = max(self.worst_units, plan.error)
        return super().requant(t, scale, bits)

    def weights(self, w: np.ndarray, axis: int) -> tuple[np.ndarray, np.ndarray]:
        """The ONNX 8-bit grid of a weight (one scale, or one per output channel), else
        the calibrated rule's."""
        w = w.astype(np.float64)
        others = tuple(a for a in range(w.ndim) if a != axis)
        for absmax in (np.abs(w).max(keepdims=True),
                       np.abs(w).max(axis=others, keepdims=True)):
            step = self._step(absmax)
            if step is None:
                continue
            q = np.round(w / step)
            if np.allclose(q * step, w, rtol=1e-5, atol=1e-7 * float(step.max())):
                return q.astype(np.int32), (1.0 / step).reshape(-1)
        return super().weights(w, axis)

    def _step(self, absmax: np.ndarray) -> np.ndarray | None:
        """Per entry of `absmax`, the model's weight scale s with absmax = k s for the
        largest integer k <= 127 (ORT's symmetric weights reach 127, 63 with
        reduce_range); None if an entry has none."""
        if not self.wscales.size or not np.all(absmax > 0):
            return None
        steps = absmax.reshape(-1, 1) / np.arange(prec_max(8), 0, -1)
        at = np.clip(np.searchsorted(self.wscales, steps), 1, max(self.wscales.size - 1, 1))
        below = self.wscales[np.minimum(at - 1, self.wscales.size - 1)]
        above = self.wscales[np.minimum(at, self.wscales.size - 1)]
        near = np.where(np.abs(below - steps) < np.abs(above - steps), below, above)
        ok = np.isclose(near, steps, rtol=1e-5, atol=0)
        if not ok.any(axis=1).all():
            return None
        return near[np.arange(len(near)), ok.argmax(axis=1)].reshape(absmax.shape)

"""Models already quantized (ONNX QDQ, QLinearConv / QLinearMatMul): their own scales, no
calibration (docs/quantize.md, "Models already quantized").

`float_model` strips the Q/DQ pairs (and turns QLinear ops into their float twins with
dequantized weights) into a float ONNX model, remembering each tensor's ONNX grid (scale
s, zero point z, integer range); the float model goes through the converter and the
quantizer's float passes as any other, and `QdqRewriter` applies the same rules with the
ONNX grids in place of calibrated thresholds:
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

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from cvmc.errors import CvmcError
from cvmc.ops.common import prec_max
from cvmc.quantize.fixedpoint import plan_requant
from cvmc.quantize.rewrite import Options, QTensor, Rewriter

QUANT_OPS = {"QuantizeLinear", "DequantizeLinear", "QLinearConv", "QLinearMatMul"}
# ops that compute the same on the integers as on the reals they stand for
_PASS = {"MaxPool", "Reshape", "Flatten", "Transpose", "Squeeze", "Unsqueeze", "Relu"}
_INTEGER_OPS = {"ConvInteger", "MatMulInteger", "QGemm", "QLinearAdd", "QLinearMul",
                "QLinearConcat", "QLinearAveragePool", "QLinearGlobalAveragePool",
                "QLinearSigmoid", "QLinearLeakyRelu", "QLinearSoftmax", "DynamicQuantizeLinear"}


@dataclass(frozen=True)
class Grid:
    """An ONNX quantized tensor: real = (q - zero) * scale, q in [qmin, qmax]."""

    scale: float
    zero: int
    qmin: int
    qmax: int

    @property
    def span(self) -> int:
        """The largest |q - zero|."""
        return max(self.zero - self.qmin, self.qmax - self.zero)

    @property
    def bounds(self) -> tuple[float, float]:
        """The reals the grid covers."""
        return (self.qmin - self.zero) * self.scale, (self.qmax - self.zero) * self.scale


def is_quantized(model) -> bool:
    """Whether an ONNX ModelProto holds quantization ops (QDQ or QLinear)."""
    return any(n.op_type in QUANT_OPS | _INTEGER_OPS for n in model.graph.node)


def _where(node) -> str:
    """How errors name a node."""
    return f"node '{node.name or node.output[0]}' ({node.op_type})"


def _attrs(node) -> dict:
    """A node's attributes; blocked quantization (opset 21's block_size) is refused."""
    from onnx import helper
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    if attrs.get("block_size"):
        raise CvmcError(f"{_where(node)}: blocked quantization (block_size); CVM scales are "
                        f"per tensor or per output channel")
    return attrs


class _Stripper:
    """One pass over an ONNX graph: float nodes out, grids and weight scales recorded."""

    def __init__(self, model):
        from onnx import numpy_helper
        self.inits = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
        self.nodes: list = []
        self.grids: dict[str, Grid] = {}
        self.ints: set[str] = set()  # tensors that are ONNX integers (their float twin's name)
        self.alias: dict[str, str] = {}
        self.clamped: dict[str, tuple[float, float]] = {}  # float tensors known in a range
        self.weight_scales: list[float] = []
        self.count = 0

    def name(self, n: str) -> str:
        """The float tensor that `n` stands for."""
        while n in self.alias:
            n = self.alias[n]
        return n

    def const(self, node, i: int, default=None) -> np.ndarray:
        """Input i of `node`, an initializer (or `default` where it is left out)."""
        if i >= len(node.input) or not node.input[i]:
            if default is None:
                raise CvmcError(f"{_where(node)}: input {i} is missing")
            return default
        if node.input[i] not in self.inits:
            raise CvmcError(f"{_where(node)}: '{node.input[i]}' must be an initializer")
        return self.inits[node.input[i]]

    def grid(self, node, s: int, z: int) -> Grid:
        """The per-tensor grid of scale input s and zero point input z."""
        from onnx import helper
        attrs = _attrs(node)
        kind = helper.tensor_dtype_to_np_dtype(attrs["output_dtype"]) \
            if attrs.get("output_dtype") else np.uint8
        scale = self.const(node, s)
        zero = self.const(node, z, np.zeros((), kind))
        if scale.size != 1 or zero.size != 1:
            raise CvmcError(f"{_where(node)}: per-axis scales of an activation; CVM scales "
                            f"activations per tensor")
        if not np.issubdtype(zero.dtype, np.integer):
            raise CvmcError(f"{_where(node)}: zero point of type {zero.dtype}")
        info = np.iinfo(zero.dtype)
        return Grid(float(scale.reshape(())), int(zero.reshape(())), int(info.min), int(info.max))

    def dequantized(self, node, q: np.ndarray, s: int, z: int, axis: int) -> np.ndarray:
        """An integer initializer as reals, per axis where its scale is a vector."""
        _attrs(node)
        scale = self.const(node, s).astype(np.float64)
        zero = self.const(node, z, np.zeros((), np.int64)).astype(np.float64)
        if scale.ndim == 1 and scale.size > 1:
            shape = [1] * q.ndim
            shape[axis % q.ndim] = -1
            scale, zero = scale.reshape(shape), zero.reshape(shape) if zero.ndim else zero
        if q.dtype == np.int8 and np.any(zero):
            raise CvmcError(f"{_where(node)}: an 8-bit weight with a nonzero zero point; "
                            f"CVM weights are symmetric")
        if q.dtype in (np.int8, np.uint8):
            self.weight_scales.extend(np.asarray(scale, np.float64).reshape(-1).tolist())
        return ((q.astype(np.float64) - zero) * scale).astype(np.float32)

    def add_init(self, name: str, value: np.ndarray) -> str:
        """A new initializer of the float model."""
        self.inits[name] = value
        return name

    def quantized(self, node, source: str, grid: Grid, out: str) -> None:
        """`out` is the ONNX integer of the float `source` on `grid`."""
        from onnx import helper
        src = self.name(source)
        lo, hi = grid.bounds
        if (lo == 0 or hi == 0) and self.clamped.get(src) != (lo, hi):
            # a one-sided range clamps (ORT drops the Relu or Clip before it)
            self.count += 1
            bounds = [self.add_init(f"{out}__{k}", np.array(v, np.float32))
                      for k, v in (("lo", lo), ("hi", hi))]
            self.nodes.append(helper.make_node("Clip", [src, *bounds], [out],
                                               name=f"{node.name}__clip"))
            self.clamped[out] = (lo, hi)
        else:
            self.alias[out] = src
        self.grids.setdefault(src, grid)
        self.grids[self.name(out)] = grid
        self.ints.add(out)

    def integer_input(self, node, i: int, grid: Grid) -> str:
        """Input i of a QLinear op: an ONNX integer on `grid`, as its float twin."""
        n = node.input[i]
        if n not in self.ints or self.grids.get(self.name(n)) != grid:
            raise CvmcError(f"{_where(node)}: input '{n}' is not a quantized tensor with "
                            f"its scale and zero point")
        return self.name(n)

    def node(self, node) -> None:
        """One ONNX node into float nodes, grids and initializers."""
        from onnx import helper
        op = node.op_type
        if op == "QuantizeLinear":
            grid = self.grid(node, 1, 2)
            if node.input[0] in self.inits:  # a float weight quantized in the model
                w = self.inits[node.input[0]].astype(np.float64)
                q = np.clip(np.round(w / grid.scale) + grid.zero, grid.qmin, grid.qmax)
                self.inits[node.output[0]] = q.astype(next(
                    t for t in (np.int8, np.uint8, np.int16, np.uint16, np.int32)
                    if (np.iinfo(t).min, np.iinfo(t).max) == (grid.qmin, grid.qmax)))
                return
            self.quantized(node, node.input[0], grid, node.output[0])
        elif op == "DequantizeLinear":
            src = node.input[0]
            if src in self.inits:
                axis = next((a.i for a in node.attribute if a.name == "axis"), 1)
                self.inits[node.output[0]] = self.dequantized(node, self.inits[src], 1, 2, axis)
            elif src in self.ints:
                if self.grids.get(self.name(src)) != self.grid(node, 1, 2):
                    raise CvmcError(f"{_where(node)}: scale or zero point differs from the "
                                    f"QuantizeLinear of '{src}'")
                self.alias[node.output[0]] = self.name(src)
            else:
                raise CvmcError(f"{_where(node)}: '{src}' is neither a quantized tensor nor "
                                f"an initializer")
        elif op in ("QLinearConv", "QLinearMatMul"):
            x = self.integer_input(node, 0, self.grid(node, 1, 2))
            if node.input[3] not in self.inits:
                raise CvmcError(f"{_where(node)}: the weight must be an initializer")
            w = self.dequantized(node, self.inits[node.input[3]], 4, 5,
                                 0 if op == "QLinearConv" else 1)
            inputs = [x, self.add_init(f"{node.output[0]}__w", w)]
            if op == "QLinearConv" and len(node.input) > 8 and node.input[8]:
                scale = (self.const(node, 1).astype(np.float64)
                         * self.const(node, 4).astype(np.float64)).reshape(-1)
                bias = (self.const(node, 8).astype(np.float64) * scale).astype(np.float32)
                inputs.append(self.add_init(f"{node.output[0]}__b", bias))
            real = f"{node.output[0]}__real"
            self.nodes.append(helper.make_node(op.removeprefix("QLinear"), inputs, [real],
                                               name=node.name, domain="",
                                               **{a.name: helper.get_attribute_value(a)
                                                  for a in node.attribute}))
            self.quantized(node, real, self.grid(node, 6, 7), node.output[0])
        elif op in _INTEGER_OPS or node.domain not in ("", "ai.onnx"):
            raise CvmcError(f"{_where(node)}: not supported in a quantized model (QDQ, "
                            f"QLinearConv and QLinearMatMul are; docs/quantize.md)")
        else:
            ints = [i for i in node.input if i in self.ints]
            if ints and op not in _PASS:
                raise CvmcError(f"{_where(node)}: computes on the ONNX integers of '{ints[0]}'"
                                f" (only {', '.join(sorted(_PASS))} may)")
            new = helper.make_node(op, [self.name(i) if i else i for i in node.input],
                                   list(node.output), name=node.name, domain=node.domain)
            new.attribute.extend(node.attribute)
            self.nodes.append(new)
            if op in _PASS and op != "Relu" and new.input[0] in self.clamped:
                self.clamped[node.output[0]] = self.clamped[new.input[0]]
            if ints:
                self.ints.update(node.output)
                self.grids.setdefault(node.output[0], self.grids[self.name(ints[0])])

    def propagate(self) -> None:
        """Tensors without a grid next to a pass-through op take its other side's grid."""
        changed = True
        while changed:
            changed = False
            for n in self.nodes:
                if n.op_type not in _PASS:
                    continue
                a, b = n.input[0], n.output[0]
                for src, dst in ((a, b), (b, a)):
                    if src in self.grids and dst not in self.grids:
                        self.grids[dst] = self.grids[src]
                        changed = True


def float_model(model):
    """(the float ONNX model, {tensor: Grid}, the weight scales, the outputs added to it)
    of a QDQ / QLinear ONNX model. Inner tensors get NNEF-safe names (`qdq_N`) and each
    one with a grid becomes an extra graph output, so that the converter keeps its name."""
    import onnx
    from onnx import helper, numpy_helper
    st = _Stripper(model)
    for node in model.graph.node:
        st.node(node)
    st.propagate()
    g = model.graph
    io = [i.name for i in g.input if i.name not in st.inits] + [o.name for o in g.output]
    for o in g.output:
        src = st.name(o.name)
        if src != o.name:  # the output is the alias of a float tensor: that one takes its name
            if src in io:
                raise CvmcError(f"output '{o.name}' is the input '{src}': nothing to compute")
            for n in st.nodes:
                n.input[:] = [o.name if i == src else i for i in n.input]
                n.output[:] = [o.name if i == src else i for i in n.output]
            st.grids[o.name] = st.grids.get(src, st.grids.get(o.name))
    made = [t for n in st.nodes for t in n.output]
    rename = {t: f"qdq_{k}" for k, t in enumerate(dict.fromkeys(made)) if t not in io}
    for n in st.nodes:
        n.input[:] = [rename.get(i, i) for i in n.input]
        n.output[:] = [rename.get(i, i) for i in n.output]
    grids = {rename.get(k, k): v for k, v in st.grids.items() if v is not None}
    used = {i for n in st.nodes for i in n.input}
    inits = [numpy_helper.from_array(np.asarray(v), k) for k, v in st.inits.items()
             if k in used]
    fm = helper.make_model(
        helper.make_graph(st.nodes, g.name, [i for i in g.input if i.name not in st.inits],
                          list(g.output), inits),
        opset_imports=[o for o in model.opset_import if o.domain in ("", "ai.onnx")])
    fm.ir_version = model.ir_version
    fm = onnx.shape_inference.infer_shapes(fm)
    known = {v.name: v for v in fm.graph.value_info}
    extra = [k for k in grids if k in known and k not in io]
    fm.graph.output.extend(known[k] for k in extra)
    return fm, grids, np.array(sorted(set(st.weight_scales))), extra


class QdqRewriter(Rewriter):
    """The quantize pass with each tensor's scale from its ONNX grid, weights on the ONNX
    weight grids, and the fixed-point error of every requantization recorded."""

    def __init__(self, layers, grids: dict[str, Grid], weight_scales: np.ndarray,
                 options: Options):
        super().__init__(layers, {}, options)
        self.grids, self.wscales = grids, weight_scales
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


def load_qdq(path: Path, tmp: Path, input_shapes: dict | None):
    """(the float graph, its grids, weight scales) of a quantized ONNX model, converted in
    `tmp`; None when the model holds no quantization ops."""
    import onnx
    from google.protobuf.message import DecodeError

    from cvmc.frontend import load_checked
    from cvmc.frontend.onnx_convert import convert_onnx
    try:
        model = onnx.load_model(path, load_external_data=False)
    except (DecodeError, ValueError, RuntimeError, OSError):
        return None  # convert_onnx reports what is wrong with the file
    if not is_quantized(model):
        return None
    model = onnx.load_model(path)
    fm, grids, wscales, extra = float_model(model)
    onnx.save_model(fm, tmp / "float.onnx")
    graph = load_checked(convert_onnx(tmp / "float.onnx", tmp / "nnef",
                                      input_shapes=input_shapes))
    graph = graph.replace(outputs=[o for o in graph.outputs if o not in extra])
    return graph, grids, wscales

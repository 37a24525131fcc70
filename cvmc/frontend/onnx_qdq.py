"""ONNX models already quantized (QDQ, QLinear ops: QLinearConv, QLinearMatMul and ORT's
com.microsoft QGemm, QLinearAdd, ...) as a float graph plus each tensor's ONNX grid, which
`cvmc quantize` consumes (its `QdqRewriter`, cvmc/quantize/qdq.py; docs/quantize.md,
"Models already quantized").

`float_model` strips the Q/DQ pairs (and turns QLinear ops into their float twins with
dequantized weights), folds Constant nodes into initializers and Identity nodes into
aliases, into a float ONNX model, remembering each tensor's ONNX grid (scale
s, zero point z, integer range) and the scales of the 8-bit weights; `load_qdq` converts
that float model as any other. Every scale, zero point, axis, bias and input count is
checked before it is used; each refusal is one CvmcError naming the ONNX node.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from cvmc.errors import CvmcError

QUANT_OPS = {"QuantizeLinear", "DequantizeLinear", "QLinearConv", "QLinearMatMul"}
# ops that compute the same on the integers as on the reals they stand for
_PASS = {"MaxPool", "Reshape", "Flatten", "Transpose", "Squeeze", "Unsqueeze", "Relu"}
# QLinear ops with a weight: the float twin, the axis of per-channel weight scales (QGemm:
# by transB), the bias input, the output's scale input
_LINEAR = {"QLinearConv": ("Conv", 0, 8, 6), "QLinearMatMul": ("MatMul", -1, None, 6),
           "QGemm": ("Gemm", None, 6, 7)}
# com.microsoft ops ORT writes (QuantFormat.QOperator): the float twin, the first input of
# each (tensor, scale, zero point) triple, the output's scale input (its zero point next)
_QOPERATOR = {"QLinearAdd": ("Add", (0, 3), 6), "QLinearMul": ("Mul", (0, 3), 6),
              "QLinearSigmoid": ("Sigmoid", (0,), 3), "QLinearLeakyRelu": ("LeakyRelu", (0,), 3),
              "QLinearSoftmax": ("Softmax", (0,), 3),
              "QLinearAveragePool": ("AveragePool", (0,), 3),
              "QLinearGlobalAveragePool": ("GlobalAveragePool", (0,), 3)}
_INTEGER_OPS = {"ConvInteger", "MatMulInteger", "QGemm", "QLinearConcat",
                "DynamicQuantizeLinear", *_QOPERATOR}
# (fewest, most) inputs of the ops read here; each has one output
_ARITY = {"QuantizeLinear": (2, 3), "DequantizeLinear": (2, 3), "QLinearConv": (8, 9),
          "QLinearMatMul": (8, 8), "QGemm": (8, 9), "QLinearConcat": (5, 1 << 20),
          "Identity": (1, 1), "Constant": (0, 0),
          **{op: (out + 1, out + 2) for op, (_, _, out) in _QOPERATOR.items()}}
_DOMAINS = ("", "ai.onnx", "com.microsoft")
_ACTIVATION_TYPES = tuple(map(np.dtype, (np.int8, np.uint8, np.int16, np.uint16)))
_INTEGER_TYPES = (*_ACTIVATION_TYPES, np.dtype(np.int32))  # int32: biases
# a scale and its reciprocal (a CVM scale) are float32 normals
_SCALE_RANGE = (float(np.finfo(np.float32).tiny), 1 / float(np.finfo(np.float32).tiny))
_NUMERIC = (1, 2, 3, 4, 5, 6, 7, 9, 10, 11, 12, 13)  # TensorProto's FLOAT .. UINT64, BOOL


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

    @property
    def dtype(self) -> np.dtype:
        """The ONNX integer type of the grid."""
        return next(t for t in _ACTIVATION_TYPES
                    if (np.iinfo(t).min, np.iinfo(t).max) == (self.qmin, self.qmax))


def is_quantized(model) -> bool:
    """Whether an ONNX ModelProto holds quantization ops (QDQ or QLinear)."""
    return any(n.op_type in QUANT_OPS | _INTEGER_OPS for n in model.graph.node)


def _where(node) -> str:
    """How errors name a node."""
    return f"node '{node.name or (node.output[0] if node.output else '')}' ({node.op_type})"


def _attrs(node) -> dict:
    """A node's attributes; blocked quantization (opset 21's block_size) is refused."""
    from onnx import helper
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    if attrs.get("block_size"):
        raise CvmcError(f"{_where(node)}: blocked quantization (block_size); CVM scales are "
                        f"per tensor or per output channel")
    return attrs


def _constant(node) -> np.ndarray:
    """The value of a Constant node."""
    from onnx import helper, numpy_helper
    if len(node.attribute) != 1:
        raise CvmcError(f"{_where(node)}: a Constant has exactly one value attribute")
    attr = node.attribute[0]
    value = helper.get_attribute_value(attr)
    if attr.name == "value" and value.data_type in _NUMERIC:
        return numpy_helper.to_array(value)
    if attr.name in ("value_float", "value_floats"):
        return np.array(value, np.float32)
    if attr.name in ("value_int", "value_ints"):
        return np.array(value, np.int64)
    raise CvmcError(f"{_where(node)}: a constant '{attr.name}' that is no numeric tensor")


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
        self.origin: dict[str, str] = {}  # float tensor -> the ONNX node that made it
        self.opset = max((o.version for o in model.opset_import
                          if o.domain in ("", "ai.onnx")), default=0)

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

    def scales(self, node, i: int) -> np.ndarray:
        """Input i of `node` as scales (float64): a float scalar or vector, each finite and
        in _SCALE_RANGE."""
        s = self.const(node, i)
        what = f"{_where(node)}: scale '{node.input[i]}'"
        if s.dtype.kind != "f" or s.ndim > 1 or not s.size:
            raise CvmcError(f"{what} is {list(s.shape)} {s.dtype}; a scale is a float scalar, "
                            f"or a vector of one per channel")
        s = s.astype(np.float64)
        bad = s[~((s >= _SCALE_RANGE[0]) & (s <= _SCALE_RANGE[1]))]
        if bad.size:
            raise CvmcError(f"{what} holds {bad[0]:g}; scales must lie in "
                            f"[{_SCALE_RANGE[0]:.3g}, {_SCALE_RANGE[1]:.3g}] (finite, > 0, "
                            f"and with a finite float32 reciprocal)")
        return s

    def zeros(self, node, i: int, kind: np.dtype | None) -> np.ndarray:
        """Input i of `node` as zero points of the integer type `kind` (0 where left out;
        required where `kind` is None, and then of an activation type)."""
        z = self.const(node, i, None if kind is None else np.zeros((), kind))
        want = _ACTIVATION_TYPES if kind is None else (kind,)
        if z.dtype not in want or z.ndim > 1:
            raise CvmcError(f"{_where(node)}: zero point '{node.input[i]}' is "
                            f"{list(z.shape)} {z.dtype}; expected a scalar or vector of "
                            f"{' or '.join(t.name for t in want)}")
        return z

    def output_type(self, node) -> np.dtype:
        """The integer type a QuantizeLinear writes: its zero point's, or `output_dtype`'s
        (they must agree), else uint8; one of _ACTIVATION_TYPES."""
        from onnx import TensorProto, helper
        code = _attrs(node).get("output_dtype")
        kind = None
        if code:
            if code not in TensorProto.DataType.values():
                raise CvmcError(f"{_where(node)}: output_dtype {code} is no ONNX type")
            kind = np.dtype(helper.tensor_dtype_to_np_dtype(code))
        if len(node.input) > 2 and node.input[2]:
            zero = self.const(node, 2).dtype
            if kind is not None and zero != kind:
                raise CvmcError(f"{_where(node)}: zero point of type {zero}, output_dtype "
                                f"{kind}")
            kind = zero
        kind = np.dtype(np.uint8) if kind is None else kind
        if kind not in _ACTIVATION_TYPES:
            raise CvmcError(f"{_where(node)}: quantizes to {kind}; cvmc takes "
                            f"{', '.join(t.name for t in _ACTIVATION_TYPES)}")
        return kind

    def grid(self, node, s: int, z: int, kind: np.dtype | None = None) -> Grid:
        """The per-tensor grid of scale input s and zero point input z (`zeros`)."""
        scale, zero = self.scales(node, s), self.zeros(node, z, kind)
        if scale.size != 1 or zero.size != 1:
            raise CvmcError(f"{_where(node)}: per-axis scales of an activation; CVM scales "
                            f"activations per tensor")
        info = np.iinfo(zero.dtype)
        grid = Grid(float(scale.reshape(())), int(zero.reshape(())), int(info.min),
                    int(info.max))
        if grid.span * grid.scale > float(np.finfo(np.float32).max):
            raise CvmcError(f"{_where(node)}: scale {grid.scale:g} of a {zero.dtype} grid "
                            f"spans reals beyond float32")
        return grid

    def per_axis(self, node, s: int, z: int, q: int, kind: np.dtype, axis: int):
        """(scales, zero points) of inputs s and z, zero points of type `kind`, for the
        weight of input q, shaped to broadcast against it: one each, or one per entry of
        `axis`."""
        shape = self.const(node, q).shape
        scale, zero = self.scales(node, s), self.zeros(node, z, kind)
        if scale.size == 1 and zero.size == 1:
            return scale.reshape(()), zero.reshape(())
        if not -len(shape) <= axis < len(shape) or scale.size != shape[axis] \
                or zero.size not in (1, scale.size):
            raise CvmcError(f"{_where(node)}: {scale.size} scales and {zero.size} zero points "
                            f"for axis {axis} of the {list(shape)} weight '{node.input[q]}'")
        at = [1] * len(shape)
        at[axis] = -1
        return scale.reshape(at), zero.reshape(at) if zero.size > 1 else zero.reshape(())

    def dequantized(self, node, q: int, s: int, z: int, axis: int) -> np.ndarray:
        """The integer initializer of input q as reals, per axis where its scale is a
        vector."""
        _attrs(node)
        w = self.const(node, q)
        if w.dtype not in _INTEGER_TYPES:
            raise CvmcError(f"{_where(node)}: '{node.input[q]}' is {w.dtype}; a quantized "
                            f"weight is {', '.join(t.name for t in _INTEGER_TYPES)}")
        scale, zero = self.per_axis(node, s, z, q, w.dtype, axis)
        if w.dtype == np.int32 and np.any(zero):
            raise CvmcError(f"{_where(node)}: zero point '{node.input[z]}' of an int32 tensor "
                            f"is not 0 (ONNX dequantizes int32 with none)")
        if w.dtype in (np.int8, np.uint8):
            self.weight_scales.extend(scale.reshape(-1).tolist())
        real = ((w.astype(np.float64) - zero) * scale).astype(np.float32)
        if not np.isfinite(real).all():
            raise CvmcError(f"{_where(node)}: '{node.input[q]}' dequantizes beyond float32")
        return real

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
            bounds = [self.add_init(f"{out}__{k}", np.array(v, np.float32))
                      for k, v in (("lo", lo), ("hi", hi))]
            self.nodes.append(helper.make_node("Clip", [src, *bounds], [out],
                                               name=f"{node.name}__clip"))
            self.origin[out] = _where(node)
            self.clamped[out] = (lo, hi)
        else:
            self.alias[out] = src
        self.grids.setdefault(src, grid)
        self.grids[self.name(out)] = grid
        self.ints.add(out)

    def integer_input(self, node, i: int) -> str:
        """Input i of a QLinear op, ONNX integers with scale input i + 1 and zero point
        input i + 2, as its float twin."""
        n = node.input[i]
        if n not in self.ints or self.grids[self.name(n)] != self.grid(
                node, i + 1, i + 2, self.grids[self.name(n)].dtype):
            raise CvmcError(f"{_where(node)}: input '{n}' is not a quantized tensor with "
                            f"its scale and zero point")
        return self.name(n)

    def real_input(self, node, i: int) -> str:
        """Input i of a QLinear op (scale i + 1, zero point i + 2) as reals: a quantized
        tensor's float twin, or an integer initializer dequantized (per tensor)."""
        if node.input[i] in self.inits:
            return self.add_init(f"{node.output[0]}__{i}", self.dequantized(node, i, i + 1,
                                                                            i + 2, 0))
        return self.integer_input(node, i)

    def output_grid(self, node, s: int, like: str) -> Grid:
        """The grid of a QLinear op's output (scale input s, zero point s + 1): where its
        zero point is left out, of the type of its input `like`."""
        given = len(node.input) > s + 1 and node.input[s + 1]
        return self.grid(node, s, s + 1, None if given or like not in self.grids
                         else self.grids[like].dtype)

    def node(self, node) -> None:
        """One ONNX node into float nodes, grids and initializers."""
        from onnx import helper
        op = node.op_type
        if node.domain not in _DOMAINS:
            raise CvmcError(f"{_where(node)}: an op of the domain '{node.domain}'")
        if not (node.output and node.output[0]):
            raise CvmcError(f"{_where(node)}: its first output has no name")
        if op in _ARITY:
            fewest, most = _ARITY[op]
            if not fewest <= len(node.input) <= most or len(node.output) != 1:
                raise CvmcError(f"{_where(node)}: has {len(node.input)} inputs and "
                                f"{len(node.output)} outputs; ONNX's {op} has "
                                f"{fewest}..{most} inputs and one output")
        if (op in _PASS or _ARITY.get(op, (0,))[0]) and not (node.input and node.input[0]):
            raise CvmcError(f"{_where(node)}: its first input has no name")
        if op == "Constant":
            self.inits[node.output[0]] = _constant(node)
        elif op == "Identity":
            src = node.input[0]
            if src in self.inits:
                self.inits[node.output[0]] = self.inits[src]
            else:
                self.alias[node.output[0]] = self.name(src)
                if src in self.ints:
                    self.ints.add(node.output[0])
        elif op == "QuantizeLinear":
            if node.input[0] in self.ints:
                raise CvmcError(f"{_where(node)}: quantizes '{node.input[0]}', which holds "
                                f"ONNX integers already")
            if node.input[0] in self.inits:  # a float weight quantized in the model
                self.quantized_weight(node)
            else:
                self.quantized(node, node.input[0], self.grid(node, 1, 2, self.output_type(node)),
                               node.output[0])
        elif op == "DequantizeLinear":
            src = node.input[0]
            if src in self.inits:
                axis = _attrs(node).get("axis", 1)
                self.inits[node.output[0]] = self.dequantized(node, 0, 1, 2, axis)
            elif src in self.ints:
                grid = self.grids[self.name(src)]
                if grid != self.grid(node, 1, 2, grid.dtype):
                    raise CvmcError(f"{_where(node)}: scale or zero point differs from the "
                                    f"QuantizeLinear of '{src}'")
                self.alias[node.output[0]] = self.name(src)
            else:
                raise CvmcError(f"{_where(node)}: '{src}' is neither a quantized tensor nor "
                                f"an initializer")
        elif op in _LINEAR:
            self.qlinear(node)
        elif op in _QOPERATOR or op == "QLinearConcat":
            self.qoperator(node)
        elif op in _INTEGER_OPS or node.domain not in ("", "ai.onnx"):
            raise CvmcError(f"{_where(node)}: not supported in a quantized model (QDQ and "
                            f"the QLinear ops of docs/quantize.md are)")
        else:
            ints = [i for i in node.input if i in self.ints]
            if ints and op not in _PASS:
                raise CvmcError(f"{_where(node)}: computes on the ONNX integers of '{ints[0]}'"
                                f" (only {', '.join(sorted(_PASS))} may)")
            if op == "Relu" and ints and self.grids[self.name(ints[0])].zero:
                raise CvmcError(f"{_where(node)}: a Relu of ONNX integers with a zero point "
                                f"is no relu of the reals they stand for")
            new = helper.make_node(op, [self.name(i) if i else i for i in node.input],
                                   list(node.output), name=node.name, domain=node.domain)
            new.attribute.extend(node.attribute)
            self.nodes.append(new)
            self.origin.update((o, _where(node)) for o in node.output)
            if op in _PASS and op != "Relu" and new.input and new.input[0] in self.clamped:
                self.clamped[node.output[0]] = self.clamped[new.input[0]]
            if ints:
                self.ints.update(node.output)
                self.grids.setdefault(node.output[0], self.grids[self.name(ints[0])])

    def quantized_weight(self, node) -> None:
        """A QuantizeLinear of a float initializer: its integers, rounded as ONNX does
        (halves to even), per tensor or per axis."""
        w = self.inits[node.input[0]]
        if w.dtype.kind != "f":
            raise CvmcError(f"{_where(node)}: quantizes '{node.input[0]}' of type {w.dtype}")
        kind = self.output_type(node)
        scale, zero = self.per_axis(node, 1, 2, 0, kind, _attrs(node).get("axis", 1))
        info = np.iinfo(kind)
        with np.errstate(all="ignore"):
            q = np.round(w.astype(np.float64) / scale) + zero
        if np.isnan(q).any():
            raise CvmcError(f"{_where(node)}: '{node.input[0]}' holds NaN")
        self.inits[node.output[0]] = np.clip(q, info.min, info.max).astype(kind)

    def qlinear(self, node) -> None:
        """QLinearConv / QLinearMatMul / QGemm: the float twin of dequantized weights (and
        bias)."""
        op, attrs = node.op_type, _attrs(node)
        twin, axis, b, out = _LINEAR[op]
        if op == "QGemm":
            alpha = attrs.pop("alpha", 1.0)
            if alpha != 1.0:
                raise CvmcError(f"{_where(node)}: alpha {alpha}; cvmc takes 1")
            axis = 0 if attrs.get("transB") else 1
        x = self.integer_input(node, 0)
        if node.input[3] not in self.inits:
            raise CvmcError(f"{_where(node)}: the weight must be an initializer")
        w = self.dequantized(node, 3, 4, 5, axis)
        inputs = [x, self.add_init(f"{node.output[0]}__w", w)]
        if b is not None and len(node.input) > b and node.input[b]:
            bias = self.const(node, b)
            if bias.dtype != np.int32 or bias.shape != (w.shape[axis],):
                raise CvmcError(f"{_where(node)}: bias '{node.input[b]}' is "
                                f"{list(bias.shape)} {bias.dtype}; expected [{w.shape[axis]}] "
                                f"int32")
            scale = self.grids[x].scale * self.scales(node, 4)
            inputs.append(self.add_init(f"{node.output[0]}__b",
                                        (bias * scale).astype(np.float32)))
        self.twin(node, twin, inputs, attrs, self.output_grid(node, out, x))

    def qoperator(self, node) -> None:
        """A com.microsoft QLinear op (QLinearAdd, QLinearConcat, ...): its float twin on
        the reals of its inputs."""
        op, attrs = node.op_type, _attrs(node)
        if op == "QLinearConcat":
            if (len(node.input) - 2) % 3:
                raise CvmcError(f"{_where(node)}: {len(node.input)} inputs; QLinearConcat "
                                f"takes a scale, a zero point, then triples")
            twin, firsts, out = "Concat", range(2, len(node.input), 3), 0
        else:
            twin, firsts, out = _QOPERATOR[op]
        if attrs.pop("channels_last", 0):
            raise CvmcError(f"{_where(node)}: channels_last; cvmc takes NCHW")
        opset = attrs.pop("opset", self.opset)  # QLinearSoftmax: its Softmax's meaning
        if (opset >= 13) != (self.opset >= 13):
            raise CvmcError(f"{_where(node)}: the softmax of opset {opset} in a model of "
                            f"opset {self.opset} (the axis means another thing)")
        inputs = [self.real_input(node, i) for i in firsts]
        self.twin(node, twin, inputs, attrs, self.output_grid(node, out, inputs[0]))

    def twin(self, node, op: str, inputs: list[str], attrs: dict, grid: Grid) -> None:
        """The float op `op` for the QLinear `node`, its output quantized on `grid`."""
        from onnx import helper
        real = f"{node.output[0]}__real"
        self.nodes.append(helper.make_node(op, inputs, [real], name=node.name, **attrs))
        self.origin[real] = _where(node)
        self.quantized(node, real, grid, node.output[0])

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
    """(the float ONNX model, {tensor: Grid}, the weight scales, the outputs added to it,
    {tensor: the ONNX node that made it}) of a QDQ / QLinear ONNX model. Inner tensors get
    NNEF-safe names (`qdq_N`) and each one with a grid becomes an extra graph output, so
    that the converter keeps its name."""
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
            st.origin[o.name] = st.origin.get(src, st.origin.get(o.name))
    made = [t for n in st.nodes for t in n.output]
    rename = {t: f"qdq_{k}" for k, t in enumerate(dict.fromkeys(made)) if t not in io}
    for n in st.nodes:
        n.input[:] = [rename.get(i, i) for i in n.input]
        n.output[:] = [rename.get(i, i) for i in n.output]
    grids = {rename.get(k, k): v for k, v in st.grids.items() if v is not None}
    origin = {rename.get(k, k): v for k, v in st.origin.items()}
    used = {i for n in st.nodes for i in n.input}
    inits = [numpy_helper.from_array(np.asarray(v), k) for k, v in st.inits.items()
             if k in used]
    fm = helper.make_model(
        helper.make_graph(st.nodes, g.name, [i for i in g.input if i.name not in st.inits],
                          list(g.output), inits),
        opset_imports=[o for o in model.opset_import if o.domain in ("", "ai.onnx")])
    fm.ir_version = model.ir_version
    try:
        fm = onnx.shape_inference.infer_shapes(fm)
    except onnx.shape_inference.InferenceError as e:
        raise CvmcError(f"ONNX's shape inference fails on its float ops: "
                        f"{str(e).splitlines()[0]}") from None
    known = {v.name: v for v in fm.graph.value_info}
    extra = [k for k in grids if k in known and k not in io]
    fm.graph.output.extend(known[k] for k in extra)
    return fm, grids, np.array(sorted(set(st.weight_scales))), extra, origin


def load_qdq(path: Path, tmp: Path, input_shapes: dict | None,
             origins: dict[str, str] | None = None):
    """(the float graph, its grids, weight scales, {tensor: ONNX node}) of a quantized
    ONNX model, converted in `tmp` (`origins` as convert_onnx fills it); None when the
    model holds no quantization ops. Its tensors and external data are checked as `cvmc
    convert` checks them before any data is read."""
    import onnx
    from google.protobuf.message import DecodeError

    from cvmc.frontend import load_checked
    from cvmc.frontend.onnx_convert import MAX_ONNX_BYTES, check_tensors, convert_onnx
    try:
        if path.stat().st_size > MAX_ONNX_BYTES:
            return None  # convert_onnx reports what is wrong with the file
        model = onnx.load_model(path, load_external_data=False)
    except (DecodeError, ValueError, RuntimeError, OSError):
        return None
    if not is_quantized(model):
        return None
    try:
        check_tensors(path, model)
    except CvmcError as e:
        raise CvmcError(f"{path}: {e.message}") from None
    onnx.load_external_data_for_model(model, str(path.parent))
    try:
        fm, grids, wscales, extra, origin = float_model(model)
    except CvmcError as e:
        raise CvmcError(f"{path}: {e.message}") from None
    onnx.save_model(fm, tmp / "float.onnx")
    try:
        graph = load_checked(convert_onnx(tmp / "float.onnx", tmp / "nnef",
                                          input_shapes=input_shapes, origins=origins))
    except CvmcError as e:  # one line naming the model and, where known, the ONNX node
        message = e.message.removeprefix(f"{tmp / 'float.onnx'}: ").splitlines()[0]
        node = next((origin[t] for t in re.findall(r"'([^']*)'", message) if t in origin),
                    None)
        raise CvmcError(f"{path}: {node + ': ' if node else ''}{message}") from None
    graph = graph.replace(outputs=[o for o in graph.outputs if o not in extra])
    return graph, grids, wscales, origin

"""Transformer models as PyTorch's TorchScript exporter writes them (`torch.onnx.export(...,
opset_version=16 or 17, dynamo=False)`), built with `onnx.helper` so that the tests need no
torch. The node sequences follow torch 2.14's exports of `nn.TransformerEncoder`
(batch_first, post-norm, ReLU) and of torchvision's `VisionTransformer` (pre-norm, GELU):

- constants are `Constant` nodes, nodes are named `/scope/Op_k` with outputs
  `/scope/Op_k_output_0`, and weights equal to another one are `Identity` nodes of it;
- `nn.MultiheadAttention` splits the packed projection with `unflatten(-1, (3, E))`:
  a `Shape` sliced around `Mod(2, 3)`, concatenated with `[3, E]` into a `Reshape`, then
  `Unsqueeze`, `Transpose`, `Squeeze` and one `Gather` per q, k, v;
- `scaled_dot_product_attention` computes its scale from the shape:
  `Shape -> Slice(-1) -> Cast -> Sqrt -> Div(1, .) -> Cast`, and multiplies q and k^T by
  its square root each;
- with a static input shape torch writes the reshapes' batch-dependent shapes as constants
  (`[S, B * H, D]`); with a dynamic batch (`dynamic_axes`) it computes them from
  `Shape -> Gather -> Mul -> Unsqueeze -> Concat`;
- ViT's `class_token.expand(n, -1, -1)` is `ConstantOfShape -> Mul -> Equal -> Where ->
  Expand`; LayerNorm is `LayerNormalization` from opset 17 and `ReduceMean, Sub, Pow,
  ReduceMean, Add, Sqrt, Div, Mul, Add` before; GELU is `Div, Erf, Add, Mul, Mul`.
"""
from __future__ import annotations

import numpy as np
from onnx import ModelProto, TensorProto, helper, numpy_helper

INT64_MAX = np.iinfo(np.int64).max


class TorchGraph:
    """Collects nodes and initializers named the way torch's exporter names them."""

    def __init__(self, seed: int, opset: int):
        self.rng = np.random.default_rng(seed)
        self.opset = opset
        self.nodes, self.inits = [], []
        self.counts: dict[str, int] = {}

    def op(self, scope: str, op: str, inputs: list[str], **attrs) -> str:
        """Append `/scope/Op_k`; returns its output."""
        k = self.counts.get(f"{scope}/{op}", 0)
        self.counts[f"{scope}/{op}"] = k + 1
        name = f"{scope}/{op}" + (f"_{k}" if k else "")
        self.nodes.append(helper.make_node(op, inputs, [f"{name}_output_0"], name=name,
                                           **attrs))
        return f"{name}_output_0"

    def const(self, scope: str, value, dtype=np.int64) -> str:
        """A Constant node (int64 unless said otherwise; a scalar where `value` is one)."""
        tensor = numpy_helper.from_array(np.array(value, dtype))
        return self.op(scope, "Constant", [], value=tensor)

    def weight(self, name: str, shape, scale: float = 0.2) -> str:
        """A random float32 initializer."""
        value = self.rng.normal(0.0, scale, shape).astype(np.float32)
        self.inits.append(numpy_helper.from_array(value, name))
        return name

    def shared(self, source: str, name: str) -> str:
        """A weight equal to `source`, as torch writes it: an Identity of it."""
        self.nodes.append(helper.make_node("Identity", [source], [name], name=f"Identity_{name}"))
        return name

    def model(self, inputs: dict[str, list], outputs: dict[str, list]) -> ModelProto:
        """The ModelProto (ir_version 8, as torch writes for these opsets)."""
        def info(items):
            return [helper.make_tensor_value_info(n, TensorProto.FLOAT, s)
                    for n, s in items.items()]
        graph = helper.make_graph(self.nodes, "main_graph", info(inputs), info(outputs),
                                  self.inits)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", self.opset)],
                                  producer_name="pytorch")
        model.ir_version = 8
        return model

    # ---- shapes as torch computes them -------------------------------------------------
    def dim(self, scope: str, x: str, axis: int) -> str:
        """x.shape[axis] as a scalar: Shape -> Gather."""
        return self.op(scope, "Gather", [self.op(scope, "Shape", [x]),
                                         self.const(scope, axis)], axis=0)

    def shape_of(self, scope: str, parts: list) -> str:
        """A shape from scalars (computed dims, unsqueezed) and ints (constants)."""
        return self.op(scope, "Concat", [
            self.const(scope, [p]) if isinstance(p, int) else
            self.op(scope, "Unsqueeze", [p, self.const(scope, [0])]) for p in parts], axis=0)

    # ---- layers -----------------------------------------------------------------------
    def layer_norm(self, scope: str, x: str, width: int, shared_bias: str | None = None) -> str:
        """nn.LayerNorm over the last axis (weight random; bias shared where given)."""
        w = self.weight(f"{scope[1:].replace('/', '.')}.weight", [width])
        b = self.shared(shared_bias, f"{scope[1:].replace('/', '.')}.bias") if shared_bias \
            else self.weight(f"{scope[1:].replace('/', '.')}.bias", [width])
        if self.opset >= 17:
            return self.op(scope, "LayerNormalization", [x, w, b], axis=-1, epsilon=1e-5)
        mean = self.op(scope, "ReduceMean", [x], axes=[-1])
        centered = self.op(scope, "Sub", [x, mean])
        square = self.op(scope, "Pow", [centered, self.const(scope, 2.0, np.float32)])
        var = self.op(scope, "ReduceMean", [square], axes=[-1])
        std = self.op(scope, "Sqrt", [self.op(scope, "Add", [
            var, self.const(scope, 1e-5, np.float32)])])
        normed = self.op(scope, "Div", [centered, std])
        return self.op(scope, "Add", [self.op(scope, "Mul", [normed, w]), b])

    def linear(self, scope: str, x: str, cin: int, cout: int) -> str:
        """nn.Linear on a 3-d input: MatMul by the transposed weight, then Add(bias, .)."""
        prefix = scope[1:].replace("/", ".")
        y = self.op(scope, "MatMul", [x, self.weight(f"onnx::MatMul_{prefix}", [cin, cout])])
        return self.op(scope, "Add", [self.weight(f"{prefix}.bias", [cout]), y])

    def gelu(self, scope: str, x: str) -> str:
        """GELU (erf form), as torch decomposes it before opset 20."""
        erf = self.op(scope, "Erf", [self.op(scope, "Div", [
            x, self.const(scope, np.sqrt(2.0), np.float32)])])
        y = self.op(scope, "Mul", [x, self.op(scope, "Add", [
            erf, self.const(scope, 1.0, np.float32)])])
        return self.op(scope, "Mul", [y, self.const(scope, 0.5, np.float32)])

    def attention(self, scope: str, x: str, seq: int, batch: int, width: int, heads: int,
                  dynamic: bool) -> str:
        """nn.MultiheadAttention(width, heads, batch_first=True) of x [B, S, E] with itself."""
        prefix, head = scope[1:].replace("/", "."), width // heads
        t = self.op(scope, "Transpose", [x], perm=[1, 0, 2])  # [S, B, E]
        s = b = heads_b = None
        if dynamic:
            s, b = self.dim(scope, t, 0), self.dim(scope, t, 1)
            heads_b = self.op(scope, "Mul", [b, self.const(scope, heads)])
        proj = self.op(scope, "MatMul", [t, self.weight(f"onnx::MatMul_{prefix}",
                                                        [width, 3 * width])])
        proj = self.op(scope, "Add", [self.weight(f"{prefix}.in_proj_bias", [3 * width]), proj])
        # proj.unflatten(-1, (3, E)): the dim as Mod(2, 3), the shape sliced around it
        mod = self.op(scope, "Mod", [self.const(scope, [2]), self.const(scope, [3])])
        shape = self.op(scope, "Shape", [proj])
        lead = self.op(scope, "Slice", [shape, self.const(scope, [0]), self.op(
            scope, "Reshape", [mod, self.const(scope, [1])])])
        after = self.op(scope, "Reshape", [self.op(scope, "Add", [mod, self.const(scope, [1])]),
                                           self.const(scope, [1])])
        tail = self.op(scope, "Slice", [shape, after, self.const(scope, [INT64_MAX])])
        target = self.op(scope, "Concat", [lead, self.const(scope, [3, width]), tail], axis=0)
        qkv = self.op(scope, "Reshape", [proj, target], allowzero=0)  # [S, B, 3, E]
        qkv = self.op(scope, "Unsqueeze", [qkv, self.const(scope, [0])])
        qkv = self.op(scope, "Transpose", [qkv], perm=[3, 1, 2, 0, 4])
        qkv = self.op(scope, "Squeeze", [qkv, self.const(scope, [3])])  # [3, S, B, E]
        per_head, split = [], []
        for k in range(3):  # q, k, v: .view(S, B * H, D).transpose(0, 1).view(B, H, S, D)
            part = self.op(scope, "Gather", [qkv, self.const(scope, k)], axis=0)
            rows = self.shape_of(scope, [s, heads_b, head]) if dynamic else \
                self.const(scope, [seq, batch * heads, head])
            part = self.op(scope, "Transpose", [self.op(scope, "Reshape", [part, rows],
                                                         allowzero=0)], perm=[1, 0, 2])
            split.append(part)
        for part in split:
            four = self.shape_of(scope, [b, heads, s, head]) if dynamic else \
                self.const(scope, [batch, heads, seq, head])
            per_head.append(self.op(scope, "Reshape", [part, four], allowzero=0))
        q, k, v = per_head
        # scaled_dot_product_attention: the scale 1 / sqrt(D) from the shape
        last = self.op(scope, "Slice", [self.op(scope, "Shape", [q]), self.const(scope, [-1]),
                                        self.const(scope, [INT64_MAX])])
        root = self.op(scope, "Sqrt", [self.op(scope, "Cast", [last], to=TensorProto.FLOAT)])
        scale = self.op(scope, "Cast", [self.op(scope, "Div", [
            self.const(scope, [1.0], np.float32), root])], to=TensorProto.FLOAT)
        kt = self.op(scope, "Transpose", [k], perm=[0, 1, 3, 2])
        q = self.op(scope, "Mul", [q, self.op(scope, "Sqrt", [scale])])
        kt = self.op(scope, "Mul", [kt, self.op(scope, "Sqrt", [scale])])
        probs = self.op(scope, "Softmax", [self.op(scope, "MatMul", [q, kt])], axis=-1)
        out = self.op(scope, "Transpose", [self.op(scope, "MatMul", [probs, v])],
                      perm=[2, 0, 1, 3])  # [S, B, H, D]
        rows = self.shape_of(scope, [self.op(scope, "Mul", [s, b]), width]) if dynamic else \
            self.const(scope, [seq * batch, width])
        out = self.op(scope, "Gemm", [self.op(scope, "Reshape", [out, rows], allowzero=0),
                                      self.weight(f"{prefix}.out_proj.weight", [width, width]),
                                      self.weight(f"{prefix}.out_proj.bias", [width])],
                      alpha=1.0, beta=1.0, transB=1)
        back = self.shape_of(scope, [s, b, width]) if dynamic else \
            self.const(scope, [seq, batch, width])
        out = self.op(scope, "Reshape", [out, back], allowzero=0)
        return self.op(scope, "Transpose", [out], perm=[1, 0, 2])  # [B, S, E]


def encoder(opset: int = 17, dynamic: bool = False, seq: int = 8, width: int = 32,
            heads: int = 4, ff: int = 64, layers: int = 2) -> ModelProto:
    """nn.TransformerEncoder(nn.TransformerEncoderLayer(width, heads, ff, dropout=0,
    batch_first=True), layers) of data [1, seq, width] (batch N with `dynamic`)."""
    g = TorchGraph(seed=17, opset=opset)
    x = "data"
    for n in range(layers):
        scope = f"/layers.{n}"
        attn = g.attention(f"{scope}/self_attn", x, seq, 1, width, heads, dynamic)
        # every norm's bias equal to the first's (zeros when fresh): torch shares it
        x = g.layer_norm(f"{scope}/norm1", g.op(scope, "Add", [x, attn]), width,
                         "layers.0.norm1.bias" if n else None)
        hidden = g.op(scope, "Relu", [g.linear(f"{scope}/linear1", x, width, ff)])
        y = g.linear(f"{scope}/linear2", hidden, ff, width)
        x = g.layer_norm(f"{scope}/norm2", g.op(scope, "Add", [x, y]), width,
                         "layers.0.norm1.bias")
    g.nodes.append(helper.make_node("Identity", [x], ["out"], name="/Identity_out"))
    batch = "N" if dynamic else 1
    return g.model({"data": [batch, seq, width]}, {"out": [batch, seq, width]})


def vit(opset: int = 16, dynamic: bool = False, image: int = 16, patch: int = 4,
        width: int = 32, heads: int = 4, ff: int = 64, layers: int = 2,
        classes: int = 10) -> ModelProto:
    """torchvision's VisionTransformer(image, patch, layers, heads, width, ff) with `classes`
    outputs, of data [1, 3, image, image] (batch N with `dynamic`)."""
    g = TorchGraph(seed=16, opset=opset)
    tokens = (image // patch) ** 2
    x = g.op("/conv_proj", "Conv", ["data", g.weight("conv_proj.weight", [width, 3, patch,
                                                                             patch]),
                                    g.weight("conv_proj.bias", [width])],
             dilations=[1, 1], group=1, kernel_shape=[patch, patch], pads=[0, 0, 0, 0],
             strides=[patch, patch])
    n = g.dim("", "data", 0) if dynamic else None
    flat = g.shape_of("", [n, width, tokens]) if dynamic else g.const("", [1, width, tokens])
    x = g.op("", "Transpose", [g.op("", "Reshape", [x, flat], allowzero=0)], perm=[0, 2, 1])
    # class_token.expand(n, -1, -1)
    sizes = g.shape_of("", [n, -1, -1]) if dynamic else g.const("", [1, -1, -1])
    ones = g.op("", "ConstantOfShape", [g.const("", [3])],
                value=numpy_helper.from_array(np.array([1], np.int64)))
    minus = g.op("", "Mul", [ones, g.const("", -1)])
    sizes = g.op("", "Where", [g.op("", "Equal", [sizes, minus]), ones, sizes])
    token = g.op("", "Expand", [g.weight("class_token", [1, 1, width]), sizes])
    x = g.op("", "Concat", [token, x], axis=1)
    x = g.op("", "Add", [x, g.weight("pos_embedding", [1, tokens + 1, width])])
    for k in range(layers):
        scope = f"/encoder/layers.{k}"
        attn = g.attention(f"{scope}/self_attn", g.layer_norm(f"{scope}/norm1", x, width),
                           tokens + 1, 1, width, heads, dynamic)
        x = g.op(scope, "Add", [x, attn])
        hidden = g.gelu(scope, g.linear(f"{scope}/linear1", g.layer_norm(
            f"{scope}/norm2", x, width), width, ff))
        x = g.op(scope, "Add", [x, g.linear(f"{scope}/linear2", hidden, ff, width)])
    x = g.layer_norm("/ln", x, width)
    x = g.op("", "Gather", [x, g.const("", 0)], axis=1)
    g.nodes.append(helper.make_node("Gemm", [x, g.weight("head.weight", [classes, width]),
                                             g.weight("head.bias", [classes])], ["out"],
                                    name="/head/Gemm", alpha=1.0, beta=1.0, transB=1))
    batch = "N" if dynamic else 1
    return g.model({"data": [batch, 3, image, image]}, {"out": [batch, classes]})

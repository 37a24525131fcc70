"""Small float32 ONNX models (opset 13) built in code with `onnx.helper`, for the ONNX ->
NNEF conversion tests (`tests/frontend/test_onnx_convert.py`) and any later test that
compiles the converted models and compares them with ONNX Runtime.

`MODELS` maps a name to a builder returning an `onnx.ModelProto`; `random_inputs(model)`
gives a fixed-seed feed dict for it. Weights come from a fixed seed too, so every build of
a model is the same model. Import this module only where `onnx` is installed.
"""
from __future__ import annotations

import numpy as np
from onnx import ModelProto, TensorProto, helper, numpy_helper

OPSET = 13


class _Builder:
    """Collects nodes and float32 initializers of one graph (weights from a fixed seed)."""

    def __init__(self, seed: int):
        self.rng = np.random.default_rng(seed)
        self.nodes = []
        self.inits = []

    def weight(self, name: str, shape, scale: float = 0.3) -> str:
        """A random float32 initializer."""
        return self.const(name, self.rng.normal(0.0, scale, shape).astype(np.float32))

    def const(self, name: str, value: np.ndarray) -> str:
        """An initializer holding `value` as given (int64 for shapes, axes, pads)."""
        self.inits.append(numpy_helper.from_array(np.asarray(value), name))
        return name

    def node(self, op: str, inputs: list[str], output: str, **attrs) -> str:
        """Append one node with a single output; returns the output's name."""
        self.nodes.append(helper.make_node(op, inputs, [output], name=output, **attrs))
        return output

    def conv(self, x: str, name: str, cin: int, cout: int, k: int = 3, bias: bool = True,
             **attrs) -> str:
        """Conv with random weights (and bias), `pads` default 'same' for odd `k`."""
        attrs.setdefault("pads", [k // 2] * 4)
        inputs = [x, self.weight(f"{name}_w", [cout, cin, k, k])]
        if bias:
            inputs.append(self.weight(f"{name}_b", [cout]))
        return self.node("Conv", inputs, name, kernel_shape=[k, k], **attrs)

    def batch_norm(self, x: str, name: str, channels: int) -> str:
        """BatchNormalization with random statistics (positive variance)."""
        scale = self.const(f"{name}_scale",
                           self.rng.uniform(0.5, 1.5, channels).astype(np.float32))
        bias = self.weight(f"{name}_bias", [channels])
        mean = self.weight(f"{name}_mean", [channels])
        var = self.const(f"{name}_var", self.rng.uniform(0.5, 2.0, channels).astype(np.float32))
        return self.node("BatchNormalization", [x, scale, bias, mean, var], name, epsilon=1e-5)

    def model(self, name: str, inputs: dict[str, list[int]],
              outputs: dict[str, list[int]]) -> ModelProto:
        """The checked ModelProto of the collected graph."""
        def info(items):
            return [helper.make_tensor_value_info(n, TensorProto.FLOAT, s)
                    for n, s in items.items()]
        graph = helper.make_graph(self.nodes, name, info(inputs), info(outputs), self.inits)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)],
                                  producer_name="cvmc-tests")
        model.ir_version = 8  # what onnxruntime of every supported version reads
        from onnx import checker
        checker.check_model(model, full_check=True)
        return model


def cnn() -> ModelProto:
    """Conv+bias, BatchNormalization, Relu, MaxPool, a Conv without bias, AveragePool,
    Flatten, Gemm and Softmax: a classifier of 1x3x16x16 images into 10 classes."""
    b = _Builder(seed=1)
    x = b.conv("data", "conv1", 3, 8)
    x = b.batch_norm(x, "bn1", 8)
    x = b.node("Relu", [x], "relu1")
    x = b.node("MaxPool", [x], "pool1", kernel_shape=[2, 2], strides=[2, 2])
    x = b.conv(x, "conv2", 8, 16, bias=False, strides=[1, 1])
    x = b.node("Relu", [x], "relu2")
    x = b.node("AveragePool", [x], "pool2", kernel_shape=[2, 2], strides=[2, 2])
    x = b.node("Flatten", [x], "flat", axis=1)
    x = b.node("Gemm", [x, b.weight("fc_w", [10, 16 * 4 * 4], 0.1), b.weight("fc_b", [10])],
               "fc", transB=1)
    b.node("Softmax", [x], "prob", axis=1)
    return b.model("cnn", {"data": [1, 3, 16, 16]}, {"prob": [1, 10]})


def mlp() -> ModelProto:
    """Gemm with transposed and with plain weights, MatMul + Add, Relu, Tanh."""
    b = _Builder(seed=2)
    x = b.node("Gemm", ["x", b.weight("w1", [64, 32], 0.2), b.weight("b1", [64])], "fc1",
               transB=1)
    x = b.node("Relu", [x], "act1")
    x = b.node("MatMul", [x, b.weight("w2", [64, 16], 0.2)], "mm2")
    x = b.node("Add", [x, b.weight("b2", [16])], "fc2")
    x = b.node("Tanh", [x], "act2")
    b.node("Gemm", [x, b.weight("w3", [16, 4]), b.weight("b3", [4])], "y")
    return b.model("mlp", {"x": [2, 32]}, {"y": [2, 4]})


def shapes() -> ModelProto:
    """Pad, Concat, Resize (nearest and linear), Transpose, Reshape, ReduceMean,
    ReduceSum, Clip, Sigmoid and Tanh, with two outputs."""
    b = _Builder(seed=3)
    i64 = np.int64
    x = b.node("Sigmoid", ["x"], "sig")                                        # 1x4x4x4
    p = b.node("Pad", [x, b.const("pads", np.array([0, 0, 2, 1, 0, 0, 2, 3], i64)),
                       b.const("pad_value", np.array(0.5, np.float32))], "pad")  # 1x4x8x8
    t = b.node("Tanh", ["x"], "tanh")
    t = b.node("Resize", [t, "", b.const("up_scales", np.array([1, 1, 2, 2], np.float32))],
               "up_nearest", mode="nearest", coordinate_transformation_mode="asymmetric",
               nearest_mode="floor")                                           # 1x4x8x8
    c = b.node("Concat", [p, t], "cat", axis=1)                                # 1x8x8x8
    c = b.node("Resize", [c, "", b.const("lin_scales", np.array([1, 1, 2, 2], np.float32))],
               "up_linear", mode="linear", coordinate_transformation_mode="half_pixel")
    c = b.node("Transpose", [c], "nhwc", perm=[0, 2, 3, 1])                    # 1x16x16x8
    c = b.node("Reshape", [c, b.const("shape", np.array([1, 256, 8], i64))], "rows")
    m = b.node("ReduceMean", [c], "mean", axes=[1], keepdims=1)                # 1x1x8
    b.node("Clip", [m, b.const("lo", np.array(0.2, np.float32)),
                    b.const("hi", np.array(0.8, np.float32))], "clipped")
    b.node("ReduceSum", [c, b.const("sum_axes", np.array([2], i64))], "sums", keepdims=0)
    return b.model("shapes", {"x": [1, 4, 4, 4]}, {"clipped": [1, 1, 8], "sums": [1, 256]})


def residual() -> ModelProto:
    """A ResNet basic block: conv-bn-relu-conv-bn, the identity added, relu."""
    b = _Builder(seed=4)
    x = b.conv("data", "conv1", 8, 8, bias=False)
    x = b.batch_norm(x, "bn1", 8)
    x = b.node("Relu", [x], "relu1")
    x = b.conv(x, "conv2", 8, 8, bias=False)
    x = b.batch_norm(x, "bn2", 8)
    x = b.node("Add", [x, "data"], "sum")
    b.node("Relu", [x], "out")
    return b.model("residual", {"data": [1, 8, 8, 8]}, {"out": [1, 8, 8, 8]})


def fragments() -> ModelProto:
    """Ops NNEF-Tools writes as fragments it defines in the document (Erf, ReduceL2,
    DepthToSpace, LpPool), LeakyRelu, and a Softmax without
    `axis` on a rank-3 tensor (opset 13: the last axis)."""
    b = _Builder(seed=5)
    x = b.node("Erf", ["x"], "erf")
    b.node("ReduceL2", [x], "norms", axes=[1], keepdims=1)                     # 1x1x4x4
    d = b.node("DepthToSpace", ["x"], "d2s", blocksize=2, mode="DCR")          # 1x1x8x8
    b.node("LeakyRelu", [d], "leaky", alpha=0.2)
    b.node("LpPool", ["x"], "lp", kernel_shape=[2, 2], strides=[2, 2], p=2)    # 1x4x2x2
    r = b.node("Reshape", ["x", b.const("rank3", np.array([1, 4, 16], np.int64))], "r3")
    b.node("Softmax", [r], "soft")
    return b.model("fragments", {"x": [1, 4, 4, 4]},
                   {"norms": [1, 1, 4, 4], "leaky": [1, 1, 8, 8], "lp": [1, 4, 2, 2],
                    "soft": [1, 4, 16]})


def elementwise() -> ModelProto:
    """Element-wise ops only: Add (broadcast over a [1, 8] weight), Sub, Mul, Div, Neg,
    Abs, Sqrt, Exp, Sigmoid, Tanh, Relu, Greater + Where, Clip."""
    b = _Builder(seed=8)
    x = b.node("Add", ["x", b.weight("bias", [1, 8])], "shifted")
    y = b.node("Mul", [x, "y"], "prod")
    y = b.node("Sub", [y, b.node("Tanh", ["y"], "tanh")], "diff")
    d = b.node("Div", [b.node("Sigmoid", [x], "sig"),
                       b.node("Sqrt", [b.node("Exp", [b.node("Abs", ["y"], "abs")], "exp")],
                              "root")], "ratio")
    w = b.node("Where", [b.node("Greater", [x, "y"], "gt"), b.node("Relu", [y], "relu"),
                         b.node("Neg", [d], "neg")], "picked")
    b.node("Clip", [w, b.const("lo", np.array(-0.5, np.float32)),
                    b.const("hi", np.array(1.5, np.float32))], "out")
    return b.model("elementwise", {"x": [2, 8], "y": [2, 8]}, {"out": [2, 8]})


def lstm() -> ModelProto:
    """A one-layer LSTM over 3 steps (NNEF-Tools writes it as the recursive fragment
    `lstm_loop`; it needs initial_h and initial_c and no sequence_lens)."""
    b = _Builder(seed=7)
    inputs = ["x", b.weight("W", [1, 20, 4]), b.weight("R", [1, 20, 5]), b.weight("B", [1, 40]),
              "", b.weight("h0", [1, 1, 5]), b.weight("c0", [1, 1, 5])]
    b.nodes.append(helper.make_node("LSTM", inputs, ["", "h", "c"], name="lstm",
                                    hidden_size=5))
    return b.model("lstm", {"x": [3, 1, 4]}, {"h": [1, 1, 5], "c": [1, 1, 5]})


def unsupported() -> ModelProto:
    """A model with an op the Khronos converter cannot convert (TopK)."""
    b = _Builder(seed=6)
    k = b.const("k", np.array([2], np.int64))
    b.nodes.append(helper.make_node("TopK", ["x", k], ["values", "indices"], name="topk"))
    graph = helper.make_graph(
        b.nodes, "topk", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8])],
        [helper.make_tensor_value_info("values", TensorProto.FLOAT, [1, 2]),
         helper.make_tensor_value_info("indices", TensorProto.INT64, [1, 2])], b.inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])


MODELS = {"cnn": cnn, "mlp": mlp, "shapes": shapes, "residual": residual,
          "fragments": fragments, "lstm": lstm, "elementwise": elementwise}


def random_inputs(model: ModelProto, seed: int = 0) -> dict[str, np.ndarray]:
    """Standard-normal float32 values for every graph input (fixed seed)."""
    rng = np.random.default_rng(seed)
    inits = {t.name for t in model.graph.initializer}
    return {i.name: rng.standard_normal([d.dim_value for d in i.type.tensor_type.shape.dim])
            .astype(np.float32) for i in model.graph.input if i.name not in inits}

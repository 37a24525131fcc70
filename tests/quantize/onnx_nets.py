"""Small float ONNX models for the quantizer's tests, built with onnx.helper."""
from __future__ import annotations

import numpy as np


def _model(nodes, inits, x_shape, out, out_shape):
    from onnx import TensorProto, helper, numpy_helper
    graph = helper.make_graph(
        nodes, "net", [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)],
        [helper.make_tensor_value_info(out, TensorProto.FLOAT, out_shape)],
        [numpy_helper.from_array(a.astype(np.float32), n) for n, a in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model


def div_net(node_name: str = ""):
    """y = x / x on a 3x3 input: a Div, which the quantizer has no rule for."""
    from onnx import helper
    return _model([helper.make_node("Div", ["x", "x"], ["y"], name=node_name)], {}, [3, 3],
                  "y", [3, 3])


def conv_bn_net(seed: int = 0):
    """conv / BN / relu / maxpool / conv / BN / relu / flatten / gemm (MNIST-like, 1x12x12)."""
    from onnx import helper
    r = np.random.default_rng(seed)
    inits = {"w1": r.standard_normal((6, 1, 3, 3)) * 0.4, "b1": r.standard_normal(6) * 0.1,
             "g1": r.random(6) + 0.5, "o1": r.standard_normal(6) * 0.1,
             "m1": r.standard_normal(6) * 0.1, "v1": r.random(6) + 0.5,
             "w2": r.standard_normal((8, 6, 3, 3)) * 0.2, "b2": r.standard_normal(8) * 0.1,
             "g2": r.random(8) + 0.5, "o2": r.standard_normal(8) * 0.1,
             "m2": r.standard_normal(8) * 0.1, "v2": r.random(8) + 0.5,
             "wf": r.standard_normal((10, 8 * 3 * 3)) * 0.2, "bf": r.standard_normal(10) * 0.1}
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
             helper.make_node("BatchNormalization", ["c1", "g1", "o1", "m1", "v1"], ["n1"]),
             helper.make_node("Relu", ["n1"], ["r1"]),
             helper.make_node("MaxPool", ["r1"], ["p1"], kernel_shape=[2, 2], strides=[2, 2]),
             helper.make_node("Conv", ["p1", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1]),
             helper.make_node("BatchNormalization", ["c2", "g2", "o2", "m2", "v2"], ["n2"]),
             helper.make_node("Relu", ["n2"], ["r2"]),
             helper.make_node("MaxPool", ["r2"], ["p2"], kernel_shape=[2, 2], strides=[2, 2]),
             helper.make_node("Flatten", ["p2"], ["f"]),
             helper.make_node("Gemm", ["f", "wf", "bf"], ["logits"], transB=1)]
    return _model(nodes, inits, [1, 1, 12, 12], "logits", [1, 10])


def branchy_net(seed: int = 1):
    """conv / relu, a residual add, a concat of a conv branch and a 4x larger-scaled branch,
    a sigmoid, a padded average pool, clip, tanh, global average pool, gemm, softmax."""
    from onnx import helper
    r = np.random.default_rng(seed)
    inits = {"w1": r.standard_normal((4, 2, 3, 3)) * 0.4, "b1": r.standard_normal(4) * 0.1,
             "w2": r.standard_normal((4, 4, 3, 3)) * 0.3, "b2": r.standard_normal(4) * 0.1,
             "w3": r.standard_normal((4, 4, 1, 1)) * 1.5, "b3": r.standard_normal(4),
             "wf": r.standard_normal((5, 8)) * 0.5, "bf": r.standard_normal(5) * 0.1}
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c1"], ["r1"]),
             helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1]),
             helper.make_node("Add", ["c2", "r1"], ["res"]),
             helper.make_node("Relu", ["res"], ["r2"]),
             helper.make_node("Conv", ["r2", "w3", "b3"], ["big"]),
             helper.make_node("Sigmoid", ["r2"], ["sig"]),
             helper.make_node("Concat", ["big", "sig"], ["cat"], axis=1),
             helper.make_node("AveragePool", ["cat"], ["ap"], kernel_shape=[3, 3],
                              pads=[1, 1, 1, 1], strides=[1, 1]),
             helper.make_node("Clip", ["ap", "lo", "hi"], ["cl"]),
             helper.make_node("Tanh", ["cl"], ["th"]),
             helper.make_node("GlobalAveragePool", ["th"], ["gap"]),
             helper.make_node("Flatten", ["gap"], ["f"]),
             helper.make_node("Gemm", ["f", "wf", "bf"], ["y"], transB=1),
             helper.make_node("Softmax", ["y"], ["prob"], axis=1)]
    inits.update({"lo": np.array(-2.0), "hi": np.array(3.0)})
    return _model(nodes, inits, [1, 2, 8, 8], "prob", [1, 5])


def torch_like_net(seed: int = 2):
    """What torch.onnx.export writes for a small conv net: the scalar of a Mul as a
    Constant node, an Identity, one conv weight and bias shared by two convs, a residual
    add, a sigmoid, a concat, global average pooling and a gemm."""
    from onnx import helper, numpy_helper
    r = np.random.default_rng(seed)
    inits = {"w1": r.standard_normal((4, 2, 3, 3)) * 0.4, "b1": r.standard_normal(4) * 0.1,
             "w2": r.standard_normal((4, 4, 3, 3)) * 0.25, "b2": r.standard_normal(4) * 0.1,
             "wf": r.standard_normal((5, 8)) * 0.5, "bf": r.standard_normal(5) * 0.1}
    half = numpy_helper.from_array(np.array(0.5, np.float32))
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c1"], ["r1"]),
             helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c2"], ["r2"]),
             helper.make_node("Conv", ["r2", "w2", "b2"], ["c3"], pads=[1, 1, 1, 1]),
             helper.make_node("Add", ["c3", "r1"], ["res"]),
             helper.make_node("Constant", [], ["k"], value=half),
             helper.make_node("Mul", ["res", "k"], ["m"]),
             helper.make_node("Identity", ["m"], ["mi"]),
             helper.make_node("Sigmoid", ["mi"], ["sg"]),
             helper.make_node("Concat", ["sg", "r1"], ["cat"], axis=1),
             helper.make_node("GlobalAveragePool", ["cat"], ["gap"]),
             helper.make_node("Flatten", ["gap"], ["f"]),
             helper.make_node("Gemm", ["f", "wf", "bf"], ["y"], transB=1)]
    return _model(nodes, inits, [1, 2, 8, 8], "y", [1, 5])

"""Whole-network benchmark models: CVM ResNet-18 and MobileNet-v1 (224x224, batch 1) with
random weights of the right precisions, their ONNX Runtime twins and their QDQ twins.

    python benchmarks/models.py resnet18 -o DIR      # an NNEF folder cvmc compiles
    python benchmarks/models.py mobilenet_v1 -o DIR

A network is a list of layers, written three ways side by side:
- NNEF (the CVM integer dialect), what cvmc compiles;
- the ONNX Runtime twin, with the quantized operators a user would deploy with ONNX
  Runtime: QLinearConv (u8 activations, s8 weights, int32 bias), MaxPool on u8, QLinearAdd
  and QLinearGlobalAveragePool (com.microsoft), MatMulInteger + Add for the classifier;
- the QDQ twin, standard ONNX only (OpenVINO rejects the com.microsoft ops): float Conv,
  Add, MaxPool, GlobalAveragePool and Gemm between DequantizeLinear (u8 activations, s8
  weights, int32 bias) and QuantizeLinear (u8), the form quantization tools export and
  OpenVINO's low-precision transformations turn into int8 kernels.
The twins have the same shapes and do the same work; their bits differ (ONNX requantizes
with round-half-even and float scales, CVM with a rounding right shift), so only cvmc is
checked bit-exactly (against the reference interpreter); a twin's output shape is
checked.

Activations are 8-bit. In CVM a layer is conv2d (+bias) -> cvm_right_shift(8 bits) [->
relu]; in ONNX the same requantization by 2^shift to u8 with zero point 0 (relu: negative
values saturate to 0) or 128 (no relu).
"""
from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

SEED = 2024


def _node(op: str, inputs: list[str], outputs: list[str], **attrs) -> tuple:
    """An ONNX node, recorded as plain data (onnx is imported only to build the model)."""
    return op, inputs, outputs, attrs


def _dq(x: str, zero_point: str, out: str) -> tuple:
    """DequantizeLinear of `x` with scale 1 (the twins' integers are CVM's integers)."""
    return _node("DequantizeLinear", [x, "one", zero_point], [out])


def _zp(net: Net, x: str) -> str:
    """The u8 zero point of activation `x`: 0 after a relu (negatives saturate), else 128."""
    return "zp0" if net.relu_of[x] else "zp128"


@dataclass
class Net:
    """Layers as NNEF statement lines and ONNX nodes, built side by side."""

    name: str
    input_shape: tuple[int, ...]
    rng: np.random.Generator = field(default_factory=lambda: np.random.default_rng(SEED))
    lines: list[str] = field(default_factory=list)
    weights: dict[str, np.ndarray] = field(default_factory=dict)
    onnx_nodes: list = field(default_factory=list)
    qdq_nodes: list = field(default_factory=list)
    onnx_consts: dict[str, np.ndarray] = field(default_factory=dict)
    relu_of: dict[str, bool] = field(default_factory=dict)  # ONNX zero point 0 vs 128
    shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)
    count: int = 0

    def fresh(self, stem: str) -> str:
        self.count += 1
        return f"{stem}{self.count}"

    def weight(self, name: str, array: np.ndarray, precision: int) -> None:
        self.weights[name] = array
        self.lines.append(f'{name} = variable<integer>(shape = {list(array.shape)}, '
                          f'label = "{name}", precision = {precision})')

    def conv(self, x: str, oc: int, k: int, stride: int = 1, groups: int = 1,
             relu: bool = True) -> str:
        """conv2d + bias -> cvm_right_shift to 8 bits [-> relu]."""
        n, c, h, w = self.shapes[x]
        pad = k // 2
        name = self.fresh("conv")
        wt = self.rng.integers(-127, 128, (oc, c // groups, k, k)).astype(np.int8)
        b = self.rng.integers(-2**14, 2**14, (oc,)).astype(np.int32)
        self.weight(f"{name}_w", wt, 8)
        self.weight(f"{name}_b", b, 16)
        # Inputs of std ~50, weights ~73: keep the output spread near 50 (8 bits, little
        # saturation).
        shift = max(1, round(np.log2(np.sqrt(c // groups * k * k) * 73.3)))
        acc, out = f"{name}_acc", f"{name}_out"
        self.lines.append(f"{acc} = conv2d({x}, {name}_w, {name}_b, padding = [{pad}, {pad}], "
                          f"stride = [{stride}, {stride}], dilation = [1, 1], "
                          f"groups = {groups})")
        shifted = f"{name}_s" if relu else out
        self.lines.append(f"{shifted} = cvm_right_shift({acc}, precision = 8, "
                          f"shift_bit = {shift})")
        if relu:
            self.lines.append(f"{out} = relu({shifted})")
        oh, ow = (h + 2 * pad - k) // stride + 1, (w + 2 * pad - k) // stride + 1
        self.shapes[out] = (n, oc, oh, ow)
        self.relu_of[out] = relu
        yscale = f"{name}_yscale"
        attrs = {"pads": [pad] * 4, "strides": [stride] * 2, "group": groups}
        self.onnx_consts.update({f"{name}_w": wt, f"{name}_b": b,
                                 yscale: np.array(2.0 ** shift, np.float32)})
        self.onnx_nodes.append(_node(
            "QLinearConv", [x, "one", _zp(self, x), f"{name}_w", "one", "wzp", yscale,
                            _zp(self, out), f"{name}_b"], [out], **attrs))
        self.qdq_nodes += [
            _dq(f"{name}_w", "wzp", f"{name}_wf"), _dq(f"{name}_b", "bzp", f"{name}_bf"),
            _dq(x, _zp(self, x), f"{name}_xf"),
            _node("Conv", [f"{name}_xf", f"{name}_wf", f"{name}_bf"], [f"{name}_yf"], **attrs),
            _node("QuantizeLinear", [f"{name}_yf", yscale, _zp(self, out)], [out])]
        return out

    def max_pool(self, x: str) -> str:
        n, c, h, w = self.shapes[x]
        out = self.fresh("pool")
        self.lines.append(f"{out} = max_pool2d({x}, pool_size = [3, 3], padding = [1, 1], "
                          f"strides = [2, 2], ceil_mode = false)")
        self.shapes[out] = (n, c, (h - 1) // 2 + 1, (w - 1) // 2 + 1)
        attrs = {"kernel_shape": [3, 3], "pads": [1] * 4, "strides": [2, 2]}
        self.onnx_nodes.append(_node("MaxPool", [x], [out], **attrs))
        self.relu_of[out] = self.relu_of[x]
        self.qdq_nodes += [_dq(x, _zp(self, x), f"{out}_xf"),
                           _node("MaxPool", [f"{out}_xf"], [f"{out}_yf"], **attrs),
                           _node("QuantizeLinear", [f"{out}_yf", "one", _zp(self, out)], [out])]
        return out

    def add_relu(self, a: str, b: str) -> str:
        """elemwise_add -> cvm_clip(8) -> relu (a residual join)."""
        out = self.fresh("add")
        self.lines += [f"{out}_s = elemwise_add({a}, {b})",
                       f"{out}_c = cvm_clip({out}_s, precision = 8)", f"{out} = relu({out}_c)"]
        self.shapes[out] = self.shapes[a]
        self.relu_of[out] = True
        self.onnx_nodes.append(_node(
            "QLinearAdd", [a, "one", _zp(self, a), b, "one", _zp(self, b), "one", "zp0"],
            [out], domain="com.microsoft"))
        self.qdq_nodes += [_dq(a, _zp(self, a), f"{out}_af"), _dq(b, _zp(self, b), f"{out}_bf"),
                           _node("Add", [f"{out}_af", f"{out}_bf"], [f"{out}_yf"]),
                           _node("QuantizeLinear", [f"{out}_yf", "one", "zp0"], [out])]
        return out

    def classifier(self, x: str, classes: int = 1000) -> str:
        """sum over H, W -> right shift to 8 bits -> dense + bias."""
        _, c, h, w = self.shapes[x]
        wt = self.rng.integers(-127, 128, (classes, c)).astype(np.int8)
        b = self.rng.integers(-2**14, 2**14, (classes,)).astype(np.int32)
        self.weight("fc_w", wt, 8)
        self.weight("fc_b", b, 16)
        shift = max(1, (h * w).bit_length() - 1)  # ~ the average
        self.lines += [f"gsum = sum({x}, axes = [2, 3])",
                       f"gavg = cvm_right_shift(gsum, precision = 8, shift_bit = {shift})",
                       "logits = dense(gavg, fc_w, fc_b)"]
        zp = _zp(self, x)
        self.shapes["logits"] = (1, classes)
        self.onnx_consts.update({"fc_w": wt, "fc_wt": np.ascontiguousarray(wt.T), "fc_b": b,
                                 "flat_shape": np.array([1, c], np.int64)})
        self.onnx_nodes += [
            _node("QLinearGlobalAveragePool", [x, "one", zp, "one", zp],
                             ["gpool"], domain="com.microsoft", channels_last=0),
            _node("Reshape", ["gpool", "flat_shape"], ["gflat"]),
            _node("MatMulInteger", ["gflat", "fc_wt", zp], ["fc"]),
            _node("Add", ["fc", "fc_b"], ["logits"])]
        self.qdq_nodes += [
            _dq(x, zp, "gpool_xf"), _node("GlobalAveragePool", ["gpool_xf"], ["gpool_yf"]),
            _node("QuantizeLinear", ["gpool_yf", "one", zp], ["gpool"]),
            _node("Flatten", ["gpool"], ["gflat_q"], axis=1), _dq("gflat_q", zp, "gflat"),
            _dq("fc_w", "wzp", "fc_wf"), _dq("fc_b", "bzp", "fc_bf"),
            _node("Gemm", ["gflat", "fc_wf", "fc_bf"], ["logits"], transB=1)]
        return "logits"

    def nnef(self) -> str:
        """The NNEF document."""
        decl = (f"data = external<integer>(shape = {list(self.input_shape)}, "
                f"precision = 8)")
        body = "".join(f"    {line};\n" for line in [decl, *self.lines])
        return f"version 1.0;\n\ngraph {self.name}( data ) -> ( logits )\n{{\n{body}}}\n"

    def onnx_model(self):
        """The ONNX Runtime twin (input 'data' as u8 = x + 128, int32 logits). Needs `onnx`."""
        return self._onnx(self.onnx_nodes, "INT32", microsoft=True)

    def qdq_model(self):
        """The standard-ONNX QDQ twin (input 'data' as u8 = x + 128, float32 logits)."""
        return self._onnx(self.qdq_nodes, "FLOAT", microsoft=False)

    def _onnx(self, nodes: list, logits_type: str, microsoft: bool):
        """An ONNX model of `nodes` with every constant the twins use as initializers."""
        from onnx import TensorProto, helper, numpy_helper

        used = {name for _, ins, _, _ in nodes for name in ins}
        consts = {**self.onnx_consts, "one": np.array(1.0, np.float32),
                  "wzp": np.array(0, np.int8), "bzp": np.array(0, np.int32),
                  "zp0": np.array(0, np.uint8), "zp128": np.array(128, np.uint8)}
        graph = helper.make_graph(
            [helper.make_node(op, ins, outs, **attrs) for op, ins, outs, attrs in nodes],
            self.name,
            [helper.make_tensor_value_info("data", TensorProto.UINT8, list(self.input_shape))],
            [helper.make_tensor_value_info("logits", getattr(TensorProto, logits_type),
                                           list(self.shapes["logits"]))],
            [numpy_helper.from_array(v, k) for k, v in consts.items() if k in used])
        opsets = [helper.make_opsetid("", 17)]
        if microsoft:
            opsets.append(helper.make_opsetid("com.microsoft", 1))
        model = helper.make_model(graph, opset_imports=opsets)
        model.ir_version = 8
        return model

    def write(self, folder: Path) -> Path:
        """graph.nnef and the .dat weights in `folder`."""
        from cvmc.frontend.tensorfile import write_tensor

        folder.mkdir(parents=True, exist_ok=True)
        (folder / "graph.nnef").write_text(self.nnef())
        for label, array in self.weights.items():
            write_tensor(folder / f"{label}.dat", array)
        return folder


def _start(name: str, size: int) -> tuple[Net, str]:
    net = Net(name, (1, 3, size, size))
    net.shapes["data"] = net.input_shape
    net.relu_of["data"] = False
    return net, "data"


def resnet18(size: int = 224) -> Net:
    """ResNet-18 (basic blocks [2, 2, 2, 2], widths 64..512)."""
    net, x = _start("resnet18", size)
    x = net.max_pool(net.conv(x, 64, 7, stride=2))
    for width, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
        for block in range(2):
            s = stride if block == 0 else 1
            y = net.conv(net.conv(x, width, 3, stride=s), width, 3, relu=False)
            if s != 1 or net.shapes[x][1] != width:
                x = net.conv(x, width, 1, stride=s, relu=False)
            x = net.add_relu(y, x)
    net.classifier(x)
    return net


def mobilenet_v1(size: int = 224) -> Net:
    """MobileNet-v1 (width 1.0): a 3x3/2 conv, 13 depthwise-separable blocks."""
    net, x = _start("mobilenet_v1", size)
    x = net.conv(x, 32, 3, stride=2)
    blocks = [(64, 1), (128, 2), (128, 1), (256, 2), (256, 1), (512, 2), *[(512, 1)] * 5,
              (1024, 2), (1024, 1)]
    for width, stride in blocks:
        c = net.shapes[x][1]
        x = net.conv(net.conv(x, c, 3, stride=stride, groups=c), width, 1)
    net.classifier(x)
    return net


MODELS = {"resnet18": resnet18, "mobilenet_v1": mobilenet_v1}


def main(argv: list[str] | None = None) -> int:
    """Write a model's NNEF folder."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("model", choices=sorted(MODELS))
    p.add_argument("-o", "--output", required=True, help="folder to write graph.nnef into")
    p.add_argument("--size", type=int, default=224, help="input height and width")
    args = p.parse_args(argv)
    folder = MODELS[args.model](args.size).write(Path(args.output))
    print(f"wrote {folder / 'graph.nnef'}")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    sys.exit(main())

"""Calibration time of `cvmc quantize` on a float ResNet-18 (224x224, random He-initialised
weights and BatchNorm statistics, built with onnx.helper: no PyTorch needed), compiled
(`--calib-on llvm`) against the reference interpreter (`--calib-on reference`).

    python benchmarks/calibration.py [--samples 256] [--reference-samples 4] [--batch 4]

Prints the seconds of each calibration (the float model's compile included for llvm) and
per sample, and of the whole `cvmc quantize` run.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np


def resnet18_onnx(size: int = 224, seed: int = 0):
    """A float ResNet-18 as torchvision lays it out (conv/BN/relu, basic blocks with 1x1
    downsampling shortcuts, max pool, global average pool, gemm), node names in PyTorch's
    export style (`/layer1/layer1.0/conv1/Conv`)."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)
    nodes, inits = [], []

    def weight(name, array):
        inits.append(numpy_helper.from_array(array.astype(np.float32), name))
        return name

    def conv_bn(x, prefix, cin, cout, k, stride, relu):
        w = weight(f"{prefix}.conv.weight",
                   rng.standard_normal((cout, cin, k, k)) * np.sqrt(2 / (cin * k * k)))
        c = f"{prefix}/Conv_output_0"
        nodes.append(helper.make_node("Conv", [x, w], [c], name=f"/{prefix}/Conv",
                                      kernel_shape=[k, k], strides=[stride, stride],
                                      pads=[k // 2] * 4))
        bn = [weight(f"{prefix}.bn.{p}", v) for p, v in (
            ("weight", rng.random(cout) * 0.5 + 0.5), ("bias", rng.standard_normal(cout) * 0.1),
            ("running_mean", rng.standard_normal(cout) * 0.1),
            ("running_var", rng.random(cout) * 0.5 + 0.5))]
        b = f"{prefix}/BatchNormalization_output_0"
        nodes.append(helper.make_node("BatchNormalization", [c, *bn], [b],
                                      name=f"/{prefix}/BatchNormalization"))
        if not relu:
            return b
        r = f"{prefix}/Relu_output_0"
        nodes.append(helper.make_node("Relu", [b], [r], name=f"/{prefix}/Relu"))
        return r

    x = conv_bn("input", "conv1", 3, 64, 7, 2, True)
    nodes.append(helper.make_node("MaxPool", [x], ["maxpool_out"], name="/maxpool/MaxPool",
                                  kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]))
    x, cin = "maxpool_out", 64
    for stage, cout in enumerate((64, 128, 256, 512), start=1):
        for block in range(2):
            prefix = f"layer{stage}/layer{stage}.{block}"
            stride = 2 if block == 0 and stage > 1 else 1
            y = conv_bn(x, f"{prefix}/conv1", cin, cout, 3, stride, True)
            y = conv_bn(y, f"{prefix}/conv2", cout, cout, 3, 1, False)
            short = conv_bn(x, f"{prefix}/downsample", cin, cout, 1, stride, False) \
                if stride != 1 or cin != cout else x
            add, out = f"{prefix}/Add_output_0", f"{prefix}/Relu_1_output_0"
            nodes.append(helper.make_node("Add", [y, short], [add], name=f"/{prefix}/Add"))
            nodes.append(helper.make_node("Relu", [add], [out], name=f"/{prefix}/Relu_1"))
            x, cin = out, cout
    nodes.append(helper.make_node("GlobalAveragePool", [x], ["pool"],
                                  name="/avgpool/GlobalAveragePool"))
    nodes.append(helper.make_node("Flatten", ["pool"], ["flat"], name="/Flatten"))
    w = weight("fc.weight", rng.standard_normal((1000, 512)) * np.sqrt(1 / 512))
    b = weight("fc.bias", rng.standard_normal(1000) * 0.01)
    nodes.append(helper.make_node("Gemm", ["flat", w, b], ["logits"], name="/fc/Gemm",
                                  transB=1))
    graph = helper.make_graph(
        nodes, "resnet18",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, 3, size, size])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, 1000])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def main(argv: list[str] | None = None) -> int:
    import onnx

    import cvmc.cli.quantize as command
    from cvmc.cli import main as cvmc_main

    timed = {}

    def clock(name: str):
        run = getattr(command, name)

        def clocked(*args, **kwargs):
            start = time.perf_counter()
            stats = run(*args, **kwargs)
            timed[name] = time.perf_counter() - start
            return stats
        return clocked
    for name in ("compiled_calibration", "reference_calibration"):
        setattr(command, name, clock(name))

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=256)
    parser.add_argument("--reference-samples", type=int, default=4,
                        help="samples for the reference interpreter's per-sample time (0: skip)")
    parser.add_argument("--batch", type=int, default=4)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="cvmc-calib-bench-") as tmp:
        d = Path(tmp)
        onnx.save(resnet18_onnx(), d / "resnet18.onnx")
        data = np.random.default_rng(1).standard_normal((args.samples, 3, 224, 224))
        np.save(d / "x.npy", data.astype(np.float32))
        runs = [("llvm", args.samples)]
        if args.reference_samples:
            runs.append(("reference", args.reference_samples))
        for how, count in runs:
            start = time.perf_counter()
            code = cvmc_main(["quantize", str(d / "resnet18.onnx"), "-o", str(d / f"q-{how}"),
                              "--calib", f"input={d / 'x.npy'}", "--samples", str(count),
                              "--calib-on", how, "--calib-batch", str(args.batch)])
            seconds = time.perf_counter() - start
            if code:
                return code
            calib = timed["compiled_calibration" if how == "llvm" else "reference_calibration"]
            print(f"{how}: {count} samples: calibration {calib:.1f} s ({calib / count:.3f} s "
                  f"per sample{', the compile included' if how == 'llvm' else ''}); the whole "
                  f"quantize {seconds:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())

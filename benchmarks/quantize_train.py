"""Float models for the quantization benchmark (issue 19), trained or built with torch.

    /tmp/torch-venv/bin/python benchmarks/quantize_train.py [--cache DIR] [--epochs N]

Not part of CI and not a cvmc dependency: run it with a Python that has torch, torchvision
and onnx (the cvmc venv does not need them). It writes into the cache folder of
`quantize_data.py`, outside git:
- models/mnist_cnn.onnx: conv/BN/relu/max-pool twice, then two dense layers;
- models/mnist_branchy.onnx: a residual add, a concat of a relu branch and a sigmoid branch
  (differently scaled), average pools and a global average pool;
  both trained on the 3,500 MNIST training images (random shifts of up to 2 pixels), with
  a fixed seed, and their float top-1 on the 1,500 held-out images in models/train.json;
- models/resnet18.onnx, models/mobilenet_v2.onnx: torchvision's networks with random
  weights (seeded), for speed; batch 1, 3x224x224.
All are exported in eval mode (BatchNorm as its running statistics), batch 1, opset 13.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch
from torch import nn
from torch.nn import functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from quantize_data import CACHE, SEED, mnist, mnist_float, write_atomic

OPSET = 13
IMAGENET_SHAPE = (1, 3, 224, 224)
MAX_SHIFT = 2  # pixels of random translation while training


def conv_bn(cin: int, cout: int, kernel: int = 3) -> nn.Sequential:
    """A conv without bias, then BatchNorm (folded into the conv by a quantizer)."""
    return nn.Sequential(nn.Conv2d(cin, cout, kernel, padding=kernel // 2, bias=False),
                         nn.BatchNorm2d(cout))


class MnistCnn(nn.Module):
    """conv/BN/relu/max-pool x2 -> dense -> relu -> dense."""

    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(conv_bn(1, 16), nn.ReLU(), nn.MaxPool2d(2),
                                      conv_bn(16, 32), nn.ReLU(), nn.MaxPool2d(2))
        self.fc1 = nn.Linear(32 * 7 * 7, 64)
        self.fc2 = nn.Linear(64, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.relu(self.fc1(self.features(x).flatten(1))))


class MnistBranchy(nn.Module):
    """stem -> avg-pool -> residual block (add) -> concat(relu branch, sigmoid branch) ->
    avg-pool -> conv -> global average pool -> dense: every rewrite issue 19 names for the
    MNIST targets."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = conv_bn(1, 24)
        self.res1 = conv_bn(24, 24)
        self.res2 = conv_bn(24, 24)
        self.relu_branch = conv_bn(24, 24)
        self.sigmoid_branch = nn.Conv2d(24, 24, 1)
        self.mix = conv_bn(48, 64)
        self.fc = nn.Linear(64, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.avg_pool2d(F.relu(self.stem(x)), 2)  # 14x14
        x = F.relu(x + self.res2(F.relu(self.res1(x))))
        x = torch.cat([F.relu(self.relu_branch(x)), torch.sigmoid(self.sigmoid_branch(x))], 1)
        x = F.relu(self.mix(F.avg_pool2d(x, 2)))  # 7x7
        return self.fc(F.adaptive_avg_pool2d(x, 1).flatten(1))


MNIST_MODELS = {"mnist_cnn": MnistCnn, "mnist_branchy": MnistBranchy}


def shifted(x: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """Each image moved by a random whole number of pixels (up to MAX_SHIFT each way),
    zeros shifted in: the augmentation that lets 3,500 images reach about 99%."""
    padded = F.pad(x, [MAX_SHIFT] * 4)
    out = torch.empty_like(x)
    side = x.shape[-1]
    offsets = torch.randint(0, 2 * MAX_SHIFT + 1, (len(x), 2), generator=generator)
    for i, (dy, dx) in enumerate(offsets.tolist()):
        out[i] = padded[i, :, dy:dy + side, dx:dx + side]
    return out


def top1(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    """Float top-1 accuracy in percent."""
    model.eval()
    with torch.no_grad():
        return float((model(x).argmax(1) == y).double().mean()) * 100


def train(model: nn.Module, x: torch.Tensor, y: torch.Tensor, epochs: int,
          seed: int) -> nn.Module:
    """Adam with a one-cycle schedule, batch 64, shifted images."""
    generator = torch.Generator().manual_seed(seed)
    batch = 64
    steps = epochs * ((len(x) + batch - 1) // batch)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3, weight_decay=1e-4)
    schedule = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=3e-3, total_steps=steps)
    for epoch in range(epochs):
        print(f"  epoch {epoch + 1}/{epochs}", flush=True)
        model.train()
        order = torch.randperm(len(x), generator=generator)
        for start in range(0, len(x), batch):
            idx = order[start:start + batch]
            loss = F.cross_entropy(model(shifted(x[idx], generator)), y[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
            schedule.step()
    return model.eval()


def export(model: nn.Module, shape: tuple[int, ...], path: Path) -> None:
    """ONNX export in eval mode, fixed batch 1, input 'data', output 'logits'."""
    import io

    buffer = io.BytesIO()
    torch.onnx.export(model.eval(), (torch.zeros(shape),), buffer, input_names=["data"],
                      output_names=["logits"], opset_version=OPSET, dynamo=False)
    write_atomic(path, buffer.getvalue())


def train_mnist(cache: Path, epochs: int, names: list[str]) -> dict[str, dict]:
    """Train the MNIST CNNs of `names`, export them; their float accuracy by name."""
    data = mnist(cache)
    x, y = torch.from_numpy(mnist_float(data.train_x)), torch.from_numpy(data.train_y)
    tx, ty = torch.from_numpy(mnist_float(data.test_x)), torch.from_numpy(data.test_y)
    record = {}
    for name in names:
        torch.manual_seed(SEED)
        net = MNIST_MODELS[name]()
        start = time.perf_counter()
        net = train(net, x, y, epochs, SEED)
        record[name] = {"float_top1": top1(net, tx, ty), "train_top1": top1(net, x, y),
                        "epochs": epochs, "seed": SEED, "torch": torch.__version__,
                        "train_s": round(time.perf_counter() - start, 1)}
        export(net, (1, 1, 28, 28), cache / "models" / f"{name}.onnx")
        print(f"{name}: held-out float top-1 {record[name]['float_top1']:.2f}% "
              f"({record[name]['train_s']} s)", flush=True)
    return record


def build_imagenet(cache: Path) -> dict[str, dict]:
    """torchvision's ResNet-18 and MobileNet-v2 with seeded random weights, exported."""
    import torchvision

    record = {}
    for name in ("resnet18", "mobilenet_v2"):
        torch.manual_seed(SEED)
        export(getattr(torchvision.models, name)(weights=None), IMAGENET_SHAPE,
               cache / "models" / f"{name}.onnx")
        record[name] = {"weights": "random", "seed": SEED,
                        "torchvision": torchvision.__version__}
        print(f"{name}: random weights, exported", flush=True)
    return record


def remember(cache: Path, entries: dict[str, dict]) -> None:
    """Merge `entries` into models/train.json, read again just before writing (another run
    may have added its models meanwhile)."""
    path = cache / "models" / "train.json"
    record = json.loads(path.read_text()) if path.exists() else {}
    write_atomic(path, (json.dumps({**record, **entries}, indent=1) + "\n").encode())


def main(argv: list[str] | None = None) -> int:
    """Train the MNIST CNNs and/or build the torchvision networks; record them in
    models/train.json (merged with what an earlier run recorded)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cache", type=Path, default=CACHE, help=f"default {CACHE}")
    parser.add_argument("--epochs", type=int, default=15)
    parser.add_argument("--only", nargs="+", choices=[*MNIST_MODELS, "imagenet"],
                        help="these models only (imagenet: ResNet-18 and MobileNet-v2; "
                             "default: all)")
    args = parser.parse_args(argv)
    torch.use_deterministic_algorithms(True)
    # One thread: small convs gain little from more, and on a shared machine the intra-op
    # threads of torch wait for each other far longer than they compute.
    torch.set_num_threads(1)
    only = args.only or [*MNIST_MODELS, "imagenet"]
    trained = [name for name in MNIST_MODELS if name in only]
    if trained:
        remember(args.cache, train_mnist(args.cache, args.epochs, trained))
    if "imagenet" in only:
        remember(args.cache, build_imagenet(args.cache))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""How the ONNX files beside this were made: small PyTorch models (random weights, seed 0)
exported as `torch.onnx.export` writes them (`encoder_dynamic` with a dynamic batch axis),
with no simplifier, so the tests convert what a user's export holds (Shape/Gather/Concat chains feeding Reshapes, Identity and Constant
nodes, LayerNormalization, Erf, LSTM). Made with torch 2.11.0 (TorchScript exporter,
`dynamo=False`), on a machine that has torch; cvmc's tests need only the .onnx files.

    python tests/data/torch_exports/make.py [OUT_DIR]
"""
import os
import sys

import torch
from torch import nn

out = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.abspath(__file__))
torch.manual_seed(0)
print("torch", torch.__version__)

class Encoder(nn.Module):
    def __init__(s):
        super().__init__()
        layer = nn.TransformerEncoderLayer(d_model=32, nhead=4, dim_feedforward=64, dropout=0.0, batch_first=True)
        s.enc = nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=False)
        s.head = nn.Linear(32, 10)
    def forward(s, x):
        return s.head(s.enc(x).mean(dim=1))

class ViT(nn.Module):
    def __init__(s, img=32, patch=8, d=32):
        super().__init__()
        s.patch = nn.Conv2d(3, d, patch, patch)
        n = (img // patch) ** 2
        s.cls = nn.Parameter(torch.randn(1, 1, d) * 0.02)
        s.pos = nn.Parameter(torch.randn(1, n + 1, d) * 0.02)
        layer = nn.TransformerEncoderLayer(d_model=d, nhead=4, dim_feedforward=64, dropout=0.0, batch_first=True, activation="gelu", norm_first=True)
        s.enc = nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=False)
        s.norm = nn.LayerNorm(d)
        s.head = nn.Linear(d, 10)
    def forward(s, x):
        x = s.patch(x).flatten(2).transpose(1, 2)
        x = torch.cat([s.cls.expand(x.shape[0], -1, -1), x], dim=1) + s.pos
        return s.head(s.norm(s.enc(x))[:, 0])

class SmallCNN(nn.Module):
    def __init__(s):
        super().__init__()
        s.c1 = nn.Conv2d(3, 8, 3, padding=1); s.c2 = nn.Conv2d(8, 16, 3, stride=2, padding=1)
        s.fc = nn.Linear(16 * 8 * 8, 10)
    def forward(s, x):
        x = torch.relu(s.c2(torch.relu(s.c1(x))))
        return s.fc(x.view(x.size(0), -1))

class FlattenCNN(SmallCNN):
    def forward(s, x):
        x = torch.relu(s.c2(torch.relu(s.c1(x))))
        return s.fc(torch.flatten(x, 1))  # Flatten: any batch, unlike view(size(0), -1)


class CRNN(nn.Module):
    def __init__(s):
        super().__init__()
        s.conv = nn.Conv2d(1, 8, 3, padding=1)
        s.lstm = nn.LSTM(8 * 8, 16, bidirectional=True, batch_first=True)
        s.fc = nn.Linear(32, 12)
    def forward(s, x):
        f = torch.relu(s.conv(x))            # [B, 8, 8, W]
        b, c, h, w = f.shape
        f = f.permute(0, 3, 1, 2).reshape(b, w, c * h)
        return s.fc(s.lstm(f)[0])

cases = [("encoder", Encoder(), (1, 16, 32), 17), ("encoder_op16", Encoder(), (1, 16, 32), 16),
         ("vit", ViT(), (1, 3, 32, 32), 17), ("small_cnn", SmallCNN(), (1, 3, 16, 16), 17),
         ("crnn", CRNN(), (1, 1, 8, 20), 12), ("flatten_cnn", FlattenCNN(), (1, 3, 16, 16), 17),
         ("encoder_dynamic", Encoder(), (1, 16, 32), 17)]
for name, m, shape, opset in cases:
    m.eval()
    x = torch.randn(*shape)
    dynamic = {"x": {0: "batch"}, "y": {0: "batch"}} if name.endswith("_dynamic") else None
    torch.onnx.export(m, (x,), f"{out}/{name}.onnx", opset_version=opset,
                      input_names=["x"], output_names=["y"], dynamic_axes=dynamic,
                      dynamo=False)
    print("ok", name, os.path.getsize(f"{out}/{name}.onnx"))

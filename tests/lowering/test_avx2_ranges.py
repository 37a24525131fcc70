"""AVX2 int8 convs and the value intervals the compiler proves (`cvmc.ops.infer.intervals`):
`cvmc quantize --weight-bits 7` gives conv weights in [-63, 63], and a ReLU net's conv data
is proven to be in [0, 127]."""
import numpy as np
import pytest

from cvmc import load_graph
from cvmc.cli import main
from cvmc.ops.infer import intervals

onnx = pytest.importorskip("onnx")
pytest.importorskip("nnef_tools", reason="needs the convert extra: pip install 'cvmc[convert]'")

from tests.quantize.onnx_nets import conv_bn_net


@pytest.fixture(scope="module")
def quantized_7bit(tmp_path_factory):
    """conv_bn_net (conv, BN, ReLU, max pool, twice, then gemm) quantized with per-channel
    7-bit weights."""
    tmp = tmp_path_factory.mktemp("q7")
    onnx.save(conv_bn_net(), tmp / "net.onnx")
    np.save(tmp / "x.npy", np.random.default_rng(3).standard_normal((8, 1, 1, 12, 12))
            .astype(np.float32))
    assert main(["quantize", str(tmp / "net.onnx"), "-o", str(tmp / "q"), "--calib",
                 f"x={tmp / 'x.npy'}", "--per-channel", "--weight-bits", "7",
                 "--calib-on", "reference"]) == 0
    return load_graph(tmp / "q")


def test_weight_bits_7_bounds_weights_and_relu_data(quantized_7bit):
    graph = quantized_7bit
    proven = intervals(graph)
    linear = [n for n in graph.nodes if n.op in ("conv2d", "dense")]
    assert len(linear) == 3
    for n in linear:
        w = graph.constants[n.inputs[1]]
        assert np.abs(w).max() <= 63 and proven[n.inputs[1]] == (int(w.min()), int(w.max()))
        assert np.abs(w).max() == 63  # each channel's absmax takes the full 7 bits
    # the second conv and the dense read ReLU outputs (through max pools and a reshape)
    assert [proven[n.inputs[0]] for n in linear[1:]] == [(0, 127), (0, 127)]


def test_weight_bits_out_of_range_is_one_error_line(tmp_path, capsys):
    onnx.save(conv_bn_net(), tmp_path / "net.onnx")
    assert main(["quantize", str(tmp_path / "net.onnx"), "-o", str(tmp_path / "q"),
                 "--weight-bits", "9"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["error: --weight-bits must be in 2..8, got 9"]

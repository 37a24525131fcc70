"""Regenerate the bundled example model: graph.nnef and its int8/int32 .dat weights.

    python examples/small_cnn/make_weights.py

conv2d (3 -> 8 channels, 3x3, bias) -> cvm_right_shift -> cvm_clip -> relu ->
max_pool2d (2x2) -> flatten -> dense (512 -> 10, bias), on a [1, 3, 16, 16] 8-bit input.
Weights are deterministic random integers (fixed seed). shift_bit = 9 brings the conv
sums (std ~26000 on random 8-bit data) to std ~50, so the 8-bit clip cuts only ~2% of
the values: the activations stay meaningful rather than saturated.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from cvmc.frontend.tensorfile import write_tensor

HERE = Path(__file__).resolve().parent
SEED = 2024

GRAPH = """\
version 1.0;

graph small_cnn( data ) -> ( logits )
{
    data = external<integer>(shape = [1, 3, 16, 16], precision = 8);
    w1 = variable<integer>(shape = [8, 3, 3, 3], label = "conv1_weight", precision = 8);
    b1 = variable<integer>(shape = [8], label = "conv1_bias", precision = 12);
    w2 = variable<integer>(shape = [10, 512], label = "fc_weight", precision = 8);
    b2 = variable<integer>(shape = [10], label = "fc_bias", precision = 16);
    c1 = conv2d(data, w1, b1, padding = [1, 1], stride = [1, 1], dilation = [1, 1],
                groups = 1);
    s1 = cvm_right_shift(c1, precision = 16, shift_bit = 9);
    k1 = cvm_clip(s1, precision = 8);
    r1 = relu(k1);
    p1 = max_pool2d(r1, pool_size = [2, 2], padding = [0, 0], strides = [2, 2],
                    ceil_mode = false);
    f1 = flatten(p1);
    logits = dense(f1, w2, b2);
}
"""


def weights(seed: int = SEED) -> dict[str, np.ndarray]:
    """The model's weights by label: int8 kernels, int32 biases inside their precisions."""
    rng = np.random.default_rng(seed)
    return {
        "conv1_weight": rng.integers(-127, 128, (8, 3, 3, 3)).astype(np.int8),
        "conv1_bias": rng.integers(-2047, 2048, (8,)).astype(np.int32),
        "fc_weight": rng.integers(-127, 128, (10, 512)).astype(np.int8),
        "fc_bias": rng.integers(-32767, 32768, (10,)).astype(np.int32),
    }


def main() -> None:
    """Write graph.nnef and one .dat file per weight next to this script."""
    (HERE / "graph.nnef").write_text(GRAPH)
    for label, array in weights().items():
        write_tensor(HERE / f"{label}.dat", array)


if __name__ == "__main__":
    main()

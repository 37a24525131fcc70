"""Every valid document of the NNEF corpus compiles for llvm, runs, and matches the
reference interpreter exactly or within its stated bound (random weights from a fixed
seed where a document ships none; `tests.nnefutil`)."""
from __future__ import annotations

import numpy as np
import pytest

from cvmc.frontend.nnef import load_nnef
from cvmc.ops import lookup
from tests.nnefutil import (
    mean_bound,
    moments_bound,
    random_inputs,
    run_both,
    running_bound,
    softmax_bound,
    with_random_weights,
)
from tests.oputil import U, assert_matches
from tests.shared import HAVE_SHARED, SHARED, requires_shared

CORPUS = SHARED / "data" / "nnef-corpus" / "valid"
DOCS = sorted(CORPUS.iterdir()) if HAVE_SHARED else []

# Bounds (docs/float.md "Float accuracy"); a document not listed must match the reference exactly.
# Sums, products and matmuls: running error analysis over the reference's values
# (`tests.nnefutil.running_bound`).
RUNNING = {"khr_op_sum_reduce.nnef", "khr_op_matmul_trA.nnef", "khr_op_linear.nnef",
           "tract_parallel_matmul.nnef", "tract_parallel_bin.nnef",
           # the sliding-window ops (nnef_nn): conv, box, up-sampling, and networks of them
           "khr_op_conv1d.nnef", "khr_op_conv2d_nobias.nnef", "khr_op_conv2d_padded.nnef",
           "khr_op_conv2d_strided.nnef", "khr_op_deconv2d.nnef", "khr_op_separable_conv2d.nnef",
           "khr_op_box_strided.nnef", "khr_op_avg_pool_ignore_border.nnef",
           "khr_op_linear_upsample_symmetric.nnef", "khr_example_alexnet.nnef",
           "khr_example_googlenet.nnef", "khr_example_resnet.nnef",
           "khr_sample_ext_custom_shuffle.nnef"}
ULP = {"tract_pow_const.nnef": lookup("pow").ulp}


def _batch_norm_bound(g, feeds, want):
    """offset + t, t = scale * (x - mean) / sqrt(variance + eps): x - mean, variance + eps
    and scale * d are the reference's bits; sqrt (pow) is within 8 u, the division and
    the last add re-round: 10 u |t| + 2 u |y| (16 u each here)."""
    w = {k: v.astype(np.float64).reshape(1, -1, 1, 1) for k, v in g.constants.items()}
    t = w["scale"] * (feeds["input"] - w["mean"]) / np.sqrt(w["variance"] + 1e-3)
    return {"output": 16 * U * (np.abs(t) + np.abs(want["output"].astype(np.float64)))}


HAND = {
    "khr_op_softmax.nnef": lambda g, f, w: {"output": softmax_bound(w["output"], 16)},
    "tract_softmax_change_axis.nnef": lambda g, f, w: {
        "output": softmax_bound(w["output"], 3)},
    "khr_op_moments.nnef": lambda g, f, w: {
        "mean": mean_bound(f["input"], (1, 2, 3)),
        "variance": moments_bound(f["input"], (1, 2, 3), w["mean"])},
    "khr_op_batch_norm.nnef": _batch_norm_bound,
}


def _bounds(name: str, g, feeds, want) -> dict:
    """{output: absolute bound} of a document (none: exact or ULP)."""
    if name in RUNNING:
        return running_bound(g, feeds)
    return HAND[name](g, feeds, want) if name in HAND else {}


# Whole networks at 224 x 224 (~30 s each to compile and run on the reference)
NETWORKS = {"khr_example_alexnet.nnef", "khr_example_googlenet.nnef", "khr_example_resnet.nnef"}


@requires_shared
@pytest.mark.parametrize("path", [pytest.param(p, marks=pytest.mark.slow)
                                  if p.name in NETWORKS else p for p in DOCS],
                         ids=lambda p: p.name)
def test_valid_document_compiles_runs_and_matches_the_reference(path, shuffle_op):
    g = with_random_weights(load_nnef(path, None))
    feeds = random_inputs(g)
    want, got = run_both(g, feeds)
    bounds = _bounds(path.name, g, feeds, want)
    for name in g.outputs:
        assert_matches(path.name, name, want[name], got[name], ULP.get(path.name, 0),
                       bounds.get(name))

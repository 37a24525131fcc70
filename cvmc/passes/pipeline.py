"""The passes: every Graph -> Graph pass, with why it is there, and `run_passes`, the one
pass manager. Each backend (cvmc/codegen/targets) lists the passes it runs, in order."""
from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from cvmc.errors import CvmcError
from cvmc.ops.infer import require_typed, verify
from cvmc.passes.fusion import fuse_kernels
from cvmc.passes.layout import block_activations, pack_conv_weights
from cvmc.passes.layout_float import block_float_activations, pack_float_convs
from cvmc.passes.matmul_weights import pack_matmul_weights, untranspose_matmul_weights
from cvmc.passes.simplify import eliminate_dead_code, fold_constants, simplify_float
from cvmc.passes.target import Target
from cvmc.passes.transformer import fuse_transformer

# Whether each pass's result is checked against the op rules (`cvmc.ops.infer.verify`)
# too, not only structurally: the tests set it (CVMC_VERIFY_TYPES=1); compiling does not
# pay for it.
VERIFY_TYPES = os.environ.get("CVMC_VERIFY_TYPES") == "1"

IR = TypeVar("IR")  # what a pass list hands on: a Graph, unless the list names its check


@dataclass(frozen=True)
class Pass:
    """One Graph -> Graph pass (or one of a list that hands on more than a Graph:
    `run_passes`'s `check`), called as `run(graph, target)` where it `needs_target` (what
    it makes depends on the target), else as `run(graph)`."""

    name: str
    run: Callable[..., Any]
    needs_target: bool = False


# Every loader types its graph (`retype`: precisions prove int32 never overflows);
# this refuses one that cannot be compiled (weights without data, an op cvmc checks
# only). Named for what it did when it inferred them: --stop-after and --dump-ir name it.
INFER_PRECISION = Pass("infer-precision", require_typed)

# Conv kernels want packed weights (OIHW16o4i: 4 input channels of an output channel
# in one 32-bit word, for VNNI's `vpdpbusd` and CUDA's `dp4a`) and a precomputed
# compensation: conv2d -> conv2d_packed on layout_transform-ed weights (folded just
# below).
PACK_CONV_WEIGHTS = Pass("pack-conv-weights", pack_conv_weights, needs_target=True)

# Float convs want their filter packed too (OIHW8o: 8 output channels of float32 in a
# vector's lanes, 16 with AVX-512) for the register-tiled FMA kernel; CPU only.
PACK_FLOAT_CONVS = Pass("pack-float-convs", pack_float_convs, needs_target=True)

# Transformer chains an exporter decomposed (layer normalization) become one op each,
# one kernel instead of seven (cvmc/passes/transformer.py).
FUSE_TRANSFORMER = Pass("fuse-transformer", fuse_transformer, needs_target=True)

# A matmul's constant transposed weight (NNEF's linear) is transposed back once, here,
# so that the CPU kernel reads weight rows along its vector of output columns.
UNTRANSPOSE_MATMUL_WEIGHTS = Pass("untranspose-matmul-weights", untranspose_matmul_weights,
                                  needs_target=True)

# A matmul's constant B is packed into column panels (P, K, 16 or 32 columns), folded
# just below: the CPU kernel reads each panel contiguously and K-blocks it in L1.
PACK_MATMUL_WEIGHTS = Pass("pack-matmul-weights", pack_matmul_weights, needs_target=True)

# Nodes whose inputs are all weights are evaluated now with the reference rules.
FOLD_CONSTANTS = Pass("fold-constants", fold_constants)

# The stdlib's float max / min / clamp / max_pool, expanded by the frontend into
# comparisons, selects, argmax_pool and sample, become one op each (same bits), so
# they fuse into their producers and max pooling is one window reduction.
SIMPLIFY = Pass("simplify", simplify_float, needs_target=True)

# Nodes (and weights) that no output depends on are dropped.
ELIMINATE_DEAD_CODE = Pass("eliminate-dead-code", eliminate_dead_code)

# Activations between two packed convs stay in the kernels' NCHW16c layout (each
# conv would otherwise transpose its result to NCHW and the next one back; on CUDA a
# blocked conv reads 4 channels of a pixel in one 32-bit load).
BLOCK_ACTIVATIONS = Pass("block-activations", block_activations, needs_target=True)

# Float activations between float convs stay NCHW8c (16c with AVX-512), the layout
# of the conv kernels' register tiles: whole vectors stored, depth-wise convs with the
# channels in the lanes (cvmc/passes/layout_float.py).
BLOCK_FLOAT_ACTIVATIONS = Pass("block-float-activations", block_float_activations,
                               needs_target=True)

# The kernel partition: epilogues into their conv / dense, element-wise chains into one
# kernel (Graph.kernels; lowering builds one kernel per group).
FUSE_KERNELS = Pass("fuse-kernels", fuse_kernels, needs_target=True)


def run_passes(graph: IR, passes: Sequence[Pass], stop_after: str | None = None,
               after_pass: Callable[[int, str, IR], None] | None = None,
               target: Target | None = None,
               check: Callable[[IR], None] | None = None) -> IR:
    """Run `passes` in order on `graph` (for `target`, which those that need one must
    have), checking each result, calling `after_pass(index, name, graph)` after each
    (`--dump-ir`: `cvmc.frontend.printer.graph_dumper`), and stop after `stop_after`.
    Running a backend's list on its own output changes nothing. A pass list that hands on
    more than a Graph (the quantizer's, cvmc/quantize/__init__.py) names the `check` of
    what it hands on; by default each result is a Graph, verified."""
    names = [p.name for p in passes]
    if stop_after is not None and stop_after not in names:
        raise CvmcError(f"unknown pass '{stop_after}' for --stop-after; "
                        f"passes: {', '.join(names)}")
    for index, p in enumerate(passes):
        if p.needs_target and target is None:
            raise ValueError(f"pass '{p.name}' needs the target it compiles for")
        graph = p.run(graph, target) if p.needs_target else p.run(graph)
        if check is not None:
            check(graph)
        elif VERIFY_TYPES:
            verify(graph)
        else:
            graph.verify()
        if after_pass is not None:
            after_pass(index, p.name, graph)
        if p.name == stop_after:
            break
    return graph

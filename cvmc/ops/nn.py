"""CVM NN operators: conv2d, dense, relu, max_pool2d, upsampling.

Spec: ../shared/spec/cvm-operators-formal.txt, "NN Operators"; precision rules from
../shared/design/cvm-semantics.md.
"""
from __future__ import annotations

import numpy as np

from cvmc.ops.registry import Fusion, op

# ---- relu -----------------------------------------------------------------------------
relu = op("relu", family="nn", inputs=("data",), fusion=Fusion.ELEMWISE, precision_rule="p_x")


@relu.shape
def _relu_shape(ins, a):
    return ins[0].shape


@relu.precision
def _relu_precision(ins, a):
    return ins[0].precision


@relu.reference
def _relu_reference(xs, a):
    return np.maximum(xs[0], 0)


@relu.lower
def _relu_lower(xs, a):
    from cvmc.lowering.te_facade import const, elementwise, tirx
    return elementwise(xs[0], lambda v: tirx.max(v, const(0)), "relu")

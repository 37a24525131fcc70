"""GOPS counts: the `arith` rules of the ops that the fusion-kind default does not fit.

The default (`OpDef.arith_ops`) counts an element-wise or broadcast op's output elements
times (inputs - 1), at least 1; a reduction its input elements; data movement (injective
ops) 0. Here: 2 per multiply-add for the convolutions and matrix products (forward, grouped,
packed, transposed, int and float alike), window ops by their window's taps per output
element, the reductions, gathers and reshapes that the registry files as opaque, and the
few element-wise ops that only copy. `cvmc bench` shows '-' for a kernel of 0 operations.
"""
from __future__ import annotations

import math
from collections.abc import Mapping

from cvmc.ir import Node, TensorType
from cvmc.ops.registry import Attrs, lookup


def _mac(outputs: int, per_output: int) -> int:
    """2 operations per multiply-add: `per_output` of them for each of `outputs`."""
    return 2 * outputs * per_output


def _size(shape) -> int:
    return math.prod(shape)


def _onednn_conv(ins, outs, a) -> int:
    # every output element sums IC/groups x taps products: the weights' volume per OC
    w = ins[1].shape
    oc = w[0] if a.weights_format == "OIX" else w[-1]
    return _mac(_size(outs[0].shape), _size(w) // oc)


def _cinn_conv(ins, outs, a) -> int:
    # The three conv types do forward's products: dy's elements x the filter's C/G x taps.
    dy, filt = {"forward": (outs[0], ins[1]), "backward_data": (ins[1], ins[0]),
                "backward_filter": (ins[1], outs[0])}[a.conv_type]
    return _mac(_size(dy.shape), _size(filt.shape[1:]))


def _matmul(ins, outs, a) -> int:
    return _mac(_size(outs[0].shape), ins[0].shape[-2 if a.transposeA else -1])


def _conv2d_packed(ins, outs, a) -> int:
    data, weight = ins[0].shape, ins[1].shape  # data NCHW or NCHW16c
    channels = data[1] * (data[4] if len(data) == 5 else 1)
    return _mac(_size(outs[0].shape), channels // a.groups * weight[2] * weight[3])


def _box_arith(per_input: bool):
    """box and argmax_pool: every output reads its window; debox: every input element is
    added into each output of its window."""
    def rule(ins, outs, a) -> int:
        return _size((ins if per_input else outs)[0].shape) * math.prod(a.size)
    return rule


def _per_input(per_element: int):
    """`per_element` operations for each element of the first input (reductions)."""
    return lambda ins, outs, a: per_element * _size(ins[0].shape)


def _none(ins, outs, a) -> int:
    return 0


def _per_output(ins, outs, a) -> int:
    return _size(outs[0].shape)


_RULES = {
    # 2 per multiply-add: output elements x C/G x taps (a deconv: its input elements)
    "conv2d": lambda ins, outs, a: _mac(_size(outs[0].shape), _size(ins[1].shape[1:])),
    "conv": lambda ins, outs, a: _mac(_size(outs[0].shape), _size(ins[1].shape[1:])),
    "deconv": lambda ins, outs, a: _mac(_size(ins[0].shape), _size(ins[1].shape[1:])),
    "conv2d_packed": _conv2d_packed,
    "onednn.convolution": _onednn_conv,
    "cinn.conv": _cinn_conv,
    "dense": lambda ins, outs, a: _mac(_size(outs[0].shape), ins[1].shape[1]),
    "matmul": _matmul,
    # B packed (*batch, P, K, C): K multiply-adds per output element, as matmul's
    "matmul_packed": lambda ins, outs, a: _mac(_size(outs[0].shape), ins[1].shape[-2]),
    "cinn.dot": lambda ins, outs, a: _mac(_size(outs[0].shape), ins[0].shape[-1]),
    # windows: one comparison or addition per tap; multilinear: a multiply-add per corner
    **dict.fromkeys(("max_pool2d", "max_pool2d_blocked"),
                    lambda ins, outs, a: _size(outs[0].shape) * math.prod(a.pool_size)),
    "box": _box_arith(False),
    "argmax_pool": _box_arith(False),
    "nnef.max_window": _box_arith(False),
    "debox": _box_arith(True),
    "multilinear_upsample": lambda ins, outs, a: _mac(_size(outs[0].shape), 2 ** len(a.factor)),
    # RoI cells are as large as the rois' values make them: one per output element
    "avg_roi_pool": _per_output,
    "max_roi_pool": _per_output,
    "roi_resample": _per_output,
    # reductions: one per input element; sum x and sum x^2 (3), sum g and
    # sum g (x - mean) (4)
    **dict.fromkeys(("sum_reduce", "max_reduce", "min_reduce", "argmax_reduce",
                     "argmin_reduce", "all_reduce", "any_reduce"), _per_input(1)),
    "cinn.bn_mean_variance": _per_input(3),
    "cinn.bn_grad_bias_scale": _per_input(4),
    # one threshold test per box; NMS: one IoU test per pair of boxes at most
    "get_valid_count": lambda ins, outs, a: _size(ins[0].shape[:-1]),
    "non_max_suppression": lambda ins, outs, a: _size(ins[0].shape[:-1]) * ins[0].shape[1],
    # data movement: selected, gathered, copied or reshaped values
    **dict.fromkeys(("sample", "desample", "concat", "split", "stack", "unstack", "gather",
                     "pad", "update", "unsqueeze", "nnef.reshape", "nnef.slice",
                     "nnef.squeeze", "nnef.tile", "nnef.transpose", "copy", "cinn.identity",
                     "cinn.const_scalar"), _none),
}


# The layers whose operations are multiply-adds (2 each above): convolutions and matrix
# products, the MACs `cvmc check` totals.
MULTIPLY_ADD_OPS = frozenset((
    "conv2d", "conv", "deconv", "conv2d_packed", "onednn.convolution", "cinn.conv", "dense",
    "matmul", "matmul_packed", "cinn.dot"))


def node_ops(node: Node, types: Mapping[str, TensorType]) -> int:
    """Arithmetic operations of a node in a typed graph (its op's `arith` rule)."""
    return lookup(node.op).arith_ops([types[i] for i in node.inputs],
                                     [types[o] for o in node.outputs], Attrs(node.attrs))


def multiply_adds(node: Node, types: Mapping[str, TensorType]) -> int:
    """A convolution's or matrix product's multiply-adds (MACs); 0 for any other op."""
    return node_ops(node, types) // 2 if node.op in MULTIPLY_ADD_OPS else 0


def register() -> None:
    """Attach the rules above (called once every op module has registered its ops)."""
    for name, rule in _RULES.items():
        lookup(name).arith(rule)

"""layout_transform: a tensor's axes reordered and blocked, the packed forms that fast
kernels want, visible in the IR.

The packing passes (`cvmc/passes/layout.py`, `layout_float.py`) write it on a constant
weight, which constant folding then packs at compile time, and between the activations
of packed kernels. The packed ops themselves are each backend's: `cvmc/ops/packed.py`
(the llvm and cuda backends) and `cvmc/ops/packed_llvm.py` (llvm only). The op is cvmc's
own (seed "cvmc"), with a literal NumPy reference like every other op, so the reference
interpreter runs the packed graph too.
"""
from __future__ import annotations

import re

import numpy as np

from cvmc.ops.common import hull, require
from cvmc.ops.registry import Attr, Fusion, op

# ---- layout_transform -----------------------------------------------------------------
# A layout names each axis by an upper-case letter ("OIHW"); a blocked layout lists the
# outer axes in their new order, then inner blocks "<factor><letter>" ("OIHW16o4i": O split
# into O/16 outer and 16 inner, I into I/4 and 4). An axis is padded with zeros up to a
# multiple of its factor. The inverse (a blocked source, a plain destination: "NCHW16c" ->
# "NCHW") merges each block back into its axis, padding included.
_BLOCK = re.compile(r"(\d+)([a-z])")

layout_transform = op(
    "layout_transform", family="layout", inputs=("data",), fusion=Fusion.INJECTIVE,
    attrs=(Attr("src_layout", "str"), Attr("dst_layout", "str")),
    precision_rule="p_x", seeds=("cvmc",),
    interval_rule="the data's, with 0 (blocking pads an axis with zeros)")


@layout_transform.interval
def _layout_transform_interval(ivs, a):
    return ivs[0] if _inverse(a) else hull(ivs[0], (0, 0))


def _plain(layout: str) -> bool:
    return layout.isalpha() and layout.isupper()


def _parse_layouts(a, ndim: int) -> tuple[str, str, list[tuple[int, str]]]:
    """(plain axes, blocked outer axes, [(factor, axis letter), ...]) after checking them;
    `ndim` is the rank of the source."""
    inverse = not _plain(a.src_layout) and _plain(a.dst_layout)
    plain, blocked = (a.dst_layout, a.src_layout) if inverse else (a.src_layout, a.dst_layout)
    outer = blocked.rstrip("0123456789abcdefghijklmnopqrstuvwxyz")
    tail = blocked[len(outer):]
    blocks = [(int(f), letter.upper()) for f, letter in _BLOCK.findall(tail)]
    ok = (_plain(plain) and len(set(plain)) == len(plain)
          and ndim == len(plain) + (len(blocks) if inverse else 0)
          and sorted(outer) == sorted(plain) and "".join(f"{f}{x.lower()}" for f, x in blocks)
          == tail and all(f >= 1 and x in plain for f, x in blocks)
          and len({x for _, x in blocks}) == len(blocks))
    require(ok, f"layout_transform: cannot transform a rank-{ndim} tensor from "
                f"'{a.src_layout}' to '{a.dst_layout}' (expected e.g. 'OIHW' -> 'OIHW16o4i' "
                f"or 'NCHW16c' -> 'NCHW')")
    return plain, outer, blocks


def _inverse(a) -> bool:
    return not _plain(a.src_layout)


def transformed_shape(shape: tuple[int, ...], a) -> tuple[int, ...]:
    """The destination shape: each blocked axis divided (rounding up) by its factor, or,
    for the inverse, multiplied back."""
    plain, outer, blocks = _parse_layouts(a, len(shape))
    factor = {x: f for f, x in blocks}
    if _inverse(a):
        return tuple(shape[outer.index(x)] * factor.get(x, 1) for x in plain)
    return (*(-(-shape[plain.index(x)] // factor.get(x, 1)) for x in outer),
            *(f for f, _ in blocks))


@layout_transform.shape
def layout_transform_shape(ins, a):
    """The shape rule: the input's shape transformed (`transformed_shape`)."""
    return transformed_shape(ins[0].shape, a)


@layout_transform.precision
def _layout_transform_precision(ins, a):
    return ins[0].precision


@layout_transform.reference
def layout_transform_reference(xs, a):
    """The reference rule: `xs[0]` (a NumPy array) transformed as `a` says."""
    x = xs[0]
    plain, outer, blocks = _parse_layouts(a, x.ndim)
    factor = {ax: f for f, ax in blocks}
    if _inverse(a):
        # Put each axis's inner block right after its outer part, then merge the two.
        inner = {ax: len(outer) + k for k, (_, ax) in enumerate(blocks)}
        order = [k for ax in plain
                 for k in (outer.index(ax), *((inner[ax],) if ax in factor else ()))]
        return x.transpose(order).reshape(transformed_shape(x.shape, a))
    # Pad each blocked axis to a multiple of its factor, split it into (outer, inner),
    # then order the axes as the destination names them.
    x = np.pad(x, [(0, -d % factor.get(ax, 1)) for d, ax in zip(x.shape, plain)])
    split = x.reshape([n for d, ax in zip(x.shape, plain)
                       for n in ((d // factor[ax], factor[ax]) if ax in factor else (d,))])
    position, k = {}, 0
    for ax in plain:
        position[ax] = k
        k += 2 if ax in factor else 1
    order = [position[ax] for ax in outer] + [position[ax] + 1 for _, ax in blocks]
    return split.transpose(order)


@layout_transform.lower
def _layout_transform_lower(xs, a):
    from cvmc.ops.te import const
    return lower_layout_transform(xs[0], a, const(0))


def lower_layout_transform(x, a, zero):
    """The transform of TE tensor `x`; padding elements are `zero`."""
    from cvmc.ops.te import shape_of, te, tirx
    shape = shape_of(x)
    plain, outer, blocks = _parse_layouts(a, len(shape))
    factor = {ax: f for f, ax in blocks}

    def unblock(*i):
        index = dict(zip(plain, i))
        return x[(*(index[ax] // factor.get(ax, 1) for ax in outer),
                  *(index[ax] % f for f, ax in blocks))]

    def block(*i):
        index = {ax: i[k] for k, ax in enumerate(outer)}
        for k, (f, ax) in enumerate(blocks):
            index[ax] = index[ax] * f + i[len(outer) + k]
        coords = [index[ax] for ax in plain]
        inside = [c < d for c, d, ax in zip(coords, shape, plain) if ax in factor]
        value = x[tuple(coords)]
        return tirx.if_then_else(tirx.all(*inside), value, zero) if inside else value
    return te.compute(transformed_shape(shape, a), unblock if _inverse(a) else block,
                      name="layout_transform")



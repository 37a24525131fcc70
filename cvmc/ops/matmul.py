"""matmul_packed: NNEF's float `matmul` on a B packed at compile time into column panels.

`matmul(A, B)` with a constant B (*batch, K, N) (a linear layer's weight, transposed back by
`untranspose-matmul-weights`) becomes `matmul_packed(A, Bp, columns = N)` on

    Bp = (*batch, P, K, C),  Bp[..., p, k, c] = B[..., k, p * C + c]  (0 where p * C + c >= N)

(`cvmc/passes/matmul_weights.py` writes the pad/reshape/transpose chain that constant folding
evaluates): P = ceil(N / C) column panels, each a contiguous K x C block, C = 2 vectors of
float32 (16 on AVX2, 32 on AVX-512) the width of the kernel's register tile. The kernel
(`cvmc/lowering/x86_matmul.py`) then reads a panel's rows one after the other instead of
one row of B every N floats, and can keep a K block of a panel in L1. Each output element
is the sum of its K products in the order k = 0, 1, ... (one thread per element, never
split): matmul's bound (docs/float.md), the same bits at any thread count. The reference is
matmul's on the unpacked B: the oracle.
"""
from __future__ import annotations

import numpy as np

from cvmc.ops.common import require
from cvmc.ops.nnef_std import matmul_shape
from cvmc.ops.registry import Attr, Attrs, Fusion, op

matmul_packed = op(
    "matmul_packed", family="layout", backends=("llvm",),
    inputs=("A", "B"), seeds=("cvmc",),
    types="scalar, scalar -> scalar", attrs=(Attr("columns", "int", lo=1),),
    # its kernel takes the element-wise epilogue (bias, activation, residual) under its tile
    fusion=Fusion.OUT_ELEMWISE)

_PLAIN = Attrs(transposeA=False, transposeB=False)


def unpacked_shape(a, bp, columns: int) -> tuple[int, ...]:
    """B's (*batch, K, N) shape for A's shape `a` and packed shape `bp` (*batch, P, K, C),
    after checking them."""
    require(len(bp) == len(a) + 1 and len(a) >= 2,
            f"matmul_packed: B packed (*batch, P, K, C) must have A's rank + 1, got A "
            f"{list(a)} and B {list(bp)}")
    *batch, panels, k, cols = bp
    require(panels == -(-columns // cols),
            f"matmul_packed: {panels} panels of {cols} columns do not pack {columns} columns")
    return (*batch, k, columns)


@matmul_packed.shape
def _shape(ins, a):
    sa, sb = ins[0].shape, ins[1].shape
    return matmul_shape("matmul_packed", [sa, unpacked_shape(sa, sb, a.columns)], _PLAIN)


def unpack(bp: np.ndarray, columns: int) -> np.ndarray:
    """(*batch, P, K, C) -> (*batch, K, N): the panels side by side, padding dropped."""
    *batch, panels, k, cols = bp.shape
    return np.swapaxes(bp, -3, -2).reshape(*batch, k, panels * cols)[..., :columns]


@matmul_packed.reference
def _reference(xs, a):
    return np.matmul(xs[0], unpack(xs[1], a.columns))


@matmul_packed.lower
def _lower(xs, a):
    from cvmc.ops.te import shape_of, te

    A, Bp = xs
    sa, sb = shape_of(A), shape_of(Bp)
    *_, panels, k_extent, cols = sb
    batch = [max(p, q) for p, q in zip(sa[:-2], sb[:-3])]
    k = te.reduce_axis((0, k_extent), name="k")

    def bidx(shape, b):
        return [0 if e == 1 else i for e, i in zip(shape, b)]

    def dot(*o):
        *b, i, j = o
        return te.sum(A(*bidx(sa[:-2], b), i, k) * Bp(*bidx(sb[:-3], b), j // cols, k, j % cols),
                      axis=k)
    # The accumulator covers whole panels; the result drops the padding columns.
    acc = te.compute((*batch, sa[-2], panels * cols), dot, name="matmul_packed_acc")
    return te.compute((*batch, sa[-2], a.columns), lambda *o: acc(*o), name="matmul_packed")

"""NNEF 1.0.5 sliding-window, up-sampling and RoI primitives: their shape rules and the
window attributes they share.

conv, deconv, box, debox, argmax_pool, sample, desample, multilinear_upsample, avg_roi_pool,
max_roi_pool, roi_resample: their entries (declarations with the reference and lower rules)
are in `nnef_nn`. Output sizes follow "Output Shape Calculation" and "Automatic Padding
Calculation" in section 4.3 of ../shared/spec/nnef-1.0-spec.txt. Shared helpers live in
`nnef_std`.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from cvmc.ops.common import MAX_WINDOW, check_window, require
from cvmc.ops.nnef_std import Shape, check_positive, fmt
from cvmc.ops.registry import Attr, Attrs


def _down(op_name: str, extent: int, f: int, pad: tuple[int, int] | None, s: int,
          d: int) -> int:
    """Down-scaled extent x from up-scaled X; auto padding (None) gives ceil(X / s)."""
    if pad is None:
        return -(-extent // s)
    fd = (f - 1) * d + 1
    padded = pad[0] + extent + pad[1]
    require(padded >= fd, f"{op_name}: padded extent {padded} (padding {pad}) is smaller "
                          f"than the dilated window {fd}")
    return (padded - fd) // s + 1


def _up(extent: int, f: int, pad: tuple[int, int] | None, s: int, d: int) -> int:
    """Up-scaled extent X from down-scaled x; auto padding (None) gives x * s."""
    if pad is None:
        return extent * s
    return (extent - 1) * s + (f - 1) * d + 1 - (pad[0] + pad[1])


def _per_dim(op_name: str, a: Attrs, n: int, what: str) -> list[tuple]:
    """Zip padding/stride/dilation per window dimension after checking their lengths."""
    for name in ("padding", "stride", "dilation"):
        value = a[name]
        require(len(value) in (0, n), f"{op_name}: expected '{name}' of length {n} (one per "
                                      f"{what} dimension) or 0, found {len(value)}")
    require(all(abs(e) <= MAX_WINDOW for pair in a.padding for e in pair),
            f"{op_name}: 'padding' items must be in [-{MAX_WINDOW}, {MAX_WINDOW}], found "
            f"{list(a.padding)}")
    pads = a.padding or (None,) * n
    return list(zip(pads, a.stride or (1,) * n, a.dilation or (1,) * n))


def window(op_name: str, x: Sequence[int], size: Sequence[int], a: Attrs, what: str,
           transposed: bool) -> Shape:
    """Window-output extents of `x` (the dims the window slides over): x for basic ops,
    X for reverse ops (transposed), where any given `output_shape` already fixed X."""
    dims = _per_dim(op_name, a, len(x), what)
    if transposed:
        out = tuple(_up(e, f, *pd) for e, f, pd in zip(x, size, dims))
    else:
        out = tuple(_down(op_name, e, f, *pd) for e, f, pd in zip(x, size, dims))
    if min(out, default=1) >= 1:  # else check_positive names the empty extent
        up, down = (out, x) if transposed else (x, out)
        for k, dim in enumerate(window_dims(a, up, down, size)):
            check_window(op_name, f"{what} axis {k}", dim.X, dim.f, dim.s, dim.d, dim.p,
                         dim.q)
    return out


def reverse_window(op_name: str, x: Shape, size: Sequence[int], a: Attrs, what: str,
                   out: Shape) -> Shape:
    """Check that down-scaling `out` (a given output_shape) gives back the input `x`."""
    expected = window(op_name, out, size, a, what, transposed=False)
    require(expected == x, f"{op_name}: input shape {fmt(x)} does not match the shape "
                           f"{fmt(expected)} derived from 'output_shape'")
    return out


@dataclass(frozen=True)
class Dim:
    """One window dimension (spec 4.3): filter size f, padding p before and q after,
    stride s, dilation d, down-scaled extent x and up-scaled extent X."""

    f: int
    p: int
    q: int
    s: int
    d: int
    x: int
    X: int

    def reach(self, reverse: bool) -> tuple[int, int]:
        """(lowest, highest) index of the extended input a window reads: up-scaled
        positions i * s + j * d - p for a basic op, down-scaled (i + p - j * d) / s for a
        reverse one (a superset: only divisible ones are read)."""
        if reverse:
            return -((self.d * (self.f - 1) - self.p) // self.s), (self.X - 1 + self.p) // self.s
        return -self.p, (self.x - 1) * self.s + (self.f - 1) * self.d - self.p


def window_dims(a: Attrs, up: Shape, down: Shape, size: Sequence[int]) -> list[Dim]:
    """Geometry of each window dimension, with empty stride/dilation as 1s and empty
    padding calculated as "Automatic Padding Calculation" says: t = max((x - 1) * s + f_d -
    X, 0), p = floor(t / 2), q = ceil(t / 2)."""
    n = len(size)
    dims = []
    for k, (f, s, d) in enumerate(zip(size, a.stride or (1,) * n, a.dilation or (1,) * n)):
        if a.padding:
            p, q = a.padding[k]
        else:
            t = max((down[k] - 1) * s + (f - 1) * d + 1 - up[k], 0)
            p, q = t // 2, t - t // 2
        dims.append(Dim(f, p, q, s, d, down[k], up[k]))
    return dims


def check_reflection(op_name: str, border: str, dims: Sequence[Dim], reverse: bool,
                     first_axis: int = 0) -> None:
    """'reflect' and 'reflect-even' are defined for one reflection at each edge (spec 4.3
    "Border Modes"): every index a window reads must map back inside the input."""
    if border not in ("reflect", "reflect-even"):
        return
    for k, dim in enumerate(dims):
        z = dim.x if reverse else dim.X
        lo, hi = dim.reach(reverse)
        extra = 0 if border == "reflect" else 1  # reflect-even repeats the edge value
        first, last = -(z - 1) - extra, 2 * (z - 1) + extra
        require(first <= lo and hi <= last,
                f"{op_name}: border '{border}' is defined for one reflection, but dimension "
                f"{first_axis + k} (extent {z}) is read at indices {lo}..{hi}, beyond the "
                f"{first}..{last} that one reflection reaches")


def _check_output_shape(op_name: str, out: Sequence[int], rank: int) -> None:
    require(len(out) in (0, rank), f"{op_name}: expected 'output_shape' of length {rank} "
                                   f"(the input rank) or 0, found {len(out)}")


# ---- conv, deconv -----------------------------------------------------------------------
def _check_bias(op_name: str, bias: Shape, rank: int, channels: int) -> None:
    """Bias is singular in every dimension but the channel one (1 or the output channels);
    NNEF aligns it left, so a [1, C] bias lines up with the (batch, channel) dims."""
    ok = len(bias) <= rank and all(e == 1 or (i == 1 and e == channels)
                                   for i, e in enumerate(bias))
    require(ok, f"{op_name}: 'bias' must be singular except in the channel dimension (1 "
                f"or {channels}), found shape {fmt(bias)}")


def _conv_groups(op_name: str, x: Shape, w: Shape, a: Attrs, transposed: bool) -> int:
    require(len(x) >= 3, f"{op_name}: input must have rank >= 3 (batch, channel, spatial), "
                         f"found shape {fmt(x)}")
    require(len(w) == len(x), f"{op_name}: expected filter of rank {len(x)} (the input "
                              f"rank), found shape {fmt(w)}")
    groups = a.groups
    if groups == 0:  # depth-wise: one group per channel of the up-scaled side
        groups = a.output_shape[1] if transposed and a.output_shape else x[1]
    if transposed:
        require(w[0] == x[1], f"{op_name}: filter batch ({w[0]}) does not match input "
                              f"channels ({x[1]})")
    else:
        require(w[1] * groups == x[1], f"{op_name}: filter channels ({w[1]}) times groups "
                                       f"({groups}) does not match input channels ({x[1]})")
    require(w[0] % groups == 0, f"{op_name}: 'groups' ({groups}) does not divide filter "
                                f"batch ({w[0]})")
    return groups


def _conv_like(op_name: str, shapes: list[Shape], a: Attrs, transposed: bool) -> Shape:
    x, w = shapes[0], shapes[1]
    groups = _conv_groups(op_name, x, w, a, transposed)
    channels = w[1] * groups if transposed else w[0]
    if len(shapes) == 3:
        _check_bias(op_name, shapes[2], len(x), channels)
    out_shape = a.get("output_shape", ())
    if out_shape:
        _check_output_shape(op_name, out_shape, len(x))
        require(out_shape[:2] == (x[0], channels), f"{op_name}: 'output_shape' {fmt(out_shape)} "
                f"must start with the input batch and output channels [{x[0]}, {channels}]")
        reverse_window(op_name, x[2:], w[2:], a, "spatial", out_shape[2:])
        out = out_shape
    else:
        out = (x[0], channels) + window(op_name, x[2:], w[2:], a, "spatial", transposed)
    check_positive(op_name, out)
    up, down = (out, x) if transposed else (x, out)
    check_reflection(op_name, a.border, window_dims(a, up[2:], down[2:], w[2:]), transposed, 2)
    return out


def conv_shape(op_name, shapes, a):
    """Output shape of conv."""
    return _conv_like(op_name, shapes, a, transposed=False)


def deconv_shape(op_name, shapes, a):
    """Output shape of deconv."""
    return _conv_like(op_name, shapes, a, transposed=True)


def window_attrs(borders: Sequence[str]) -> tuple[Attr, ...]:
    return (Attr("border", "str", "constant", choices=tuple(borders)),
            Attr("padding", "int_pairs", ()),
            Attr("stride", "ints", (), lo=1),
            Attr("dilation", "ints", (), lo=1))


# ---- box, debox, argmax_pool, sample, desample ------------------------------------------
def _pool_like(op_name: str, x: Shape, a: Attrs, transposed: bool) -> Shape:
    """Window over every dimension of x (batch and channel included), size per dim."""
    require(len(a.size) == len(x), f"{op_name}: expected 'size' of length {len(x)} (the "
                                   f"input rank), found {fmt(a.size)}")
    out_shape = a.get("output_shape", ())
    if out_shape:
        _check_output_shape(op_name, out_shape, len(x))
        out = reverse_window(op_name, x, a.size, a, "input", out_shape)
    else:
        out = window(op_name, x, a.size, a, "input", transposed)
    check_positive(op_name, out)
    up, down = (out, x) if transposed else (x, out)
    check_reflection(op_name, a.border, window_dims(a, up, down, a.size), transposed)
    return out


def box_shape(op_name, shapes, a):
    """Output shape of box and argmax_pool."""
    return _pool_like(op_name, shapes[0], a, transposed=False)


def debox_shape(op_name, shapes, a):
    """Output shape of debox."""
    return _pool_like(op_name, shapes[0], a, transposed=True)


def sample_shape(op_name, shapes, a):
    """Output shape of sample."""
    x, index = shapes
    out = _pool_like(op_name, x, a, transposed=False)
    require(index == out, f"{op_name}: 'index' shape {fmt(index)} does not match the "
                          f"output shape {fmt(out)}")
    return out


def desample_shape(op_name, shapes, a):
    """Output shape of desample."""
    x, index = shapes
    require(index == x, f"{op_name}: 'index' shape {fmt(index)} does not match 'input' "
                        f"shape {fmt(x)}")
    return _pool_like(op_name, x, a, transposed=True)


# ---- multilinear_upsample ----------------------------------------------------------------
def upsample_shape(op_name, shapes, a):
    """Output shape of multilinear_upsample."""
    (x,) = shapes
    require(len(a.factor) == len(x) - 2, f"{op_name}: expected 'factor' of length "
                                         f"{len(x) - 2} (one per spatial dimension), found "
                                         f"{fmt(a.factor)}")
    # interpolation reads one index beyond each edge, which 'reflect' maps to index 1
    require(a.border != "reflect" or min(x[2:]) >= 2, f"{op_name}: border 'reflect' needs "
            f"spatial extents of at least 2, found shape {fmt(x)}")
    return x[:2] + tuple(e * f for e, f in zip(x[2:], a.factor))


# ---- RoI pooling / resampling ------------------------------------------------------------
def roi_shape(op_name, shapes, a):
    """Output shape of the RoI ops."""
    x, rois, batch_index = shapes
    spatial = len(x) - 2
    require(spatial >= 1, f"{op_name}: input must have rank >= 3, found shape {fmt(x)}")
    require(len(rois) == 2 and rois[1] == 2 * spatial,
            f"{op_name}: 'rois' must have shape [N, {2 * spatial}], found {fmt(rois)}")
    # spec 4.6 says (N, 1); the Khronos parser and its tests use (N): accept both
    require(batch_index in ((rois[0],), (rois[0], 1)),
            f"{op_name}: 'batch_index' must have shape [{rois[0]}] or [{rois[0]}, 1], found "
            f"{fmt(batch_index)}")
    require(len(a.output_size) == spatial, f"{op_name}: expected 'output_size' of length "
                                           f"{spatial}, found {fmt(a.output_size)}")
    return (rois[0], x[1]) + a.output_size



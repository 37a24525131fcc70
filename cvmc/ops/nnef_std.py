"""NNEF 1.0.5 standard primitives: what their entries share, and the shape rules of the
reduce, shape-manipulation, matmul and update primitives.

`declare` registers an NNEF primitive; each primitive is one entry, declared with its
rules in its op family's module: `nnef_math` (element-wise), `nnef_tensor` (reduce,
shape, matmul, update; shape rules here), `nnef_nn` and `nnef_pool` (sliding-window) and
`nnef_resample` (up-sampling, RoI; shape rules of the three in `nnef_std_nn`). The entry
is the primitive's one declaration: the frontend reads documents with the `fragment`
declarations generated from the entries (`cvmc.ops.describe`), which must agree with the
Khronos stdlib's (cvmc/frontend/stdlib.nnef, the spec's file verbatim;
tests/ops/test_declarations.py); shape rules follow chapter 4 of
../shared/spec/nnef-1.0-spec.txt.
Compound fragments (min, max, clamp, relu, softmax, mean_reduce, moments,
nearest_upsample, add_n, ...) are expanded by the frontend and get no entry. Where a
primitive's name is a CVM op with another signature or other shape semantics, the entry
is `nnef.<name>` (abs: the CVM op on integer tensors, `nnef.abs` on scalars).

Every shape rule works on plain shapes and raises `OpRuleError` naming the op, the
operand or attribute, what was expected and what was found (worded like the Khronos
parser).
"""
from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from cvmc.ops.common import require
from cvmc.ops.registry import REQUIRED, Attr, Attrs, Fusion, OpDef, op

Shape = tuple[int, ...]
ShapeRule = Callable[[str, list[Shape], Attrs], "Shape | list[Shape]"]


def fmt(values: Sequence[int]) -> str:
    """A shape or integer list as `[1, 2, 3]`."""
    return "[" + ", ".join(str(v) for v in values) + "]"


def declare(name: str, rule: ShapeRule, inputs: Sequence[str], types: str,
            attrs: Sequence[Attr] = (), outputs: Sequence[str] = ("output",),
            fusion: Fusion = Fusion.OPAQUE, precision_rule: str = "", ulp: int = 0,
            multiply_add: bool = False) -> OpDef:
    """Register an NNEF primitive (`types` as its stdlib declaration has them, see
    `registry`) whose shape rule sees plain input shapes; the caller attaches the
    reference and lower rules (and the precision rule `precision_rule` describes, for an
    integer result)."""
    d = op(name, family="nnef", seeds=("nnef",), types=types, inputs=inputs, attrs=attrs,
           outputs=outputs, fusion=fusion, precision_rule=precision_rule, ulp=ulp,
           multiply_add=multiply_add)
    label = name.removeprefix("nnef.")  # messages use the name the document spells

    @d.shape
    def _shape(ins, a):
        return rule(label, [tuple(t.shape) for t in ins], a)

    return d


def check_axes(op_name: str, what: str, axes: Sequence[int], rank: int) -> None:
    """Axes must be unique and in [0, rank) (NNEF has no negative axes)."""
    require(all(0 <= x < rank for x in axes),
            f"{op_name}: {what} must be in range [0,{rank}), found {fmt(axes)}")
    require(len(set(axes)) == len(axes), f"{op_name}: {what} must be unique, found {fmt(axes)}")


def check_axis(op_name: str, axis: int, rank: int) -> None:
    """A single `axis` attribute must be in [0, rank)."""
    require(0 <= axis < rank, f"{op_name}: 'axis' must be in range [0,{rank}), found {axis}")


def check_positive(op_name: str, shape: Sequence[int], what: str = "output shape") -> None:
    """NNEF tensor extents are strictly positive; a rule whose result is not is an error."""
    require(all(e >= 1 for e in shape),
            f"{op_name}: {what} must have positive extents, found {fmt(shape)}")


def broadcast(op_name: str, names: Sequence[str], shapes: Sequence[Shape]) -> Shape:
    """NNEF broadcasting: shapes align LEFT, missing trailing dims count as 1; per dim the
    extents must be equal or singular, and the non-singular one is carried over."""
    rank = max(len(s) for s in shapes)
    out = []
    for i in range(rank):
        extents = {s[i] for s in shapes if i < len(s)} - {1}
        found = " vs ".join(f"{n} {fmt(s)}" for n, s in zip(names, shapes))
        require(len(extents) <= 1,
                f"{op_name}: arguments are not broadcast compatible in dimension {i} "
                f"(extents must be equal or 1; NNEF aligns shapes left): {found}")
        out.append(extents.pop() if extents else 1)
    return tuple(out)


def ints_attr(name: str, default=REQUIRED, lo: int | None = None) -> Attr:
    """An integer[] attribute."""
    return Attr(name, "ints", default, lo=lo)


def update_shape(op_name, shapes, a):
    variable, value = shapes
    require(value == variable, f"{op_name}: shape of update value {fmt(value)} does not "
                               f"match shape of variable {fmt(variable)}")
    return variable


# ---- reduce ---------------------------------------------------------------------------
def reduce_shape(op_name, shapes, a):
    (x,) = shapes
    check_axes(op_name, "axes", a.axes, len(x))
    return tuple(1 if i in a.axes else e for i, e in enumerate(x))


# ---- matmul ---------------------------------------------------------------------------
def matmul_shape(op_name, shapes, a):
    A, B = shapes
    require(len(A) == len(B), f"{op_name}: argument rank mismatch (A {fmt(A)} vs B {fmt(B)})")
    require(len(A) >= 2, f"{op_name}: rank of arguments must be at least 2, found {len(A)}")
    m, k_a = (A[-1], A[-2]) if a.transposeA else (A[-2], A[-1])
    k_b, n = (B[-1], B[-2]) if a.transposeB else (B[-2], B[-1])
    require(k_a == k_b, f"{op_name}: inner dimensions must agree ({k_a} vs {k_b}) for "
                        f"A {fmt(A)} and B {fmt(B)}")
    return broadcast(op_name, ("A batch", "B batch"), (A[:-2], B[:-2])) + (m, n)


# ---- reshape, unsqueeze ----------------------------------------------------------------
def reshape_shape(op_name, shapes, a):
    (x,) = shapes
    rank, start = len(x), a.axis_start
    require(start <= rank, f"{op_name}: 'axis_start' must be in range [0,{rank}], found {start}")
    end = rank if a.axis_count == -1 else start + a.axis_count
    require(end <= rank, f"{op_name}: 'axis_start' + 'axis_count' ({end}) must be in range "
                         f"[0,{rank}]")
    require(all(s >= -1 for s in a.shape),
            f"{op_name}: items in 'shape' must be >= -1, found {fmt(a.shape)}")
    require(list(a.shape).count(-1) <= 1,
            f"{op_name}: at most one item may be -1 in 'shape', found {fmt(a.shape)}")
    require(all(start + i < rank for i, s in enumerate(a.shape) if s == 0),
            f"{op_name}: a 0 item in 'shape' {fmt(a.shape)} has no input extent to inherit")
    new = [x[start + i] if s == 0 else s for i, s in enumerate(a.shape)]
    volume, known = math.prod(x[start:end]), math.prod(s for s in new if s != -1)
    if -1 in new:
        require(volume % known == 0, f"{op_name}: volume of 'shape' {fmt(a.shape)} does not "
                                     f"divide volume of input[{start}:{end}] {fmt(x[start:end])}")
        new[new.index(-1)] = volume // known
    require(math.prod(new) == volume, f"{op_name}: volume of 'shape' {fmt(a.shape)} does not "
                                      f"equal volume of input[{start}:{end}] {fmt(x[start:end])}")
    return x[:start] + tuple(new) + x[end:]


def unsqueeze_shape(op_name, shapes, a):
    (x,) = shapes
    rank = len(x) + len(a.axes)
    check_axes(op_name, "axes", a.axes, rank)
    rest = iter(x)  # axes are positions in the output; the input extents fill the others
    return tuple(1 if i in a.axes else next(rest) for i in range(rank))


def squeeze_shape(op_name, shapes, a):
    (x,) = shapes
    check_axes(op_name, "axes", a.axes, len(x))
    require(all(x[i] == 1 for i in a.axes), f"{op_name}: squeezed dimensions must be "
                                            f"singular, found {fmt(x)} with axes {fmt(a.axes)}")
    return tuple(e for i, e in enumerate(x) if i not in a.axes)


def transpose_shape(op_name, shapes, a):
    (x,) = shapes
    n = len(a.axes)
    require(n <= len(x), f"{op_name}: length of 'axes' ({n}) must not exceed the input rank "
                         f"({len(x)})")
    require(sorted(a.axes) == list(range(n)),
            f"{op_name}: axes must be a permutation of [0..{n - 1}], found {fmt(a.axes)}")
    return tuple(x[i] for i in a.axes) + x[n:]


# ---- concat, split, stack, unstack ------------------------------------------------------
def concat_shape(op_name, shapes, a):
    first = shapes[0]
    check_axis(op_name, a.axis, len(first))
    for s in shapes:
        require(len(s) == len(first) and all(
            e == f for i, (e, f) in enumerate(zip(s, first)) if i != a.axis),
            f"{op_name}: shapes of 'values' must be identical in all dimensions other than "
            f"'axis' ({a.axis}), found {', '.join(fmt(v) for v in shapes)}")
    return first[:a.axis] + (sum(s[a.axis] for s in shapes),) + first[a.axis + 1:]


def split_shape(op_name, shapes, a):
    (x,) = shapes
    check_axis(op_name, a.axis, len(x))
    require(len(a.ratios) >= 1, f"{op_name}: 'ratios' must not be empty")
    total = sum(a.ratios)
    require(x[a.axis] % total == 0, f"{op_name}: sum of 'ratios' {fmt(a.ratios)} ({total}) "
                                    f"does not divide the extent {x[a.axis]} along 'axis' {a.axis}")
    unit = x[a.axis] // total
    return [x[:a.axis] + (unit * r,) + x[a.axis + 1:] for r in a.ratios]


def stack_shape(op_name, shapes, a):
    first = shapes[0]
    require(0 <= a.axis <= len(first),
            f"{op_name}: 'axis' must be in range [0,{len(first) + 1}), found {a.axis}")
    require(all(s == first for s in shapes), f"{op_name}: shapes of 'values' must be "
                                             f"identical, found {', '.join(fmt(s) for s in shapes)}")
    return first[:a.axis] + (len(shapes),) + first[a.axis:]


def unstack_shape(op_name, shapes, a):
    (x,) = shapes
    check_axis(op_name, a.axis, len(x))
    return [x[:a.axis] + x[a.axis + 1:]] * x[a.axis]


# ---- slice ------------------------------------------------------------------------------
def _slice_extent(op_name: str, axis: int, x: int, begin: int, end: int, stride: int) -> int:
    """Extent along one sliced axis (NNEF 1.0.5): negative offsets count from the end,
    offsets are clamped to [-1, x], and end 0 with stride 1 means the whole extent."""
    if end == 0 and stride == 1:
        end = x
    first, last = (max(-1, min(x, v + x if v < 0 else v)) for v in (begin, end))
    ok = 0 <= first < last <= x if stride > 0 else -1 <= last < first < x
    require(ok, f"{op_name}: slice range {begin}:{end}:{stride} along axis {axis} "
                f"(extent {x}) is empty or invalid")
    return -((last - first) // -stride) if stride > 0 else -((first - last) // stride)


def slice_starts(shape: Sequence[int], a: Attrs) -> list[int]:
    """The first index `slice` reads along each dimension (0 where it does not slice):
    `begin`, counted from the end when negative, clamped as `_slice_extent` does."""
    starts = [0] * len(shape)
    for axis, b in zip(a.axes, a.begin):
        x = shape[axis]
        starts[axis] = max(-1, min(x, b + x if b < 0 else b))
    return starts


def slice_shape(op_name, shapes, a):
    (x,) = shapes
    stride = a.stride or (1,) * len(a.axes)
    for what, values in (("begin", a.begin), ("end", a.end), ("stride", stride)):
        require(len(values) == len(a.axes), f"{op_name}: length of '{what}' ({len(values)}) "
                                            f"does not equal length of 'axes' ({len(a.axes)})")
    check_axes(op_name, "'axes'", a.axes, len(x))
    require(all(s != 0 for s in stride), f"{op_name}: 'stride' must be non-zero, found "
                                         f"{fmt(stride)}")
    out = list(x)
    for axis, b, e, s in zip(a.axes, a.begin, a.end, stride):
        out[axis] = _slice_extent(op_name, axis, x[axis], b, e, s)
    return tuple(out)


# ---- pad, tile, gather ------------------------------------------------------------------
def pad_shape(op_name, shapes, a):
    (x,) = shapes
    require(len(a.padding) == len(x), f"{op_name}: expected 'padding' of length {len(x)} "
                                      f"(the input rank), found {len(a.padding)}")
    out = tuple(p + e + q for e, (p, q) in zip(x, a.padding))
    check_positive(op_name, out)
    # every padded position takes its value from the border mode: 'ignore' has none to give
    require(a.border != "ignore", f"{op_name}: border 'ignore' leaves the padding without "
                                  f"values; use 'constant', 'replicate', 'reflect' or "
                                  f"'reflect-even'")
    # 'reflect' / 'reflect-even' are defined for one reflection at each edge (spec 4.3)
    limit = {"reflect": 1, "reflect-even": 0}.get(a.border)
    if limit is not None:
        for k, (e, (p, q)) in enumerate(zip(x, a.padding)):
            require(max(p, q) <= e - limit, f"{op_name}: border '{a.border}' is defined for "
                                            f"one reflection, but dimension {k} (extent {e}) "
                                            f"is padded by ({p}, {q}): at most {e - limit}")
    return out


def tile_shape(op_name, shapes, a):
    (x,) = shapes
    require(len(a.repeats) == len(x), f"{op_name}: expected 'repeats' of length {len(x)} "
                                      f"(the input rank), found {fmt(a.repeats)}")
    return tuple(e * r for e, r in zip(x, a.repeats))


def gather_shape(op_name, shapes, a):
    x, indices = shapes
    check_axis(op_name, a.axis, len(x))
    return x[:a.axis] + indices + x[a.axis + 1:]


BORDERS = ("ignore", "constant", "replicate", "reflect", "reflect-even")

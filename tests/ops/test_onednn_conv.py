"""onednn.convolution and the canonical N-d convolution (cvmc/ops/conv_nd.py).

Expected values come from hand-computed cases (each auto_pad mode, groups, dilation, the
formats), the spec's formula as loops and tvm.topi.testing's conv1d/2d/3d (oracles of the
reference), oneDNN's auto_pad formula as its source writes it, ONNX Runtime's Conv (its
own auto_pad; float32 within the bound) and the benchdnn shapes of real networks, compiled
for llvm against the reference: integers bit-exact, float32 within `sum_bound`.
`-m crosscheck` adds torch where it is installed.
"""
from __future__ import annotations

import itertools
import tempfile
from pathlib import Path

import numpy as np
import pytest
from tvm.topi.testing import (
    conv1d_ncw_python,
    conv2d_nchw_python,
    conv3d_ncdhw_python,
    dilate_python,
)

from cvmc.errors import CvmcError
from cvmc.ir import Graph, Node, TensorType
from cvmc.ops import lookup
from cvmc.ops.conv_nd import conv_nd_reference
from cvmc.ops.infer import retype
from cvmc.ops.onednn import NAME, auto_pads
from cvmc.ops.registry import Attrs
from cvmc.reference import reference_run
from tests.benchdnn_shapes import SHAPES_DIR, ConvShape, read_shapes, scaled
from tests.oputil import check_op, one_op_graph

MODES = ("none", "same_upper", "same_lower", "valid")
FORMATS = (("NCX", "OIX"), ("NXC", "XIO"))
U = 2.0**-24  # unit roundoff of float32


def attrs(r: int, **kw) -> dict:
    """Attributes of an r-d convolution: dense, unpadded, stride 1, NCX / OIX unless given."""
    a = {"strides": [1] * r, "pads_begin": [0] * r, "pads_end": [0] * r, "dilations": [1] * r,
         "data_format": "NCX", "weights_format": "OIX"}
    return {**a, **kw}


def in_format(x: np.ndarray, w: np.ndarray, data_format: str, weights_format: str):
    """NCX src / OIX weights rearranged as `data_format` / `weights_format`."""
    return (np.moveaxis(x, 1, -1) if data_format == "NXC" else x,
            np.moveaxis(np.moveaxis(w, 0, -1), 0, -2) if weights_format == "XIO" else w)


def out_of_format(y: np.ndarray, data_format: str) -> np.ndarray:
    """A dst in `data_format` rearranged as NCX."""
    return np.moveaxis(y, -1, 1) if data_format == "NXC" else y


def sum_bound(magnitude: np.ndarray, terms: int) -> np.ndarray:
    """|compiled - reference| allowed for a float32 sum whose terms' magnitudes add up to
    `magnitude`, each term going through at most `terms` roundings (a product and the
    additions; K in the README): gamma(terms + 2) * magnitude, gamma(n) = n u / (1 - n u)
    (Higham, Accuracy and Stability of Numerical Algorithms, 3.1: recursive summation in any
    fixed order), one rounding more for the reference's own float32 result and one for the
    float64 reference's error; plus 2^-150 per term for products that underflow."""
    n = terms + 2
    return n * U / (1 - n * U) * magnitude + terms * 2.0**-150


def conv_tolerance(xs: list[np.ndarray], a: dict) -> np.ndarray:
    """`sum_bound` of a float convolution: the op's reference on |src|, |weights|, |bias|
    sums the terms' magnitudes; a term is a product plus one rounding per addition (the
    weights' per-output taps, plus the bias)."""
    d = lookup(NAME)
    mags = [np.abs(x.astype(np.float64)) for x in xs]
    magnitude = d.run_reference(mags, Attrs(d.normalize_attrs(a)))[0]
    w = xs[1].shape
    taps = int(np.prod(w)) // (w[0] if a.get("weights_format") == "OIX" else w[-1])
    return sum_bound(magnitude, taps + (len(xs) == 3))


def assert_close(ref: np.ndarray, got: np.ndarray, tol: np.ndarray, what: str) -> None:
    """|got - ref| <= tol elementwise (float32 arrays)."""
    err = np.abs(got.astype(np.float64) - ref.astype(np.float64))
    bad = ~(err <= tol)
    assert not bad.any(), (f"{what}: |compiled - reference| = {err[bad].max()} exceeds the "
                           f"bound at {np.argwhere(bad)[0].tolist()}")


# ---- hand-computed cases: 1-D, one channel, NCX / OIX --------------------------------------
X5 = [1, 2, 3, 4, 5]
HAND = [
    # explicit pads, stride 2: padded [0 1 2 3 4 5], taps (0,1,2) and (2,3,4)
    (X5, [1, 10, 100], {"strides": [2], "pads_begin": [1]}, [210, 432]),
    # valid: no padding, whatever pads say
    (X5, [1, 10, 100], {"strides": [2], "auto_pad": "valid", "pads_begin": [4],
                        "pads_end": [4]}, [321, 543]),
    # same_upper, stride 2: O = 3, P = 2 -> (1, 1): padded [0 1 2 3 4 5 0]
    (X5, [1, 10, 100], {"strides": [2], "auto_pad": "same_upper"}, [210, 432, 54]),
    # odd total P = 1: upper pads after, lower before (pads_begin / pads_end ignored)
    (X5, [1, 10], {"auto_pad": "same_upper", "pads_begin": [3]}, [21, 32, 43, 54, 5]),
    (X5, [1, 10], {"auto_pad": "same_lower", "pads_end": [3]}, [10, 21, 32, 43, 54]),
    # none: explicit asymmetric pads (2, 0)
    (X5, [1, 10], {"pads_begin": [2]}, [0, 10, 21, 32, 43, 54]),
    # dilation 2 (DK = 3) with same_upper: P = 2 -> (1, 1); taps p[i] and p[i + 2]
    (X5, [1, 10], {"dilations": [2], "auto_pad": "same_upper"}, [20, 31, 42, 53, 4]),
    # dilation 2 with same_lower, stride 2: O = 3, P = (3-1)*2 + 3 - 5 = 2 -> (1, 1)
    (X5, [1, 10], {"dilations": [2], "strides": [2], "auto_pad": "same_lower"},
     [20, 42, 4]),
    # P clamped at 0 (stride 3 > kernel): O = floor(4 / 3) + 1 = 2 = ceil(5 / 3)
    (X5, [7], {"strides": [3], "auto_pad": "same_upper"}, [7, 28]),
    # dilation 1 is dense (oneDNN Graph), not oneDNN primitive's "dilation 0"
    (X5, [1, 10, 100], {"dilations": [1]}, [321, 432, 543]),
]


@pytest.mark.parametrize("x, w, given, expected", HAND)
@pytest.mark.parametrize("kind", ["int", "float"])
def test_hand_cases(x, w, given, expected, kind):
    """Reference equals the hand-computed values; compiled equals the reference."""
    dtype, p = (np.int64, 8) if kind == "int" else (np.float32, None)
    xs = np.array(x, dtype).reshape(1, 1, -1)
    ws = np.array(w, dtype).reshape(1, 1, -1)
    ref = check_op(NAME, [(xs, p), (ws, p)], attrs(1, **given), weights=(1,))[0]
    assert ref.ravel().tolist() == expected


def test_groups_and_bias_by_hand():
    """Two groups of a 1x1 2-D conv: output channel g reads input channel g only."""
    x = np.array([[[[1, 2]], [[3, 4]]]])                # (1, 2, 1, 2)
    w = np.array([[[[5]]], [[[-7]]]])                    # (2, 1, 1, 1)
    b = np.array([100, -100])
    for arrays, p in ((x, 8), (x.astype(np.float32), None)):
        ins = [(arrays, p), (w.astype(arrays.dtype), p), (b.astype(arrays.dtype), 12 if p else p)]
        ref = check_op(NAME, ins, attrs(2, groups=2), weights=(1, 2))[0]
        assert ref.tolist() == [[[[105, 110]], [[-121, -128]]]]


def test_formats_agree():
    """NXC vs NCX and XIO vs OIX: the same numbers, in the reference exactly and compiled
    (integers exactly, floats within the bound)."""
    rng = np.random.default_rng(1)
    x = rng.integers(-127, 128, (2, 4, 7, 6))
    w = rng.integers(-127, 128, (6, 2, 3, 2))
    b = rng.integers(-999, 1000, (6,))
    geom = {"strides": [2, 1], "pads_begin": [1, 0], "pads_end": [0, 2], "dilations": [2, 1],
            "groups": 2}
    results = {}
    for kind, (data_format, weights_format) in itertools.product(
            ("int", "float"), itertools.product(("NCX", "NXC"), ("OIX", "XIO"))):
        dtype, p, pb = (np.int64, 8, 12) if kind == "int" else (np.float32, None, None)
        xs, ws = in_format(x.astype(dtype), w.astype(dtype), data_format, weights_format)
        a = attrs(2, **geom, data_format=data_format, weights_format=weights_format)
        ins = [(xs, p), (ws, p), (b.astype(dtype), pb)]
        ref = check_op(NAME, ins, a, weights=(1, 2))[0]
        results.setdefault(kind, []).append(out_of_format(ref, data_format))
    for kind, outs in results.items():
        assert all(np.array_equal(o, outs[0]) for o in outs), kind
    assert np.array_equal(results["int"][0], results["float"][0])  # small ints: exact


# ---- the reference against independent oracles ------------------------------------------
def direct(x, w, b, strides, pads_begin, dilations, groups, out):
    """The spec's formula as loops: dst(n, g*OCG + o, y) = bias + sum_{i, k} src(n, g*ICG +
    i, y*S + k*D - PB) * weights(g*OCG + o, i, k), src 0 outside."""
    n = x.shape[0]
    oc, icg, *k = w.shape
    ocg = oc // groups
    y = np.zeros((n, oc, *out), dtype=np.float64 if x.dtype.kind == "f" else np.int64)
    for b_, o in itertools.product(range(n), range(oc)):
        g = o // ocg
        for pos in itertools.product(*map(range, out)):
            total = b[o] if b is not None else 0
            for i, tap in itertools.product(range(icg), itertools.product(*map(range, k))):
                at = [p * s + t * d - pb for p, s, t, d, pb in
                      zip(pos, strides, tap, dilations, pads_begin)]
                if all(0 <= a < e for a, e in zip(at, x.shape[2:])):
                    total += x[(b_, g * icg + i, *at)] * w[(o, i, *tap)]
            y[(b_, o, *pos)] = total
    return y


# (src NCX shape, weights OIX shape, strides, pads_begin, pads_end, dilations, groups)
ORACLE_CASES = [
    ((2, 3, 9), (4, 3, 3), [2], [2], [1], [2], 1),
    ((1, 4, 8), (6, 2, 2), [1], [0], [3], [3], 2),
    ((2, 4, 7, 6), (6, 2, 3, 2), [2, 1], [1, 0], [0, 2], [2, 1], 2),
    ((1, 3, 5, 5), (3, 1, 3, 3), [1, 2], [2, 1], [1, 2], [1, 2], 3),   # depthwise
    ((1, 2, 4, 5, 4), (4, 2, 2, 3, 2), [1, 2, 1], [1, 0, 1], [0, 1, 2], [2, 1, 1], 1),
    ((1, 4, 5, 4, 4), (2, 2, 3, 1, 2), [2, 1, 3], [0, 1, 0], [1, 0, 1], [1, 1, 2], 2),
]


def _oracle_inputs(case, kind, seed):
    xs, ws, *_ = case
    rng = np.random.default_rng(seed)
    if kind == "int":
        return (rng.integers(-127, 128, xs), rng.integers(-127, 128, ws),
                rng.integers(-999, 1000, ws[0]))
    return (rng.standard_normal(xs), rng.standard_normal(ws), rng.standard_normal(ws[0]))


@pytest.mark.parametrize("case", ORACLE_CASES)
@pytest.mark.parametrize("kind", ["int", "float"])
def test_reference_matches_direct_loops_and_topi(case, kind):
    """conv_nd_reference == the spec's loops (exactly for integers) == tvm.topi.testing's
    conv1d_ncw / conv2d_nchw / conv3d_ncdhw on the zero-padded src and dilated weights."""
    _, _, strides, pb, pe, dil, groups = case
    x, w, b = _oracle_inputs(case, kind, 7)
    got = conv_nd_reference(x, w, b, strides, pb, pe, dil, groups)
    want = direct(x, w, b, strides, pb, dil, groups, got.shape[2:])
    if kind == "int":
        assert got.dtype == np.int64 and np.array_equal(got, want)
    else:
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
    xp = np.pad(x, [(0, 0), (0, 0), *zip(pb, pe)])
    r = x.ndim - 2
    if r == 1:  # topi's conv1d has no groups: one call per group
        topi = np.concatenate([conv1d_ncw_python(xg, wg, strides, 0, dil) for xg, wg in zip(
            np.split(xp, groups, axis=1), np.split(w, groups, axis=0))], axis=1)
    else:
        wd = dilate_python(w, (1, 1, *dil))
        fn = conv2d_nchw_python if r == 2 else conv3d_ncdhw_python
        topi = fn(xp, wd, strides, 0, groups=groups)
    np.testing.assert_allclose(got, topi + b.reshape(-1, *[1] * r), rtol=1e-12, atol=1e-9)


# conv_nd itself serves NNEF's conv too, whose padding may be negative (cropping)
NEGATIVE_PAD_CASES = [
    ((2, 4, 7, 6), (6, 2, 3, 2), [2, 1], [-1, 2], [1, -1], [1, 2], 2),
    ((1, 3, 9), (2, 3, 2), [3], [-2], [-1], [2], 1),
    ((1, 2, 5, 6, 4), (2, 1, 2, 2, 3), [1, 2, 1], [0, -1, 1], [-1, 1, -2], [2, 1, 1], 2),
]


@pytest.mark.parametrize("case", NEGATIVE_PAD_CASES)
def test_canonical_conv_crops_with_negative_pads(case):
    """conv_nd_reference == the spec's loops when a pad is negative (the src is cropped)."""
    _, _, strides, pb, pe, dil, groups = case
    x, w, b = _oracle_inputs(case, "int", 11)
    got = conv_nd_reference(x, w, b, strides, pb, pe, dil, groups)
    assert np.array_equal(got, direct(x, w, b, strides, pb, dil, groups, got.shape[2:]))


@pytest.mark.parametrize("case", NEGATIVE_PAD_CASES + ORACLE_CASES[:4])
@pytest.mark.parametrize("channels_last", [False, True])
@pytest.mark.parametrize("kind", ["int", "float"])
def test_canonical_lowering_equals_canonical_reference(case, channels_last, kind):
    """conv_nd_compute (unscheduled, built for llvm by TVM alone) == conv_nd_reference: int32
    exactly, float32 within the bound; NCX or NXC dst, negative and positive pads."""
    import tvm
    from tvm import te

    from cvmc.ops.conv_nd import conv_nd_compute

    _, _, strides, pb, pe, dil, groups = case
    dtype = "int32" if kind == "int" else "float32"
    arrays = [v.astype(dtype) for v in _oracle_inputs(case, kind, 13)]
    x, w, b = (te.placeholder(v.shape, dtype, name) for v, name in zip(arrays, "xwb"))
    y = conv_nd_compute(x, w, b, strides, pb, pe, dil, groups, "conv", channels_last)
    ex = tvm.compile(tvm.IRModule({"main": te.create_prim_func([x, w, b, y])}),
                     target={"kind": "llvm"})
    out = tvm.runtime.tensor(np.zeros([int(d) for d in y.shape], dtype))
    ex["main"](*map(tvm.runtime.tensor, arrays), out)
    got = np.moveaxis(out.numpy(), -1, 1) if channels_last else out.numpy()
    ref = conv_nd_reference(*[v.astype(np.float64 if kind == "float" else np.int64)
                              for v in arrays], strides, pb, pe, dil, groups)
    if kind == "int":
        assert np.array_equal(got, ref)
    else:
        mags = conv_nd_reference(*[np.abs(v.astype(np.float64)) for v in arrays], strides, pb,
                                 pe, dil, groups)
        taps = int(np.prod(arrays[1].shape[1:]))
        assert_close(ref.astype(np.float32), got, sum_bound(mags, taps + 1), "conv_nd")


def test_auto_pad_is_onednn_formula():
    """auto_pads == oneDNN's infer_auto_pad as its source writes it (total from X % S,
    clamped at 0; lower: (P + 1) / 2 before), and same_* give O = ceil(X / S)."""
    for x, k, s, d in itertools.product(range(1, 13), range(1, 6), range(1, 5), range(1, 4)):
        ek = (k - 1) * d + 1
        total = max(0, ek - s if x % s == 0 else ek - x % s)
        for mode, before in (("same_upper", total // 2), ("same_lower", (total + 1) // 2)):
            a = Attrs(auto_pad=mode, strides=(s,), dilations=(d,), pads_begin=(9,),
                      pads_end=(9,))
            assert auto_pads((x,), (k,), a) == ((before,), (total - before,))
            if ek <= x + total:
                assert (x + total - ek) // s + 1 == -(-x // s), (x, k, s, d)


# ---- precision and errors -----------------------------------------------------------------
def test_integer_precision_rule():
    """p_src + p_weights + bitlen(IC/groups * K1*K2), with bias max(that, p_b) + 1."""
    x, w = np.zeros((1, 6, 5, 5), np.int64), np.zeros((4, 3, 3, 3), np.int64)
    a = attrs(2, groups=2)
    g = one_op_graph(NAME, [(x, 7), (w, 8)], a, weights=(1,))
    assert g.types["y0"].precision == 7 + 8 + 5  # 3 * 3 * 3 = 27: 5 bits
    g = one_op_graph(NAME, [(x, 8), (w, 8), (np.zeros(4, np.int64), 25)], a, weights=(1, 2))
    assert g.types["y0"].precision == 26
    assert g.types["y0"].dtype == "int32"
    f = one_op_graph(NAME, [(x.astype(np.float32), None), (w.astype(np.float32), None)], a,
                     weights=(1,))
    assert f.types["y0"] == TensorType((1, 4, 3, 3), "float32")


def _error(inputs, given, weights=(1,)) -> str:
    with pytest.raises(CvmcError) as e:
        one_op_graph(NAME, inputs, given, weights)
    return e.value.message


def test_errors_name_the_rule():
    """Bad operands and attributes: one message naming the operand or attribute."""
    xi, wi = (np.zeros((1, 4, 5, 5), np.int64), 8), (np.zeros((6, 2, 3, 3), np.int64), 8)
    xf, wf = (np.zeros((1, 4, 5, 5), np.float32), None), (np.zeros((6, 2, 3, 3), np.float32),
                                                           None)
    a = attrs(2, groups=2)
    cases = [
        ([xi, wi], attrs(2, groups=1), "weights have 2 input channels per group, expected 4"),
        ([xi, wi], attrs(2, groups=4), "groups=4 must divide"),
        ([xi, wi], attrs(3, groups=2), "'strides' must have 2 values"),
        ([xi, wi], {**a, "dilations": [1, 0]}, "'dilations' must be in [1, 16777216]"),
        ([xi, wi], {**a, "pads_end": [0, -1]}, "'pads_end' must be in [0, 16777216]"),
        ([xi, wi], {**a, "auto_pad": "SAME"}, "'auto_pad' must be"),
        ([xi, wi], {**a, "data_format": "NCHW"}, "'data_format' must be"),
        ([xi, wi], {**a, "dilations": [3, 1]}, "dilated kernel extent 7"),
        ([xi, wi], {**a, "pads_begin": [2**24, 0], "pads_end": [2**24, 0]},
         "exceeds the tensor limits"),
        ([(np.zeros((1, 4, 5), np.int64), 8), wi], a, "weights must have rank 3"),
        ([(np.zeros((4, 5), np.int64), 8), (np.zeros((6, 4), np.int64), 8)], attrs(0),
         "src must have rank 3, 4 or 5"),
        ([xi, wi, (np.zeros(5, np.int64), 8)], a, "bias must have shape [6]"),
        ([(np.zeros((1, 4, 5, 5), bool), None), wf], a, "src must be float32 or integer"),
        ([xf, wi], a, "generic inputs must all have one element type"),
        ([(np.zeros((1, 4, 5, 5), np.int64), 9), wi], a, "src precision must be <= 8"),
    ]
    for inputs, given, expected in cases:
        assert expected in _error(inputs, given, tuple(range(1, len(inputs)))), expected
    big = (np.zeros((1, 2048, 1, 1), np.int64), 8), (np.full((4096, 2048, 1, 1), 0), 8)
    assert "outside 1..32" in _error([*big, (np.zeros(4096, np.int64), 32)], attrs(2))


def test_integer_kernels_use_no_floating_point():
    """The integer convolution lowers to integer TIR only (llvm and cuda)."""
    from cvmc.lowering.lower import lower_graph
    from cvmc.passes.fusion import fuse_kernels
    from cvmc.passes.target import Target

    rng = np.random.default_rng(3)
    for data_format, weights_format in FORMATS:
        x, w = in_format(rng.integers(-9, 9, (1, 4, 6, 5)), rng.integers(-9, 9, (4, 2, 3, 3)),
                         data_format, weights_format)
        g = one_op_graph(NAME, [(x, 8), (w, 8)], attrs(2, groups=2, pads_begin=[1, 1],
                         data_format=data_format, weights_format=weights_format), (1,))
        for target in (Target.make("llvm"), Target.make("cuda")):
            script = lower_graph(fuse_kernels(g, target), target)[0].script()
            assert "float" not in script, (target, data_format)


# ---- benchdnn shapes of real networks ------------------------------------------------------
def _shape_files() -> list[Path]:
    return sorted(SHAPES_DIR.glob("shapes_*")) if SHAPES_DIR.is_dir() else []


def _conv_inputs(shape: ConvShape, kind: str, layout: tuple[str, str], seed: int):
    """(src, weights, bias) for a benchdnn shape in `layout`, random inside 8 bits (int) or
    normal (float)."""
    rng = np.random.default_rng(seed)
    xs = (shape.mb, shape.ic, *shape.i)
    ws = (shape.oc, shape.ic // shape.g, *shape.k)
    if kind == "int":
        x, w, b = (rng.integers(-127, 128, xs), rng.integers(-127, 128, ws),
                   rng.integers(-2**15 + 1, 2**15, shape.oc))
    else:
        x, w, b = (rng.standard_normal(s).astype(np.float32) for s in (xs, ws, shape.oc))
    return (*in_format(x, w, *layout), b)


def _conv_attrs(shape: ConvShape, mode: str, layout: tuple[str, str]) -> dict:
    r = len(shape.i)
    return attrs(r, strides=list(shape.s), dilations=list(shape.d), pads_begin=list(
        shape.pad_l), pads_end=list(shape.pad_r), auto_pad=mode, groups=shape.g,
        data_format=layout[0], weights_format=layout[1])


def _sweep(shapes: list[ConvShape], everything: bool) -> list[tuple]:
    """(shape, auto_pad mode, layout, kind) to test: per shape every mode in both layouts
    and both element kinds, or (the default suite) every mode in one layout and one kind,
    alternating so that a list of two or more shapes meets every mode in both layouts and
    both kinds."""
    if everything:
        combos = list(itertools.product(shapes, MODES, FORMATS, ("int", "float")))
    else:
        combos = [(shape, mode, FORMATS[(j + m) % 2], ("int", "float")[j % 2])
                  for j, shape in enumerate(shapes) for m, mode in enumerate(MODES)]
    # `valid` has no output where the image is smaller than the dilated kernel (an SSD
    # layer convolves a 2x2 image with a padded 3x3 kernel): the op rejects it, as oneDNN
    return [c for c in combos if c[1] != "valid" or all(
        i >= (k - 1) * d + 1 for i, k, d in zip(c[0].i, c[0].k, c[0].d))]


def _multi_conv_graph(combos) -> tuple[Graph, dict[str, np.ndarray]]:
    """One graph holding one convolution per combo (src an input, weights and bias
    weights), and its feeds."""
    d = lookup(NAME)
    types, consts, nodes, feeds = {}, {}, [], {}
    for idx, (shape, mode, layout, kind) in enumerate(combos):
        x, w, b = _conv_inputs(shape, kind, layout, idx)
        a = d.normalize_attrs(_conv_attrs(shape, mode, layout))
        names = (f"s{idx}", f"w{idx}", f"b{idx}")
        precs = (8, 8, 16) if kind == "int" else (None, None, None)
        dtype = "int32" if kind == "int" else "float32"
        for name, arr, p in zip(names, (x, w, b), precs):
            types[name] = TensorType(arr.shape, dtype, p)
        feeds[names[0]] = x
        consts.update({names[1]: w, names[2]: b})
        out = d.infer_shapes([types[n] for n in names], a)[0]
        types[f"d{idx}"] = TensorType(out, dtype)
        nodes.append(Node(NAME, names, (f"d{idx}",), dict(a)))
    g = Graph("benchdnn", list(feeds), [n.outputs[0] for n in nodes], nodes, types, consts)
    return retype(g), feeds


def _check_sweep(combos) -> None:
    """Compile every combo in one llvm module and compare with the reference."""
    import cvmc_runtime

    from cvmc.codegen import compile_model

    g, feeds = _multi_conv_graph(combos)
    ref = reference_run(g, feeds)
    with tempfile.TemporaryDirectory(prefix="cvmc-onednn-") as tmp:
        compile_model(g, Path(tmp) / "convs.cvmx", "llvm")
        got = cvmc_runtime.load(Path(tmp) / "convs.cvmx").run(feeds)
    for idx, (shape, mode, layout, kind) in enumerate(combos):
        what = f"{shape.name} {mode} {layout} {kind}"
        r, c = ref[f"d{idx}"], got[f"d{idx}"]
        assert r.dtype == c.dtype and r.shape == c.shape, what
        if kind == "int":
            assert np.array_equal(r, c), what
        else:
            xs = [feeds[f"s{idx}"], g.constants[f"w{idx}"], g.constants[f"b{idx}"]]
            assert_close(r, c, conv_tolerance(xs, _conv_attrs(shape, mode, layout)), what)


def _handful(shapes: list[ConvShape]) -> list[ConvShape]:
    """The first, middle and last layer of a list (deterministic, spread over the net)."""
    picks = dict.fromkeys((0, len(shapes) // 2, len(shapes) - 1))
    return [shapes[i] for i in picks]


def test_benchdnn_shapes_parse():
    """Every descriptor of every list parses to a geometry whose output sizes are positive;
    the README's worked rules hold on a few descriptors computed by hand."""
    files = _shape_files()
    if not files:
        pytest.skip("../shared/data/benchdnn-conv-shapes not present")
    assert all(min(s.out()) >= 1 for f in files for s in read_shapes(f))
    from tests.benchdnn_shapes import parse_descriptor
    s = parse_descriptor('g2mb256ic96ih27oc256oh27kh5ph2n"alexnet:conv2"')
    assert (s.g, s.mb, s.ic, s.oc, s.i, s.k, s.s, s.d, s.pad_l, s.pad_r, s.out()) == \
        (2, 256, 96, 256, (27, 27), (5, 5), (1, 1), (1, 1), (2, 2), (2, 2), (27, 27))
    s = parse_descriptor('ic17oc17_iw8ow4kw1pw0sw2_n"conv_basic_1d:1x1_stride_tail"')
    assert (s.mb, s.i, s.pad_r, s.out()) == (2, (8,), (-1,), (4,))  # p_r = 3*2 - 8 + 1 - 0
    s = parse_descriptor('ic3oc16_id5od5kd3pd1_n"conv_basic_3d:1st"')
    assert (s.i, s.k, s.pad_l, s.pad_r) == ((5, 5, 5), (3, 3, 3), (1, 1, 1), (1, 1, 1))
    s = parse_descriptor('mb16_g1ic3oc32_ih610oh608kh3sh1dh0ph0_iw610ow608kw3sw1dw0pw0_n"y"')
    assert (s.mb, s.i, s.d, s.out()) == (16, (610, 610), (1, 1), (608, 608))
    s = parse_descriptor("ic8ih9oc4kh3dh1n\"dilated\"")  # output computed: 9 - 5 + 1
    assert (s.d, s.pad_l, s.out()) == ((2, 2), (0, 0), (5, 5))


@pytest.mark.parametrize("path", _shape_files(), ids=lambda p: p.name)
def test_benchdnn_shapes_compiled(path):
    """A handful of layers per list, scaled down, in every auto_pad mode and both layouts,
    integer and float: compiled (llvm) == reference."""
    _check_sweep(_sweep([scaled(s) for s in _handful(read_shapes(path))], everything=False))


@pytest.mark.slow
@pytest.mark.parametrize("path", _shape_files(), ids=lambda p: p.name)
def test_benchdnn_shapes_compiled_all(path):
    """Every layer of every list, scaled down, every mode, layout and element kind."""
    shapes = read_shapes(path)
    for start in range(0, len(shapes), 6):  # a few modules per list, each of moderate size
        _check_sweep(_sweep([scaled(s) for s in shapes[start:start + 6]], everything=True))


def _onnx_conv(shape: ConvShape, mode: str, x, w, b) -> np.ndarray:
    """ONNX Runtime's Conv (NCX / OIX float32; auto_pad as ONNX defines it) on one layer."""
    ort = pytest.importorskip("onnxruntime")
    from onnx import TensorProto, helper, numpy_helper

    pads = {} if mode != "none" else {"pads": [*shape.pad_l, *shape.pad_r]}
    node = helper.make_node("Conv", ["x", "w", "b"], ["y"], auto_pad={
        "none": "NOTSET", "same_upper": "SAME_UPPER", "same_lower": "SAME_LOWER",
        "valid": "VALID"}[mode], strides=list(shape.s), dilations=list(shape.d),
        group=shape.g, **pads)
    graph = helper.make_graph(
        [node], "conv", [helper.make_tensor_value_info("x", TensorProto.FLOAT, x.shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    session = ort.InferenceSession(model.SerializeToString(),
                                   providers=["CPUExecutionProvider"])
    return session.run(None, {"x": x})[0]


def _check_onnxruntime(shapes: list[ConvShape]) -> None:
    """The float reference equals ONNX Runtime's Conv (an independent implementation of the
    same convolution and of SAME_UPPER / SAME_LOWER / VALID padding) within the float32
    summation bound, in every auto_pad mode."""
    for shape in shapes:
        # ONNX Runtime refuses SAME_* padding with dilations (hand cases cover those)
        for mode in MODES if max(shape.d) == 1 else ("none", "valid"):
            x, w, b = _conv_inputs(shape, "float", FORMATS[0], 5)
            a = _conv_attrs(shape, mode, FORMATS[0])
            d = lookup(NAME)
            ref = d.run_reference([v.astype(np.float64) for v in (x, w, b)],
                                  Attrs(d.normalize_attrs(a)))[0].astype(np.float32)
            got = _onnx_conv(shape, mode, x, w, b)
            assert got.shape == ref.shape, (shape.name, mode)
            assert_close(ref, got, conv_tolerance([x, w, b], a), f"{shape.name} {mode}")


@pytest.mark.parametrize("path", _shape_files(), ids=lambda p: p.name)
def test_reference_matches_onnxruntime(path):
    """... on the scaled benchdnn layers."""
    _check_onnxruntime([scaled(s) for s in _handful(read_shapes(path))])


def test_reference_matches_onnxruntime_dilated():
    """... with dilations (the lists have none), strides above the dilated kernel (same_*
    padding clamped at 0), 1-D, 2-D and 3-D."""
    _check_onnxruntime([
        ConvShape("dilated-2d", 2, 2, 4, 6, (9, 8), (3, 2), (2, 3), (2, 3), (1, 0), (0, 2)),
        ConvShape("stride>kernel-1d", 1, 1, 3, 2, (8,), (2,), (5,), (1,), (0,), (1,)),
        ConvShape("dilated-3d", 1, 3, 3, 6, (6, 5, 7), (2, 3, 2), (1, 2, 3), (3, 1, 2),
                  (1, 2, 0), (2, 0, 1)),
    ])


# ---- optional cross-check against torch (not in CI: pytest -m crosscheck) -----------------
@pytest.mark.crosscheck
@pytest.mark.parametrize("path", _shape_files(), ids=lambda p: p.name)
def test_reference_matches_torch(path):
    """The float reference == torch.nn.functional.conv1d/2d/3d (float64) on the scaled
    benchdnn layers, with TensorFlow's SAME padding (extra after for same_upper) written
    here from its definition."""
    torch = pytest.importorskip("torch")
    fn = {1: torch.nn.functional.conv1d, 2: torch.nn.functional.conv2d,
          3: torch.nn.functional.conv3d}
    for shape in map(scaled, _handful(read_shapes(path))):
        for mode, layout in itertools.product(MODES, FORMATS):
            x, w, b = _conv_inputs(shape, "float", layout, 5)
            a = _conv_attrs(shape, mode, layout)
            ref = lookup(NAME).run_reference([x.astype(np.float64), w.astype(np.float64),
                                              b.astype(np.float64)],
                                             Attrs(lookup(NAME).normalize_attrs(a)))[0]
            pads = []
            for i, k, s, d, pl, pr in zip(shape.i, shape.k, shape.s, shape.d, shape.pad_l,
                                          shape.pad_r):
                total = max(0, (-(-i // s) - 1) * s + (k - 1) * d + 1 - i)
                pads.append({"none": (pl, pr), "valid": (0, 0),
                             "same_upper": (total // 2, total - total // 2),
                             "same_lower": (total - total // 2, total // 2)}[mode])
            xt, wt = (torch.from_numpy(np.ascontiguousarray(v).astype(np.float64)) for v in
                      (out_of_format(x, layout[0]),
                       np.moveaxis(np.moveaxis(w, -1, 0), -1, 1) if layout[1] == "XIO"
                       else w))
            xt = torch.nn.functional.pad(xt, [p for pair in reversed(pads) for p in pair])
            want = fn[len(shape.i)](xt, wt, torch.from_numpy(b.astype(np.float64)),
                                    stride=shape.s, dilation=shape.d, groups=shape.g).numpy()
            np.testing.assert_allclose(out_of_format(ref, layout[0]), want, rtol=1e-10,
                                       atol=1e-10)

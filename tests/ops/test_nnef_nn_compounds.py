"""The stdlib compound fragments built on NNEF's window ops (spec 4.3.4, 4.9.2-4.9.4): each
is a tiny NNEF document, parsed (the frontend expands the fragment), compiled for llvm, run
by the runtime and compared with `cvmc.reference_run` within the bound its ops compose to
(docs/float.md "Float accuracy").

Bounds: u = 2^-24. A sum-like op is within gamma(K + 2) * S (tests.oputil.sum_bound); a
chain of linear ops with nonnegative coefficients in their magnitudes is within the sum of
its ops' K against S of the whole chain (the reference of the chain on |inputs|). pow
(sqr, sqrt) is within 4 ULP, every other element-wise op within 1; on positive data these
compose to a relative bound.
"""
from __future__ import annotations

import cvmc_runtime
import numpy as np
import pytest

import cvmc
from cvmc.errors import CvmcError
from cvmc.frontend.nnef import parse_nnef
from tests.oputil import U, op_reference, sum_bound, sum_tolerances

RNG = np.random.default_rng(2024)


def _graph(inputs: dict[str, tuple], body: str, outputs: str = "y",
           weights: dict[str, np.ndarray] | None = None):
    """A parsed graph with float inputs {name: shape}, weights given as variables."""
    weights = weights or {}
    decls = [f"    {n} = external<scalar>(shape = {list(s)});" for n, s in inputs.items()]
    decls += [f"    {n} = variable<scalar>(shape = {list(w.shape)}, label = \"{n}\");"
              for n, w in weights.items()]
    text = (f"version 1.0;\ngraph C( {', '.join(inputs)} ) -> ( {outputs} )\n{{\n"
            + "\n".join(decls) + f"\n    {body}\n}}\n")
    g = parse_nnef(text, "c.nnef")
    return g.replace(constants={**g.constants, **weights})


def _run(g, feeds: dict[str, np.ndarray], tmp_path) -> tuple[dict, dict]:
    """(compiled llvm outputs, reference outputs)."""
    cvmc.compile(g, tmp_path / "c.cvmx", target="llvm")
    return cvmc_runtime.load(tmp_path / "c.cvmx").run(feeds), cvmc.reference_run(g, feeds)


def _within(got: np.ndarray, want: np.ndarray, bound) -> None:
    err = np.abs(got.astype(np.float64) - want)
    assert np.all(err <= bound), f"worst {err.max()} at {np.unravel_index(err.argmax(), err.shape)}"


def _same_bits(got: np.ndarray, want: np.ndarray) -> None:
    assert got.dtype == want.dtype and np.array_equal(got.view(np.uint8), want.view(np.uint8))


def _f(*shape, lo: float | None = None) -> np.ndarray:
    """Random float32 (normal, or uniform in [lo, lo + 2) with lo)."""
    x = RNG.standard_normal(shape) if lo is None else lo + 2 * RNG.random(shape)
    return x.astype(np.float32)


X = _f(2, 3, 7, 8)
XPOS = _f(2, 3, 7, 8, lo=0.5)
POOL = "size = [1, 1, 3, 3], stride = [1, 1, 2, 2]"


@pytest.mark.parametrize("border", ["ignore", "constant", "replicate"])
def test_max_pool_is_exact(border, tmp_path):
    g = _graph({"x": X.shape}, f"y = max_pool(x, {POOL}, border = '{border}');")
    got, want = _run(g, {"x": X}, tmp_path)
    _same_bits(got["y"], want["y"])


def test_max_pool_with_index_is_exact(tmp_path):
    g = _graph({"x": X.shape}, "y, i = max_pool_with_index(x, size = [1, 1, 2, 3], "
               "padding = [(0, 0), (0, 0), (1, 0), (1, 1)], dilation = [1, 1, 2, 1]);",
               outputs="y, i")
    got, want = _run(g, {"x": X}, tmp_path)
    _same_bits(got["y"], want["y"])
    assert np.array_equal(got["i"], want["i"]) and want["i"].max() < 6


@pytest.mark.parametrize("border", ["constant", "ignore", "reflect"])
def test_avg_pool(border, tmp_path):
    g = _graph({"x": X.shape}, f"y = avg_pool(x, {POOL}, border = '{border}');")
    got, want = _run(g, {"x": X}, tmp_path)
    (tol,) = sum_tolerances("box", [(X, None)], {"size": [1, 1, 3, 3], "stride": [1, 1, 2, 2],
                                                 "border": border, "normalize": True}, 9 + 1)
    _within(got["y"], want["y"], tol)


def test_rms_pool(tmp_path):
    """sqrt(avg_pool(sqr(x))): positive terms, so the box is within (K + 2) u relative;
    sqr and sqrt (pow) 4 ULP each, sqrt halves what it is given."""
    g = _graph({"x": X.shape}, f"y = rms_pool(x, {POOL});")
    got, want = _run(g, {"x": X}, tmp_path)
    _within(got["y"], want["y"], (9 + 16) * U * want["y"])


@pytest.mark.parametrize("op, attrs", [
    ("separable_conv", "padding = [(1, 0), (0, 1)], stride = [2, 1], dilation = [1, 2]"),
    ("separable_deconv", "padding = [(1, 1), (0, 1)], stride = [2, 2]"),
])
def test_separable_conv_and_deconv(op, attrs, tmp_path):
    """Two linear ops (depth-wise K1 = 6 taps, point-wise K2 = 3 channels + bias): within
    sum_bound(S, K1 + K2 + 3), S the chain's reference on magnitudes."""
    weights = {"plane": _f(3, 1, 2, 3), "point": _f(4, 3, 1, 1), "b": _f(1, 4)}
    if op == "separable_deconv":  # deconv filters are [input, output / groups, ...]
        weights["point"] = _f(3, 4, 1, 1)
        weights["plane"] = _f(4, 1, 2, 3)
    x = X[:, :3] if op == "separable_conv" else _f(2, 3, 4, 4)
    body = f"y = {op}(x, plane, point, b, {attrs});"
    g = _graph({"x": x.shape}, body, weights=weights)
    got, want = _run(g, {"x": x}, tmp_path)
    magnitudes = _graph({"x": x.shape}, body, weights={k: np.abs(w) for k, w in weights.items()})
    s = cvmc.reference_run(magnitudes, {"x": np.abs(x)})["y"].astype(np.float64)
    _within(got["y"], want["y"], sum_bound(s * (1 + 4 * U), 6 + 4 + 3))


@pytest.mark.parametrize("body", [
    "y = nearest_downsample(x, factor = [2, 3]);",
    "y = nearest_upsample(x, factor = [2, 3]);",
])
def test_nearest_down_and_upsample_are_exact(body, tmp_path):
    g = _graph({"x": X.shape}, body)
    got, want = _run(g, {"x": X}, tmp_path)
    _same_bits(got["y"], want["y"])
    if "down" in body:
        assert np.array_equal(got["y"], X[:, :, ::2, ::3])
    else:
        assert np.array_equal(got["y"], X.repeat(2, axis=2).repeat(3, axis=3))


def test_area_downsample(tmp_path):
    x = X[:, :, :6, :6]
    g = _graph({"x": x.shape}, "y = area_downsample(x, factor = [2, 3]);")
    got, want = _run(g, {"x": x}, tmp_path)
    (tol,) = sum_tolerances("box", [(x, None)], {"size": [1, 1, 2, 3], "stride": [1, 1, 2, 3],
                                                 "padding": [(0, 0)] * 4, "normalize": True},
                            6 + 1)
    _within(got["y"], want["y"], tol)
    # the mean of each 2 x 3 block (NumPy, independent)
    blocks = x.astype(np.float64).reshape(2, 3, 3, 2, 2, 3).mean(axis=(3, 5))
    _within(got["y"], blocks, tol + U * np.abs(blocks))


def test_local_response_normalization(tmp_path):
    """x / (bias + alpha * box(x^2) / V)^beta: the denominator is positive, each op adds a
    few u relative (sqr, pow: 4 ULP; box: K + 2), beta <= 1 scales it."""
    body = ("y = local_response_normalization(x, size = [1, 3, 3, 3], alpha = 0.5, "
            "beta = 0.75, bias = 2.0);")
    g = _graph({"x": X.shape}, body)
    got, want = _run(g, {"x": X}, tmp_path)
    _within(got["y"], want["y"], (27 + 16) * U * np.abs(want["y"]))


def test_local_mean_normalization(tmp_path):
    """x - box(x) / V: the box bound plus one rounding of the difference."""
    g = _graph({"x": X.shape}, "y = local_mean_normalization(x, size = [1, 1, 3, 3]);")
    got, want = _run(g, {"x": X}, tmp_path)
    _within(got["y"], want["y"], _centered_bound())


def _centered_bound() -> np.ndarray:
    """local_mean_normalization's bound on X: the box's, and one rounding of x - mean
    relative to |x| + mean(|x|)."""
    box = {"size": [1, 1, 3, 3], "normalize": True}
    mean_abs = op_reference("box", np.abs(X), **box)
    return sum_bound(mean_abs, 9 + 1) + 2 * U * (np.abs(X) + mean_abs)


def test_local_variance_normalization(tmp_path):
    """x / max(sqrt(box(x^2) / V) + bias, epsilon): positive denominator, relative bound."""
    body = ("y = local_variance_normalization(x, size = [1, 1, 3, 3], bias = 1.0, "
            "epsilon = 0.001);")
    g = _graph({"x": X.shape}, body)
    got, want = _run(g, {"x": X}, tmp_path)
    _within(got["y"], want["y"], (9 + 16) * U * np.abs(want["y"]))


def test_local_contrast_normalization(tmp_path):
    """The variance normalization of the centered values c: an error d in c moves the
    result by at most |d| / sigma + |c| max|d| / sigma^2 (sigma >= bias = 1), plus the
    variance normalization's own relative bound."""
    body = "y = local_contrast_normalization(x, size = [1, 1, 3, 3], bias = 1.0);"
    g = _graph({"x": X.shape}, body)
    got, want = _run(g, {"x": X}, tmp_path)
    centered = _graph({"x": X.shape}, "y = local_mean_normalization(x, size = [1, 1, 3, 3]);")
    c = cvmc.reference_run(centered, {"x": X})["y"].astype(np.float64)
    d = _centered_bound()
    _within(got["y"], want["y"], d + np.abs(c) * d.max() + (9 + 16) * U * np.abs(want["y"]))


def test_batch_normalization(tmp_path):
    """offset + scale * (x - mean) / sqrt(variance + epsilon): x - mean rounds relative to
    |x| + |mean| (it may cancel), sqrt is pow (4 ULP), the rest one rounding each."""
    c = X.shape[1]
    params = {"m": _f(1, c), "v": _f(1, c, lo=0.5), "o": _f(1, c), "s": _f(1, c)}
    g = _graph({"x": X.shape}, "y = batch_normalization(x, m, v, o, s, epsilon = 0.001);",
               weights=params)
    got, want = _run(g, {"x": X}, tmp_path)
    p = {k: v.astype(np.float64)[:, :, None, None] for k, v in params.items()}
    scale = np.abs(p["s"]) * (np.abs(X) + np.abs(p["m"])) / np.sqrt(p["v"] + 0.001)
    _within(got["y"], want["y"], 16 * U * (np.abs(p["o"]) + scale))


def test_linear(tmp_path):
    w, b = _f(5, 12), _f(1, 5)
    x = _f(3, 12)
    g = _graph({"x": x.shape}, "y = linear(x, w, b);", weights={"w": w, "b": b})
    got, want = _run(g, {"x": x}, tmp_path)
    s = np.abs(x).astype(np.float64) @ np.abs(w).T + np.abs(b)
    _within(got["y"], want["y"], sum_bound(s, 12 + 1))


@pytest.mark.parametrize("op", ["l1_normalization", "l2_normalization"])
def test_l1_l2_normalization(op, tmp_path):
    g = _graph({"x": X.shape}, f"y = {op}(x, axes = [1], bias = 1.0);")
    got, want = _run(g, {"x": X}, tmp_path)
    _within(got["y"], want["y"], 16 * U * np.abs(want["y"]))


@pytest.mark.parametrize("op", ["avg_roi_align", "max_roi_align"])
def test_roi_align_fragments_do_not_type_check(op):
    """The stdlib's roi_align fragments pool with size = sampling_rate (one entry per
    spatial dim), but avg_pool / max_pool take one per input dim (spec 4.3.2): the Khronos
    parser rejects them too ("expected kernel shape of rank 4")."""
    text = f"""version 1.0;
graph g( x, r, b ) -> ( y )
{{
    x = external<scalar>(shape = [1, 2, 6, 6]);
    r = external<scalar>(shape = [3, 4]);
    b = external<integer>(shape = [3], precision = 4);
    y = {op}(x, r, b, output_size = [2, 2], sampling_rate = [2, 2]);
}}
"""
    with pytest.raises(CvmcError, match="expected 'size' of length 4 \\(the input rank\\), "
                                        "found \\[2, 2\\]"):
        parse_nnef(text, "g.nnef")


def test_roi_align_by_its_definition(tmp_path):
    """What the roi_align fragments mean, written with full-rank pooling sizes."""
    rois = np.array([[0.5, 1.0, 4.0, 5.5], [-1.0, 0.0, 2.0, 3.0]], np.float32)
    batch = np.array([1, 0])
    text = """version 1.0;
graph g( x, r, b ) -> ( y, z )
{
    x = external<scalar>(shape = [2, 3, 7, 8]);
    r = external<scalar>(shape = [2, 4]);
    b = external<integer>(shape = [2], precision = 4);
    t = roi_resample(x, r, b, output_size = [4, 6]);
    y = avg_pool(t, size = [1, 1, 2, 2], stride = [1, 1, 2, 2]);
    z = max_pool(t, size = [1, 1, 2, 2], stride = [1, 1, 2, 2]);
}
"""
    g = parse_nnef(text, "g.nnef")
    feeds = {"x": X, "r": rois, "b": batch}
    got, want = _run(g, feeds, tmp_path)
    # roi_resample: 2^2 + 3 * 2 roundings; the avg then 4 + 1 more; max selects
    magnitudes = cvmc.reference_run(g, {**feeds, "x": np.abs(X)})
    _within(got["y"], want["y"], sum_bound(magnitudes["y"].astype(np.float64), 10 + 5))
    _within(got["z"], want["z"], sum_bound(magnitudes["z"].astype(np.float64), 10))

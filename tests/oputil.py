"""Test helpers: build one-op graphs, run them on the reference and compiled for llvm."""
from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np

from cvmc.ir import Graph, Node, TensorType
from cvmc.ops import lookup
from cvmc.ops.infer import retype
from cvmc.ops.registry import Attrs
from cvmc.reference import reference_run


def compile_passes(graph: Graph, target=None, stop_after: str | None = None,
                   after_pass=None) -> Graph:
    """`graph` through the passes compiling for `target` runs (its backend's list,
    `cvmc.codegen.targets`); with no target, through those every backend runs that need
    none (typing, constant folding, dead code), as the reference interpreter takes it."""
    from cvmc.codegen.targets import backend
    from cvmc.passes.pipeline import (
        ELIMINATE_DEAD_CODE,
        FOLD_CONSTANTS,
        INFER_PRECISION,
        run_passes,
    )

    if target is None:
        return run_passes(graph, (INFER_PRECISION, FOLD_CONSTANTS, ELIMINATE_DEAD_CODE),
                          stop_after, after_pass)
    return backend(target).run_passes(graph, target, stop_after, after_pass)


def rand_in_precision(rng: np.random.Generator, shape, p: int) -> np.ndarray:
    """Random int64 values inside precision p: |v| <= 2^(p-1) - 1."""
    bound = (1 << (p - 1)) - 1
    return rng.integers(-bound, bound + 1, size=shape, dtype=np.int64)


def one_op_graph(op: str, inputs: list[tuple[np.ndarray, int | None]],
                 attrs: dict | None = None, weights: tuple[int, ...] = (),
                 out_dtype: str = "int32") -> Graph:
    """A graph applying `op` to `inputs` [(array, precision)]; indices in `weights` become
    weights (constants with that declared precision), the rest graph inputs x0, x1, ...
    An integer array is a CVM integer tensor of that precision; a float array (precision
    None) is float32 and a bool array bool. `out_dtype` is what a `cast` converts to."""
    d = lookup(op)
    a = d.normalize_attrs(attrs or {})
    names = [f"w{i}" if i in weights else f"x{i}" for i in range(len(inputs))]
    types = {n: TensorType(tuple(arr.shape), _dtype_of(arr), p)
             for n, (arr, p) in zip(names, inputs)}
    shapes = d.infer_shapes([types[n] for n in names], a)
    outs = tuple(f"y{i}" for i in range(len(shapes)))
    types.update({o: TensorType(s, out_dtype) for o, s in zip(outs, shapes)})
    consts = {n: arr.astype(types[n].dtype) if not types[n].is_integer else arr
              for n, (arr, _) in zip(names, inputs) if n.startswith("w")}
    g = Graph("test", [n for n in names if n.startswith("x")], list(outs),
              [Node(d.name, tuple(names), outs, dict(a))], types, consts)
    return retype(g)


def _dtype_of(arr: np.ndarray) -> str:
    return {"f": "float32", "b": "bool"}.get(arr.dtype.kind, "int32")


def ulp_distance(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Units in the last place between two float32 arrays (0 where both are the same NaN
    class or equal; +-0 count as equal)."""
    ia = a.astype(np.float32).view(np.int32).astype(np.int64)
    ib = b.astype(np.float32).view(np.int32).astype(np.int64)
    # map the sign-magnitude bit patterns onto a monotonic integer line
    ia = np.where(ia < 0, -(ia & 0x7FFFFFFF), ia)
    ib = np.where(ib < 0, -(ib & 0x7FFFFFFF), ib)
    both_nan = np.isnan(a) & np.isnan(b)
    return np.where(both_nan, 0, np.abs(ia - ib))


U = 2.0**-24  # unit roundoff of float32


def sum_bound(magnitude: np.ndarray, terms: int) -> np.ndarray:
    """The |compiled - reference| a float32 sum may show: gamma(terms + 2) * magnitude,
    gamma(n) = n u / (1 - n u), u = 2^-24, where `magnitude` is the sum of the terms'
    magnitudes and `terms` the roundings a term goes through (K in the README's "Float
    accuracy"): recursive summation in any fixed order (Higham, Accuracy and Stability of
    Numerical Algorithms, 3.1), one more rounding for the reference's own float32 result and
    one for slack; plus 2^-150 per term for products that underflow."""
    n = terms + 2
    return n * U / (1 - n * U) * magnitude + terms * 2.0**-150


def sum_tolerances(op: str, inputs: list[tuple[np.ndarray, int | None]], attrs: dict | None,
                   terms: int, magnitude: tuple[int, ...] | None = None) -> list[np.ndarray]:
    """`sum_bound` per output of a sum-like op: the magnitudes are the op's reference rule
    (float64, not rounded) on |x| for its float inputs (those in `magnitude`, None: all),
    which sums the terms' magnitudes wherever the op is linear with nonnegative
    coefficients in those inputs (conv, box, interpolation, ...)."""
    d = lookup(op)
    xs = [np.abs(arr.astype(np.float64)) if arr.dtype.kind == "f" and
          (magnitude is None or i in magnitude) else
          arr.astype(np.float64) if arr.dtype.kind == "f" else arr.astype(np.int64)
          for i, (arr, _) in enumerate(inputs)]
    with np.errstate(all="ignore"):
        sums = d.run_reference(xs, Attrs(d.normalize_attrs(attrs or {})))
    return [sum_bound(s, terms) for s in sums]


def op_reference(op: str, *xs, **attrs) -> np.ndarray:
    """The first output of the op's reference rule on float64 / int64 arrays (no float32
    rounding)."""
    d = lookup(op)
    arrays = [np.asarray(x, np.float64) if np.asarray(x).dtype.kind == "f" else
              np.asarray(x, np.int64) for x in xs]
    with np.errstate(all="ignore"):
        return d.run_reference(arrays, Attrs(d.normalize_attrs(attrs)))[0]


def assert_matches(op: str, name: str, ref: np.ndarray, got: np.ndarray, ulp: int = 0,
                   atol: np.ndarray | None = None) -> None:
    """Compiled equals reference: bit for bit (ulp=0; NaN matching NaN), float32 within
    `ulp` units in the last place, or (`atol`, per element) within an absolute bound."""
    assert ref.dtype == got.dtype and ref.shape == got.shape, (name, ref.dtype, got.dtype)
    if atol is not None:
        r, c = ref.astype(np.float64), got.astype(np.float64)
        with np.errstate(invalid="ignore"):
            err = np.abs(r - c)
            ok = (err <= atol) | (r == c) | (np.isnan(r) & np.isnan(c))
        where = np.argwhere(~ok)[0].tolist() if not ok.all() else None
        assert ok.all(), (f"{op} output {name}: |compiled - reference| = {err[~ok].max()} "
                          f"exceeds the bound at index {where} (bound {atol[tuple(where)]})")
    elif ref.dtype.kind == "f" and ulp == 0:  # the same bits (-0 is not 0); any NaN is NaN
        same = (ref.view(np.int32) == got.view(np.int32)) | (np.isnan(ref) & np.isnan(got))
        assert same.all(), (f"{op} output {name}: compiled differs from reference at index "
                            f"{np.argwhere(~same)[0].tolist()}")
    elif ref.dtype.kind == "f":
        dist = ulp_distance(ref, got)
        worst = int(dist.max(initial=0))
        assert worst <= ulp, (f"{op} output {name}: {worst} ULP from the reference (bound "
                              f"{ulp}) at index {np.unravel_index(dist.argmax(), dist.shape)}")
    else:
        assert np.array_equal(ref, got), f"{op} output {name}: compiled differs from reference"


def run_reference(g: Graph, inputs: list[np.ndarray]) -> list[np.ndarray]:
    """Reference outputs of a one_op_graph in output order."""
    feeds = {n: inputs[int(n[1:])] for n in g.inputs}
    res = reference_run(g, feeds)
    return [res[o] for o in g.outputs]


def run_compiled_llvm(g: Graph, inputs: list[np.ndarray]) -> list[np.ndarray]:
    """Compile `g` for the host CPU through the real path (.cvmx + runtime) and run it."""
    import cvmc_runtime

    from cvmc.codegen import compile_model

    with tempfile.TemporaryDirectory(prefix="cvmc-op-") as tmp:
        path = Path(tmp) / "op.cvmx"
        compile_model(g, path, "llvm")
        model = cvmc_runtime.load(path)
    res = model.run({n: inputs[int(n[1:])] for n in g.inputs})
    return [res[o] for o in g.outputs]


def check_op(op: str, inputs: list[tuple[np.ndarray, int | None]], attrs: dict | None = None,
             weights: tuple[int, ...] = (), ulp: int = 0, out_dtype: str = "int32",
             terms: int = 0, magnitude: tuple[int, ...] | None = None) -> list[np.ndarray]:
    """Reference vs compiled (llvm), bit-exact (floats: within `ulp`, or with `terms` within
    `sum_tolerances`); returns the reference outputs."""
    g = one_op_graph(op, inputs, attrs, weights, out_dtype)
    xs = [arr for arr, _ in inputs]
    ref = run_reference(g, xs)
    got = run_compiled_llvm(g, xs)
    atols = sum_tolerances(op, inputs, attrs, terms, magnitude) if terms else [None] * len(ref)
    for name, r, c, atol in zip(g.outputs, ref, got, atols):
        assert_matches(op, name, r, c, ulp, atol)
    return ref

"""Test helpers: build one-op graphs, run them on the reference and compiled for llvm."""
from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np

from cvmc.ir import Graph, Node, TensorType
from cvmc.ops import lookup
from cvmc.passes.precision import infer_precision
from cvmc.reference import reference_run


def rand_in_precision(rng: np.random.Generator, shape, p: int) -> np.ndarray:
    """Random int64 values inside precision p: |v| <= 2^(p-1) - 1."""
    bound = (1 << (p - 1)) - 1
    return rng.integers(-bound, bound + 1, size=shape, dtype=np.int64)


def one_op_graph(op: str, inputs: list[tuple[np.ndarray, int]], attrs: dict | None = None,
                 weights: tuple[int, ...] = ()) -> Graph:
    """A graph applying `op` to `inputs` [(array, precision)]; indices in `weights` become
    weights (constants with that declared precision), the rest graph inputs x0, x1, ..."""
    d = lookup(op)
    a = d.normalize_attrs(attrs or {})
    names = [f"w{i}" if i in weights else f"x{i}" for i in range(len(inputs))]
    types = {n: TensorType(tuple(arr.shape), "int32", p) for n, (arr, p) in zip(names, inputs)}
    outs = tuple(f"y{i}" for i in range(len(d.outputs))) if not d.outputs[0].startswith("*") \
        else ("y0",)
    shapes = d.infer_shapes([types[n] for n in names], a)
    types.update({o: TensorType(s, "int32") for o, s in zip(outs, shapes)})
    consts = {n: arr for n, (arr, _) in zip(names, inputs) if n.startswith("w")}
    g = Graph("test", [n for n in names if n.startswith("x")], list(outs),
              [Node(d.name, tuple(names), outs, dict(a))], types, consts)
    return infer_precision(g)


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


def check_op(op: str, inputs: list[tuple[np.ndarray, int]], attrs: dict | None = None,
             weights: tuple[int, ...] = ()) -> list[np.ndarray]:
    """Reference vs compiled (llvm), bit-exact; returns the reference outputs."""
    g = one_op_graph(op, inputs, attrs, weights)
    xs = [arr for arr, _ in inputs]
    ref = run_reference(g, xs)
    got = run_compiled_llvm(g, xs)
    for name, r, c in zip(g.outputs, ref, got):
        assert r.dtype == c.dtype and r.shape == c.shape, (name, r.dtype, c.dtype)
        assert np.array_equal(r, c), f"{op} output {name}: compiled differs from reference"
    return ref

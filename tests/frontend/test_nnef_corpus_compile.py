"""Every valid document of the NNEF corpus compiles for llvm, runs, and matches the
reference interpreter (random weights, fixed seed, where a document ships none)."""
from __future__ import annotations

import cvmc_runtime
import numpy as np
import pytest

import cvmc
from cvmc.frontend.nnef import load_nnef
from tests.shared import HAVE_SHARED, SHARED, requires_shared

CORPUS = SHARED / "data" / "nnef-corpus" / "valid"
DOCS = sorted(CORPUS.iterdir()) if HAVE_SHARED else []
# Whole networks at 224x224: minutes of NumPy reference convolutions each.
NETWORKS = {"khr_example_alexnet.nnef", "khr_example_googlenet.nnef", "khr_example_resnet.nnef"}
# A body-less custom fragment: cvmc can only check it (tests/frontend/test_nnef_corpus.py).
CHECK_ONLY = {"khr_parser_custom_fragment.nnef", "khr_sample_ext_custom_shuffle.nnef"}


def random_values(t, rng: np.random.Generator) -> np.ndarray:
    """Data of a tensor type: standard normal floats, fair logicals, integers inside the
    precision (or small ones where none is declared)."""
    if t.dtype == "float32":
        return rng.standard_normal(t.shape).astype(np.float32)
    if t.dtype == "bool":
        return rng.random(t.shape) < 0.5
    bound = (1 << (t.precision - 1)) - 1 if t.precision else 3
    return rng.integers(-bound, bound + 1, t.shape).astype(np.int32)


def with_weights(g, rng: np.random.Generator):
    """`g` with random data for every variable whose .dat file the corpus lacks."""
    missing = {w: random_values(g.types[w], rng) for w in g.labels if w not in g.constants}
    return g.replace(constants={**g.constants, **missing})


@requires_shared
@pytest.mark.parametrize("path", [pytest.param(p, marks=pytest.mark.slow)
                                  if p.name in NETWORKS else p for p in DOCS],
                         ids=lambda p: p.name)
def test_valid_document_compiles_runs_and_matches_the_reference(path, tmp_path):
    if path.name in CHECK_ONLY:
        pytest.skip("a custom primitive without a body: check-only")
    rng = np.random.default_rng(11)
    g = with_weights(load_nnef(path, None), rng)
    cvmc.compile(g, tmp_path / "m.cvmx", target="llvm")
    feeds = {n: random_values(g.types[n], rng) for n in g.inputs}
    got = cvmc_runtime.load(tmp_path / "m.cvmx").run(feeds)
    want = cvmc.reference_run(g, feeds)
    for name, value in want.items():
        assert got[name].dtype == value.dtype, name
        if value.dtype.kind == "f":
            # each op within its stated bound; a few ops chained: a small relative error
            scale = 1.0 + np.abs(value[np.isfinite(value)]).max(initial=0.0)
            np.testing.assert_allclose(got[name], value, rtol=1e-4, atol=1e-5 * scale,
                                       err_msg=name)
        else:
            assert np.array_equal(got[name], value), name

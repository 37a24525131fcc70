"""The float path end to end: NNEF scalar/logical tensors through `cvmc compile`, the
runtime and `cvmc run`; the same bits on every run and at every thread count."""
from __future__ import annotations

import hashlib

import cvmc_runtime
import numpy as np
import pytest

import cvmc
from cvmc.cli import main
from cvmc.frontend.nnef import parse_nnef
from tests.nnefutil import run_digests

GRAPH = """version 1.0;
graph F( x, m ) -> ( y, z, k )
{
    x = external<scalar>(shape = [8, 256]);
    m = external<logical>(shape = [8, 1]);
    t = tanh(x);
    q = mul(x, 0.25);
    e = exp(q);
    s = add(t, e);
    r = div(t, e);
    y = select(m, s, r);
    h = mul(y, 100.0);
    z = round(h);
    k = gt(z, 5.0);
}
"""

@pytest.fixture(scope="module")
def artifact(tmp_path_factory):
    d = tmp_path_factory.mktemp("float")
    g = parse_nnef(GRAPH, "f.nnef")
    cvmc.compile(g, d / "f.cvmx", target="llvm")
    rng = np.random.default_rng(5)
    feeds = {"x": (rng.standard_normal((8, 256)) * 4).astype(np.float32),
             "m": rng.random((8, 1)) < 0.5}
    np.savez(d / "feeds.npz", **feeds)
    return d, g, feeds


def test_outputs_have_their_types_and_match_the_reference(artifact):
    d, g, feeds = artifact
    model = cvmc_runtime.load(d / "f.cvmx")
    assert [(s.name, s.dtype, s.precision) for s in model.inputs] == \
        [("x", "float32", None), ("m", "bool", None)]
    got, want = model.run(feeds), cvmc.reference_run(g, feeds)
    assert {k: v.dtype for k, v in got.items()} == \
        {"y": np.float32, "z": np.float32, "k": np.bool_}
    # a chain of ops, each within its stated bound (tanh, exp: 4 ULP; the rest exact): y
    # is within a few ULP of the operands t, e (t + e may cancel: relative to |t| + |e|)
    x = feeds["x"].astype(np.float64)
    scale = np.abs(np.tanh(x)) + np.exp(x * 0.25)
    assert np.all(np.abs(got["y"] - want["y"]) <= 16 * 2.0**-24 * scale)
    # round() can only differ where y*100 sits within those few ulps of a half
    differs = got["z"] != want["z"]
    assert differs.mean() < 0.01
    assert np.array_equal(got["k"], got["z"] > 5.0)


def test_same_bits_every_run_and_thread_count(artifact):
    d, _, _ = artifact
    one, two = (run_digests(d / "f.cvmx", d / "feeds.npz", n) for n in (1, 2))
    assert len(one) == 1 and one == two


def test_wrong_input_kinds_are_refused(artifact):
    d, _, feeds = artifact
    model = cvmc_runtime.load(d / "f.cvmx")
    with pytest.raises(cvmc_runtime.ModelError, match="input 'x': expected a float array"):
        model.run({**feeds, "x": np.zeros((8, 256), np.int32)})
    with pytest.raises(cvmc_runtime.ModelError, match="input 'm': expected a bool array"):
        model.run({**feeds, "m": np.zeros((8, 1), np.float32)})
    # float64 is rounded to float32, as NumPy's astype rounds
    x64 = feeds["x"].astype(np.float64) + 1e-12
    assert np.array_equal(model.run({**feeds, "x": x64})["y"], model.run(feeds)["y"])


def test_cvmc_run_reads_and_writes_float_and_bool_npy(artifact, tmp_path):
    d, _, feeds = artifact
    np.save(tmp_path / "x.npy", feeds["x"])
    np.save(tmp_path / "m.npy", feeds["m"])
    out = tmp_path / "out"
    assert main(["run", str(d / "f.cvmx"), "--input", f"x={tmp_path / 'x.npy'}",
                 "--input", f"m={tmp_path / 'm.npy'}", "--output-dir", str(out)]) == 0
    want = cvmc_runtime.load(d / "f.cvmx").run(feeds)
    for name in ("y", "z", "k"):
        got = np.load(out / f"{name}.npy")
        assert got.dtype == want[name].dtype and np.array_equal(got, want[name])
    digest = hashlib.sha256(np.load(out / "y.npy").tobytes()).hexdigest()
    assert digest == hashlib.sha256(want["y"].tobytes()).hexdigest()

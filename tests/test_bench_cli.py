"""`cvmc bench` and `--threads` (smoke tests: structure, not speed)."""
from __future__ import annotations

import json

import numpy as np
import pytest

from cvmc.cli import main
from tests.test_cli_robustness import DATA, EXAMPLE


@pytest.fixture(scope="module")
def artifact(tmp_path_factory):
    path = tmp_path_factory.mktemp("bench") / "m.cvmx"
    assert main(["compile", str(EXAMPLE), "-o", str(path)]) == 0
    return path


def test_bench_reports_every_kernel(artifact, tmp_path, capsys):
    out = tmp_path / "b.json"
    assert main(["bench", str(artifact), "--threads", "1", "--repeat", "3", "--warmup", "1",
                 "--json", str(out)]) == 0
    assert "end to end (3 runs, 1 threads)" in capsys.readouterr().out
    report = json.loads(out.read_text())
    plan_kernels = json.loads(__import__("zipfile").ZipFile(artifact).read("plan.json"))["kernels"]
    assert [k["kernel"] for k in report["kernels"]] == [k["symbol"] for k in plan_kernels]
    for k in report["kernels"]:
        assert 0 < k["min_ms"] <= k["median_ms"] <= k["max_ms"]
    assert abs(sum(k["share"] for k in report["kernels"]) - 1) < 1e-9
    conv = report["kernels"][0]
    # The example's first kernel: conv, 2 * 8 output channels * 16*16 pixels * 3*3*3 taps,
    # then right shift, clip and relu, one operation per output element each.
    assert plan_kernels[0]["arith_ops"] == 2 * 8 * 16 * 16 * 27 + 3 * 8 * 16 * 16
    assert conv["gops"] > 0
    assert report["run"]["min_ms"] > 0


def test_threads_option(artifact, tmp_path, capsys):
    for threads in ("1", "2"):
        assert main(["run", str(artifact), "--threads", threads, "--input", f"data={DATA}",
                     "--output-dir", str(tmp_path / threads)]) == 0
    one, two = (np.load(tmp_path / t / "logits.npy") for t in "12")
    assert np.array_equal(one, two)
    with pytest.raises(SystemExit) as e:
        main(["bench", str(artifact), "--threads", "0"])
    assert e.value.code == 2


def test_gops_counts_float_conv_and_matmul_multiply_adds():
    """`arith_ops` (GOPS in bench) counts 2 per multiply-add for float convs and matmuls,
    as for integer ones: conv 4 x 6 x 6 outputs of 3 x 3 x 3 taps; matmul 2 x 3 outputs of
    K = 5 (A transposed)."""
    from cvmc.frontend.nnef import parse_nnef
    from cvmc.lowering.lower import lower_graph
    from cvmc.ops.infer import retype
    from cvmc.passes.fusion import fuse_kernels
    from cvmc.passes.target import Target

    text = """version 1.0;
graph G(x, f, a, b) -> (y, z) {
  x = external<scalar>(shape = [1, 3, 8, 8]);
  f = external<scalar>(shape = [4, 3, 3, 3]);
  a = external<scalar>(shape = [5, 2]);
  b = external<scalar>(shape = [5, 3]);
  y = conv(x, f, padding = [(0, 0), (0, 0)]);
  z = matmul(a, b, transposeA = true);
}
"""
    target = Target.make()
    _, _, plan = lower_graph(fuse_kernels(retype(parse_nnef(text, "g.nnef")), target), target)
    assert {k["ops"][0]: k["arith_ops"] for k in plan["kernels"]} == \
        {"conv": 2 * 27 * 4 * 6 * 6, "matmul": 2 * 5 * 2 * 3}


def test_gops_dash_for_data_movement(tmp_path, capsys):
    """A kernel that only moves data (a transpose) has no GOPS: '-' in the table, null in
    the JSON, instead of a count of its output elements."""
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "graph.nnef").write_text("""version 1.0;
graph G(x) -> (y) {
  x = external<scalar>(shape = [16, 8]);
  y = transpose(x, axes = [1, 0]);
}
""")
    artifact, out = tmp_path / "t.cvmx", tmp_path / "b.json"
    assert main(["compile", str(tmp_path / "m"), "-o", str(artifact)]) == 0
    capsys.readouterr()
    assert main(["bench", str(artifact), "--repeat", "2", "--warmup", "1", "--json",
                 str(out)]) == 0
    (row,) = json.loads(out.read_text())["kernels"]
    assert row["gops"] is None
    line = next(s for s in capsys.readouterr().out.splitlines() if row["kernel"] in s)
    assert line.split()[-2] == "-"  # ... max ms, GOPS, share


def test_bench_into_a_file_keeps_each_kernel_on_one_line(artifact, tmp_path):
    # not a terminal: no wrapping at 80 columns, so a kernel's row can be grepped whole
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    out = subprocess.run([sys.executable, "-m", "cvmc.cli", "bench", str(artifact),
                          "--repeat", "2", "--warmup", "1"], capture_output=True, text=True,
                         env=env, check=True).stdout
    plan = json.loads(__import__("zipfile").ZipFile(artifact).read("plan.json"))
    for kernel in plan["kernels"]:
        line = next(x for x in out.splitlines() if kernel["symbol"] in x.split())
        assert line.split()[1] == kernel["schedule"] and line.rstrip().endswith("%")

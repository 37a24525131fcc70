"""Bombs (issue 22, item 7): work that grows with the input stays bounded. `check` is
linear in the graph (its time at 4N nodes is compared with N: a ratio, not a time), and
the reference interpreter refuses a node whose work exceeds its bound before computing."""
from __future__ import annotations

import time

import numpy as np
import pytest

from cvmc.cli import main
from cvmc.errors import CvmcError
from cvmc.frontend.nnef import parse_nnef
from cvmc.reference import MAX_WORK, reference_run


def chain(n: int) -> str:
    """An NNEF graph of n integer relus in a chain."""
    body = "".join(f"  t{i} = relu(t{i - 1});\n" for i in range(1, n))
    return ("version 1.0;\ngraph G(x) -> (y) {\n  x = external<integer>(shape = [4, 4], "
            f"precision = 8);\n  t0 = relu(x);\n{body}  y = relu(t{n - 1});\n}}\n")


def _check_seconds(tmp_path, n: int, capsys) -> float:
    doc = tmp_path / f"chain{n}.nnef"
    doc.write_text(chain(n))
    start = time.perf_counter()
    assert main(["check", str(doc)]) == 0
    elapsed = time.perf_counter() - start
    assert f"t{n - 1}" in capsys.readouterr().out
    return elapsed


def test_check_time_is_linear_in_the_graph(tmp_path, capsys):
    _check_seconds(tmp_path, 100, capsys)  # warm: the grammar, the op registry
    small = min(_check_seconds(tmp_path, 500, capsys) for _ in range(2))
    # the best of two, as for `small`: a parallel test worker (-n auto) may stall one run
    large = min(_check_seconds(tmp_path, 2000, capsys) for _ in range(2))
    assert large / small < 8, (small, large)  # 4x the nodes; quadratic would be 16x


@pytest.mark.slow
@pytest.mark.parametrize("n", [100_000])
def test_check_of_a_100000_node_chain(tmp_path, capsys, n):
    assert _check_seconds(tmp_path, n, capsys) < 120


@pytest.mark.parametrize("size, taps", [([1, 1, 16384, 16384], 16384 * 16384),
                                        ([1, 1, 8192, 16384], 8192 * 16384)])
def test_reference_refuses_a_window_past_its_bound(size, taps):
    g = parse_nnef("version 1.0;\ngraph G(x) -> (y) {\n  x = external(shape = [1, 1, 4, 4]);\n"
                   f"  y = max_pool(x, size = {size});\n}}\n", "bomb.nnef")
    start = time.perf_counter()
    with pytest.raises(CvmcError) as e:
        reference_run(g, {"x": np.zeros((1, 1, 4, 4), np.float32)})
    assert time.perf_counter() - start < 10
    assert e.value.span.line == 4
    assert f"16 output elements x {taps} operations each is {16 * taps}, more than the " \
           f"reference interpreter's bound {MAX_WORK}" in e.value.message


def test_reference_bound_counts_a_conv_by_channels_and_taps():
    """A conv costs C/G x taps per output element: 64 x 64 x 128 x 128 outputs x (C x 3 x 3)
    is 2^30 x 0.5625 for C = 64 (computed) and 2^30 x 1.125 for C = 128 (refused)."""
    def conv(channels: int):
        return parse_nnef("version 1.0;\ngraph G(x) -> (y) {\n"
                          f"  x = external(shape = [1, {channels}, 128, 128]);\n"
                          f"  w = constant(shape = [64, {channels}, 3, 3], value = [0.0]);\n"
                          "  y = conv(x, w);\n}\n", "c.nnef")
    with pytest.raises(CvmcError, match="1048576 output elements x 1152 operations each is "
                                        "1207959552, more than"):
        reference_run(conv(128), {"x": np.zeros((1, 128, 128, 128), np.float32)})
    assert 1048576 * 64 * 9 <= MAX_WORK  # the C = 64 conv is within the bound


def test_fusion_splits_a_long_elementwise_chain():
    """An element-wise chain fuses into kernels of at most MAX_GROUP_NODES nodes, in order:
    TVM's build time grows exponentially with the depth of one inlined chain (20 relus:
    minutes)."""
    from cvmc.ops.infer import retype
    from cvmc.passes.fusion import MAX_GROUP_NODES, fuse_groups

    g = retype(parse_nnef(chain(40), "chain.nnef"))
    groups = fuse_groups(g)
    assert [len(gr.nodes) for gr in groups] == [8, 8, 8, 8, 8, 1] and MAX_GROUP_NODES == 8
    assert [n.name for gr in groups for n in gr.nodes] == [n.name for n in g.nodes]
    assert all(gr.inputs == [groups[k - 1].outputs[-1]] for k, gr in enumerate(groups) if k)


def test_identical_kernels_are_built_once(tmp_path):
    """A chain cut into equal groups calls one function for all of them (each call with its
    own buffers), and still computes what the reference does."""
    import cvmc_runtime

    from cvmc.codegen import compile_model
    from cvmc.lowering.lower import lower_graph
    from cvmc.ops.infer import retype
    from cvmc.passes.fusion import fuse_kernels
    from cvmc.passes.target import Target

    g = retype(parse_nnef(chain(40), "chain.nnef"))
    mod, groups, plan = lower_graph(fuse_kernels(g, Target.make()), Target.make())
    symbols = [k["symbol"] for k in plan["kernels"]]
    assert len(groups) == 6 and len(mod.functions) == 2
    assert symbols[:5] == [symbols[0]] * 5 and symbols[5] != symbols[0]
    assert len({tuple(k["args"]) for k in plan["kernels"]}) == 6
    x = np.arange(-8, 8, dtype=np.int8).reshape(4, 4)
    compile_model(g, tmp_path / "chain.cvmx")
    got = cvmc_runtime.load(tmp_path / "chain.cvmx").run({"x": x})
    assert np.array_equal(got["y"], reference_run(g, {"x": x})["y"])
    assert np.array_equal(got["y"], np.maximum(x, 0))


def _compile_seconds(tmp_path, n: int) -> float:
    doc = tmp_path / f"chain{n}.nnef"
    doc.write_text(chain(n))
    start = time.perf_counter()
    assert main(["compile", str(doc), "-o", str(tmp_path / f"chain{n}.cvmx")]) == 0
    return time.perf_counter() - start


@pytest.mark.slow
def test_compile_of_a_20000_node_chain(tmp_path):
    assert _compile_seconds(tmp_path, 20_000) < 120

"""Gas as CVM-Runtime computes it (src/runtime/infer_attr.cc, CvmRuntime::GetOps), checked
against numbers worked out by hand."""
from __future__ import annotations

import numpy as np

from cvmc.cli import main
from cvmc.frontend import load_graph
from cvmc.frontend.tensorfile import write_tensor
from cvmc.passes.gas import gas

GRAPH = """version 1.0;
graph G( data ) -> ( s )
{
    data = external<integer>(shape = [1, 3, 4, 4], precision = 8);
    w = variable<integer>(shape = [2, 3, 3, 3], label = "w", precision = 8);
    b = variable<integer>(shape = [2], label = "b", precision = 8);
    w2 = variable<integer>(shape = [5, 8], label = "w2", precision = 8);
    c = conv2d(data, w, b, padding = [1, 1]);
    r = relu(c);
    p = max_pool2d(r, pool_size = [2, 2], strides = [2, 2]);
    q = cvm_clip(p, precision = 8);
    f = flatten(q);
    d = dense(f, w2);
    s = sum(d, axes = [1]);
}
"""


def _model(tmp_path):
    (tmp_path / "graph.nnef").write_text(GRAPH)
    for label, shape in (("w", (2, 3, 3, 3)), ("b", (2,)), ("w2", (5, 8))):
        write_tensor(tmp_path / f"{label}.dat", np.ones(shape, np.int8))
    return tmp_path / "graph.nnef"


# By hand. Operations, per output element x output size:
#   conv2d (3*3*3*3 + 1 for the bias) = 82 x 32 = 2624; relu 1 x 32 = 32;
#   max_pool2d 2*2 = 4 x 8 = 32; cvm_clip 1 x 8 = 8; flatten 1 x 8 = 8;
#   dense 3*8 = 24 x 5 = 120; sum 5/1 = 5 x 1 = 5.         total 2829
# Memory, 5 per element: data 48 + w 54 + b 2 + w2 40 = 144 inputs and weights, and
#   outputs 32 + 32 + 8 + 8 + 8 + 5 + 1 = 94: 5 * 238 = 1190.
OPERATIONS, MEMORY = 2829, 1190


def test_gas_hand_computed(tmp_path):
    cost = gas(load_graph(_model(tmp_path)))
    assert (cost.operations, cost.memory, cost.total) == (OPERATIONS, MEMORY, 4019)


def test_cvmc_check_prints_gas(tmp_path, capsys):
    assert main(["check", str(_model(tmp_path))]) == 0
    assert "gas: 4019 (operations 2829 + memory 1190" in capsys.readouterr().out

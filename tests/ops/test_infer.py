"""Precision inference: graph-level behaviour (per-op rules are tested with each op)."""
import numpy as np
import pytest

from cvmc.errors import CvmcError
from cvmc.ir import Graph, Node, TensorType
from cvmc.ops.common import bitlen, data_precision, numprec
from cvmc.ops.infer import retype


@pytest.mark.parametrize("n, want", [(0, 0), (1, 1), (8, 4), (9, 4), (576, 10), (2**31, 32)])
def test_bitlen_matches_design_note(n, want):
    assert bitlen(n) == want


@pytest.mark.parametrize("r, want", [(0, 2), (1, 3), (127, 9), (126, 8)])
def test_numprec(r, want):
    # numprec(r) = bitlen(r + 1) + 1 (cvm-semantics.md)
    assert numprec(r) == want


@pytest.mark.parametrize("values, want", [([0], 1), ([1, -1], 2), ([127], 8), ([-128], 9),
                                          ([2**31 - 1], 32)])
def test_weight_precision_is_smallest_that_holds(values, want):
    # |v| <= 2^(p-1) - 1
    assert data_precision(np.array(values)) == want


def relu_graph(input_prec=8, weight=None):
    types = {"x": TensorType((2, 3), "int32", input_prec), "y": TensorType((2, 3))}
    consts = {}
    src = "x"
    if weight is not None:
        types["w"] = TensorType((2, 3), "int32", None)
        consts["w"] = weight
        src = "w"
    return Graph("g", ["x"], ["y"], [Node("relu", (src,), ("y",), {})], types, consts)


def test_storage_dtype_follows_precision():
    g = retype(relu_graph(8))
    assert g.types["y"] == TensorType((2, 3), "int8", 8)
    g = retype(relu_graph(9))
    assert g.types["y"] == TensorType((2, 3), "int32", 9)


def test_weight_precision_inferred_from_data():
    g = retype(relu_graph(8, weight=np.full((2, 3), 300)))
    assert g.types["w"].precision == 10 and g.types["y"].precision == 10


def test_input_without_precision_may_hold_any_int32():
    assert retype(relu_graph(None)).types["x"] == TensorType((2, 3), "int32", 32)


def test_weight_without_data_is_rejected():
    g = relu_graph(8)
    g = g.replace(labels={"w": "conv/w"}, types={**g.types, "w": TensorType((2, 3))})
    with pytest.raises(CvmcError, match=r"weight 'w': its data file 'conv/w.dat' was not found"):
        retype(g)


def test_cvm_op_on_a_float_tensor_is_rejected_by_name():
    g = relu_graph(8)
    g = g.replace(types={**g.types, "x": TensorType((2, 3), "float32")})
    with pytest.raises(CvmcError, match="relu 'y': input 'x' is float32, not an integer "
                                        "tensor"):
        retype(g)


def test_typed_op_checks_kinds_and_types_its_results():
    """NNEF ops: inputs of the declared kinds; results of the declared kind; a generic op
    on integers passes the widest precision on (select), a cast to integer gets 32."""
    f, b = TensorType((2,), "float32"), TensorType((2,), "bool")
    i8, i12 = TensorType((2,), "int32", 8), TensorType((2,), "int32", 12)

    def infer(op, ins, out=f):
        names = [f"x{k}" for k in range(len(ins))]
        g = Graph("g", names, ["y"], [Node(op, tuple(names), ("y",), {})],
                  {**dict(zip(names, ins)), "y": out})
        return retype(g).types["y"]

    assert infer("add", [f, f]) == f
    assert infer("lt", [f, f]) == b
    assert infer("select", [b, i8, i12]) == TensorType((2,), "int32", 12)
    assert infer("cast", [f], TensorType((2,), "int32")) == TensorType((2,), "int32", 32)
    with pytest.raises(CvmcError, match="add 'y': input 'x0' must be a tensor<scalar>, got a "
                                        "tensor<integer>; on integer tensors use"):
        infer("add", [i8, f])
    with pytest.raises(CvmcError, match="select 'y': generic inputs must all have one"):
        infer("select", [b, i8, f])

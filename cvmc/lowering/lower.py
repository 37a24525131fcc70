"""Graph nodes -> TE -> PrimFuncs.

Kernel inputs and outputs use the tensors' storage dtypes (int8 / int32); an op's
`lower` rule sees int32 views of its inputs (inlined casts) and returns int32 (or int64)
tensors, which are cast to the output storage dtype here. The precision rules guarantee
that the cast never changes a value.
"""
from __future__ import annotations

from collections.abc import Mapping

from cvmc.ir import Node, TensorType
from cvmc.ops import lookup
from cvmc.ops.registry import Attrs


def node_compute(node: Node, types: Mapping[str, TensorType], inputs: Mapping[str, object]):
    """TE outputs of `node`, reading its inputs from `inputs` (name -> te.Tensor)."""
    from cvmc.lowering.te_facade import cast

    views = []
    for name in node.inputs:
        t = inputs[name]
        views.append(t if t.dtype == "int32" else cast(t, "int32", f"{name}_i32"))
    outs = lookup(node.op).run_lower(views, Attrs(node.attrs))
    result = []
    for name, out in zip(node.outputs, outs):
        dtype = types[name].dtype
        result.append(out if out.dtype == dtype else cast(out, dtype, f"{name}_cast"))
    return result


def lower_node(node: Node, types: Mapping[str, TensorType], symbol: str):
    """A PrimFunc `symbol(inputs..., outputs...)` computing one node."""
    from cvmc.lowering.te_facade import te

    placeholders = {n: te.placeholder(types[n].shape, types[n].dtype, name=n)
                    for n in dict.fromkeys(node.inputs)}
    outs = node_compute(node, types, placeholders)
    args = [placeholders[n] for n in dict.fromkeys(node.inputs)] + outs
    return te.create_prim_func(args).with_attr("global_symbol", symbol)

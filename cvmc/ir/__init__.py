"""The graph IR: Graph / Node / TensorType. Never imports TVM."""
from cvmc.ir.graph import Graph, Node, TensorType, storage_dtype

__all__ = ["Graph", "Node", "TensorType", "storage_dtype"]

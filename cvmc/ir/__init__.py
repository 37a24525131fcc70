"""The graph IR: Graph / Node / TensorType. Never imports TVM."""
from cvmc.ir.graph import Graph, InvalidGraph, Node, TensorType, storage_dtype

__all__ = ["Graph", "InvalidGraph", "Node", "TensorType", "storage_dtype"]

"""cvmc: a compiler for integer (CVM) neural networks.

Public API (README, "Python API"): `load_graph` (read a model), `GraphBuilder` (build one
from Python, CINN's way), `reference_run` (the NumPy oracle), `compile` (build a .cvmx
artifact; the pass pipeline runs inside), `print_graph` (the graph as NNEF text),
`CvmcError` (every user mistake).
"""
from cvmc.builder import GraphBuilder
from cvmc.errors import CvmcError
from cvmc.frontend import load_graph
from cvmc.frontend.printer import print_graph
from cvmc.reference import reference_run

__all__ = ["CvmcError", "GraphBuilder", "compile", "load_graph", "print_graph",
           "reference_run"]


def __getattr__(name: str):
    # compile pulls in TVM (~300 MB); import it only when asked for, so that parsing,
    # checking and the reference interpreter never load TVM.
    if name == "compile":
        from cvmc.codegen import compile_model
        return compile_model
    raise AttributeError(f"module 'cvmc' has no attribute {name!r}")

"""cvmc: a compiler for integer (CVM) neural networks.

Public API: `load_graph` (read a model), `reference_run` (the NumPy oracle),
`compile_model` (build an artifact; see cvmc.codegen).
"""
from cvmc.errors import CvmcError
from cvmc.frontend import load_graph
from cvmc.reference import reference_run

__all__ = ["CvmcError", "compile_model", "load_graph", "reference_run"]


def __getattr__(name: str):
    # compile_model pulls in TVM (~300 MB); import it only when asked for, so that
    # parsing, checking and the reference interpreter never load TVM.
    if name == "compile_model":
        from cvmc.codegen import compile_model
        return compile_model
    raise AttributeError(f"module 'cvmc' has no attribute {name!r}")

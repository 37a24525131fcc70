"""cvmc: a compiler for integer (CVM) neural networks.

Public API: `load_graph` (read a model), `reference_run` (the NumPy oracle),
`compile_model` (build an artifact; see cvmc.codegen).
"""
from cvmc.errors import CvmcError
from cvmc.frontend import load_graph
from cvmc.reference import reference_run

__all__ = ["CvmcError", "load_graph", "reference_run"]

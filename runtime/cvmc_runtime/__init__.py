"""cvmc_runtime: load a compiled .cvmx artifact and run it (NumPy + apache-tvm-ffi only)."""
from cvmc_runtime.model import Model, load, set_num_threads
from cvmc_runtime.signature import ModelError, TensorSpec

__all__ = ["Model", "ModelError", "TensorSpec", "load", "set_num_threads"]

"""cvmc_runtime: load a compiled .cvmx artifact and run it (NumPy + apache-tvm-ffi only)."""

"""cvmc_runtime: load a compiled .cvmx artifact and run it (NumPy + apache-tvm-ffi only).

Running: `load`, `Model`, `ModelError`, `TensorSpec`, `set_num_threads`, `pool_stats` and
`load_kernels`
(the process's one thread pool, `cvmc_runtime.pool`), and what a
quantized model clipped (`Saturation`, `SaturationWarning`); top-1 predictions
over a dataset in local processes or on Ray Data (`predict`, `predict_ray`, and
`dataset_rows`, the dataset's samples as they count them). The rest is the
artifact contract, which the compiler that writes artifacts uses (cvmc imports only these
names, never the modules behind them): the file format (`write_artifact`) and its native
runtime (`NATIVE_ABI`, the C sources in `NATIVE_FOLDER`), input checks (`check_inputs`),
the plan's arena rules (`ARENA_ALIGNMENT`, `buffer_lifetimes`, `tensor_bytes`), the library signature (`signature_json`, `SIGNATURE_FUNCTION`), the CPU
features the runtime can check (`CPUINFO_FLAGS`, `host_flags`), atomic file writes, the one
.npy reader (`read_npy`, `MAX_NPY_BYTES`), and the one rule from reals to CVM integers and
back (`quantize`, `dequantize`; a scale per slice of a concatenated output:
`sliced_scale`, its quantization.json form `scale_entry`, its checks `sliced_problem`).
"""
from cvmc_runtime.artifact import NATIVE_ABI, NATIVE_FOLDER, write_artifact
from cvmc_runtime.cpu import CPUINFO_FLAGS, host_flags
from cvmc_runtime.evaluate import dataset_rows, predict, predict_ray
from cvmc_runtime.fileio import atomic_write, atomic_write_bytes
from cvmc_runtime.library import SIGNATURE_FUNCTION, signature_json
from cvmc_runtime.model import Model, load
from cvmc_runtime.npyfile import MAX_NPY_BYTES, read_npy
from cvmc_runtime.plan import ARENA_ALIGNMENT, buffer_lifetimes, tensor_bytes
from cvmc_runtime.pool import load_kernels, pool_stats, set_num_threads
from cvmc_runtime.quant import Saturation, SaturationWarning, dequantize, quantize
from cvmc_runtime.signature import (
    ModelError,
    TensorSpec,
    check_inputs,
    scale_entry,
    sliced_problem,
    sliced_scale,
)

__all__ = ["ARENA_ALIGNMENT", "CPUINFO_FLAGS", "MAX_NPY_BYTES", "NATIVE_ABI", "NATIVE_FOLDER",
           "SIGNATURE_FUNCTION", "Model", "ModelError", "Saturation", "SaturationWarning",
           "TensorSpec", "atomic_write",
           "atomic_write_bytes", "buffer_lifetimes", "check_inputs", "dataset_rows",
           "dequantize", "host_flags", "load", "load_kernels", "pool_stats", "predict", "predict_ray",
           "quantize", "read_npy", "scale_entry", "set_num_threads", "signature_json",
           "sliced_problem", "sliced_scale", "tensor_bytes",
           "write_artifact"]

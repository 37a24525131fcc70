"""Load a .cvmx artifact and run it: NumPy + apache-tvm-ffi, no TVM compiler."""
from __future__ import annotations

import os
import tempfile
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from cvmc_runtime.artifact import LIBRARY, read_artifact
from cvmc_runtime.cpu import check_host_cpu
from cvmc_runtime.library import check_library
from cvmc_runtime.plan import tensor_bytes
from cvmc_runtime.pool import register_pool
from cvmc_runtime.quant import Saturation, quantize
from cvmc_runtime.quant import dequantize as reals_of
from cvmc_runtime.signature import ModelError, TensorSpec, check_inputs

ALIGNMENT = 64  # AVX-512 kernels assume 64-byte aligned buffers and nothing checks it


def aligned_empty(shape, dtype) -> np.ndarray:
    """A C-contiguous array whose data pointer is 64-byte aligned."""
    dtype = np.dtype(dtype)
    count = int(np.prod(shape, dtype=np.int64))
    # At least one element: NumPy gives an empty slice the base pointer, not the offset one.
    nbytes = max(count, 1) * dtype.itemsize
    raw = np.empty(nbytes + ALIGNMENT, dtype=np.uint8)
    start = -raw.ctypes.data % ALIGNMENT
    return raw[start:start + nbytes].view(dtype)[:count].reshape(shape)


class _Buffers:
    """Named tensors handed to kernels, on the CPU or on a CUDA device."""

    def __init__(self, module, device: str):
        import tvm_ffi

        self._ffi = tvm_ffi
        self.module = module
        self.device = device
        self.host: dict[str, np.ndarray] = {}
        self.tensors: dict[str, object] = {}

    def allocate(self, name: str, shape, dtype: str, memory: np.ndarray | None = None) -> None:
        """A tensor for `name` (on CUDA, also a host staging array); on the CPU it may be a
        view of `memory` (64-byte aligned bytes from the arena)."""
        self.host[name] = aligned_empty(tuple(shape), dtype) if memory is None else \
            memory.view(dtype).reshape(tuple(shape))
        host = self._ffi.from_dlpack(self.host[name], require_alignment=ALIGNMENT)
        if self.device == "cpu":
            self.tensors[name] = host
        else:
            self.tensors[name] = self.module["cvmc_empty"](list(shape), dtype)

    def upload(self, name: str, value: np.ndarray) -> None:
        """Copy `value` into the tensor of `name`."""
        self.host[name][...] = value
        if self.device != "cpu":
            self.module["cvmc_copy"](self._host_tensor(name), self.tensors[name])

    def download(self, name: str) -> np.ndarray:
        """A fresh NumPy copy of the tensor of `name`."""
        if self.device != "cpu":
            self.module["cvmc_copy"](self.tensors[name], self._host_tensor(name))
            self.module["cvmc_sync"]()
        return self.host[name].copy()

    def _host_tensor(self, name: str):
        return self._ffi.from_dlpack(self.host[name], require_alignment=ALIGNMENT)


class Model:
    """A loaded artifact: `inputs`, `outputs` (TensorSpecs) and `run`."""

    def __init__(self, plan: dict, module, weights: Mapping[str, np.ndarray]):
        self.plan = plan
        self.inputs = [TensorSpec.from_json(s) for s in plan["inputs"]]
        self.outputs = [TensorSpec.from_json(s) for s in plan["outputs"]]
        self._kernels = [(module[k["symbol"]], k["args"]) for k in plan["kernels"]]
        self._buf = _Buffers(module, plan["device"])
        self.saturation = Saturation()  # what the last run clipped
        specs = [*plan["inputs"], *plan["weights"], *plan["outputs"]]
        for spec in {s["name"]: s for s in specs}.values():
            self._buf.allocate(spec["name"], spec["shape"], spec["dtype"])
        # Intermediate buffers, and only they, live in one arena allocated once per loaded
        # model, at the offsets the compiler planned by liveness (validated with the plan).
        arena = plan.get("arena") if plan["device"] == "cpu" else None
        memory = aligned_empty((max(arena["bytes"], 1),), "uint8") if arena else None
        for spec in plan["buffers"]:
            offset = arena["offsets"][spec["name"]] if arena else None
            view = None if offset is None else \
                memory[offset:offset + tensor_bytes(spec)]  # type: ignore[index]
            self._buf.allocate(spec["name"], spec["shape"], spec["dtype"], view)
        for name, value in weights.items():
            self._buf.upload(name, value)

    def run(self, feeds: Mapping[str, object], saturate: bool = False,
            dequantize: bool = False, warn_saturation: bool = True) -> dict[str, np.ndarray]:
        """Check the inputs, call every kernel in order, return the outputs by name.

        A float array for an input with a scale is quantized by `cvmc_runtime.quantize`;
        `dequantize=True` returns every output with a scale as float32 reals (q / scale).
        `self.saturation` then counts what the quantized model clipped (float input values
        beyond an input's range, outputs with a scale at the ends of their integer range);
        where anything clipped, one SaturationWarning says so (unless `warn_saturation` is
        False).
        """
        for flag, value in (("saturate", saturate), ("dequantize", dequantize),
                            ("warn_saturation", warn_saturation)):
            if not isinstance(value, (bool, np.bool_)):
                raise ModelError(f"{flag} must be True or False, got {value!r:.40}")
        scaled = [s for s in self.outputs if s.scale is not None]
        if dequantize and not scaled:
            raise ModelError("dequantize: this artifact records no output scale (compile a "
                             "quantized model folder holding quantization.json)")
        saturation = Saturation()
        feeds = _quantize_feeds(self.inputs, feeds, saturation)
        for name, value in check_inputs(self.inputs, feeds, saturate).items():
            self._buf.upload(name, value)
        for index in range(len(self._kernels)):
            self._call(index)
        outputs = {s.name: self._buf.download(s.name) for s in self.outputs}
        for spec in scaled:
            if spec.precision is not None:
                saturation.count_output(spec.name, outputs[spec.name], spec.precision)
            if dequantize:
                outputs[spec.name] = reals_of(outputs[spec.name], spec.scale)
        self.saturation = saturation
        if warn_saturation:
            saturation.warn()
        return outputs

    def _call(self, index: int) -> None:
        kernel, args = self._kernels[index]
        try:
            kernel(*[self._buf.tensors[a] for a in args])
        # The packed-function wrapper rejects arguments of the wrong rank, shape or dtype:
        # a plan that does not match its library.
        except (TypeError, ValueError, RuntimeError) as e:
            raise ModelError(f"kernel '{self.plan['kernels'][index]['symbol']}' rejects its "
                             f"arguments: the plan does not match the library ({e})") from None

    def profile(self, feeds: Mapping[str, object], repeat: int = 20,
                warmup: int = 3) -> tuple[list[list[float]], list[float]]:
        """(seconds of each kernel call, per kernel; seconds of each whole `run`): every
        kernel timed alone over `repeat` rounds after `warmup`, then whole runs."""
        import time

        for name, value, least in (("repeat", repeat, 1), ("warmup", warmup, 0)):
            if type(value) is not int or value < least:
                raise ModelError(f"{name} must be an integer >= {least}, got {value!r:.40}")
        self.run(feeds)
        for _ in range(warmup):
            self.run(feeds)
        per_kernel: list[list[float]] = [[] for _ in self._kernels]
        for _ in range(repeat):
            for index, times in enumerate(per_kernel):
                start = time.perf_counter()
                self._call(index)
                if self.plan["device"] != "cpu":
                    self._buf.module["cvmc_sync"]()
                times.append(time.perf_counter() - start)
        runs = []
        for _ in range(repeat):
            start = time.perf_counter()
            self.run(feeds)
            runs.append(time.perf_counter() - start)
        return per_kernel, runs


def _quantize_feeds(specs: list[TensorSpec], feeds: object, saturation: Saturation) -> object:
    """`feeds` with each float array given for an input with a scale quantized to its
    precision (the values it clips counted in `saturation`); anything else as given, for
    check_inputs to check (an integer array for a scaled input is taken as already
    quantized)."""
    scaled = {s.name: s for s in specs if s.scale is not None}
    if not scaled or not isinstance(feeds, Mapping):
        return feeds
    out = dict(feeds)
    for name, spec in scaled.items():
        if name not in feeds:
            continue  # check_inputs names it
        try:
            value = np.asarray(feeds[name])
        except (ValueError, TypeError):  # ragged lists: check_inputs names it
            continue
        if value.dtype.kind == "f":
            if value.shape != spec.shape:  # before quantize copies it to float64
                raise ModelError(f"input '{name}': expected shape {list(spec.shape)}, got "
                                 f"{list(value.shape)}")
            out[name] = quantize(f"input '{name}'", value, spec.scale, spec.precision)
            saturation.count_input(name, value, spec.scale, spec.precision)
    return out


def cuda_available() -> bool:
    """True if the CUDA driver reports at least one GPU."""
    import ctypes

    try:
        cuda = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return False
    count = ctypes.c_int(0)
    return cuda.cuInit(0) == 0 and cuda.cuDeviceGetCount(ctypes.byref(count)) == 0 \
        and count.value > 0


def load(path: str | os.PathLike) -> Model:
    """Load a .cvmx artifact; every problem with the file is a ModelError."""
    if not isinstance(path, (str, os.PathLike)) or not isinstance(os.fspath(path), str):
        raise ModelError(f"load expects the path of a .cvmx file (a str or os.PathLike), "
                         f"got {type(path).__name__}")
    plan, library, weights = read_artifact(path)
    try:
        module = _load_library(plan, library)
        check_library(plan, module)
        return Model(plan, module, weights)
    except ModelError as e:
        raise ModelError(f"{path}: {e}") from None
    except (KeyError, AttributeError) as e:
        raise ModelError(f"{path}: plan does not match its library ({e})") from None
    except MemoryError:
        raise ModelError(f"{path}: not enough memory for the buffers its plan declares") \
            from None


def _load_library(plan: dict, library: bytes):
    """The kernel library loaded, once this machine is known to be able to run it: a CUDA
    GPU for a cuda plan, every CPU feature its code needs for a cpu plan (checked before
    the code is mapped, not found by a SIGILL); a cpu plan's kernels get the process's
    native runtime (cvmc_runtime.pool)."""
    import tvm_ffi

    if plan["device"] == "cuda" and not cuda_available():
        raise ModelError(f"built for CUDA ({plan['target']['arch']}), but no CUDA GPU is "
                         f"available on this machine")
    if plan["device"] == "cpu":
        check_host_cpu(plan["target"])
        register_pool()  # the process's pool, for tvm-ffi to give these kernels
    with tempfile.TemporaryDirectory(prefix="cvmx-") as tmp:
        lib = Path(tmp) / LIBRARY
        lib.write_bytes(library)
        try:
            return tvm_ffi.load_module(str(lib))
        except Exception as e:  # noqa: BLE001 (tvm-ffi reports a bad library generically)
            raise ModelError(f"cannot load its kernel library ({e})") from None

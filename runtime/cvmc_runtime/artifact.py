"""The .cvmx artifact: one zip file holding the kernel library, the plan and the weights.

Members: `cvmx.json` (format name and version, and the native ABI version: the interface
between the kernels and the native runtime they call, `native/cvmc_pool.h`), `plan.json`
(signature, weights, buffers, kernel calls), `kernels.so` (the compiled library: CPU
kernels, which get the process's native runtime when loaded (cvmc_runtime.pool), or CUDA
host wrappers with their device code compiled ahead of time) and `weights/<index>.npy`.
"""
from __future__ import annotations

import io
import json
import zipfile
import zlib
from pathlib import Path

import numpy as np

from cvmc_runtime.fileio import atomic_write
from cvmc_runtime.npyfile import read_npy
from cvmc_runtime.plan import check_weights, validate_plan
from cvmc_runtime.signature import ModelError

FORMAT = "cvmx"
FORMAT_VERSION = 1
NATIVE_ABI = 2  # CVMC_ABI_VERSION in native/cvmc_pool.h
NATIVE_FOLDER = Path(__file__).parent / "native"  # the native runtime's C sources
LIBRARY = "kernels.so"
ZIP_EPOCH = (1980, 1, 1, 0, 0, 0)  # the zip format's earliest date: no build time in the file


def write_artifact(path: str | Path, plan: dict, library: bytes,
                   weights: dict[str, np.ndarray]) -> None:
    """Write a .cvmx file; `plan['weights']` names the arrays in `weights`, in order. The
    same inputs give the same bytes (members carry a fixed timestamp)."""
    def member(z: zipfile.ZipFile, name: str, data: bytes, deflate: bool = True) -> None:
        info = zipfile.ZipInfo(name, date_time=ZIP_EPOCH)
        info.compress_type = zipfile.ZIP_DEFLATED if deflate else zipfile.ZIP_STORED
        z.writestr(info, data)

    def write(file) -> None:
        with zipfile.ZipFile(file, "w") as z:
            member(z, "cvmx.json", json.dumps({"format": FORMAT, "version": FORMAT_VERSION,
                                             "abi": NATIVE_ABI}))
            member(z, "plan.json", json.dumps(plan, indent=1, allow_nan=False))
            member(z, LIBRARY, library)
            for index, spec in enumerate(plan["weights"]):
                buf = io.BytesIO()
                # np.require keeps a rank-0 weight rank 0 (ascontiguousarray makes it [1])
                array = np.require(weights[spec["name"]], requirements="C")
                np.save(buf, array, allow_pickle=False)
                # float weights barely deflate (random mantissas) and deflating them cost
                # most of a float model's write time: stored as they are
                member(z, f"weights/{index}.npy", buf.getvalue(), deflate=array.dtype.kind != "f")
    # A temporary file renamed into place: an interrupted compile never leaves a
    # half-written artifact, nor destroys the one that was there.
    atomic_write(path, write)


MAX_JSON_BYTES = 64 << 20  # cvmx.json and plan.json (a ResNet-50 plan is ~100 KB)
MAX_LIBRARY_BYTES = 1 << 30
NPY_HEADER_ALLOWANCE = 4096  # a .npy header is at most a few hundred bytes


def _member(z: zipfile.ZipFile, name: str, limit: int) -> bytes:
    """A member's bytes, its uncompressed size checked against `limit` before it is read
    (zipfile then checks the size and the CRC as it reads). Only members the plan needs
    are ever read."""
    info = z.getinfo(name)
    if info.file_size > limit:
        raise ModelError(f"member '{name}' declares {info.file_size} bytes, more than the "
                         f"{limit} it may hold")
    return z.read(info)


def _weight_bytes(spec: dict) -> int:
    return int(np.prod(spec["shape"], dtype=np.int64)) * np.dtype(spec["dtype"]).itemsize


def read_artifact(path: str | Path) -> tuple[dict, bytes, dict[str, np.ndarray]]:
    """(plan, library bytes, weights by name); any damage is a ModelError."""
    try:
        with zipfile.ZipFile(path) as z:
            header = json.loads(_member(z, "cvmx.json", MAX_JSON_BYTES))
            if not isinstance(header, dict) or header.get("format") != FORMAT or \
                    header.get("version") != FORMAT_VERSION:
                raise ModelError(f"artifact format {header!r:.80} is not "
                                 f"{FORMAT} version {FORMAT_VERSION}; recompile the model")
            if header.get("abi") != NATIVE_ABI:
                raise ModelError(f"its kernels were built for native runtime ABI "
                                 f"{header.get('abi')!r:.20}, this runtime has ABI "
                                 f"{NATIVE_ABI}; recompile the model")
            plan = json.loads(_member(z, "plan.json", MAX_JSON_BYTES))
            validate_plan(plan)
            library = _member(z, LIBRARY, MAX_LIBRARY_BYTES)
            # Each weight member may hold no more than its declared shape and dtype need.
            weights = {spec["name"]: read_npy(
                _member(z, f"weights/{i}.npy", _weight_bytes(spec) + NPY_HEADER_ALLOWANCE),
                f"member 'weights/{i}.npy'", _weight_bytes(spec))
                for i, spec in enumerate(plan["weights"])}
            check_weights(plan, weights)
    except FileNotFoundError:
        raise ModelError(f"{path}: no such file") from None
    except ModelError as e:
        raise ModelError(f"{path}: {e}") from None
    # RecursionError: deeply nested JSON; MemoryError: a library too large for this machine.
    except (zipfile.BadZipFile, zlib.error, KeyError, ValueError, OSError, EOFError,
            RecursionError, MemoryError) as e:
        raise ModelError(f"{path}: not a valid .cvmx artifact ({e})") from None
    return plan, library, weights

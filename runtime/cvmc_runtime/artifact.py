"""The .cvmx artifact: one zip file holding the kernel library, the plan and the weights.

Members: `cvmx.json` (format name and version), `plan.json` (signature, weights, buffers,
kernel calls), `kernels.so` (the compiled library: CPU kernels, or CUDA host wrappers with
their device code compiled ahead of time) and `weights/<index>.npy`.
"""
from __future__ import annotations

import io
import json
import zipfile
import zlib
from pathlib import Path

import numpy as np

from cvmc_runtime.fileio import atomic_write
from cvmc_runtime.plan import check_weights, validate_plan
from cvmc_runtime.signature import ModelError

FORMAT = "cvmx"
FORMAT_VERSION = 1
LIBRARY = "kernels.so"


def write_artifact(path: str | Path, plan: dict, library: bytes,
                   weights: dict[str, np.ndarray]) -> None:
    """Write a .cvmx file; `plan['weights']` names the arrays in `weights`, in order."""
    def write(file) -> None:
        with zipfile.ZipFile(file, "w", compression=zipfile.ZIP_DEFLATED) as z:
            z.writestr("cvmx.json", json.dumps({"format": FORMAT, "version": FORMAT_VERSION}))
            z.writestr("plan.json", json.dumps(plan, indent=1))
            z.writestr(LIBRARY, library)
            for index, spec in enumerate(plan["weights"]):
                buf = io.BytesIO()
                np.save(buf, np.ascontiguousarray(weights[spec["name"]]), allow_pickle=False)
                z.writestr(f"weights/{index}.npy", buf.getvalue())
    # A temporary file renamed into place: an interrupted compile never leaves a
    # half-written artifact, nor destroys the one that was there.
    atomic_write(path, write)


def read_artifact(path: str | Path) -> tuple[dict, bytes, dict[str, np.ndarray]]:
    """(plan, library bytes, weights by name); any damage is a ModelError."""
    try:
        with zipfile.ZipFile(path) as z:
            bad = z.testzip()
            if bad is not None:
                raise ModelError(f"corrupt artifact (member '{bad}' fails its checksum)")
            header = json.loads(z.read("cvmx.json"))
            if not isinstance(header, dict) or header.get("format") != FORMAT or \
                    header.get("version") != FORMAT_VERSION:
                raise ModelError(f"artifact format {header!r:.80} is not "
                                 f"{FORMAT} version {FORMAT_VERSION}; recompile the model")
            plan = json.loads(z.read("plan.json"))
            validate_plan(plan)
            library = z.read(LIBRARY)
            weights = {spec["name"]: np.load(io.BytesIO(z.read(f"weights/{i}.npy")),
                                             allow_pickle=False)
                       for i, spec in enumerate(plan["weights"])}
            check_weights(plan, weights)
    except FileNotFoundError:
        raise ModelError(f"{path}: no such file") from None
    except ModelError as e:
        raise ModelError(f"{path}: {e}") from None
    # RecursionError: deeply nested JSON; MemoryError: a .npy header claiming a huge shape.
    except (zipfile.BadZipFile, zlib.error, KeyError, ValueError, OSError, EOFError,
            RecursionError, MemoryError) as e:
        raise ModelError(f"{path}: not a valid .cvmx artifact ({e})") from None
    return plan, library, weights

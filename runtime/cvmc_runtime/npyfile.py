"""The one .npy reader: an artifact's weights, and every array a user names (`cvmc run
--input`, `bench --input`, `quantize --calib`, `eval --data` / `--labels`).

The header is parsed first and the array it declares is bounded in bytes (dtype size times
elements, not elements alone) and compared with the bytes the file actually holds, so a
header claiming gigabytes on a small file is refused before anything is allocated. No
pickles (object arrays) are read.
"""
from __future__ import annotations

import io
import os
import stat
from typing import BinaryIO

import numpy as np

from cvmc_runtime.signature import ModelError

# The data of one array a user names: 2^30 four-byte elements, the largest tensor a model
# may have (int32 or float32); datasets and calibration sets are bounded alike.
MAX_NPY_BYTES = 4 << 30
_HEADERS = {(1, 0): np.lib.format.read_array_header_1_0,
            (2, 0): np.lib.format.read_array_header_2_0}


def read_npy(source: str | os.PathLike | bytes, what: str,
             max_bytes: int = MAX_NPY_BYTES) -> np.ndarray:
    """The array in a .npy file (a path to a regular file) or in `source` bytes, whose data
    may hold at most `max_bytes`; every problem is a ModelError starting with `what` (what
    the array is, e.g. `--input data`)."""
    if not isinstance(source, (bytes, str, os.PathLike)) or type(max_bytes) is not int:
        raise ModelError(f"{what}: expected a path or bytes and an integer max_bytes, got "
                         f"{type(source).__name__} and {max_bytes!r:.40}")
    file = "" if isinstance(source, bytes) else f" '{os.fspath(source)}'"
    subject = f"{what}:{file}" if file else what
    try:
        with _open(source) as f:
            read_header = _HEADERS.get(np.lib.format.read_magic(f))
            if read_header is None:
                raise ValueError("unsupported .npy format version")
            shape, _, dtype = read_header(f)
            if dtype.hasobject:
                raise ValueError("it holds Python objects (pickles), which are not read")
            declared = int(np.prod(shape, dtype=object)) * dtype.itemsize
            start = f.tell()
            held = f.seek(0, os.SEEK_END) - start  # the bytes after the header
            if declared > max_bytes:
                raise ModelError(f"{subject} declares {dtype} {list(shape)}, {declared} "
                                 f"bytes: more than the {max_bytes} an array may hold here")
            if held != declared:
                raise ModelError(f"{subject} holds {held} bytes of data, but its header "
                                 f"declares {dtype} {list(shape)}, {declared} bytes")
            f.seek(0)
            return np.load(f, allow_pickle=False)
    except (OSError, ValueError, EOFError) as e:  # missing, empty, truncated, not .npy
        raise ModelError(f"{what}: cannot read{file} as a .npy array "
                         f"({getattr(e, 'strerror', None) or str(e) or type(e).__name__})") \
            from None
    except MemoryError:
        raise ModelError(f"{subject} does not fit in memory") from None


def _open(source: str | os.PathLike | bytes) -> BinaryIO:
    """`source` bytes as a file, or the regular file at path `source` (opened without
    blocking: a FIFO or a device is refused, not waited on)."""
    if isinstance(source, bytes):
        return io.BytesIO(source)
    fd = os.open(source, os.O_RDONLY | os.O_NONBLOCK)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise ValueError("not a regular file")
    return os.fdopen(fd, "rb")

"""CVM-Runtime params files: a TVM NDArray list (names, then DLTensor-serialized arrays).

Layout (little-endian): u64 list magic, u64 reserved, u64 N, N names (u64 length +
bytes), u64 N, then N arrays: u64 array magic, u64 reserved, i32 device type, i32 device
id, i32 ndim, u8 type code (0 = int), u8 bits, u16 lanes, i64 shape[ndim], i64 byte
count, raw data. Every length is checked against the bytes left before anything is
allocated, so a corrupt or hostile file fails with one clear message.
"""
from __future__ import annotations

import struct
from pathlib import Path

import numpy as np

from cvmc.errors import CvmcError

LIST_MAGIC = 0xF7E58D4F05049CB7
ARRAY_MAGIC = 0xDD5E40F096B4A13F
_DL_INT, _DL_CPU = 0, 1
_ARRAY_HEAD = struct.Struct("<QQiiiBBH")


class _Reader:
    """Bounds-checked little-endian reads from a byte buffer."""

    def __init__(self, data: bytes, name: str):
        self.data, self.name, self.pos = data, name, 0

    def fail(self, message: str) -> CvmcError:
        return CvmcError(f"params file '{self.name}': {message}")

    def take(self, n: int, what: str) -> bytes:
        if n < 0 or n > len(self.data) - self.pos:
            raise self.fail(f"truncated {what} at byte {self.pos} (needs {n} bytes, "
                            f"{len(self.data) - self.pos} left)")
        self.pos += n
        return self.data[self.pos - n:self.pos]

    def unpack(self, fmt: str, what: str) -> tuple:
        s = struct.Struct("<" + fmt)
        return s.unpack(self.take(s.size, what))

    def count(self, what: str, item_size: int) -> int:
        """A u64 element count, rejected when the remaining bytes cannot hold it."""
        (n,) = self.unpack("Q", what)
        if n * item_size > len(self.data) - self.pos:
            raise self.fail(f"{what} {n} is larger than the file can hold")
        return n


def _read_array(r: _Reader, name: str) -> np.ndarray:
    magic, _, _dev_type, _dev_id, ndim, code, bits, lanes = r.unpack(
        _ARRAY_HEAD.format[1:], f"header of array '{name}'")
    if magic != ARRAY_MAGIC:
        raise r.fail(f"array '{name}': bad magic 0x{magic:016x} (expected 0x{ARRAY_MAGIC:016x})")
    if code != _DL_INT or bits not in (8, 32) or lanes != 1:
        raise r.fail(f"array '{name}': unsupported element type (code {code}, {bits} bits, "
                     f"{lanes} lanes); expected int8 or int32")
    if not 0 <= ndim <= 6:
        raise r.fail(f"array '{name}': rank {ndim} outside 0..6")
    shape = r.unpack(f"{ndim}q", f"shape of array '{name}'")
    if any(d < 0 for d in shape):
        raise r.fail(f"array '{name}': negative dimension in shape {list(shape)}")
    (nbytes,) = r.unpack("q", f"byte count of array '{name}'")
    expected = int(np.prod(shape, dtype=object)) * bits // 8
    if nbytes != expected:
        raise r.fail(f"array '{name}': byte count {nbytes} does not match shape {list(shape)} "
                     f"of int{bits} ({expected} bytes)")
    raw = r.take(nbytes, f"data of array '{name}'")
    return np.frombuffer(raw, dtype=f"<i{bits // 8}").astype(np.int32).reshape(shape)


def read_params_bytes(data: bytes, name: str) -> dict[str, np.ndarray]:
    """Decode a CVM-Runtime params blob into named int32 arrays."""
    r = _Reader(data, name)
    magic, _ = r.unpack("QQ", "header")
    if magic != LIST_MAGIC:
        raise r.fail(f"bad magic 0x{magic:016x} (expected 0x{LIST_MAGIC:016x}): "
                     f"not a CVM-Runtime params file")
    names = []
    for _ in range(r.count("name count", 8)):
        length = r.count("name length", 1)
        try:
            names.append(r.take(length, "name").decode("utf-8"))
        except UnicodeDecodeError:
            raise r.fail(f"array name #{len(names)} is not UTF-8") from None
    (n_arrays,) = r.unpack("Q", "array count")
    if n_arrays != len(names):
        raise r.fail(f"{len(names)} names but {n_arrays} arrays")
    if len(set(names)) != len(names):
        dup = next(n for n in names if names.count(n) > 1)
        raise r.fail(f"array name '{dup}' appears twice")
    arrays = {n: _read_array(r, n) for n in names}
    if r.pos != len(data):
        raise r.fail(f"{len(data) - r.pos} trailing bytes after the last array")
    return arrays


def read_params(path: Path) -> dict[str, np.ndarray]:
    """Read a CVM-Runtime params file."""
    try:
        data = Path(path).read_bytes()
    except OSError as e:
        raise CvmcError(f"params file '{path}': cannot read: {e.strerror}") from None
    return read_params_bytes(data, str(path))


def params_bytes(arrays: dict[str, np.ndarray]) -> bytes:
    """Encode named arrays as a CVM-Runtime params blob: int8 arrays as 8-bit payloads,
    every other one as int32 (the two widths CVM-Runtime loads)."""
    out = [struct.pack("<QQQ", LIST_MAGIC, 0, len(arrays))]
    for name in arrays:
        encoded = name.encode("utf-8")
        out.append(struct.pack("<Q", len(encoded)) + encoded)
    out.append(struct.pack("<Q", len(arrays)))
    for arr in arrays.values():
        data = np.ascontiguousarray(arr, dtype="<i1" if arr.dtype == np.int8 else "<i4")
        bits = data.dtype.itemsize * 8
        out.append(_ARRAY_HEAD.pack(ARRAY_MAGIC, 0, _DL_CPU, 0, data.ndim, _DL_INT, bits, 1))
        out.append(struct.pack(f"<{data.ndim}qq", *data.shape, data.nbytes) + data.tobytes())
    return b"".join(out)

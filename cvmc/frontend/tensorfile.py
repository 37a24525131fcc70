"""NNEF tensor files (.dat, spec section 5.2): a 128-byte header, then the raw items.

Item-type codes: the spec's (0x00 float, 0x01 integer with a signedness parameter,
0x10 / 0x11 linear / logarithmic quantization indices) and those the Khronos tools
write (0 float, 1 unsigned (signed when the first parameter word is non-zero),
2 / 3 quantized unsigned / signed, 4 signed, 5 bool). The 4-byte code is a vendor half
and an algorithm half; both byte orders of the halves are accepted for vendor 0
(Khronos), since the spec does not say which half comes first and the tools put the
algorithm in the low half. Quantization indices are returned as stored (unsigned
integers): interpreting them is the quantization algorithm's job, not the file's.
"""
from __future__ import annotations

import struct
from pathlib import Path

import numpy as np

from cvmc.errors import CvmcError

HEADER_SIZE = 128
MAGIC = b"\x4e\xef"
MAX_RANK = 8
_HEADER = struct.Struct("<2s2BII8III")  # magic, version, data length, rank, dims, bits, code

FLOAT, UINT, QUINT, QINT, INT, BOOL = 0, 1, 2, 3, 4, 5
LINEAR_QUANT, LOG_QUANT = 0x10, 0x11
_KNOWN_CODES = (FLOAT, UINT, QUINT, QINT, INT, BOOL, LINEAR_QUANT, LOG_QUANT)
_INT_BITS = (8, 16, 32, 64)


def _item_code(raw: int, name: str) -> int:
    """The Khronos algorithm code from the 4-byte field, whichever half holds it."""
    low, high = raw & 0xFFFF, raw >> 16
    code = low if high == 0 else high if low == 0 else -1
    if code not in _KNOWN_CODES:
        raise CvmcError(f"tensor file '{name}': unsupported item type code 0x{raw:08x} "
                        f"(expected a Khronos code: 0, 1, 2, 3, 4, 5, 0x10 or 0x11)")
    return code


def _item_dtype(code: int, bits: int, signed_param: int, name: str) -> np.dtype:
    """The NumPy dtype of the stored items, or a CvmcError for a combination we cannot read."""
    if code == FLOAT and bits in (16, 32, 64):
        return np.dtype(f"<f{bits // 8}")
    if code == BOOL and bits in (1, 8):
        return np.dtype(np.bool_)
    if code in (UINT, QUINT, QINT, INT, LINEAR_QUANT, LOG_QUANT) and bits in _INT_BITS:
        signed = code in (QINT, INT) or (code == UINT and signed_param != 0)
        return np.dtype(f"<{'i' if signed else 'u'}{bits // 8}")
    raise CvmcError(f"tensor file '{name}': unsupported {bits} bits per item for item type "
                    f"code 0x{code:02x} (expected 8/16/32/64-bit integers, 16/32/64-bit "
                    f"floats or 1/8-bit bools)")


def _parse_header(data: bytes, name: str) -> tuple[tuple[int, ...], int, np.dtype]:
    """Validate the header against the buffer; returns (shape, bits per item, dtype)."""
    if len(data) < HEADER_SIZE:
        raise CvmcError(f"tensor file '{name}': truncated header ({len(data)} bytes, "
                        f"expected at least {HEADER_SIZE})")
    magic, major, minor, length, rank, *rest = _HEADER.unpack_from(data)
    dims, bits, raw_code = rest[:MAX_RANK], rest[MAX_RANK], rest[MAX_RANK + 1]
    if magic != MAGIC:
        raise CvmcError(f"tensor file '{name}': bad magic number {magic.hex()} "
                        f"(expected 4eef): not an NNEF tensor file")
    if (major, minor) != (1, 0):
        raise CvmcError(f"tensor file '{name}': unsupported version {major}.{minor} "
                        f"(expected 1.0)")
    if rank > MAX_RANK:
        raise CvmcError(f"tensor file '{name}': rank {rank} exceeds the maximum {MAX_RANK}")
    shape = tuple(dims[:rank])
    signed_param = struct.unpack_from("<I", data, _HEADER.size)[0]
    dtype = _item_dtype(_item_code(raw_code, name), bits, signed_param, name)
    # Checked against the buffer before anything is allocated, in Python ints (no overflow).
    expected = (int(np.prod(shape, dtype=object)) * bits + 7) // 8
    if length != expected:
        raise CvmcError(f"tensor file '{name}': header declares {length} data bytes but "
                        f"shape {list(shape)} at {bits} bits per item needs {expected}")
    actual = len(data) - HEADER_SIZE
    if actual != length:
        what = "truncated data" if actual < length else "trailing bytes after the data"
        raise CvmcError(f"tensor file '{name}': {what}: header declares {length} data bytes, "
                        f"file holds {actual}")
    return shape, bits, dtype


def read_tensor_bytes(data: bytes, name: str) -> np.ndarray:
    """Decode an NNEF tensor file held in memory; `name` labels errors."""
    shape, bits, dtype = _parse_header(data, name)
    payload = np.frombuffer(data, dtype=np.uint8, offset=HEADER_SIZE)
    count = int(np.prod(shape, dtype=np.int64))
    if bits == 1:
        # Bits are packed most significant first, as the Khronos tools do.
        items = np.unpackbits(payload, count=count).astype(np.bool_)
    else:
        items = payload.view(dtype)
        if dtype == np.bool_ and not np.all(payload <= 1):
            raise CvmcError(f"tensor file '{name}': 8-bit bool items must be 0 or 1")
    return items.astype(dtype.newbyteorder("="), copy=True).reshape(shape)


def read_tensor_file(path: Path) -> np.ndarray:
    """Read an NNEF tensor file from disk."""
    try:
        data = Path(path).read_bytes()
    except OSError as e:
        raise CvmcError(f"tensor file '{path}': cannot read: {e.strerror}") from None
    return read_tensor_bytes(data, str(path))


_WRITE_CODES: dict[str, tuple[int, int]] = {  # numpy kind -> (item code, signed parameter)
    "f": (FLOAT, 0), "i": (INT, 1), "u": (UINT, 0), "b": (BOOL, 0),
}


def tensor_bytes(array: np.ndarray) -> bytes:
    """Encode an array (int/uint 8..64, float 16..64, bool) as NNEF tensor file bytes."""
    array = np.asarray(array)
    if array.dtype.kind not in _WRITE_CODES or array.ndim > MAX_RANK:
        raise CvmcError(f"cannot write a tensor of dtype {array.dtype} and rank {array.ndim} "
                        f"(expected an integer, float or bool dtype and rank <= {MAX_RANK})")
    code, signed = _WRITE_CODES[array.dtype.kind]
    bits = 1 if code == BOOL else array.dtype.itemsize * 8
    if code == BOOL:
        payload = np.packbits(array.reshape(-1)).tobytes()
    else:
        payload = array.astype(array.dtype.newbyteorder("<")).tobytes()
    dims = list(array.shape) + [0] * (MAX_RANK - array.ndim)
    header = _HEADER.pack(MAGIC, 1, 0, len(payload), array.ndim, *dims, bits, code)
    header += struct.pack("<I", signed)
    return header.ljust(HEADER_SIZE, b"\0") + payload


def write_tensor(path: Path, array: np.ndarray) -> None:
    """Write an array as an NNEF tensor file (see `tensor_bytes`)."""
    Path(path).write_bytes(tensor_bytes(array))

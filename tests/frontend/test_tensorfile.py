"""NNEF tensor files: round trips against the Khronos `nnef` package, and every corrupt case."""
from __future__ import annotations

import struct
from pathlib import Path

import nnef
import numpy as np
import pytest

from cvmc.errors import CvmcError
from cvmc.frontend.tensorfile import read_tensor_bytes, read_tensor_file, tensor_bytes, write_tensor

ARRAYS = [
    np.arange(-6, 6, dtype=np.int8).reshape(3, 4),
    np.array([-(2**31), 2**31 - 1, 0], dtype=np.int32),
    np.array([[-(2**15), 7]], dtype=np.int16),
    np.array([-(2**63), 2**63 - 1], dtype=np.int64),
    np.arange(250, 256, dtype=np.uint8).reshape(1, 2, 3),
    np.array([2**16 - 1, 0], dtype=np.uint16),
    np.array([2**32 - 1], dtype=np.uint32),
    np.array([2**64 - 1], dtype=np.uint64),
    np.array([1.5, -0.25], dtype=np.float16),
    np.array([[1e30, -2.5]], dtype=np.float32),
    np.array([np.pi], dtype=np.float64),
    np.array([True, False, True, True, False, False, True, False, True]),
    np.array(7, dtype=np.int32),
    np.zeros((2, 0, 3), dtype=np.int8),
    np.ones((1,) * 8, dtype=np.int8),
]


def _khronos_bytes(array: np.ndarray, tmp_path: Path, **kw) -> bytes:
    path = tmp_path / "k.dat"
    with open(path, "wb") as f:
        nnef.write_tensor(f, array, **kw)
    return path.read_bytes()


def _header(length: int, shape: tuple[int, ...], bits: int, code: int, param: int = 0,
            magic: bytes = b"N\xef", version: tuple[int, int] = (1, 0),
            rank: int | None = None) -> bytes:
    """A header packed field by field from the spec's layout (independent of the writer)."""
    dims = list(shape) + [0] * (8 - len(shape))
    rank = len(shape) if rank is None else rank
    head = magic + bytes(version) + struct.pack("<II8III", length, rank, *dims, bits, code)
    return (head + struct.pack("<I", param)).ljust(128, b"\0")


@pytest.mark.parametrize("array", ARRAYS, ids=lambda a: f"{a.dtype}{list(a.shape)}")
def test_reads_what_khronos_writes(array: np.ndarray, tmp_path: Path) -> None:
    got = read_tensor_bytes(_khronos_bytes(array, tmp_path), "t")
    assert got.dtype == array.dtype and got.shape == array.shape
    assert np.array_equal(got, array)


@pytest.mark.parametrize("array", ARRAYS, ids=lambda a: f"{a.dtype}{list(a.shape)}")
def test_khronos_reads_what_we_write(array: np.ndarray, tmp_path: Path) -> None:
    write_tensor(tmp_path / "w.dat", array)
    with open(tmp_path / "w.dat", "rb") as f:
        got = nnef.read_tensor(f)
    assert got.dtype == array.dtype and got.shape == array.shape
    assert np.array_equal(got, array)
    assert np.array_equal(read_tensor_file(tmp_path / "w.dat"), array)


@pytest.mark.parametrize("dtype", [np.int8, np.uint16])
def test_khronos_quantized_items_read_as_integers(dtype: type, tmp_path: Path) -> None:
    array = np.array([1, 2, 3], dtype=dtype)
    got = read_tensor_bytes(_khronos_bytes(array, tmp_path, quantized=True), "t")
    assert got.dtype == array.dtype and np.array_equal(got, array)


def test_spec_integer_code_with_signedness_parameter() -> None:
    payload = struct.pack("<2h", -3, 300)
    signed = _header(4, (2,), 16, 0x01, param=1) + payload
    unsigned = _header(4, (2,), 16, 0x01, param=0) + payload
    assert read_tensor_bytes(signed, "t").tolist() == [-3, 300]
    assert read_tensor_bytes(unsigned, "t").tolist() == [65533, 300]


def test_spec_codes_in_the_high_half_and_quantized_indices() -> None:
    # Vendor 0 in the low half, algorithm 0x01 in the high half: the other reading of the spec.
    data = _header(2, (2,), 8, 0x01 << 16, param=1) + bytes([0xFF, 5])
    assert read_tensor_bytes(data, "t").tolist() == [-1, 5]
    lin = _header(3, (3,), 8, 0x10) + bytes([0, 128, 255])
    assert read_tensor_bytes(lin, "t").tolist() == [0, 128, 255]


def test_bool_bits_are_packed_most_significant_first() -> None:
    data = _header(2, (10,), 1, 5) + bytes([0b10100000, 0b01000000])
    assert read_tensor_bytes(data, "t").tolist() == [1, 0, 1, 0, 0, 0, 0, 0, 0, 1]


def _fails(data: bytes, *words: str) -> None:
    with pytest.raises(CvmcError) as e:
        read_tensor_bytes(data, "conv1/filter.dat")
    for w in ("conv1/filter.dat", *words):
        assert w in str(e.value)


def test_corrupt_files_are_rejected() -> None:
    good = _header(4, (2, 2), 8, 4) + bytes(4)
    assert read_tensor_bytes(good, "t").shape == (2, 2)
    _fails(good[:100], "truncated header")
    _fails(b"PK" + good[2:], "bad magic")
    _fails(_header(4, (2, 2), 8, 4, version=(2, 0)) + bytes(4), "version 2.0")
    _fails(good[:-1], "truncated data")
    _fails(good + b"\0", "trailing bytes")
    _fails(_header(5, (2, 2), 8, 4) + bytes(5), "declares 5", "needs 4")
    _fails(_header(1, (1,) * 8, 8, 4, rank=9) + bytes(1), "rank 9")
    _fails(_header(4, (2, 2), 8, 0x42) + bytes(4), "item type code")
    _fails(_header(2, (2, 2), 4, 4) + bytes(2), "4 bits per item")
    _fails(_header(2, (2,), 8, 5) + bytes([1, 2]), "0 or 1")


def test_huge_declared_size_is_rejected_before_allocating() -> None:
    # 2 GB declared, consistent with the dims: only the file size can reveal the lie.
    data = _header(2**31, (2**15, 2**16), 8, 4) + bytes(100)
    _fails(data, "truncated data", str(2**31))
    # Dims whose product overflows 32 (and 64) bits must not wrap around to a small size.
    _fails(_header(0, (2**32 - 1,) * 8, 8, 4), "declares 0")


def test_writer_rejects_unsupported_arrays(tmp_path: Path) -> None:
    with pytest.raises(CvmcError, match="complex"):
        tensor_bytes(np.zeros(2, dtype=np.complex64))
    with pytest.raises(CvmcError, match="rank 9"):
        tensor_bytes(np.zeros((1,) * 9, dtype=np.int8))


def test_missing_file_is_a_cvmc_error(tmp_path: Path) -> None:
    with pytest.raises(CvmcError, match="cannot read"):
        read_tensor_file(tmp_path / "nope.dat")

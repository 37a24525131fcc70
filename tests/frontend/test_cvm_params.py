"""CVM-Runtime params files, built byte by byte from the documented layout."""
from __future__ import annotations

import struct

import numpy as np
import pytest

from cvmc.errors import CvmcError
from cvmc.frontend.cvm_params import params_bytes, read_params, read_params_bytes

LIST_MAGIC = struct.pack("<Q", 0xF7E58D4F05049CB7)
ARRAY_MAGIC = struct.pack("<Q", 0xDD5E40F096B4A13F)


def pack_array(shape: tuple[int, ...], values: list[int], bits: int = 32,
               nbytes: int | None = None, magic: bytes = ARRAY_MAGIC, code: int = 0) -> bytes:
    """One DLTensor record: magic, reserved, ctx, ndim, dtype, shape, byte count, data."""
    data = struct.pack(f"<{len(values)}{'b' if bits == 8 else 'i'}", *values)
    head = magic + struct.pack("<Q", 0) + struct.pack("<iii", 1, 0, len(shape))
    head += struct.pack("<BBH", code, bits, 1) + struct.pack(f"<{len(shape)}q", *shape)
    return head + struct.pack("<q", len(data) if nbytes is None else nbytes) + data


def pack_params(arrays: dict[str, bytes], n_arrays: int | None = None) -> bytes:
    """The list: magic, reserved, names (u64 count, u64 length + bytes each), count, arrays."""
    out = LIST_MAGIC + struct.pack("<QQ", 0, len(arrays))
    for name in arrays:
        out += struct.pack("<Q", len(name)) + name.encode()
    out += struct.pack("<Q", len(arrays) if n_arrays is None else n_arrays)
    return out + b"".join(arrays.values())


def test_reads_hand_built_int8_and_int32_arrays() -> None:
    blob = pack_params({"w": pack_array((2, 2), [1, -2, 3, -128], bits=8),
                        "b": pack_array((3,), [2**31 - 1, -(2**31), 0])})
    got = read_params_bytes(blob, "m.params")
    assert list(got) == ["w", "b"]
    assert got["w"].tolist() == [[1, -2], [3, -128]] and got["w"].dtype == np.int32
    assert got["b"].tolist() == [2**31 - 1, -(2**31), 0]


def test_writer_matches_hand_built_bytes_and_round_trips(tmp_path) -> None:
    arrays = {"w": np.array([[1, -2], [3, 4]], dtype=np.int8), "b": np.array([7], np.int32)}
    # int8 arrays are written as 8-bit payloads (CVM-Runtime widens them on load), int32 as 32.
    expected = pack_params({"w": pack_array((2, 2), [1, -2, 3, 4], bits=8),
                            "b": pack_array((1,), [7])})
    assert params_bytes(arrays) == expected
    (tmp_path / "p").write_bytes(expected)
    got = read_params(tmp_path / "p")
    assert all(np.array_equal(got[k], v) for k, v in arrays.items())


def _fails(blob: bytes, *words: str) -> None:
    with pytest.raises(CvmcError) as e:
        read_params_bytes(blob, "m.params")
    for w in ("m.params", *words):
        assert w in str(e.value)


def test_corrupt_params_files() -> None:
    good = pack_params({"w": pack_array((2,), [1, 2])})
    _fails(b"\0" * 8 + good[8:], "bad magic")
    _fails(good[:-1], "truncated data of array 'w'")
    _fails(good[:20], "truncated")
    _fails(good + b"\0", "1 trailing bytes")
    _fails(pack_params({"w": pack_array((2,), [1, 2])}, n_arrays=2), "1 names but 2 arrays")
    _fails(pack_params({"w": pack_array((2,), [1, 2], magic=b"\1" * 8)}), "array 'w': bad magic")
    _fails(pack_params({"w": pack_array((2,), [1, 2], nbytes=12)}), "byte count 12",
           "(8 bytes)")
    _fails(pack_params({"w": pack_array((3,), [1, 2])}), "byte count 8", "(12 bytes)")
    _fails(pack_params({"w": pack_array((2,), [1, 2], code=2)}), "unsupported element type")
    _fails(pack_params({"w": pack_array((2,), [1, 2], bits=16)}), "unsupported element type")
    _fails(pack_params({"w": pack_array((2,), [1, 2]), "x": pack_array((2,), [1, 2])})
           .replace(b"x", b"w", 1), "'w' appears twice")


def test_huge_counts_rejected_before_allocating() -> None:
    _fails(LIST_MAGIC + struct.pack("<QQ", 0, 2**60), "name count", "larger than the file")
    _fails(LIST_MAGIC + struct.pack("<QQQ", 0, 1, 2**40) + b"w", "name length")
    huge = pack_params({"w": pack_array((2**20, 2**20), [], nbytes=2**42)})
    _fails(huge, "truncated data of array 'w'")


def test_missing_file(tmp_path) -> None:
    with pytest.raises(CvmcError, match="cannot read"):
        read_params(tmp_path / "none.params")

"""The .grz container: round trip, and every way a file can be wrong raises RecordingError."""

from __future__ import annotations

import hashlib
import json
import struct
import zlib
from pathlib import Path

import numpy as np
import pytest
import zstandard

from grpolab.replay import format as fmt
from grpolab.replay.format import RecordingError, decode_container, read_container, write_container


def _arrays() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {
        "i8": np.array([-128, 0, 127], dtype=np.int8),
        "i16": np.arange(-5, 5, dtype=np.int16).reshape(2, 5),
        "i32": rng.integers(-(2**31), 2**31 - 1, size=17, dtype=np.int32),
        "i64": np.array([-(2**63), 2**63 - 1], dtype=np.int64),
        "u8": np.array([0, 255], dtype=np.uint8),
        "u16": np.array([65535], dtype=np.uint16),
        "u32": np.array([2**32 - 1, 3], dtype=np.uint32),
        "u64": np.array([2**64 - 1, 0], dtype=np.uint64),
        "f16": np.array([1.5, -np.inf], dtype=np.float16),
        "f32": rng.standard_normal((3, 4, 5)).astype(np.float32),
        "f64": np.array([np.nan, 1e300, -0.0]),
        "bool": np.array([True, False, True]),
        "scalar": np.array(2.5, dtype=np.float64),
        "empty": np.zeros((0, 7), dtype=np.int32),
        "bigendian": np.arange(6, dtype=">i4"),
        "strided": np.arange(20, dtype=np.int64)[::3],
    }


def test_round_trip_identical_arrays_and_header(tmp_path: Path) -> None:
    arrays = _arrays()
    header = {"a": 1, "nested": {"s": "ünï", "l": [1.5, None, True]}}
    path = tmp_path / "x.grz"
    n = write_container(path, header, arrays)
    assert n == path.stat().st_size
    assert [p.name for p in tmp_path.iterdir()] == ["x.grz"]  # no temp file left behind
    got_header, got = read_container(path)
    assert got_header == header
    assert list(got) == list(arrays)
    for k, a in arrays.items():
        b = got[k]
        assert b.shape == a.shape, k
        assert b.dtype == a.dtype.newbyteorder("<") and b.dtype.name == a.dtype.name, k
        assert np.array_equal(a, b, equal_nan=a.dtype.kind == "f"), k
        assert b.flags.writeable


def test_write_rejects_unsupported_dtypes(tmp_path: Path) -> None:
    for bad in (np.array(["a"]), np.array([object()]), np.array([1 + 2j])):
        with pytest.raises(ValueError, match="cannot be stored"):
            write_container(tmp_path / "x.grz", {}, {"a": bad})
    with pytest.raises(TypeError, match="JSON"):
        write_container(tmp_path / "x.grz", {"a": object()}, {})
    assert not (tmp_path / "x.grz").exists()


def _small() -> bytes:
    return fmt.encode_container(
        {"k": "v"}, {"a": np.arange(6, dtype=np.int32), "b": np.array([0.5], dtype=np.float32)}
    )


def test_truncation_at_every_byte(tmp_path: Path) -> None:
    data = _small()
    path = tmp_path / "t.grz"
    for cut in range(len(data)):
        path.write_bytes(data[:cut])
        with pytest.raises(RecordingError) as e:
            read_container(path)
        assert str(path) in str(e.value) and "truncated" in str(e.value), (cut, str(e.value))
    path.write_bytes(data)
    read_container(path)


def test_every_flipped_bit_is_rejected() -> None:
    data = _small()
    for i in range(len(data)):
        for bit in range(8):
            bad = bytearray(data)
            bad[i] ^= 1 << bit
            with pytest.raises(RecordingError):
                decode_container(bytes(bad), name="f.grz")


def test_checksum_mismatch_message(tmp_path: Path) -> None:
    data = bytearray(_small())
    data[40] ^= 0xFF  # inside the stored SHA-256
    path = tmp_path / "c.grz"
    path.write_bytes(bytes(data))
    with pytest.raises(RecordingError, match=r"c\.grz: corrupt recording: SHA-256 checksum"):
        read_container(path)
    data = bytearray(_small())
    data[-3] ^= 0x10  # inside the compressed payload
    with pytest.raises(RecordingError, match="corrupt recording: CRC-32 checksum"):
        decode_container(bytes(data))
    with pytest.raises(RecordingError, match="unexpected bytes after the payload"):
        decode_container(_small() + b"\0")


def test_future_version(tmp_path: Path) -> None:
    data = bytearray(_small())
    struct.pack_into("<I", data, 8, 2)
    path = tmp_path / "future.grz"
    path.write_bytes(bytes(data))
    with pytest.raises(
        RecordingError, match=r"future\.grz: recording written by a newer grpolab: version 2 > 1"
    ):
        read_container(path)


def test_bad_magic_and_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "notes.grz"
    path.write_text("hello, this is not a recording at all\n")
    with pytest.raises(RecordingError, match=r"notes\.grz: not a grpolab recording \(bad magic"):
        read_container(path)
    path.write_bytes(b"")
    with pytest.raises(RecordingError, match="truncated"):
        read_container(path)
    with pytest.raises(RecordingError, match="no such recording"):
        read_container(tmp_path / "absent.grz")
    with pytest.raises(RecordingError, match="directory"):
        read_container(tmp_path)


def _seal(payload: bytes) -> bytes:
    """Wrap an uncompressed payload in a valid preamble (correct sizes, CRC-32 and SHA-256)."""
    frame = zstandard.ZstdCompressor().compress(payload)
    pre = struct.pack(
        "<8sIIQQ32s",
        fmt.MAGIC,
        1,
        zlib.crc32(frame),
        len(payload),
        len(frame),
        hashlib.sha256(payload).digest(),
    )
    return pre + frame


def _forge_raw(index: bytes, data: bytes = b"", declared: int | None = None) -> bytes:
    """A file whose checksums are valid but whose index says what the test wants."""
    pad = b"\0" * ((-(8 + len(index))) % 8)
    return _seal(struct.pack("<Q", len(index) if declared is None else declared) + index + pad + data)


def _forge(table: dict, data: bytes) -> bytes:
    return _forge_raw(json.dumps({"header": {}, "arrays": table}).encode(), data)


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ({"dtype": "bfloat16", "shape": [2], "offset": 0, "nbytes": 4}, "unknown dtype 'bfloat16'"),
        ({"dtype": "object", "shape": [1], "offset": 0, "nbytes": 8}, "unknown dtype 'object'"),
        (
            {"dtype": "int32", "shape": [3], "offset": 0, "nbytes": 8},
            r"shape \[3\] of int32 needs 12 bytes but nbytes is 8",
        ),
        ({"dtype": "int32", "shape": [4], "offset": 0, "nbytes": 16}, "outside the 8-byte data region"),
        ({"dtype": "int32", "shape": [1], "offset": 8, "nbytes": 4}, "outside"),
        ({"dtype": "int32", "shape": [-1], "offset": 0, "nbytes": 4}, "non-negative integers"),
        ({"dtype": "int32", "shape": "2", "offset": 0, "nbytes": 8}, "non-negative integers"),
        ({"dtype": "int32", "shape": [2]}, "malformed entry"),
        (
            {"dtype": "bool", "shape": [8], "offset": 0, "nbytes": 8},
            "bool array holds bytes other than 0 and 1",
        ),
    ],
)
def test_inconsistent_array_table(entry: dict, message: str) -> None:
    data = _forge({"x": entry}, struct.pack("<ii", 1, 2))
    with pytest.raises(RecordingError, match=message) as e:
        decode_container(data, name="forged.grz")
    assert "forged.grz" in str(e.value) and "'x'" in str(e.value)


def test_malformed_index() -> None:
    with pytest.raises(RecordingError, match="malformed index JSON"):
        decode_container(_forge_raw(b"{not json"))
    with pytest.raises(RecordingError, match="malformed index: expected an object"):
        decode_container(_forge_raw(b'{"header": 1, "arrays": {}}'))
    with pytest.raises(RecordingError, match="index length"):
        decode_container(_forge_raw(b"{}", declared=1000))

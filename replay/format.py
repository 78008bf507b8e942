"""The `.grz` container: a versioned, checksummed, zstd-compressed JSON header plus named arrays.

Not pickle: reading a `.grz` file never executes code. Layout (all integers little-endian)::

    preamble (64 bytes, uncompressed)
      0  magic              8 bytes  b"\\x89GRZ\\r\\n\\x1a\\n"
      8  format_version     uint32   FORMAT_VERSION
     12  frame_crc32        uint32   CRC-32 of the zstd frame (catches any damage to the compressed bytes)
     16  payload_nbytes     uint64   length of the uncompressed payload
     24  compressed_nbytes  uint64   length of the zstd frame that follows
     32  payload_sha256     32 bytes SHA-256 of the uncompressed payload
    zstd frame (compressed_nbytes bytes, nothing after it) holding the payload:
      0  index_nbytes       uint64
      8  index              UTF-8 JSON {"header": {...}, "arrays": {name: {"dtype", "shape",
                            "offset", "nbytes"}}}
         padding to a multiple of 8
         data region        raw little-endian array bytes; `offset` is relative to its start,
                            each array starts on an 8-byte boundary

Every way a file can be wrong (not a recording, truncated, corrupt, from a newer grpolab,
inconsistent array table) raises `RecordingError` naming the file and the problem.
"""

from __future__ import annotations

import hashlib
import json
import math
import struct
import zlib
from pathlib import Path
from typing import Any

import numpy as np
import zstandard

from grpolab.core.atomic import atomic_write_bytes

FORMAT_VERSION = 1
SUFFIX = ".grz"
MAGIC = b"\x89GRZ\r\n\x1a\n"
_PREAMBLE = struct.Struct("<8sIIQQ32s")
PREAMBLE_NBYTES = _PREAMBLE.size  # 64
_ALIGN = 8

ALLOWED_DTYPES: dict[str, np.dtype] = {
    name: np.dtype(name).newbyteorder("<")
    for name in (
        "int8",
        "int16",
        "int32",
        "int64",
        "uint8",
        "uint16",
        "uint32",
        "uint64",
        "float16",
        "float32",
        "float64",
        "bool",
    )
}


class RecordingError(ValueError):
    """A recording file is missing, malformed, truncated, corrupt or from a newer grpolab."""


def _pad(n: int) -> int:
    return (-n) % _ALIGN


def dtype_name(dtype: np.dtype) -> str:
    """The container's name for a NumPy dtype ("int32", "float32", "bool", ...).

    Raises:
        ValueError: for dtypes the container does not store (bfloat16, complex, object, strings, ...).
    """
    dtype = np.dtype(dtype)
    name = dtype.name
    if name not in ALLOWED_DTYPES or dtype.kind not in "iufb":
        raise ValueError(f"dtype {dtype} cannot be stored; allowed: {', '.join(ALLOWED_DTYPES)}")
    return name


def encode_container(header: dict[str, Any], arrays: dict[str, np.ndarray], *, level: int = 3) -> bytes:
    """Serialize `header` and `arrays` to the bytes of a `.grz` file (see the module docstring).

    Args:
        header: JSON-serializable dict (str keys); stored verbatim.
        arrays: name -> NumPy array of an allowed dtype, any shape (0-d and empty arrays included).
        level: zstd compression level (1..22).

    Raises:
        TypeError: header is not a dict, or is not JSON-serializable, or an array is not an ndarray.
        ValueError: an array has a dtype the container does not store.
    """
    if not isinstance(header, dict):
        raise TypeError(f"header must be a dict, got {type(header).__name__}")
    table: dict[str, dict[str, Any]] = {}
    blobs: list[bytes | np.ndarray] = []
    offset = 0
    for name, arr in arrays.items():
        if not isinstance(name, str):
            raise TypeError(f"array names must be str, got {name!r}")
        if not isinstance(arr, np.ndarray):
            raise TypeError(f"array {name!r} must be a numpy.ndarray, got {type(arr).__name__}")
        dname = dtype_name(arr.dtype)
        data = np.asarray(arr, dtype=ALLOWED_DTYPES[dname])
        if not data.flags.c_contiguous:
            data = data.copy(order="C")  # np.ascontiguousarray would turn 0-d arrays into 1-d
        raw = data.reshape(-1).view(np.uint8)
        table[name] = {"dtype": dname, "shape": list(data.shape), "offset": offset, "nbytes": data.nbytes}
        blobs.append(raw)
        offset += data.nbytes
        pad = _pad(offset)
        if pad:
            blobs.append(b"\0" * pad)
            offset += pad
    try:
        index = json.dumps({"header": header, "arrays": table}, ensure_ascii=False).encode("utf-8")
    except (TypeError, ValueError) as e:
        raise TypeError(f"recording header is not JSON-serializable: {e}") from e
    payload = b"".join([struct.pack("<Q", len(index)), index, b"\0" * _pad(8 + len(index)), *blobs])
    compressed = zstandard.ZstdCompressor(
        level=level, write_content_size=True, write_checksum=False
    ).compress(payload)
    crc = zlib.crc32(compressed)
    preamble = _PREAMBLE.pack(
        MAGIC, FORMAT_VERSION, crc, len(payload), len(compressed), hashlib.sha256(payload).digest()
    )
    return preamble + compressed


def write_container(
    path: str | Path, header: dict[str, Any], arrays: dict[str, np.ndarray], *, level: int = 3
) -> int:
    """Write a `.grz` container atomically (temp file in the same directory, fsync, rename).

    Args:
        path: destination; parent directories are created.
        header: JSON-serializable dict.
        arrays: name -> NumPy array of an allowed dtype (`ALLOWED_DTYPES`).
        level: zstd compression level (default 3).

    Returns:
        Bytes written.

    Raises:
        TypeError / ValueError: see `encode_container`; OSError from the filesystem.
    """
    data = encode_container(header, arrays, level=level)
    atomic_write_bytes(path, data)
    return len(data)


def _fail(name: str, msg: str) -> RecordingError:
    return RecordingError(f"{name}: {msg}")


def decode_container(data: bytes, *, name: str = "<bytes>") -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """Parse and validate the bytes of a `.grz` file; inverse of `encode_container`.

    Args:
        data: the whole file.
        name: used in error messages (the file path).

    Returns:
        (header dict, name -> writable little-endian NumPy array with its stored dtype and shape).

    Raises:
        RecordingError: not a recording, truncated, trailing bytes, checksum mismatch (corrupt),
            future format version, malformed index, unknown dtype, or an array whose shape, nbytes
            or offset is inconsistent.
    """
    n = len(data)
    if n < len(MAGIC):
        if MAGIC.startswith(bytes(data)):
            raise _fail(
                name, f"truncated recording: {n} bytes, shorter than the {PREAMBLE_NBYTES}-byte preamble"
            )
        raise _fail(
            name, f"not a grpolab recording (bad magic bytes {bytes(data[:8])!r}, expected {MAGIC!r})"
        )
    if bytes(data[:8]) != MAGIC:
        raise _fail(
            name, f"not a grpolab recording (bad magic bytes {bytes(data[:8])!r}, expected {MAGIC!r})"
        )
    if n < 12:
        raise _fail(name, f"truncated recording: {n} bytes, shorter than the {PREAMBLE_NBYTES}-byte preamble")
    (version,) = struct.unpack_from("<I", data, 8)
    if version > FORMAT_VERSION:
        raise _fail(
            name,
            f"recording written by a newer grpolab: version {version} > {FORMAT_VERSION}; upgrade grpolab to read it",
        )
    if version < 1:
        raise _fail(name, f"invalid format version {version} (corrupt preamble)")
    if n < PREAMBLE_NBYTES:
        raise _fail(name, f"truncated recording: {n} bytes, shorter than the {PREAMBLE_NBYTES}-byte preamble")
    _, _, crc, payload_nbytes, compressed_nbytes, digest = _PREAMBLE.unpack_from(data, 0)
    body = n - PREAMBLE_NBYTES
    if body < compressed_nbytes:
        raise _fail(
            name, f"truncated recording: {body} of {compressed_nbytes} compressed payload bytes present"
        )
    if body > compressed_nbytes:
        raise _fail(name, f"corrupt recording: {body - compressed_nbytes} unexpected bytes after the payload")
    frame = memoryview(data)[PREAMBLE_NBYTES:]
    if zlib.crc32(frame) != crc:
        raise _fail(
            name, "corrupt recording: CRC-32 checksum of the compressed payload does not match the preamble"
        )
    try:
        frame_size = zstandard.frame_content_size(frame)
    except zstandard.ZstdError as e:
        raise _fail(name, f"corrupt recording: compressed payload unreadable ({e})") from None
    if frame_size != payload_nbytes:
        raise _fail(
            name,
            f"corrupt recording: payload size {frame_size} in the zstd frame != {payload_nbytes} in the preamble",
        )
    try:
        payload = zstandard.ZstdDecompressor().decompress(frame, max_output_size=payload_nbytes)
    except (zstandard.ZstdError, MemoryError) as e:
        raise _fail(name, f"corrupt recording: zstd decompression failed ({e})") from None
    if len(payload) != payload_nbytes:
        raise _fail(
            name,
            f"corrupt recording: payload decompressed to {len(payload)} bytes, expected {payload_nbytes}",
        )
    if hashlib.sha256(payload).digest() != digest:
        raise _fail(name, "corrupt recording: SHA-256 checksum of the payload does not match the preamble")
    return _parse_payload(bytearray(payload), name)


def _parse_payload(payload: bytearray, name: str) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    if len(payload) < 8:
        raise _fail(name, "malformed payload: shorter than its 8-byte index length")
    (index_nbytes,) = struct.unpack_from("<Q", payload, 0)
    data_start = 8 + index_nbytes + _pad(8 + index_nbytes)
    if data_start > len(payload):
        raise _fail(
            name, f"malformed payload: index length {index_nbytes} exceeds the payload ({len(payload)} bytes)"
        )
    try:
        index = json.loads(payload[8 : 8 + index_nbytes].decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise _fail(name, f"malformed index JSON: {e}") from None
    if (
        not isinstance(index, dict)
        or not isinstance(index.get("header"), dict)
        or not isinstance(index.get("arrays"), dict)
    ):
        raise _fail(name, "malformed index: expected an object with 'header' and 'arrays' objects")
    data_nbytes = len(payload) - data_start
    view = memoryview(payload)[data_start:]
    arrays: dict[str, np.ndarray] = {}
    for aname, spec in index["arrays"].items():
        arrays[aname] = _read_array(view, data_nbytes, aname, spec, name)
    return index["header"], arrays


def _read_array(view: memoryview, data_nbytes: int, aname: str, spec: Any, name: str) -> np.ndarray:
    where = f"array {aname!r}"
    if not isinstance(spec, dict) or not {"dtype", "shape", "offset", "nbytes"} <= set(spec):
        raise _fail(name, f"{where}: malformed entry {spec!r} (needs dtype, shape, offset, nbytes)")
    dname, shape, offset, nbytes = spec["dtype"], spec["shape"], spec["offset"], spec["nbytes"]
    if dname not in ALLOWED_DTYPES:
        raise _fail(name, f"{where}: unknown dtype {dname!r} (allowed: {', '.join(ALLOWED_DTYPES)})")
    ints = (shape if isinstance(shape, list) else [None]) + [offset, nbytes]
    if not all(type(v) is int and v >= 0 for v in ints):
        raise _fail(
            name,
            f"{where}: shape {shape!r}, offset {offset!r} and nbytes {nbytes!r} must be non-negative integers",
        )
    dtype = ALLOWED_DTYPES[dname]
    count = math.prod(shape)
    if count * dtype.itemsize != nbytes:
        raise _fail(
            name,
            f"{where}: shape {shape} of {dname} needs {count * dtype.itemsize} bytes but nbytes is {nbytes}",
        )
    if offset + nbytes > data_nbytes:
        raise _fail(
            name,
            f"{where}: bytes [{offset}, {offset + nbytes}) lie outside the {data_nbytes}-byte data region",
        )
    arr = np.frombuffer(view, dtype=dtype, count=count, offset=offset).reshape(shape)
    if dname == "bool" and count and arr.view(np.uint8).max() > 1:
        raise _fail(name, f"{where}: bool array holds bytes other than 0 and 1")
    return arr


def read_container(path: str | Path) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """Read and validate a `.grz` container written by `write_container`.

    Returns:
        (header dict, name -> NumPy array with its stored dtype and shape; arrays are writable).

    Raises:
        RecordingError: the file does not exist or is not a regular file, or anything
            `decode_container` rejects (bad magic, truncated, corrupt, newer version, bad arrays).
    """
    path = Path(path)
    try:
        with open(path, "rb") as f:
            head = f.read(PREAMBLE_NBYTES)
            if len(head) < PREAMBLE_NBYTES or head[:8] != MAGIC:
                return decode_container(head, name=str(path))  # raises: truncated / not a recording
            data = head + f.read()
    except FileNotFoundError:
        raise RecordingError(f"{path}: no such recording") from None
    except IsADirectoryError:
        raise RecordingError(f"{path}: is a directory, not a recording") from None
    return decode_container(data, name=str(path))


def read_header(path: str | Path) -> dict[str, Any]:
    """The JSON header of a `.grz` container, without decompressing its arrays.

    For start-up checks over many recordings (run identities, fingerprints): only the preamble and
    the start of the zstd frame are read. The checksums cover the whole payload, so they are
    checked when the file is loaded with `read_container`, not here.

    Raises:
        RecordingError: the file does not exist or is a directory, is not a recording, comes from a
            newer grpolab, or its index is truncated, undecompressable or not a JSON object.
    """
    path, name = Path(path), str(path)
    try:
        with open(path, "rb") as f:
            head = f.read(PREAMBLE_NBYTES)
            if len(head) < PREAMBLE_NBYTES or head[:8] != MAGIC:
                return decode_container(head, name=name)[0]  # raises: truncated / not a recording
            (version,) = struct.unpack_from("<I", head, 8)
            if not 1 <= version <= FORMAT_VERSION:
                return decode_container(head, name=name)[0]  # raises: newer / invalid version
            try:
                reader = zstandard.ZstdDecompressor().stream_reader(f)
                (index_nbytes,) = struct.unpack("<Q", _read_exact(reader, 8, name))
                payload_nbytes = _PREAMBLE.unpack_from(head, 0)[3]
                if 8 + index_nbytes > payload_nbytes:
                    raise _fail(
                        name,
                        f"malformed payload: index length {index_nbytes} exceeds the payload ({payload_nbytes} bytes)",
                    )
                index_bytes = _read_exact(reader, index_nbytes, name)
            except zstandard.ZstdError as e:
                raise _fail(name, f"corrupt recording: compressed payload unreadable ({e})") from None
    except FileNotFoundError:
        raise RecordingError(f"{path}: no such recording") from None
    except IsADirectoryError:
        raise RecordingError(f"{path}: is a directory, not a recording") from None
    try:
        index = json.loads(index_bytes.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise _fail(name, f"malformed index JSON: {e}") from None
    if not isinstance(index, dict) or not isinstance(index.get("header"), dict):
        raise _fail(name, "malformed index: expected an object with a 'header' object")
    return index["header"]


def _read_exact(reader: Any, n: int, name: str) -> bytes:
    """Exactly `n` decompressed bytes from a zstd stream reader (RecordingError when it ends first)."""
    chunks, got = [], 0
    while got < n:
        chunk = reader.read(min(n - got, 1 << 20))
        if not chunk:
            raise _fail(name, f"truncated recording: the payload ends within its {n}-byte index")
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)

"""Read an offline wandb run's transaction log (`run-<id>.wandb`) with wandb's own protobuf Record.

wandb 0.31 ships no Python reader for the file (its Go core writes and syncs it), so this follows the
format its core writes: a 7-byte header (b":W&B", magic 0xBEE1, version 0) and then LevelDB log
framing, 32 KiB blocks of chunks with a 7-byte header (CRC32C, length, type FULL 1 / FIRST 2 / MIDDLE 3 /
LAST 4), each whole payload one serialized `wandb.proto.wandb_internal_pb2.Record`.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

from wandb.proto import wandb_internal_pb2

BLOCK = 32 * 1024
HEADER = struct.Struct("<4sHB")
CHUNK = struct.Struct("<IHB")


def read_records(path: Path) -> list[wandb_internal_pb2.Record]:
    """Every Record of the file, in order. Raises ValueError when the header is not wandb's."""
    data = path.read_bytes()
    ident, magic, version = HEADER.unpack_from(data)
    if (ident, magic, version) != (b":W&B", 0xBEE1, 0):
        raise ValueError(f"{path}: not a wandb transaction log (header {data[:7]!r})")
    records, payload, pos = [], b"", HEADER.size
    while pos + CHUNK.size <= len(data):
        if BLOCK - pos % BLOCK < CHUNK.size:  # the block's tail is padding
            pos += BLOCK - pos % BLOCK
            continue
        _crc, length, kind = CHUNK.unpack_from(data, pos)
        if kind == 0 and length == 0:
            break
        pos += CHUNK.size
        payload += data[pos : pos + length]
        pos += length
        if kind in (1, 4):  # FULL or LAST: a whole record
            record = wandb_internal_pb2.Record()
            record.ParseFromString(payload)
            records.append(record)
            payload = b""
    return records


def history(records: list[wandb_internal_pb2.Record]) -> list[dict[str, Any]]:
    """The history rows (`run.log` calls): metric name → JSON value."""
    return [
        {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in r.history.item}
        for r in records
        if r.WhichOneof("record_type") == "history"
    ]


def of_type(records: list[wandb_internal_pb2.Record], kind: str) -> list[Any]:
    """The payloads of the records of one type ("run", "metric", "exit", ...)."""
    return [getattr(r, kind) for r in records if r.WhichOneof("record_type") == kind]

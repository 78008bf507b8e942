"""What a grpolab run directory says about its progress, for `grpolab diagnose hang`.

`read_run_context`: run.json's name, world size and device, the final `status` event of
events.jsonl and the ages of the last metrics.jsonl / events.jsonl records (from their own "time"
fields, so a copied run directory, whose files all have fresh modification times, reads right). `activity_snapshot` + `changed_files`: which of the files
whose change means progress (metrics.jsonl, events.jsonl, ranks/*.json) changed between two looks.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ACTIVITY_FILES = ("metrics.jsonl", "events.jsonl")
"""Run-directory files whose growth means progress (besides `ranks/*.json`)."""


@dataclass
class RunContext:
    """What the run directory says besides the rank files (None fields: not known)."""

    name: str | None = None
    world_size: int | None = None
    device: str | None = None
    """run.json's config "device" (cpu, cuda, cuda:0 …): a cuda run talks NCCL, a cpu run gloo."""
    final_status: dict[str, Any] | None = None
    """The last `status` event of events.jsonl (finished | failed | interrupted), if the run wrote one."""
    metrics_age_s: float | None = None
    """Seconds since the last metrics.jsonl record's "time" (its file's mtime when no record has one)."""
    events_age_s: float | None = None
    """Seconds since the last events.jsonl record's "time" (its file's mtime when no record has one)."""

    @property
    def backend(self) -> str | None:
        """ "nccl" for a cuda run, "gloo" for a cpu run, None when run.json says neither."""
        if self.device is None:
            return None
        if self.device.startswith("cuda"):
            return "nccl"
        return "gloo" if self.device == "cpu" else None


def _tail_lines(path: Path, max_bytes: int = 65536) -> list[str]:
    with open(path, "rb") as f:
        f.seek(0, os.SEEK_END)
        size = f.tell()
        f.seek(max(0, size - max_bytes))
        data = f.read()
    lines = data.decode(errors="replace").splitlines()
    return lines[1:] if size > max_bytes else lines


def _records(path: Path) -> list[dict[str, Any]]:
    """The JSON objects among the last lines of a .jsonl file, oldest first ([] when unreadable)."""
    try:
        lines = _tail_lines(path)
    except OSError:
        return []
    records = []
    for line in lines:
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict):
            records.append(record)
    return records


def _age_s(path: Path, records: list[dict[str, Any]], now: float) -> float | None:
    """Seconds since the newest record's "time" field, else since the file's mtime; None without the file."""
    times = [r["time"] for r in records if isinstance(r.get("time"), (int, float))]
    if times:
        return max(0.0, now - float(max(times)))
    try:
        return max(0.0, now - path.stat().st_mtime)
    except OSError:
        return None


def read_run_context(run_dir: Path, now: float) -> RunContext:
    """run.json's name, world size and device, the final status event and the metrics/events ages (s)."""
    ctx = RunContext()
    try:
        meta = json.loads((run_dir / "run.json").read_text(encoding="utf-8"))
        ctx.name = meta.get("name")
        ctx.world_size = meta.get("world_size")
        device = (meta.get("config") or {}).get("device")
        ctx.device = device if isinstance(device, str) else None
    except (OSError, ValueError, AttributeError):
        pass
    metrics = _records(run_dir / "metrics.jsonl")
    events = _records(run_dir / "events.jsonl")
    ctx.metrics_age_s = _age_s(run_dir / "metrics.jsonl", metrics, now)
    ctx.events_age_s = _age_s(run_dir / "events.jsonl", events, now)
    for record in reversed(events):
        if record.get("event") == "status":
            ctx.final_status = record
            break
    return ctx


def activity_snapshot(run_dir: Path | None) -> dict[str, tuple[int, int]]:
    """(mtime in ns, size in bytes) of every file whose change means progress; {} without a run dir."""
    if run_dir is None:
        return {}
    paths = [run_dir / name for name in ACTIVITY_FILES] + sorted((run_dir / "ranks").glob("*.json"))
    snap = {}
    for path in paths:
        try:
            st = path.stat()
        except OSError:
            continue
        snap[str(path.relative_to(run_dir))] = (st.st_mtime_ns, st.st_size)
    return snap


def changed_files(before: dict[str, tuple[int, int]], after: dict[str, tuple[int, int]]) -> list[str]:
    """Files created, removed or modified between two `activity_snapshot`s, sorted."""
    return sorted(k for k in set(before) | set(after) if before.get(k) != after.get(k))

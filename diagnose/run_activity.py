"""What a grpolab run directory says about its progress, for `grpolab diagnose hang`.

`read_run_context`: run.json's name and world size, the final `status` event of events.jsonl and
the ages of metrics.jsonl / events.jsonl. `activity_snapshot` + `changed_files`: which of the files
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
    final_status: dict[str, Any] | None = None
    """The last `status` event of events.jsonl (finished | failed | interrupted), if the run wrote one."""
    metrics_age_s: float | None = None
    events_age_s: float | None = None


def _tail_lines(path: Path, max_bytes: int = 65536) -> list[str]:
    with open(path, "rb") as f:
        f.seek(0, os.SEEK_END)
        size = f.tell()
        f.seek(max(0, size - max_bytes))
        data = f.read()
    lines = data.decode(errors="replace").splitlines()
    return lines[1:] if size > max_bytes else lines


def read_run_context(run_dir: Path, now: float) -> RunContext:
    """run.json's name and world size, the final status event and the ages of metrics/events (s)."""
    ctx = RunContext()
    try:
        meta = json.loads((run_dir / "run.json").read_text(encoding="utf-8"))
        ctx.name = meta.get("name")
        ctx.world_size = meta.get("world_size")
    except (OSError, ValueError, AttributeError):
        pass
    for name, attr in (("metrics.jsonl", "metrics_age_s"), ("events.jsonl", "events_age_s")):
        try:
            setattr(ctx, attr, max(0.0, now - (run_dir / name).stat().st_mtime))
        except OSError:
            pass
    try:
        for line in reversed(_tail_lines(run_dir / "events.jsonl")):
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if isinstance(record, dict) and record.get("event") == "status":
                ctx.final_status = record
                break
    except OSError:
        pass
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

"""What a grpolab run directory says about its progress, for `grpolab diagnose hang`, read through the
run-directory reader (`grpolab.rundir.reader`, the one parser of the run's files).

`read_run_context`: run.json's name, world size, device and backend, the run's final `status` event
and the ages of its newest metric record and event (from their own "time" fields, so a copied run
directory, whose files all have fresh modification times, reads right). `activity_snapshot` +
`changed_files`: which of the files whose change means progress (the metrics and events files,
ranks/*.json) changed between two looks.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from grpolab.rundir.reader import (
    EVENTS_FILE,
    METRICS_FILE,
    RANKS_DIR,
    RunDirError,
    final_status_event,
    read_jsonl_tail,
    read_run_meta,
)

ACTIVITY_FILES = (METRICS_FILE, EVENTS_FILE)
"""Run-directory files whose growth means progress (besides `ranks/*.json`)."""
ADVICE_BACKENDS = {"nccl": "nccl", "det_nccl": "nccl", "gloo": "gloo", "det_gloo": "gloo"}
"""run.json's "backend" (core/dist.py, core/det_backend.py) → the backend family the advice is for:
the det backends move their slots over NCCL (det_nccl) or gloo (det_gloo)."""


@dataclass
class RunContext:
    """What the run directory says besides the rank files (None fields: not known)."""

    name: str | None = None
    world_size: int | None = None
    device: str | None = None
    """run.json's config.model.device (cpu, cuda, cuda:0 …)."""
    backend: str | None = None
    """run.json's top-level "backend" (nccl, gloo, det_nccl, det_gloo); None for a one-process run."""
    final_status: dict[str, Any] | None = None
    """The run's final `status` event (finished | failed | interrupted), if the run wrote one."""
    metrics_age_s: float | None = None
    """Seconds since the newest metric record's "time" (its file's mtime when no record has one)."""
    events_age_s: float | None = None
    """Seconds since the newest event's "time" (its file's mtime when no record has one)."""

    @property
    def advice_backend(self) -> str | None:
        """ "nccl" or "gloo", the backend family the next steps are for: run.json's backend
        (`ADVICE_BACKENDS`), else the device's (a cuda run talks NCCL, a cpu run gloo); None when
        run.json says neither."""
        if self.backend in ADVICE_BACKENDS:
            return ADVICE_BACKENDS[self.backend]
        if self.device is None:
            return None
        if self.device.startswith("cuda"):
            return "nccl"
        return "gloo" if self.device == "cpu" else None


def _age_s(path: Path, now: float) -> float | None:
    """Seconds since the newest record's "time" among the file's last lines, else since the file's
    mtime; None without the file."""
    times = [r["time"] for r in read_jsonl_tail(path) if isinstance(r.get("time"), int | float)]
    if times:
        return max(0.0, now - float(max(times)))
    try:
        return max(0.0, now - path.stat().st_mtime)
    except OSError:
        return None


def read_run_context(run_dir: Path, now: float) -> RunContext:
    """run.json's name, world size, device and backend, the final status event and the metrics and
    events ages (seconds before `now`, Unix seconds). A missing or unreadable run.json leaves those
    fields None; never raises for the directory's contents."""
    ctx = RunContext()
    try:
        meta = read_run_meta(run_dir)
    except RunDirError:
        pass
    else:
        ctx.name, ctx.world_size, ctx.device, ctx.backend = (
            meta.name,
            meta.world_size,
            meta.device,
            meta.backend,
        )
    ctx.metrics_age_s = _age_s(run_dir / METRICS_FILE, now)
    ctx.events_age_s = _age_s(run_dir / EVENTS_FILE, now)
    ctx.final_status = final_status_event(run_dir)
    return ctx


def activity_snapshot(run_dir: Path | None) -> dict[str, tuple[int, int]]:
    """(mtime in ns, size in bytes) of every file whose change means progress; {} without a run dir."""
    if run_dir is None:
        return {}
    paths = [run_dir / name for name in ACTIVITY_FILES] + sorted((run_dir / RANKS_DIR).glob("*.json"))
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

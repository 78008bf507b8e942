"""What the Timeline page shows, shaped from what a run recorded (no Streamlit here).

- `phase_spans`: each rollout step's phases on the wall clock. The widths are the step's `perf N:`
  record (`perf/<phase>_time`, seconds, core/metrics.PhaseTimer); a step ends at its perf record's
  `time` and began `perf/step_time` seconds before. Inside a step the phases are laid end to end in
  the loop's order (train/loop.GRPORun.step), which is the order they run in; the time no phase
  covers is `other`. An eval runs before its step (outside `perf/step_time`) and is drawn just before.
- `artifacts`: the run's profiler traces and memory snapshots (the `profiler_trace` and
  `memory_snapshot` events, plus files in RUN_DIR/profile, RUN_DIR/memory, --tensorboard-dir and
  --memory-snapshot-dir that other ranks wrote), each once with its size and the command that opens
  it. Snapshots are listed, never loaded.
- `wandb_link`: run.json's "wandb" entry (monitor/wandb_sink.py) as a link or a sync command.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

STEP_ORDER = [
    "rollout",
    "load_rollout_data",
    "engine_release",
    "reward",
    "save_rollout_data",
    "wake_up",
    "log_probs",
    "ref_log_probs",
    "actor_train",
    "save_model",
    "sleep",
    "engine_resume",
    "update_weights",
]
"""Phases of a step in the order GRPORun.step runs them (offload = engine_release / sleep, onload =
wake_up / engine_resume, sync = update_weights); a phase not named here follows them."""
BEFORE_STEP = ["eval"]
"""Phases timed before the step's clock starts (GRPORun.run evaluates, then calls step)."""
DERIVED = {"train", "step"}
"""<name> of perf/<name>_time keys that are sums of others (core/metrics.perf_metrics), not phases."""
OPENERS = {
    "trace": "open https://ui.perfetto.dev and load {path} (or chrome://tracing)",
    "memray": "memray flamegraph {path}",
    "torch": "python -m torch.cuda._memory_viz trace_plot {path} -o {html}",
}
"""The command that opens each kind of file (Perfetto; memray's and torch's HTML viewers)."""


def phase_spans(frame: pd.DataFrame) -> pd.DataFrame:
    """One row per (rollout, phase): rollout_id, phase, start and end (unix seconds), seconds.

    Args:
        frame: a run's metric frame (ui/readers.records_to_frame: (kind, step) index, a `time`
            column in unix seconds).
    Returns an empty frame (same columns) when the run has no perf record with a time.
    """
    columns = ["rollout_id", "phase", "start", "end", "seconds"]
    if frame.empty or "perf" not in frame.index.get_level_values("kind"):
        return pd.DataFrame(columns=columns)
    perf = frame.xs("perf", level="kind")
    phases = [c[5:-5] for c in perf.columns if c.startswith("perf/") and c.endswith("_time")]
    phases = [p for p in phases if p not in DERIVED]
    order = [p for p in STEP_ORDER if p in phases] + [p for p in phases if p not in STEP_ORDER + BEFORE_STEP]
    rows: list[dict[str, Any]] = []
    for rollout_id, rec in perf.iterrows():
        end, step = rec.get("time"), rec.get("perf/step_time")
        if pd.isna(end) or pd.isna(step):
            continue
        start = float(end) - float(step)
        for phase in BEFORE_STEP:
            seconds = rec.get(f"perf/{phase}_time")
            if seconds is not None and not pd.isna(seconds):
                rows.append(_span(rollout_id, phase, start - seconds, seconds))
        covered = 0.0  # summed as durations: unix times (~1.8e9 s) would round each sum to ~2.4e-7 s
        for phase in order:
            seconds = rec.get(f"perf/{phase}_time")
            if seconds is None or pd.isna(seconds):
                continue
            rows.append(_span(rollout_id, phase, start + covered, float(seconds)))
            covered += float(seconds)
        if float(step) - covered > 0:
            rows.append(_span(rollout_id, "other", start + covered, float(step) - covered))
    return pd.DataFrame(rows, columns=columns)


def _span(rollout_id: Any, phase: str, start: float, seconds: float) -> dict[str, Any]:
    return {
        "rollout_id": int(rollout_id),
        "phase": phase,
        "start": start,
        "end": start + seconds,
        "seconds": seconds,
    }


@dataclass(frozen=True)
class Artifact:
    """One trace or snapshot file: kind (trace | memray | torch), path, bytes (None: missing), the
    event that recorded it (None: found in the run directory), the command that opens it."""

    kind: str
    path: Path
    bytes: int | None
    event: str | None
    command: str


def _kind(path: Path) -> str | None:
    name = path.name
    if name.endswith(".pt.trace.json.gz") or name.endswith(".pt.trace.json"):
        return "trace"
    if name.endswith(".bin") and name.startswith("memray-"):
        return "memray"
    if name.endswith(".pickle"):
        return "torch"
    return None


def _artifact(path: Path, event: str | None) -> Artifact | None:
    kind = _kind(path)
    if kind is None:
        return None
    size = path.stat().st_size if path.is_file() else None
    quoted = shlex.quote(str(path))
    html = shlex.quote(str(path.with_suffix(".html")))
    return Artifact(kind, path, size, event, OPENERS[kind].format(path=quoted, html=html))


def artifacts(
    run_dir: Path, events: list[dict[str, Any]], folders: list[Path] | None = None
) -> list[Artifact]:
    """The run's traces and snapshots: those its events name, then the files in RUN_DIR/profile,
    RUN_DIR/memory and `folders` (the run's --tensorboard-dir / --memory-snapshot-dir:
    `artifact_folders`), where ranks other than 0 write theirs, in that order, each file once.

    Events store absolute paths. An older event's relative path was relative to the command's working
    directory, which is not known here: it is matched by file name inside the run directory (kept as
    recorded, missing, when no file of that name is there).
    """
    found: dict[Path, Artifact] = {}
    for e in events:
        if e.get("event") in ("profiler_trace", "memory_snapshot") and isinstance(e.get("path"), str):
            path = Path(e["path"])
            item = _artifact(path if path.is_absolute() else _by_name(run_dir, path), e["event"])
            if item is not None:
                found.setdefault(_key(item.path), item)
    for folder in (run_dir / "profile", run_dir / "memory", *(folders or [])):
        for path in sorted(folder.glob("*")) if folder.is_dir() else []:
            item = _artifact(path, None)
            if item is not None:
                found.setdefault(_key(item.path), item)
    return list(found.values())


def artifact_folders(run_json: dict[str, Any]) -> list[Path]:
    """The run's --tensorboard-dir (traces) and --memory-snapshot-dir (snapshots) from run.json's
    "config" (absent: the run wrote them under RUN_DIR/profile and RUN_DIR/memory)."""
    config = run_json.get("config") if isinstance(run_json.get("config"), dict) else {}
    values = [
        (config.get("monitoring") or {}).get("tensorboard_dir"),
        (config.get("profiling") or {}).get("memory_snapshot_dir"),
    ]
    return [Path(v) for v in values if isinstance(v, str) and v]


def _by_name(run_dir: Path, path: Path) -> Path:
    """The file named `path.name` inside `run_dir` (its first match, searched recursively), else `path`."""
    matches = sorted(run_dir.rglob(path.name)) if run_dir.is_dir() else []
    return matches[0] if matches else path


def _key(path: Path) -> Path:
    """One key per file however it was named (absolute, through a link, relative)."""
    try:
        return path.resolve()
    except OSError:
        return path


def wandb_link(run_json: dict[str, Any]) -> str | None:
    """Markdown for run.json's wandb run: its URL (online), else the `wandb sync` command of its
    folder (offline), else its id; None when the run used no wandb."""
    info = run_json.get("wandb")
    if not isinstance(info, dict) or not info.get("id"):
        return None
    if info.get("url"):
        return f"[wandb run {info['id']}]({info['url']})"
    if info.get("dir") and info.get("mode") == "offline":
        return f"wandb run {info['id']} (offline): `wandb sync {shlex.quote(str(info['dir']))}`"
    return f"wandb run {info['id']} ({info.get('mode') or 'no url'})"

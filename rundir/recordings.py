"""Where a run's files named in its events are on this machine: recordings, checkpoints, the model.

The trainer writes paths as it saw them (absolute, or relative to its working directory). A run
directory copied elsewhere, or inspected from another working directory, still finds them here:
one lookup rule, used by the UI's Rollouts page and `grpolab replay logprobs`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

RECORDINGS_DIR = "rollouts"
"""Folder of a run directory where recordings are looked for by file name."""


def locate(run_dir: str | Path, recorded: str) -> Path | None:
    """An existing path for `recorded` as the trainer wrote it, or None.

    Tried in order: as given when absolute; else under the current directory, the run directory
    and each of its parents; last `RUN_DIR/rollouts/<file name>` (a recording moved with its run).
    """
    if not recorded:
        return None
    run_dir, p = Path(run_dir), Path(recorded)
    candidates = [p] if p.is_absolute() else [Path.cwd() / p, run_dir / p, *(d / p for d in run_dir.parents)]
    candidates.append(run_dir / RECORDINGS_DIR / p.name)
    return next((c for c in candidates if c.exists()), None)


def recorded_rollouts(run_dir: str | Path, events: list[dict[str, Any]]) -> dict[int, Path]:
    """Recordings of a run on this machine: rollout id → .grz file, in rollout order.

    From the `rollout_recorded` events first, then `RUN_DIR/rollouts/*.grz` whose name holds the
    rollout id (eval recordings, `eval_<id>`, are skipped).

    Args:
        run_dir: the run directory.
        events: its events.jsonl objects (`rundir.reader.read_events`).
    """
    run_dir = Path(run_dir)
    out: dict[int, Path] = {}
    for ev in events:
        if ev.get("event") == "rollout_recorded" and isinstance(ev.get("rollout_id"), int):
            found = locate(run_dir, str(ev.get("path") or ""))
            if found is not None and found.is_file():
                out[ev["rollout_id"]] = found
    folder = run_dir / RECORDINGS_DIR
    if folder.is_dir():
        for f in sorted(folder.glob("*.grz")):
            digits = "".join(ch for ch in f.stem if ch.isdigit())
            if digits and "eval" not in f.stem and int(digits) not in out:
                out[int(digits)] = f
    return dict(sorted(out.items()))

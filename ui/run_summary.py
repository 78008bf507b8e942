"""One row of the UI's runs table (`RunInfo`), built from what `RunStore` read: a run directory's
run.json, metrics and status, or a foreign console log (pure: the store does the reading and caching).

Warnings say what the store noticed: a half-written or unparsable metrics line, values that are not
numbers, a missing or broken run.json, a log without metric lines.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from grpolab.rundir import reader
from grpolab.rundir.foreign_logs import ParsedLog
from grpolab.ui import readers


@dataclass(frozen=True)
class RunInfo:
    """One row of the runs table.

    Attributes:
        run_id: stable id (path relative to its RUNS_ROOT, prefixed by the root's name when
            several roots are given).
        source: "grpolab" (a run directory) or "miles log" (a console log).
        status: finished | failed | interrupted | running | crashed | incomplete | ended.
        steps: train steps logged (`step` rows; rollouts when a run logged no step).
        last_reward: the last `rollout/raw_reward`, or None.
        model / seed / start_time: from run.json (a log: from its launch command line and first
            timestamp); None when unknown.
        deterministic: run.json's environment.deterministic switches ({} for logs).
        warnings: what the store noticed (no metric lines, skipped lines, missing run.json...).
    """

    run_id: str
    name: str
    path: Path
    source: str
    status: str
    steps: int
    last_reward: float | None
    model: str | None
    seed: int | None
    start_time: float | None
    deterministic: dict[str, Any] = field(default_factory=dict)
    warnings: tuple[str, ...] = ()


def directory_summary(
    run_id: str,
    path: Path,
    meta: reader.RunMeta | str,
    metrics: reader.MetricsFile,
    frame: pd.DataFrame,
    status: str,
) -> RunInfo:
    """The row of a run directory: `meta` is its run.json, or why it cannot be read (then the status is
    the caller's "incomplete"); `frame` its scalars (`RunStore.frame`)."""
    warnings: list[str] = []
    name = metrics.path.name
    if metrics.partial_last_line:
        warnings.append(f"{name} ends in a half-written line (skipped)")
    if metrics.bad_lines:
        warnings.append(f"{name} lines {[n for n, _ in metrics.bad_lines[:5]]} do not parse (skipped)")
    if metrics.non_numeric:
        odd = [f"line {n}: {k} = {v}" for n, kv in metrics.non_numeric.items() for k, v in kv.items()]
        warnings.append(f"{name}: {len(odd)} value(s) not a number (left out): {'; '.join(odd[:3])}")
    if isinstance(meta, str):
        warnings.append(f"{reader.RUN_JSON} is missing" if "no such file" in meta else meta)
        meta = None
    elif meta.config_error:
        warnings.append(meta.config_error)
    return RunInfo(
        run_id=run_id,
        name=path.name if meta is None else meta.name,
        path=path,
        source="grpolab",
        status=status,
        steps=readers.count_steps(frame),
        last_reward=readers.last_value(frame, "rollout/raw_reward"),
        model=None if meta is None else meta.model,
        seed=None if meta is None else meta.seed,
        start_time=None if meta is None else meta.start_time,
        deterministic=dict(meta.environment.get("deterministic") or {}) if meta else {},
        warnings=tuple(warnings),
    )


def log_summary(
    run_id: str, path: Path, parsed: ParsedLog | OSError, frame: pd.DataFrame | None, *, recent: bool
) -> RunInfo:
    """The row of a foreign console log: `parsed` is the parsed file, or the error reading it (then
    `frame` is None); `recent` whether it grew within the store's heartbeat timeout ("running", else
    "ended")."""
    if isinstance(parsed, OSError):
        return RunInfo(run_id, path.name, path, "miles log", "unreadable", 0, None, None, None, None,
                       warnings=(f"cannot read: {parsed.strerror or parsed}",))  # fmt: skip
    assert frame is not None, "a parsed log has a frame"
    warnings: list[str] = []
    if not parsed.records:
        warnings.append(f"no metric lines in {parsed.lines} lines (not a training log, or it died early)")
    if parsed.unparsed:
        warnings.append(f"{parsed.unparsed} metric line(s) did not parse (e.g. a half-written last line)")
    seed = parsed.flags.get("seed")
    return RunInfo(
        run_id=run_id,
        name=path.stem,
        path=path,
        source="miles log",
        status="running" if recent else "ended",
        steps=readers.count_steps(frame),
        last_reward=readers.last_value(frame, "rollout/raw_reward"),
        model=parsed.flags.get("hf-checkpoint"),
        seed=int(seed) if seed is not None and seed.isdigit() else None,
        start_time=parsed.first_time,
        warnings=tuple(warnings),
    )

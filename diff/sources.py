"""What `grpolab diff` reads of a run: a grpolab run directory or a Miles/slime console log.

One `RunSource` per side, read through the project's readers only: run.json, metrics.jsonl and
events.jsonl through `rundir.reader`, a log through `rundir.foreign_logs.parse_file`, recordings
through `rundir.recordings.recorded_rollouts`, per-step hashes through `checkers.step_hash`. The
metric frame is built by `diff.frames.records_to_frame`, the one the Compare page draws from, so both
see the same (kind, step) rows (Miles' two `perf N:` lines merged, a resumed run's last values).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from grpolab.checkers.step_hash import step_hash_files
from grpolab.core.config.paths import resolve_config_paths
from grpolab.diff.frames import logged_frame, records_to_frame
from grpolab.rundir import reader, recordings
from grpolab.rundir.completion import run_completion
from grpolab.rundir.foreign_logs import parse_file


class DiffInputError(ValueError):
    """A path given to `grpolab diff` is not a run (the message names it and says why); exit 2."""


@dataclass
class RunSource:
    """One side of a diff.

    Attributes:
        path: the run directory or log file; kind: "grpolab" or "log".
        frame: metrics as a (kind, step) frame, one float64 column per key plus `time`.
        logged: which cells of `frame` the run logged (bool, same index; a logged NaN is True).
        config: the resolved config (run.json "config" with "seed"), or a log's launch flags {name: value}.
        environment: run.json's environment fingerprint ({} for a log).
        data: run.json's data identity ({} when not recorded: a log, or a run older than it).
        recordings: rollout id → .grz file of the rollouts the run recorded ({} for a log).
        step_hashes: step → checks/model_hash_step_<N>.json ({} for a log or without the flag).
        tokenizer_dir: the run's --hf-checkpoint when it is a local folder (for decoding), else None.
        notes: what could not be used (a recording of another run), for the report's notes.
        status: how the run ended when it is not complete ("failed, 1/2 rollouts: it failed at
            rollout 1: RuntimeError: boom"; `rundir.completion`, the rule of `grpolab gate`'s
            status row); "" for a run that finished every rollout asked, or a log.
    """

    path: Path
    kind: str
    frame: pd.DataFrame
    logged: pd.DataFrame
    config: dict[str, Any] = field(default_factory=dict)
    environment: dict[str, Any] = field(default_factory=dict)
    data: dict[str, Any] = field(default_factory=dict)
    recordings: dict[int, Path] = field(default_factory=dict)
    step_hashes: dict[int, Path] = field(default_factory=dict)
    tokenizer_dir: Path | None = None
    notes: list[str] = field(default_factory=list)
    status: str = ""


def read_source(path: str | Path) -> RunSource:
    """Read one side: a run directory (`reader.is_run_dir`) or a Miles/slime/grpolab console log.

    Raises:
        DiffInputError: the path does not exist, is a folder that is not a run directory, a run
            directory whose run.json does not read, a file that is not readable or holds no metric
            line (every message names the path).
    """
    p = Path(path)
    if not p.exists():
        raise DiffInputError(f"{p}: no such file or directory")
    if p.is_dir():
        if not reader.is_run_dir(p):
            raise DiffInputError(f"{p}: not a run directory (no {', '.join(reader.RUN_MARKERS)})")
        return _read_run_dir(p)
    try:
        parsed = parse_file(p)
    except OSError as e:
        raise DiffInputError(f"{p}: unreadable ({e.strerror or e})") from None
    if not any(r.metrics for r in parsed.records):  # a progress line alone (README's example) is none
        raise DiffInputError(f"{p}: not a run directory, and no metric line of a Miles/slime log in it")
    records = parsed.records
    return RunSource(p, "log", records_to_frame(records), logged_frame(records), config=dict(parsed.flags))


def _read_run_dir(path: Path) -> RunSource:
    """A grpolab run directory's side (run.json must read; metrics may be absent: judged later)."""
    try:
        meta = reader.read_run_meta(path)
        records = reader.read_metrics(path)
        events = reader.read_events(path)
    except (reader.RunDirError, OSError) as e:
        raise DiffInputError(str(e)) from None
    config = dict(meta.config_dict)
    cwd = meta.raw.get("cwd")
    if isinstance(cwd, str) and os.path.isabs(cwd):  # `runs/x` and `/repo/runs/x` are one folder
        config = resolve_config_paths(config, cwd)
    if meta.seed is not None:
        config["seed"] = meta.seed
    debug = config.get("debug")
    template = debug.get("save_debug_rollout_data") if isinstance(debug, dict) else None
    data = meta.raw.get("data_identity")
    model = recordings.locate(path, meta.model, run_dir_first=True) if meta.model else None
    found = recordings.recorded_rollouts(
        path, events, template if isinstance(template, str) else None, run_dir_first=True
    )
    own, notes = _own_recordings(found, str(meta.raw.get("run_id") or ""))
    return RunSource(
        path=path,
        kind="grpolab",
        frame=records_to_frame(records),
        logged=logged_frame(records),
        config=config,
        environment=meta.environment,
        data=data if isinstance(data, dict) else {},
        recordings=own,
        step_hashes=step_hash_files(path),
        tokenizer_dir=model if model is not None and model.is_dir() else None,
        notes=notes,
        status=_status(path),
    )


def _status(path: Path) -> str:
    """How a run directory ended when it is not complete (`rundir.completion`, the rule of
    `grpolab gate`'s status row): "failed, 1/2 rollouts: it failed at rollout 1: <error>"; ""
    when it finished every rollout it was asked for."""
    done = run_completion(path)
    return "" if done.complete else done.describe()


def _own_recordings(found: dict[int, Path], run_id: str) -> tuple[dict[int, Path], list[str]]:
    """The recordings whose .grz header names this run (run.json's run_id), and a note per one that
    names another run (left out: comparing it would judge another run's rollouts). A header without
    a run_id (older recordings), a run without one, or an unreadable header keeps the file."""
    from grpolab.replay.format import RecordingError, read_header

    own, notes = {}, []
    for rid, file in found.items():
        try:
            theirs = str(read_header(file).get("run_id") or "")
        except (RecordingError, OSError):
            theirs = ""
        if run_id and theirs and theirs != run_id:
            notes.append(f"recording {file} is of run {theirs}, not this run ({run_id}): not compared")
        else:
            own[rid] = file
    return own, notes

"""Continuing a run directory: a `--load` start of the same run appends to the crashed start's folder.

A start may continue a directory when run.json's config equals its own apart from
`CONTINUE_MAY_CHANGE` (where it resumes from and how the folder was spelled) and no rank of the
run there is alive. run.json keeps the first start's top-level fields and lists every start in
"starts"; the earlier start's rank files are removed (every rank of this start writes its own).
Which metric records the new start replaces is the `resume` marker's job (`RunDirectory.resumed`,
read by `reader.read_metrics_file`).

A directory whose every start ended `failed` before logging a metric (bad input found after the
directory was made: a checkpoint of other data, missing recordings...) holds no run yet: any next
start reuses it, with any config (`failed_before_first_rollout`, `restart_failed_run`). run.json's
top-level fields become the new start's, "starts" keeps the failed ones, and events.jsonl and
console.log go on, so the earlier failure stays on record above the new start's events.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from grpolab.core.atomic import atomic_write_json
from grpolab.core.processes import is_this_host, pid_alive
from grpolab.rundir.reader import METRICS_FILE, RUN_JSON, RunDirError, read_events, read_run_meta
from grpolab.rundir.status import HEARTBEAT_TIMEOUT_S, RANKS_DIR, final_status_event, read_ranks

CONTINUE_MAY_CHANGE: frozenset[tuple[str, str]] = frozenset(
    {("checkpoint", "load"), ("checkpoint", "allow_data_change"), ("run", "run_dir")}
)
"""(section, field) of the config a continuing start may set differently from the run's first start."""


def continue_run(path: Path, config: dict[str, Any], start: dict[str, Any]) -> list[dict[str, Any]]:
    """Add `start` to the run in `path` (run.json "starts"), after checking it is the same run.

    Args:
        path: the run directory (holds run.json); config: this start's `Config.to_dict()`.
        start: what run.json records of this start (argv, start_time, pid, world size, backend).

    Returns:
        Every start of the run, this one last.

    Raises:
        FileExistsError: run.json is unreadable, its config differs (names up to 6 flags with both
            values), or a rank of the run there is still alive (names it).
    """
    try:
        meta = read_run_meta(path)
    except RunDirError as e:
        raise FileExistsError(f"--run-dir {path} holds a run whose {RUN_JSON} cannot be read: {e}") from None
    differences = config_differences(meta.config_dict, config)
    if differences:
        raise FileExistsError(
            f"--run-dir {path} holds another run ({'; '.join(differences[:6])}); --load continues a run "
            "directory only with the flags it was started with: choose another --run-dir"
        )
    alive = running_ranks(path)
    if alive:
        raise FileExistsError(f"--run-dir {path}: the run there is still running ({alive[0]})")
    raw = dict(meta.raw)
    earlier = raw.get("starts")
    if not isinstance(earlier, list):  # a run.json from before "starts": its first start
        earlier = [{"argv": raw.get("argv"), "start_time": raw.get("start_time"), "pid": None}]
    starts = [*earlier, start]
    raw["starts"] = starts
    atomic_write_json(path / RUN_JSON, raw)
    for rank_file in (path / RANKS_DIR).glob("*.json"):
        rank_file.unlink(missing_ok=True)
    return starts


def new_run_refusal(path: Path) -> str | None:
    """Why a new run (one that does not `--load`) may not start in the run directory `path`, or None:
    it holds a run (run.json exists) that got past its first rollout. A directory whose every start
    failed before it is reused (`restart_failed_run`). Read by `RunDirectory.create` and by the checks
    before a run (`train.preflight`), so a taken `--run-dir` is refused before torch loads."""
    if not (path / RUN_JSON).exists() or failed_before_first_rollout(path):
        return None
    return (
        f"--run-dir: {path} already holds a run (run.json exists); choose another --run-dir "
        "(to continue that run after a crash, give its own flags and --load its --save directory)"
    )


def failed_before_first_rollout(path: Path) -> bool:
    """Whether the run directory `path` holds only starts that failed before their first rollout.

    True when run.json reads, events.jsonl ends with a `failed` status event, every `status` event
    in it is `failed`, and metrics.jsonl has no record (missing, or blank lines only). A run that
    was interrupted, finished, is running or was killed (no final status) is never reused.
    """
    if (final_status_event(path) or {}).get("status") != "failed":
        return False
    try:
        read_run_meta(path)
        events = read_events(path)
        metrics = (path / METRICS_FILE).read_bytes() if (path / METRICS_FILE).exists() else b""
    except (RunDirError, OSError):
        return False
    if metrics.strip():
        return False
    return all(e.get("status") == "failed" for e in events if e.get("event") == "status")


def restart_failed_run(path: Path, body: dict[str, Any], start: dict[str, Any]) -> list[dict[str, Any]]:
    """Write run.json for a new start in `path`, which `failed_before_first_rollout` said holds none.

    Args:
        path: the run directory; body: run.json's top-level fields of this start (config, argv, seed...).
        start: what run.json records of this start in "starts".

    Returns:
        Every start of the directory, the failed ones first and this one last.

    Raises:
        RunDirError: run.json cannot be read (`failed_before_first_rollout` read it just before).
    """
    raw = read_run_meta(path).raw
    earlier = raw.get("starts")
    if not isinstance(earlier, list):
        earlier = [{"argv": raw.get("argv"), "start_time": raw.get("start_time"), "pid": None}]
    starts = [*earlier, start]
    atomic_write_json(path / RUN_JSON, {**body, "starts": starts})
    for rank_file in (path / RANKS_DIR).glob("*.json"):
        rank_file.unlink(missing_ok=True)
    return starts


def config_differences(saved: dict[str, Any], config: dict[str, Any]) -> list[str]:
    """`--flag X there, Y here` for each config field whose value differs, outside `CONTINUE_MAY_CHANGE`.

    `saved` (run.json's config) is read as `Config.from_dict` reads it, so a field added to the
    config since it was written counts with its default; when it does not parse (a field since
    removed), it is compared as written and a field only one side has shows as "(absent)". Both
    sides are compared as JSON (tuples as lists).
    """
    from grpolab.core.config import Config
    from grpolab.core.config.flags import train_flags

    try:
        saved = Config.from_dict(saved).to_dict()
    except (ValueError, TypeError):
        pass
    flags = {(f.section, f.field): f.flag for f in train_flags()}
    saved = json.loads(json.dumps(saved, default=str))
    now = json.loads(json.dumps(config, default=str))
    out = []
    for section in sorted(set(saved) | set(now)):
        old_fields, new_fields = _section(saved, section), _section(now, section)
        for name in sorted(set(old_fields) | set(new_fields)):
            old, new = old_fields.get(name, "(absent)"), new_fields.get(name, "(absent)")
            if (section, name) not in CONTINUE_MAY_CHANGE and old != new:
                out.append(f"{flags.get((section, name), f'{section}.{name}')} {old} there, {new} here")
    return out


def _section(config: dict[str, Any], name: str) -> dict[str, Any]:
    value = config.get(name)
    return value if isinstance(value, dict) else {}


def running_ranks(path: Path, *, now: float | None = None) -> list[str]:
    """The ranks of the run in `path` that are still alive, one phrase each ([] after a final status).

    A rank on this host is alive while its pid is (this process excepted); a rank on another host
    while its heartbeat is younger than `HEARTBEAT_TIMEOUT_S`. Unlike the status rule, which waits
    for the heartbeat to age, a rank killed on this host counts as gone at once: a crashed run can
    be continued right away.
    """
    if final_status_event(path) is not None:
        return []
    ranks, _ = read_ranks(path, retries=0)
    now = time.time() if now is None else now
    alive = []
    for r in ranks:
        if is_this_host(r.host):
            if r.pid != os.getpid() and pid_alive(r.pid):
                alive.append(f"rank {r.rank} is pid {r.pid}, alive on this host")
        elif r.heartbeat_time is not None and now - r.heartbeat_time < HEARTBEAT_TIMEOUT_S:
            alive.append(f"rank {r.rank} on {r.host} beat {now - r.heartbeat_time:.0f} s ago")
    return alive

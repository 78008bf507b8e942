"""A run's rank files and its status: the one place that decides finished / failed / interrupted /
running / crashed (re-exported by `rundir.reader`; import from there). It imports nothing of the
reader, which imports it.

`ranks/<rank>.json` is rewritten by each rank (`RunDirectory.heartbeat`, atomic) with its rank, pid,
host, role, heartbeat {phase, rollout_id, step, time} and, when the rank's loop raised, "error".
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, get_args

from grpolab.core.processes import is_this_host, pid_alive, started_after

EVENTS_FILE = "events.jsonl"
RANKS_DIR = "ranks"
TAIL_BYTES = 64 << 10
"""Bytes read at a time from the end of a file (`final_status_event`, `reader.read_jsonl_tail`)."""

RunStatus = Literal["finished", "failed", "interrupted", "running", "crashed"]
FINAL_STATUSES: tuple[str, ...] = get_args(RunStatus)[:3]
"""The values of a `status` event the writer writes (`RunDirectory.finish`)."""
HEARTBEAT_TIMEOUT_S = 300.0
"""A run without a final status whose newest heartbeat is older than this (seconds) has crashed;
the rule for ranks of other hosts (a rank of this host whose pid is gone counts at once).
5 minutes: the UI's default since its first version; a rank rewrites its heartbeat at every phase
of a step, and a phase of the tiny CPU runs takes seconds (raise it for slow phases)."""


def status_event_of(events: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The final `status` event of events in file order: the last event, when it is a `status`
    event with a string "status" (finished | failed | interrupted). The writer writes it last
    (`RunDirectory.finish`), so None means the run has not ended by itself (running or killed)."""
    last = events[-1] if events else None
    if last is not None and last.get("event") == "status" and isinstance(last.get("status"), str):
        return last
    return None


def _last_line(path: Path, chunk: int = TAIL_BYTES) -> bytes | None:
    """The last complete, non-empty line of a file, read backwards `chunk` bytes at a time."""
    with open(path, "rb") as f:
        end = f.seek(0, os.SEEK_END)
        data = b""
        pos = end
        while pos > 0:
            pos = max(0, pos - chunk)
            f.seek(pos)
            data = f.read(end - pos)
            if not data.endswith(b"\n"):  # a half-written last line is not a record yet
                cut = data.rfind(b"\n")
                if cut < 0:
                    continue
                data, end = data[: cut + 1], pos + cut + 1
            body = data.rstrip(b"\r\n \t")
            if body and (b"\n" in body or pos == 0):
                return body.rsplit(b"\n", 1)[-1]
        return None


def final_status_event(run_dir: str | Path) -> dict[str, Any] | None:
    """The run's final `status` event (finished | failed | interrupted), or None when events.jsonl
    does not end with one (still running, killed, or no events.jsonl). The writer writes it last;
    only the file's last complete line is read, however long the file or the line."""
    try:
        line = _last_line(Path(run_dir) / EVENTS_FILE)
    except OSError:
        return None
    try:
        obj = json.loads(line) if line else None
    except ValueError:
        return None
    return status_event_of([obj]) if isinstance(obj, dict) else None


@dataclass(frozen=True)
class RankRecord:
    """One usable `ranks/<rank>.json`.

    Attributes:
        rank: the rank (the file's "rank", else its stem); pid: its process id (> 0).
        host: hostname the rank ran on (None when not recorded); role: e.g. "actor+rollout".
        heartbeat: {phase, rollout_id, step, time (unix seconds)} or None.
        error: the exception the rank recorded before failing (type, message, traceback tail).
        source: the file's path; written_at: its modification time (unix seconds), None if unknown.
    """

    rank: int
    pid: int
    host: str | None
    role: str | None
    heartbeat: dict[str, Any] | None
    error: str | None
    source: str
    written_at: float | None

    @property
    def heartbeat_time(self) -> float | None:
        """The heartbeat's time (unix seconds), or None without one."""
        t = (self.heartbeat or {}).get("time")
        return float(t) if isinstance(t, int | float) and not isinstance(t, bool) else None


def _load(path: Path, retries: int, wait_s: float) -> Any:
    """json.loads with a short retry: a rank file may be mid-rewrite by a writer without atomic rename."""
    for attempt in range(retries + 1):
        try:
            return json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError:
            if attempt == retries:
                raise
            time.sleep(wait_s)
    raise AssertionError("unreachable")


def _rank_record(path: Path, data: Any) -> RankRecord | str:
    """The record of one parsed rank file, or the problem (one line naming the file)."""
    if not isinstance(data, dict):
        return f"{path}: expected a JSON object with rank and pid; skipped"
    rank, pid = data.get("rank", path.stem), data.get("pid")
    try:
        rank = int(rank)
    except (TypeError, ValueError):
        return f"{path}: 'rank' must be an integer, got {rank!r}; skipped"
    if isinstance(pid, bool) or not isinstance(pid, int) or pid <= 0:
        return f"{path}: 'pid' must be a positive integer, got {pid!r}; skipped"
    try:
        written_at: float | None = path.stat().st_mtime
    except OSError:
        written_at = None
    text = lambda key: data[key] if isinstance(data.get(key), str) else None  # noqa: E731
    heartbeat = data.get("heartbeat")
    return RankRecord(
        rank=rank,
        pid=pid,
        host=text("host"),
        role=text("role"),
        heartbeat=heartbeat if isinstance(heartbeat, dict) else None,
        error=str(data["error"]) if data.get("error") else None,
        source=str(path),
        written_at=written_at,
    )


def read_ranks(
    run_dir: str | Path, *, retries: int = 2, wait_s: float = 0.1
) -> tuple[list[RankRecord], list[str]]:
    """The usable rank files of `run_dir/ranks/*.json`, sorted by (rank, pid), and the problems.

    A file that is not JSON (retried `retries` times, `wait_s` seconds apart), not an object,
    or has no integer rank / positive pid is skipped and named in the problems; of two files for
    the same rank the one with the newer heartbeat is kept. No ranks/ folder gives ([], []).
    """
    folder = Path(run_dir) / RANKS_DIR
    files = sorted(folder.glob("*.json")) if folder.is_dir() else []
    records: list[RankRecord] = []
    problems: list[str] = []
    for path in files:
        try:
            got = _rank_record(path, _load(path, retries, wait_s))
        except json.JSONDecodeError as e:
            got = f"{path}: not valid JSON ({e.msg} at line {e.lineno}); half-written? skipped"
        except OSError as e:
            got = f"{path}: unreadable ({e.strerror}); skipped"
        if isinstance(got, str):
            problems.append(got)
        else:
            records.append(got)
    newest: dict[int, RankRecord] = {}
    for r in sorted(records, key=lambda r: -(r.heartbeat_time or float("-inf"))):
        if r.rank in newest:
            other = newest[r.rank].source
            problems.append(
                f"{r.source}: rank {r.rank} is also in {other}, whose heartbeat is newer; skipped"
            )
        else:
            newest[r.rank] = r
    return sorted(newest.values(), key=lambda r: (r.rank, r.pid)), problems


def rank_is_gone(rank: RankRecord) -> bool:
    """True when the rank ran on this host and its process is known to be over: its pid no longer
    runs (core.processes.pid_alive; a zombie counts as gone) or belongs to a process that started
    after the rank's last heartbeat (the pid was reused; core.processes.started_after). A rank of
    another host is never known gone: only its heartbeat's age tells (HEARTBEAT_TIMEOUT_S)."""
    if not is_this_host(rank.host):
        return False
    if not pid_alive(rank.pid):
        return True
    beat = rank.heartbeat_time
    return beat is not None and started_after(rank.pid, beat)


def live_heartbeat_times(ranks: list[RankRecord]) -> list[float]:
    """The heartbeat times (unix seconds) of the ranks that may still run: every rank with a
    heartbeat but those `rank_is_gone` says are over. `decide_status` takes these, so a run whose
    ranks on this host were all killed is "crashed" at once instead of after the heartbeat timeout."""
    return [t for r in ranks if (t := r.heartbeat_time) is not None and not rank_is_gone(r)]


def decide_status(
    final_event: dict[str, Any] | None,
    heartbeat_times: list[float],
    *,
    now: float,
    heartbeat_timeout_s: float = HEARTBEAT_TIMEOUT_S,
) -> RunStatus:
    """The status rule: the final `status` event's value (finished | failed | interrupted) when the
    run wrote one; else "running" while the newest of `heartbeat_times` (unix seconds; the ranks
    that may still run, `live_heartbeat_times`) is younger than `heartbeat_timeout_s`, else
    "crashed". A status event with another value counts as none."""
    status = (final_event or {}).get("status")
    if status in FINAL_STATUSES:
        return status  # type: ignore[return-value]
    if heartbeat_times and now - max(heartbeat_times) < heartbeat_timeout_s:
        return "running"
    return "crashed"


def run_status(
    run_dir: str | Path, *, now: float | None = None, heartbeat_timeout_s: float = HEARTBEAT_TIMEOUT_S
) -> RunStatus:
    """The status of the run in `run_dir` (`decide_status` over its files; `now` defaults to the
    clock). Never raises for the directory's contents: unreadable files count as absent."""
    event = final_status_event(run_dir)
    beats: list[float] = []
    if (event or {}).get("status") not in FINAL_STATUSES:
        ranks, _ = read_ranks(run_dir, retries=0)
        beats = live_heartbeat_times(ranks)
    now = time.time() if now is None else now
    return decide_status(event, beats, now=now, heartbeat_timeout_s=heartbeat_timeout_s)


__all__ = [
    "EVENTS_FILE",
    "RANKS_DIR",
    "TAIL_BYTES",
    "final_status_event",
    "status_event_of",
    "FINAL_STATUSES",
    "HEARTBEAT_TIMEOUT_S",
    "RankRecord",
    "RunStatus",
    "decide_status",
    "live_heartbeat_times",
    "rank_is_gone",
    "read_ranks",
    "run_status",
]

"""The rank processes `grpolab diagnose hang` inspects, and whether each one is still that rank.

Three sources: a run directory's `ranks/*.json` (rank, pid, host, role, heartbeat, optional "error"
written when the rank's training loop raised), `--pid P …` (ranks numbered in the order given), and
`--match PATTERN` (hang/match.py: processes whose `/proc/<pid>/cmdline` matches, ranks from `RANK`
in their environment, forked workers and orphans told apart). `rank_liveness` says whether a rank
still runs: its pid is gone or a zombie, or the pid now belongs to a process that started after
the rank's last heartbeat (or, for `--pid`/`--match`, after discovery): the kernel reused it. The
/proc readers are in common/procfs.py.
"""

from __future__ import annotations

import socket
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from grpolab.diagnose.common.procfs import (
    is_alive,
    proc_cmdline,
    proc_env_rank,
    proc_parent,
    proc_start_time,
    proc_state,
    started_after,
)
from grpolab.rundir.reader import RANKS_DIR, read_ranks

__all__ = [
    "InspectError",
    "RankTarget",
    "is_alive",
    "proc_cmdline",
    "proc_env_rank",
    "proc_parent",
    "proc_state",
    "rank_liveness",
    "ranks_from_pids",
    "read_rank_files",
    "refresh_heartbeats",
]


class InspectError(Exception):
    """The ranks could not be inspected (exit code 2); the message names the flag/file and the reason."""


@dataclass
class RankTarget:
    """One rank process to inspect."""

    rank: int
    pid: int
    host: str | None = None
    """Hostname from the rank file; None when found on this machine (`--pid`, `--match`)."""
    role: str | None = None
    heartbeat: dict[str, Any] | None = None
    """The rank file's heartbeat: phase, rollout_id, step, time (Unix seconds)."""
    error: str | None = None
    """The exception the rank recorded before failing (rank file "error")."""
    source: str = ""
    """Where the rank came from: the rank file's path, `--pid` or `--match`."""
    written_at: float | None = None
    """The rank file's modification time (Unix seconds); None for `--pid` / `--match`."""
    started: float | None = None
    """The process start time seen at discovery (Unix seconds, procfs.proc_start_time); `--pid` and
    `--match` only: a later different start time means the pid was reused meanwhile."""
    caveat: str | None = None
    """A doubt about whether this process is the rank (`--match`: only an orphaned process matched
    its RANK; hang/match.py); the verdict shows it."""

    @property
    def local(self) -> bool:
        """True when the process runs on this machine, so py-spy can reach it."""
        return self.host is None or self.host in _local_hostnames()

    def heartbeat_age_s(self, now: float) -> float | None:
        """Seconds since the rank's last heartbeat, or None without one."""
        t = (self.heartbeat or {}).get("time")
        return max(0.0, now - float(t)) if isinstance(t, (int, float)) else None

    def last_seen(self) -> float | None:
        """When the rank was last known to run (Unix seconds): its heartbeat time, else its rank file's
        modification time (a copied run directory has newer mtimes, which only delays reuse detection)."""
        t = (self.heartbeat or {}).get("time")
        return float(t) if isinstance(t, (int, float)) and not isinstance(t, bool) else self.written_at


def rank_liveness(target: RankTarget) -> tuple[bool, str | None]:
    """(alive, why not): whether the rank's process still runs and is still that rank.

    A rank on another host counts as alive (this host cannot tell). Gone: the pid is gone or a
    zombie ("exited (pid gone)"), or the pid now belongs to a process that started after the rank's
    last heartbeat (procfs.started_after, margin procfs.PID_REUSE_MARGIN_S) or, for `--pid` /
    `--match`, whose start time differs from the one seen at discovery.
    """
    if not target.local:
        return True, None
    if not is_alive(target.pid):
        return False, "exited (pid gone)"
    last_seen = target.last_seen()
    if last_seen is not None and started_after(target.pid, last_seen):
        return False, (
            f"exited: pid {target.pid} now belongs to another process started after the rank's last heartbeat"
        )
    if target.started is not None:
        now_started = proc_start_time(target.pid)
        if now_started is not None and abs(now_started - target.started) > 1.0:
            return (
                False,
                f"exited: pid {target.pid} now belongs to another process started during the diagnosis",
            )
    return True, None


def _local_hostnames() -> set[str]:
    name = socket.gethostname()
    return {name, name.split(".")[0], socket.getfqdn(), "localhost"}


def read_rank_files(run_dir: Path) -> tuple[list[RankTarget], list[str]]:
    """The ranks listed in `run_dir/ranks/*.json` (read by `rundir.reader.read_ranks`: of two files
    for one rank the newer heartbeat wins), sorted by rank, and problems with unusable files.

    Returns:
        (targets, problems): a problem is one line naming a rank file that could not be used.

    Raises:
        InspectError: `run_dir` does not exist, is not a directory, has no `ranks/*.json`, or none
            of its rank files is usable.
    """
    if not run_dir.exists():
        raise InspectError(f"RUN_DIR {run_dir}: no such directory")
    if not run_dir.is_dir():
        raise InspectError(f"RUN_DIR {run_dir}: not a directory (expected a grpolab run directory)")
    records, problems = read_ranks(run_dir)
    if not records and not problems:
        what = "is empty" if not any(run_dir.iterdir()) else f"has no {RANKS_DIR}/*.json"
        raise InspectError(
            f"RUN_DIR {run_dir}: {what} (expected the run directory of `grpolab train`, whose ranks "
            "write ranks/<rank>.json with their pid; for other processes use --pid or --match)"
        )
    if not records:
        raise InspectError(f"RUN_DIR {run_dir}: no usable rank file in {RANKS_DIR}/: " + "; ".join(problems))
    targets = [
        RankTarget(
            rank=r.rank,
            pid=r.pid,
            host=r.host,
            role=r.role,
            heartbeat=r.heartbeat,
            error=r.error,
            source=r.source,
            written_at=r.written_at,
        )
        for r in records
    ]
    return targets, problems


def ranks_from_pids(pids: Sequence[int]) -> list[RankTarget]:
    """`--pid P …`: rank i is the i-th pid.

    Raises:
        InspectError: a pid is given twice, is not positive, or no such process exists.
    """
    if len(set(pids)) != len(pids):
        raise InspectError(f"--pid: each pid must be given once, got {' '.join(map(str, pids))}")
    targets = []
    for rank, pid in enumerate(pids):
        if pid <= 0:
            raise InspectError(f"--pid {pid}: expected a positive process id")
        if not is_alive(pid):
            raise InspectError(f"--pid {pid}: no such process (it exited or never existed)")
        targets.append(RankTarget(rank=rank, pid=pid, source="--pid", started=proc_start_time(pid)))
    return targets


def refresh_heartbeats(targets: list[RankTarget], run_dir: Path | None) -> list[RankTarget]:
    """Re-read the rank files into `targets` (a heartbeat or an error may be newer than discovery).

    Returns `targets`, updated in place; unchanged without a run directory or when the rank files
    cannot be read any more.
    """
    if run_dir is None:
        return targets
    try:
        fresh, _ = read_rank_files(run_dir)
    except InspectError:
        return targets
    by_rank = {t.rank: t for t in fresh}
    for t in targets:
        if t.rank in by_rank and by_rank[t.rank].pid == t.pid:
            t.heartbeat = by_rank[t.rank].heartbeat
            t.error = by_rank[t.rank].error or t.error
            t.written_at = by_rank[t.rank].written_at
    return targets

"""The rank processes `grpolab diagnose hang` inspects, and what /proc says about them.

Three sources: a run directory's `ranks/*.json` (rank, pid, host, role, heartbeat, optional "error"
written when the rank's training loop raised), `--pid P …` (ranks numbered in the order given), and
`--match PATTERN` (processes whose `/proc/<pid>/cmdline` matches, this command and its parents
excluded; ranks from `RANK` in their environment when some have it, the rest listed as skipped
launchers). Liveness comes from /proc (a zombie counts as gone), or `os.kill(pid, 0)` without /proc.
"""

from __future__ import annotations

import json
import os
import re
import socket
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any


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

    @property
    def local(self) -> bool:
        """True when the process runs on this machine, so py-spy can reach it."""
        return self.host is None or self.host in _local_hostnames()

    def heartbeat_age_s(self, now: float) -> float | None:
        """Seconds since the rank's last heartbeat, or None without one."""
        t = (self.heartbeat or {}).get("time")
        return max(0.0, now - float(t)) if isinstance(t, (int, float)) else None


def _local_hostnames() -> set[str]:
    name = socket.gethostname()
    return {name, name.split(".")[0], socket.getfqdn(), "localhost"}


def _read_json_retry(path: Path, *, retries: int = 2, wait_s: float = 0.1) -> Any:
    """json.load with a short retry: a rank file may be mid-rewrite by a writer without atomic rename."""
    for attempt in range(retries + 1):
        try:
            return json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError:
            if attempt == retries:
                raise
            time.sleep(wait_s)
    raise AssertionError("unreachable")


def read_rank_files(run_dir: Path) -> tuple[list[RankTarget], list[str]]:
    """The ranks listed in `run_dir/ranks/*.json`, sorted by rank, and problems with unreadable files.

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
    files = sorted((run_dir / "ranks").glob("*.json")) if (run_dir / "ranks").is_dir() else []
    if not files:
        what = "is empty" if not any(run_dir.iterdir()) else "has no ranks/*.json"
        raise InspectError(
            f"RUN_DIR {run_dir}: {what} (expected the run directory of `grpolab train`, whose ranks "
            "write ranks/<rank>.json with their pid; for other processes use --pid or --match)"
        )
    targets: list[RankTarget] = []
    problems: list[str] = []
    for path in files:
        try:
            data = _read_json_retry(path)
        except json.JSONDecodeError as e:
            problems.append(f"{path}: not valid JSON ({e.msg} at line {e.lineno}); half-written? skipped")
            continue
        except OSError as e:
            problems.append(f"{path}: unreadable ({e.strerror}); skipped")
            continue
        if not isinstance(data, dict):
            problems.append(f"{path}: expected a JSON object with rank and pid; skipped")
            continue
        pid = data.get("pid")
        rank = data.get("rank", path.stem)
        try:
            rank = int(rank)
        except (TypeError, ValueError):
            problems.append(f"{path}: 'rank' must be an integer, got {rank!r}; skipped")
            continue
        if isinstance(pid, bool) or not isinstance(pid, int) or pid <= 0:
            problems.append(f"{path}: 'pid' must be a positive integer, got {pid!r}; skipped")
            continue
        heartbeat = data.get("heartbeat") if isinstance(data.get("heartbeat"), dict) else None
        error = data.get("error")
        targets.append(
            RankTarget(
                rank=rank,
                pid=pid,
                host=data.get("host") if isinstance(data.get("host"), str) else None,
                role=data.get("role") if isinstance(data.get("role"), str) else None,
                heartbeat=heartbeat,
                error=str(error) if error else None,
                source=str(path),
            )
        )
    newest: dict[int, RankTarget] = {}
    now = time.time()
    for t in sorted(targets, key=lambda t: (t.heartbeat_age_s(now) is None, t.heartbeat_age_s(now) or 0.0)):
        if t.rank in newest:
            problems.append(
                f"{t.source}: rank {t.rank} is also in {newest[t.rank].source}, whose heartbeat is newer; skipped"
            )
        else:
            newest[t.rank] = t
    targets = list(newest.values())
    if not targets:
        raise InspectError(f"RUN_DIR {run_dir}: no usable rank file in ranks/: " + "; ".join(problems))
    targets.sort(key=lambda t: (t.rank, t.pid))
    return targets, problems


def proc_cmdline(pid: int) -> str | None:
    """The command line of `pid` (/proc/<pid>/cmdline, arguments joined by spaces), or None."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None
    return " ".join(part.decode(errors="replace") for part in raw.split(b"\0") if part) or None


def proc_env_rank(pid: int) -> int | None:
    """`RANK` from the environment of `pid` (/proc/<pid>/environ); None when unset, not an integer
    or unreadable."""
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return None
    for entry in raw.split(b"\0"):
        if entry.startswith(b"RANK="):
            try:
                return int(entry[5:])
            except ValueError:
                return None
    return None


def proc_state(pid: int) -> str | None:
    """The state letter of /proc/<pid>/stat (R, S, D, Z, T, …), or None when the process is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat[stat.rfind(")") + 2 :][:1] or None


def proc_parent(pid: int) -> int | None:
    """The parent pid of `pid` (/proc/<pid>/stat), or None when the process is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rfind(")") + 2 :].split()
    return int(fields[1]) if len(fields) > 1 else None


def is_alive(pid: int) -> bool:
    """True when `pid` runs (a zombie, exited but not yet reaped by its parent, counts as gone)."""
    state = proc_state(pid)
    if state is not None:
        return state not in ("Z", "X")
    if Path("/proc/self").exists():
        return False
    try:  # no /proc (not Linux): signal 0 only checks existence
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


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
        targets.append(RankTarget(rank=rank, pid=pid, source="--pid"))
    return targets


def _own_lineage() -> set[int]:
    """This process and its ancestors: their command lines contain the --match pattern itself."""
    pids, pid = set(), os.getpid()
    while pid and pid not in pids:
        pids.add(pid)
        pid = proc_parent(pid) or 0
    return pids


def ranks_from_match(pattern: str) -> tuple[list[RankTarget], list[str]]:
    """`--match PATTERN`: processes whose command line matches the regular expression.

    Ranks come from `RANK` in each process's environment when some matches have it (the others are
    launchers such as torchrun's agent, returned as notes), else from pid order. A match whose
    parent also matches with the same command line and RANK (a forked data-loader worker) is
    skipped with a note.

    Raises:
        InspectError: the pattern is not a valid regular expression, or nothing matches.
    """
    try:
        regex = re.compile(pattern)
    except re.error as e:
        raise InspectError(f"--match {pattern!r}: not a valid regular expression ({e})") from None
    exclude = _own_lineage()
    found: list[tuple[int, str, int | None]] = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) in exclude:
            continue
        pid = int(entry.name)
        cmd = proc_cmdline(pid)
        if cmd is None or not regex.search(cmd) or not is_alive(pid):
            continue
        found.append((pid, cmd, proc_env_rank(pid)))
    if not found:
        raise InspectError(
            f"--match {pattern!r}: no running process's command line (/proc/*/cmdline) matches"
        )
    notes: list[str] = []
    matched = {pid: (cmd, rank) for pid, cmd, rank in found}
    workers = {}  # forked children (data-loader workers) inherit the command line and RANK of their rank
    for pid, cmd, rank in found:
        parent = proc_parent(pid)
        if parent in matched and rank is not None and matched[parent] == (cmd, rank):
            workers[pid] = parent
    for pid, parent in sorted(workers.items()):
        notes.append(
            f"pid {pid} matches but is a forked child of matching pid {parent} (same command line and "
            "RANK: a worker?): skipped"
        )
    found = [f for f in found if f[0] not in workers]
    with_rank = [f for f in found if f[2] is not None]
    if with_rank:
        for pid, _cmd, rank in found:
            if rank is None:
                notes.append(f"pid {pid} matches but has no RANK in its environment (a launcher?): skipped")
        ranks = sorted(with_rank, key=lambda f: (f[2], f[0]))
        if len({f[2] for f in ranks}) != len(ranks):
            notes.append("several matching processes share one RANK (several jobs?): numbered by pid order")
            ranks = [(pid, cmd, i) for i, (pid, cmd, _) in enumerate(sorted(ranks))]
    else:
        ranks = [(pid, cmd, i) for i, (pid, cmd, _) in enumerate(sorted(found))]
    return [RankTarget(rank=int(r), pid=pid, source="--match") for pid, _cmd, r in ranks], notes


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
    return targets

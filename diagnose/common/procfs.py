"""What Linux's /proc says about a process, for `grpolab diagnose hang`: command line, environment,
state, parent, process group, start time, liveness, and whether a recorded pid now belongs to
another process.

Every reader returns None (or False) when the process is gone or the file cannot be read; none
raises. Liveness, start time and pid reuse are `core.processes`' (one answer for the whole package),
re-exported here under this module's names (`is_alive`, `proc_start_time`, `started_after`).
"""

from __future__ import annotations

from pathlib import Path

from grpolab.core.processes import PID_REUSE_MARGIN_S, proc_stat_fields, started_after
from grpolab.core.processes import pid_alive as is_alive
from grpolab.core.processes import process_start_time as proc_start_time


def proc_cmdline(pid: int) -> str | None:
    """The command line of `pid` (/proc/<pid>/cmdline, arguments joined by spaces), or None."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None
    return " ".join(part.decode(errors="replace") for part in raw.split(b"\0") if part) or None


def proc_environ(pid: int) -> dict[str, str] | None:
    """The environment of `pid` (/proc/<pid>/environ), or None when unreadable (gone, another user)."""
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return None
    env = {}
    for entry in raw.split(b"\0"):
        name, sep, value = entry.partition(b"=")
        if sep:
            env[name.decode(errors="replace")] = value.decode(errors="replace")
    return env


def proc_env_rank(pid: int) -> int | None:
    """`RANK` from the environment of `pid`; None when unset, not an integer or unreadable."""
    value = (proc_environ(pid) or {}).get("RANK")
    try:
        return None if value is None else int(value)
    except ValueError:
        return None


def proc_state(pid: int) -> str | None:
    """The state letter of /proc/<pid>/stat (R, S, D, Z, T, …), or None when the process is gone."""
    fields = proc_stat_fields(pid)
    return fields[0][:1] if fields else None


def proc_parent(pid: int) -> int | None:
    """The parent pid of `pid` (/proc/<pid>/stat), or None when the process is gone."""
    fields = proc_stat_fields(pid)
    return int(fields[1]) if fields and len(fields) > 1 else None


def proc_children(pid: int) -> list[int]:
    """The pids whose parent is `pid` (a scan of /proc), in /proc's order; [] when it has none or is gone."""
    children = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and proc_parent(int(entry.name)) == pid:
            children.append(int(entry.name))
    return children


def proc_group_and_session(pid: int) -> tuple[int, int] | None:
    """(process group id, session id) of `pid` (/proc/<pid>/stat fields 5 and 6), or None when gone.

    A process started in its own session (`setsid`; torchrun starts every worker so) leads both:
    both ids are its own pid. A forked child keeps its parent's group and session, so its ids name
    the process it was forked from when that one led them.
    """
    fields = proc_stat_fields(pid)
    return (int(fields[2]), int(fields[3])) if fields and len(fields) > 3 else None


__all__ = [
    "PID_REUSE_MARGIN_S",
    "is_alive",
    "proc_children",
    "proc_cmdline",
    "proc_env_rank",
    "proc_environ",
    "proc_group_and_session",
    "proc_parent",
    "proc_start_time",
    "proc_state",
    "started_after",
]

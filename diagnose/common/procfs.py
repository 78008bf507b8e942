"""What Linux's /proc says about a process, for `grpolab diagnose hang`: command line, environment,
state, parent, process group, start time, liveness, and whether a recorded pid now belongs to
another process.

Every reader returns None (or False) when the process is gone or the file cannot be read; none
raises. Without /proc (not Linux) `is_alive` falls back to `os.kill(pid, 0)`.
"""

from __future__ import annotations

import os
from pathlib import Path

PID_REUSE_MARGIN_S = 2.0
"""grpolab's slack (seconds) before a process start time later than a rank's last heartbeat means the
pid was reused: /proc/stat's `btime` is whole seconds (the computed start can be up to 1 s early or,
after a clock step, a little late), so anything within 2 s is read as the same process."""


def _stat_fields(pid: int) -> list[str] | None:
    """/proc/<pid>/stat split after the command name: index 0 is field 3 (state), index 19 field 22."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat[stat.rfind(")") + 2 :].split()


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
    fields = _stat_fields(pid)
    return fields[0][:1] if fields else None


def proc_parent(pid: int) -> int | None:
    """The parent pid of `pid` (/proc/<pid>/stat), or None when the process is gone."""
    fields = _stat_fields(pid)
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
    fields = _stat_fields(pid)
    return (int(fields[2]), int(fields[3])) if fields and len(fields) > 3 else None


def _boot_time() -> float | None:
    """`btime` of /proc/stat: the boot time in Unix seconds (whole seconds)."""
    try:
        for line in Path("/proc/stat").read_text().splitlines():
            if line.startswith("btime "):
                return float(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


def proc_start_time(pid: int) -> float | None:
    """When `pid` started, in Unix seconds, or None when gone or unreadable.

    Formula (proc(5)): field 22 of /proc/<pid>/stat, `starttime`, is clock ticks after boot; divided
    by `os.sysconf("SC_CLK_TCK")` and added to /proc/stat's `btime`. Accurate to about 1 s (btime
    is whole seconds).
    """
    fields = _stat_fields(pid)
    boot = _boot_time()
    if not fields or len(fields) < 20 or boot is None:
        return None
    try:
        return boot + int(fields[19]) / os.sysconf("SC_CLK_TCK")
    except (ValueError, OSError):
        return None


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


def started_after(pid: int, when: float, margin_s: float = PID_REUSE_MARGIN_S) -> bool:
    """True when process `pid` started more than `margin_s` seconds after `when` (Unix seconds).

    A rank's pid whose process started after the rank's own last heartbeat cannot be that rank: the
    rank exited and the kernel gave its pid to another process. False when the start time is unknown.
    """
    start = proc_start_time(pid)
    return start is not None and start > when + margin_s

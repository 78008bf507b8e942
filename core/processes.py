"""The processes of this machine: is a pid alive, when did it start, is a host name this machine.

The one answer to "does this pid still run" for the whole package: a run's status
(`rundir/status.py`), continuing a run directory, a checkpoint's temporary folder and lock,
`grpolab diagnose hang` and the watchdog (`diagnose/common/procfs.py` names these functions for
its readers). Linux's /proc is read where it exists; elsewhere `os.kill(pid, 0)` answers. Nothing
here raises for a pid that is gone or unreadable.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

PID_REUSE_MARGIN_S = 2.0
"""grpolab's slack (seconds) before a process start time later than a rank's last heartbeat means the
pid was reused: /proc/stat's `btime` is whole seconds (the computed start can be up to 1 s early or,
after a clock step, a little late), so anything within 2 s is read as the same process."""


def proc_stat_fields(pid: int) -> list[str] | None:
    """/proc/<pid>/stat split after the command name: index 0 is field 3 (state), index 19 field 22
    (proc(5)); None when the process is gone or the file cannot be read (no /proc)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat[stat.rfind(")") + 2 :].split()


def pid_alive(pid: int) -> bool:
    """True when process `pid` runs on this machine.

    A zombie (exited, not yet reaped by its parent) or a dead task (state Z or X in /proc/<pid>/stat)
    counts as gone. Without a readable /proc/<pid>/stat (not Linux, or /proc mounted with hidepid)
    `os.kill(pid, 0)` decides: no such process is gone, PermissionError (another user's process) is
    alive. A pid <= 0 names no single process (kill(2) would address a process group): False.
    """
    if pid <= 0:
        return False
    fields = proc_stat_fields(pid)
    if fields:
        return fields[0][:1] not in ("Z", "X")
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    except OSError:  # e.g. a pid beyond the kernel's range
        return False
    return True


def _boot_time() -> float | None:
    """`btime` of /proc/stat: the boot time in Unix seconds (whole seconds)."""
    try:
        for line in Path("/proc/stat").read_text().splitlines():
            if line.startswith("btime "):
                return float(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


def process_start_time(pid: int) -> float | None:
    """When `pid` started, in Unix seconds, or None when gone or unreadable (no /proc).

    Formula (proc(5)): field 22 of /proc/<pid>/stat, `starttime`, is clock ticks after boot; divided
    by `os.sysconf("SC_CLK_TCK")` and added to /proc/stat's `btime`. Accurate to about 1 s (btime
    is whole seconds).
    """
    fields = proc_stat_fields(pid)
    boot = _boot_time()
    if not fields or len(fields) < 20 or boot is None:
        return None
    try:
        return boot + int(fields[19]) / os.sysconf("SC_CLK_TCK")
    except (ValueError, OSError):
        return None


def started_after(pid: int, when: float, margin_s: float = PID_REUSE_MARGIN_S) -> bool:
    """True when process `pid` started more than `margin_s` seconds after `when` (Unix seconds).

    A rank's pid whose process started after the rank's own last heartbeat cannot be that rank: the
    rank exited and the kernel gave its pid to another process. False when the start time is unknown.
    """
    start = process_start_time(pid)
    return start is not None and start > when + margin_s


def this_host_names() -> set[str]:
    """The names a file written on this machine records as its host: `socket.gethostname()` (what
    the run directory's writer records), its first label, and "localhost"."""
    name = socket.gethostname()
    return {name, name.split(".")[0], "localhost"}


def is_this_host(host: str | None) -> bool:
    """True when `host` names this machine (`this_host_names`); None (a record without a host, or a
    process found here by pid) counts as this machine."""
    return host is None or host in this_host_names()


__all__ = [
    "PID_REUSE_MARGIN_S",
    "is_this_host",
    "pid_alive",
    "proc_stat_fields",
    "process_start_time",
    "started_after",
    "this_host_names",
]

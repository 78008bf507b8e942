"""What `grpolab watchdog` watches: a log file or a grpolab run directory (its console.log), the pids to
stop, and the wait for a target that does not exist yet (the watchdog may start before the run).

Like `tail -F`, a target that appears while the watchdog waits is read from its first line.
"""

from __future__ import annotations

import errno
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from grpolab.diagnose.common.procfs import is_alive

DEFAULT_WAIT_S = 300.0
"""How long the watchdog waits for a log or run directory that does not exist yet (grpolab's: a run
creates its directory and console.log within seconds of starting, after imports and, with torchrun,
the rendezvous; five minutes covers a slow start without hiding a wrong path for long)."""
WAIT_POLL_S = 0.5
"""Seconds between two looks for the log while waiting for it."""


def stamped(label: str, message: str) -> str:
    """One message line, stamped like `date -u +%FT%TZ` and labelled with what is watched."""
    return f"{time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())} {label}: {message}"


@dataclass(frozen=True, kw_only=True)
class WatchTarget:
    """What to watch: the log, the run directory it belongs to (or None), the pids to stop."""

    log: Path
    run_dir: Path | None
    stop_pids: tuple[int, ...]
    """--stop-pid; empty for a run directory (its ranks are looked up at stop time)."""
    from_start: bool = False
    """Read the log from its first line (it appeared while the watchdog waited), not from its end."""


def check_stop_pid(stop_pid: int | None) -> tuple[int, ...]:
    """--stop-pid as the pids to stop (empty without it).

    Raises:
        ValueError: it is not a live process this user may signal.
    """
    if stop_pid is None:
        return ()
    if stop_pid <= 0:  # kill(0) and kill(-1) would signal a process group or every process
        raise ValueError(f"--stop-pid must be a process id > 0, got {stop_pid}")
    try:
        os.kill(stop_pid, 0)
    except ProcessLookupError:
        raise ValueError(f"--stop-pid {stop_pid}: no such process, so nothing would guard the run") from None
    except PermissionError:
        raise ValueError(f"--stop-pid {stop_pid}: not allowed to signal that process") from None
    if not is_alive(stop_pid):
        raise ValueError(f"--stop-pid {stop_pid}: that process has already exited")
    return (stop_pid,)


def find_log(path: Path) -> tuple[Path, Path | None] | None:
    """(log, run directory or None) for a log file or a run directory holding console.log; None while
    the file, or the directory's console.log, does not exist."""
    if path.is_dir():
        log = path / "console.log"
        return (log, path) if log.exists() else None
    return (path, None) if path.exists() else None


def wait_for_target(
    path: Path,
    stop_pids: tuple[int, ...],
    *,
    wait_s: float = DEFAULT_WAIT_S,
    out: TextIO | None = None,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> WatchTarget | None:
    """The target at `path`, waiting up to `wait_s` seconds for it to appear (one "waiting" line).

    Returns:
        The target (read from its start if it appeared while waiting), or None when a --stop-pid
        process exited before the log appeared (the run ended).

    Raises:
        FileNotFoundError: still missing after `wait_s` seconds (the message says what was missing).
    """
    deadline = clock() + wait_s
    waited = False
    while True:
        found = find_log(path)
        if found is not None:
            return WatchTarget(log=found[0], run_dir=found[1], stop_pids=stop_pids, from_start=waited)
        gone = [pid for pid in stop_pids if not is_alive(pid)]
        if gone:
            print(
                stamped(str(path), f"the run ended (process {gone[0]} exited) before its log appeared"),
                file=out,
            )
            return None
        if clock() >= deadline:
            after = f" after waiting {wait_s:g} s (--wait-seconds)" if wait_s > 0 else ""
            if path.is_dir():
                why = f"a directory without console.log{after}, not a grpolab run directory"
            else:
                why = f"No such file or directory{after}"
            raise FileNotFoundError(errno.ENOENT, why, str(path))
        if not waited:
            what = f"{path / 'console.log'}" if path.is_dir() else "it"
            print(
                stamped(str(path), f"waiting up to {wait_s:g} s for {what} to appear (--wait-seconds)"),
                file=out,
            )
            (out or sys.stdout).flush()
            waited = True
        sleep(min(WAIT_POLL_S, max(0.0, deadline - clock())))


__all__ = ["DEFAULT_WAIT_S", "WatchTarget", "check_stop_pid", "find_log", "stamped", "wait_for_target"]

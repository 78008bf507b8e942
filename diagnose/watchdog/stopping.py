"""Stopping a run's processes like `docker stop`: SIGTERM, then SIGKILL after a grace period.

grpolab train turns SIGTERM into status "interrupted" (its final event is written); a rank stuck in a
collective or a C call, or any process that ignores SIGTERM, is killed with SIGKILL once the grace
period has passed, so the watchdog never leaves a dead-engine run alive. Liveness is read with
`os.kill(pid, 0)` and /proc (a zombie counts as gone); the pids of a grpolab run on this host come
from its `ranks/*.json`.
"""

from __future__ import annotations

import os
import signal
import socket
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from grpolab.diagnose.common.procfs import is_alive
from grpolab.rundir.reader import read_ranks

DEFAULT_GRACE_S = 10.0
"""Seconds between SIGTERM and SIGKILL (the default grace period of `docker stop`, which the Miles 101
manual's watchdog script relies on)."""
KILL_WAIT_S = 5.0
"""Seconds to wait for a process to go after SIGKILL (grpolab's: SIGKILL takes effect at once unless the
process is stuck in the kernel, e.g. in uninterruptible I/O)."""
POLL_S = 0.1
"""Seconds between liveness checks while waiting."""


def run_dir_pids(run_dir: Path) -> list[int]:
    """Pids of the run's rank processes on this host, from its rank files (`rundir.reader.read_ranks`;
    unusable files are skipped)."""
    host = socket.gethostname()
    ranks, _ = read_ranks(run_dir, retries=0)
    return sorted({r.pid for r in ranks if r.host == host})


def _processes(pids: Sequence[int]) -> str:
    return f"process{'es' if len(pids) > 1 else ''} {', '.join(map(str, pids))}"


def stop_processes(
    pids: Sequence[int],
    *,
    grace_s: float = DEFAULT_GRACE_S,
    say: Callable[[str], None],
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> list[int]:
    """SIGTERM every pid; SIGKILL those still running `grace_s` seconds later (as `docker stop -t`).

    Args:
        pids: the processes to stop.
        grace_s: seconds between SIGTERM and SIGKILL (>= 0).
        say: prints one message line (what was sent to whom, what survived).
        clock / sleep: monotonic seconds and sleeping (injectable).

    Returns:
        The pids still running KILL_WAIT_S seconds after SIGKILL (normally none), or those that could
        not be signalled (permission).
    """
    sent, refused = [], []
    for pid in pids:
        try:
            os.kill(pid, signal.SIGTERM)
            sent.append(pid)
        except ProcessLookupError:
            say(f"process {pid} had already exited")
        except PermissionError:
            say(f"not allowed to send SIGTERM to process {pid}; stop it by hand")
            refused.append(pid)
    if not sent:
        return refused
    say(f"sent SIGTERM to {_processes(sent)}; SIGKILL follows after {grace_s:g} s if still running")
    left = _wait_gone(sent, grace_s, clock, sleep)
    if not left:
        return refused
    killed = []
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)
        except ProcessLookupError:
            pass  # it exited just now
        except PermissionError:
            say(f"not allowed to send SIGKILL to process {pid}; stop it by hand")
            refused.append(pid)
    if killed:
        say(f"{_processes(killed)} still running {grace_s:g} s after SIGTERM: sent SIGKILL")
    survivors = _wait_gone(killed, KILL_WAIT_S, clock, sleep)
    if survivors:
        say(
            f"{_processes(survivors)} still running {KILL_WAIT_S:g} s after SIGKILL (stuck in the kernel?); "
            "stop it by hand"
        )
    return refused + survivors


def _wait_gone(
    pids: Sequence[int], seconds: float, clock: Callable[[], float], sleep: Callable[[float], None]
) -> list[int]:
    """Wait up to `seconds` for every pid to exit; return those still running."""
    deadline = clock() + seconds
    left = [pid for pid in pids if is_alive(pid)]
    while left and clock() < deadline:
        sleep(min(POLL_S, max(0.0, deadline - clock())))
        left = [pid for pid in left if is_alive(pid)]
    return left


__all__ = ["DEFAULT_GRACE_S", "KILL_WAIT_S", "run_dir_pids", "stop_processes"]

"""Signals that end `grpolab bisect` the way Ctrl-C does: SIGTERM (`timeout`, a scheduler) and SIGHUP
(a closed terminal) raise `Interrupted`, so the running commit's process group is killed, its worktree
removed and report.json written (as `core.interrupts.interrupt_on_sigterm` does for `grpolab train`).
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

from grpolab.core.interrupts import SignalHandler

SIGNALS = (signal.SIGTERM, signal.SIGHUP)
"""Turned into `Interrupted` while a bisection runs (SIGINT already raises KeyboardInterrupt)."""


class Interrupted(KeyboardInterrupt):
    """SIGTERM or SIGHUP arrived; `signum` is the signal's number (exit code 128 + signum)."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"signal {signum}")
        self.signum = signum


def exit_code(exc: KeyboardInterrupt) -> int:
    """128 + the signal's number: 143 for SIGTERM, 129 for SIGHUP, 130 for Ctrl-C (SIGINT)."""
    return 128 + (exc.signum if isinstance(exc, Interrupted) else int(signal.SIGINT))


def interrupt_on_signals() -> dict[int, SignalHandler]:
    """Install the handlers of `SIGNALS`; returns the ones replaced ({} off the main thread)."""

    def handler(signum: int, frame: FrameType | None) -> None:
        raise Interrupted(signum)

    if threading.current_thread() is not threading.main_thread():
        return {}
    return {int(s): signal.signal(s, handler) for s in SIGNALS}


def restore_signals(previous: dict[int, SignalHandler]) -> None:
    """Put back the handlers `interrupt_on_signals` replaced."""
    for signum, old in previous.items():
        if old is not None:
            signal.signal(signum, old)


@contextmanager
def signals_held() -> Iterator[None]:
    """Block SIGINT and `SIGNALS` while cleaning up (a worktree's removal is not cut short); a signal
    that arrived meanwhile is delivered when the block ends."""
    held = {signal.SIGINT, *SIGNALS}
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, held)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)

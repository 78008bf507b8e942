"""SIGTERM during a run: an interrupt the loop can end cleanly on, and silence while it writes its end.

`grpolab train` turns SIGTERM (`timeout`, a scheduler, torchrun stopping its ranks) into a
KeyboardInterrupt so the run directory gets its final `status` event; the handler it replaced comes
back when the run ends, so a library caller (or a test process) keeps its own.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable
from types import FrameType
from typing import Any

SignalHandler = Callable[[int, FrameType | None], Any] | int | None
"""What `signal.signal` takes and returns: a function, SIG_DFL/SIG_IGN, or None (not set from Python)."""


def interrupt_on_sigterm() -> SignalHandler:
    """Treat SIGTERM (`timeout`, a scheduler) like Ctrl-C, so the final status event is written.

    Returns the handler it replaced (None off the main thread, where signals cannot be set), for
    `restore_sigterm` when the run ends: a library caller's own handler comes back.
    """

    def handler(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    if threading.current_thread() is not threading.main_thread():
        return None
    return signal.signal(signal.SIGTERM, handler)


def hold_sigterm() -> None:
    """Swallow SIGTERM while a failed or interrupted run writes its error and final status.

    On a multi-rank failure torchrun sends SIGTERM to the surviving ranks as soon as one exits; a
    second KeyboardInterrupt raised inside the failure path would leave `ranks/<r>.json` without its
    error and events.jsonl without its `status` event (exit 130 instead of 1). A Python handler, not
    SIG_IGN: an ignored signal would stay ignored in every process started afterwards.
    """
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, lambda signum, frame: None)


def restore_sigterm(previous: SignalHandler) -> None:
    """Put back the SIGTERM handler `interrupt_on_sigterm` replaced (no-op off the main thread)."""
    if previous is not None and threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, previous)

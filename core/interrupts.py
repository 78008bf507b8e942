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


class SignalInterrupt(KeyboardInterrupt):
    """The KeyboardInterrupt a signal other than SIGINT raised in the main thread; `signum` says which,
    so the command can exit 128 + its number (143 after SIGTERM), as a shell reports a process the
    signal ended."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"signal {signum}")
        self.signum = signum


def interrupt_exit_code(exc: KeyboardInterrupt) -> int:
    """The exit code of a command ended by `exc`: 128 + the signal's number (130 for Ctrl+C, 143 for
    SIGTERM), the shell's convention, which every grpolab command follows."""
    return 128 + getattr(exc, "signum", signal.SIGINT)


HELD = (signal.SIGTERM, signal.SIGINT)
"""The signals a run ends on (SIGTERM turned into an interrupt, SIGINT is Ctrl+C), held while it ends."""


def interrupt_on_sigterm() -> dict[int, SignalHandler]:
    """Treat SIGTERM (`timeout`, a scheduler) like Ctrl-C, so the final status event is written.

    Returns the handlers of `HELD` as they were (empty off the main thread, where signals cannot be
    set), for `restore_handlers` when the run ends: a library caller's own handlers come back.
    """

    def handler(signum: int, frame: FrameType | None) -> None:
        raise SignalInterrupt(signum)

    if threading.current_thread() is not threading.main_thread():
        return {}
    previous = {s: signal.getsignal(s) for s in HELD}
    signal.signal(signal.SIGTERM, handler)
    return previous


def hold_interrupts() -> dict[int, SignalHandler]:
    """Swallow SIGTERM and SIGINT while a failed or interrupted run writes its error and final status.

    On a multi-rank failure torchrun sends SIGTERM to the surviving ranks as soon as one exits, and on
    Ctrl+C it sends its ranks SIGINT again while they stop: a second KeyboardInterrupt raised inside the
    ending path would leave `ranks/<r>.json` without its error, events.jsonl without its `status` event,
    or print a traceback after the run's last line. Python handlers, not SIG_IGN: an ignored signal
    would stay ignored in every process started afterwards. Returns the handlers it replaced (empty
    off the main thread), for `restore_handlers`.
    """
    if threading.current_thread() is not threading.main_thread():
        return {}
    previous = {s: signal.getsignal(s) for s in HELD}
    for s in HELD:
        signal.signal(s, lambda signum, frame: None)
    return previous


def restore_handlers(previous: dict[int, SignalHandler]) -> None:
    """Put back the handlers `interrupt_on_sigterm` or `hold_interrupts` replaced (no-op off the main thread)."""
    if threading.current_thread() is not threading.main_thread():
        return
    for s, handler in previous.items():
        if handler is not None:
            signal.signal(s, handler)

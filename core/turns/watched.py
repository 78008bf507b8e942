"""The event loop of a rollout's user coroutines (tool calls, custom generate functions, agent episodes),
run where a watchdog sees it blocked.

`--agent-timeout` bounds each call by `asyncio.wait` (core/turns/tools.call_within), which needs the event
loop to run: an `async def` function that blocks it (`time.sleep`, a synchronous HTTP client, a long
computation) stops every episode and every timer, so no call ever times out and the run hangs. Here the
loop runs in its own thread while the caller's thread sends it a heartbeat; a loop that does not answer
for `--agent-timeout` seconds fails the run, naming the call that was running (its task is named after
the sample) and the user's file:line where it blocks. The blocked thread is a daemon: it ends with the
process.
"""

from __future__ import annotations

import asyncio
import sys
import sysconfig
import threading
import time
from collections.abc import Coroutine
from pathlib import Path
from types import FrameType
from typing import Any

_POLL = 0.05
"""Seconds between heartbeats (a loop that answers costs one callback per beat)."""
_LIBRARY_ROOTS = tuple(
    str(Path(p).resolve()) for p in {sysconfig.get_paths()["stdlib"], sysconfig.get_paths()["purelib"]}
)


STOP_GRACE_S = 5.0
"""Seconds an interrupted caller waits for the cancelled episodes to end (their `finally` blocks: a
session's DELETE) before the interrupt goes on; a blocked loop cannot cancel, and is left to the process."""


class LoopBlocked(RuntimeError):
    """A coroutine blocked the event loop for longer than `--agent-timeout` (the message names it)."""


def _user_frame(frame: FrameType | None) -> FrameType | None:
    """The innermost frame of the user's code in a stack (not the standard library, site-packages or
    grpolab); the innermost frame when none is."""
    innermost = frame
    while frame is not None:
        module = str(frame.f_globals.get("__name__", ""))
        ours = module.startswith("grpolab.") and not module.startswith("grpolab.examples.")
        path = str(Path(frame.f_code.co_filename).resolve())
        if not ours and not path.startswith(_LIBRARY_ROOTS) and "site-packages" not in path:
            return frame
        frame = frame.f_back
    return innermost


def _blocked_message(
    thread: threading.Thread, loop: asyncio.AbstractEventLoop, flag: str, timeout: float
) -> str:
    task = asyncio.current_task(loop)
    what = task.get_name() if task is not None else "a coroutine"
    frame = _user_frame(sys._current_frames().get(thread.ident or -1))
    where = f" at {frame.f_code.co_filename}:{frame.f_lineno} (in {frame.f_code.co_name})" if frame else ""
    return (
        f"{flag}: {what} blocked the event loop for more than --agent-timeout {timeout:g} s{where}: a blocking "
        "call inside `async def` (time.sleep, a synchronous HTTP client, a long computation) stops every "
        "episode and every timeout; await asyncio.sleep or an async client, or run it with asyncio.to_thread"
    )


def _cancel_all(loop: asyncio.AbstractEventLoop | None) -> None:
    """Cancel every task of `loop` from another thread (nothing when it has closed)."""
    if loop is None:
        return

    def cancel() -> None:
        for task in asyncio.all_tasks(loop):
            task.cancel()

    try:
        loop.call_soon_threadsafe(cancel)
    except RuntimeError:  # closed
        pass


def run_watched(main: Coroutine[Any, Any, Any], *, timeout: float, flag: str) -> Any:
    """`asyncio.run(main)`, the loop in a daemon thread answering a heartbeat every 0.05 s.

    Args:
        main: the coroutine (its tasks should be named after the sample they serve).
        timeout: `--agent-timeout`, seconds the loop may go without answering.
        flag: the flag of the user's function, named in the error.

    Raises:
        LoopBlocked: the loop did not answer for `timeout` seconds (see the module docstring).
        KeyboardInterrupt: Ctrl+C or SIGTERM while it runs, after the loop's tasks were cancelled and had
            up to `STOP_GRACE_S` seconds to end.
        Whatever `main` raises.
    """
    box: dict[str, Any] = {}
    started = threading.Event()

    async def wrapped() -> Any:
        box["loop"] = asyncio.get_running_loop()
        started.set()
        return await main

    def target() -> None:
        try:
            box["result"] = asyncio.run(wrapped())
        except BaseException as e:  # handed to the caller's thread
            box["error"] = e
        finally:
            started.set()

    thread = threading.Thread(target=target, name="grpolab-episodes", daemon=True)
    thread.start()
    try:
        started.wait()
        while thread.is_alive():
            beat = threading.Event()
            try:
                box["loop"].call_soon_threadsafe(beat.set)
            except (RuntimeError, KeyError):  # the loop has closed (or never ran): the thread is ending
                thread.join()
                break
            sent = time.monotonic()
            while not beat.wait(_POLL) and thread.is_alive():
                if time.monotonic() - sent > timeout:
                    raise LoopBlocked(_blocked_message(thread, box["loop"], flag, timeout))
            thread.join(_POLL)
    except KeyboardInterrupt:  # Ctrl+C / SIGTERM: the episodes are cancelled (their `finally` runs) first
        _cancel_all(box.get("loop"))
        thread.join(STOP_GRACE_S)
        raise
    if "error" in box:
        raise box["error"]
    return box.get("result")

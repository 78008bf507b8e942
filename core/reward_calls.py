"""Calling the user's reward function: under `--reward-timeout`, and failures that say where.

What it does:
1. `CustomReward` is a `--custom-rm-path` function together with its `--reward-timeout`.
2. `RewardCaller.call` runs one call. Async functions are awaited on the event loop (a timeout
   cancels the coroutine). Sync functions under a timeout run one at a time, in call order, on one
   daemon worker thread per batch (`_SyncWorker`); a call that outlives the timeout is abandoned with
   its thread (Python cannot kill a thread: it keeps running, as a daemon, until the process exits,
   and the run ends with the error). Without a timeout (`--reward-timeout 0`, plain callables and the
   built-in rewards) sync functions run inline on the event loop's thread, the main thread.
3. Every failure of the user's function is a `RewardError` (a RuntimeError: `grpolab train` exits 1,
   status failed) naming the function as `pkg.mod.fn`, the sample index and, when it raised, the
   innermost frame in the function's own file (`file:line in fn: source`) and the frame that raised.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import linecache
import queue
import sys
import threading
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any


class RewardError(RuntimeError):
    """The user's reward function failed: it raised, timed out, or returned NaN/inf or a non-number."""


class RewardTimeout(RewardError):
    """A reward call did not return within `--reward-timeout` seconds."""


@dataclass(frozen=True)
class CustomReward:
    """A `--custom-rm-path` function and the `--reward-timeout` its calls run under.

    Calling it calls `fn` directly (no timeout); `score_samples` applies the timeout.

    Attributes:
        fn: the imported callable, sync or async.
        timeout: seconds one call may take, or None to wait forever (sync calls then run inline).
    """

    fn: Callable[..., Any]
    timeout: float | None = None

    def __call__(self, argument: Any) -> Any:
        return self.fn(argument)


def _target(fn: Callable[..., Any]) -> Any:
    """The function behind wrappers: CustomReward, functools.partial, decorators (`__wrapped__`)."""
    while True:
        if isinstance(fn, CustomReward):
            fn = fn.fn
        elif isinstance(fn, functools.partial):
            fn = fn.func
        elif hasattr(fn, "__wrapped__"):
            fn = fn.__wrapped__
        else:
            return fn if inspect.isroutine(fn) or inspect.isclass(fn) else type(fn)


def function_name(fn: Callable[..., Any]) -> str:
    """`pkg.mod.fn` of a reward function (`pkg.mod.Class` for a callable object)."""
    target = _target(fn)
    module = getattr(target, "__module__", None)
    name = getattr(target, "__qualname__", None) or getattr(target, "__name__", None) or repr(target)
    return f"{module}.{name}" if module else name


def is_async(fn: Callable[..., Any]) -> bool:
    """True for `async def` functions (also behind a partial or as a callable object's `__call__`)."""
    target = fn.fn if isinstance(fn, CustomReward) else fn
    if inspect.iscoroutinefunction(target):
        return True
    return (
        callable(target)
        and not inspect.isroutine(target)
        and inspect.iscoroutinefunction(type(target).__call__)
    )


def _module_file(fn: Callable[..., Any]) -> Path | None:
    module = sys.modules.get(getattr(_target(fn), "__module__", None) or "")
    file = getattr(module, "__file__", None)
    return Path(file).resolve() if file else None


def _frame_text(frame: traceback.FrameSummary) -> str:
    line = (frame.line or linecache.getline(frame.filename, frame.lineno or 0)).strip()
    return f"{frame.filename}:{frame.lineno} in {frame.name}" + (f": {line}" if line else "")


def error_location(fn: Callable[..., Any], error: BaseException) -> str:
    """Where `error` came from: ` at FILE:LINE in FUNC: SOURCE` for the innermost frame in the file of
    `fn`'s module (the user's own code), then `; raised in ...` when the raising frame is elsewhere
    (a library the function called). Empty when the traceback has no frames."""
    frames = traceback.extract_tb(error.__traceback__)
    if not frames:
        return ""
    own_file = _module_file(fn)
    own = [f for f in frames if own_file is not None and Path(f.filename).resolve() == own_file]
    innermost = frames[-1]
    if not own:
        return f" raised in {_frame_text(innermost)}"
    text = f" at {_frame_text(own[-1])}"
    return text if own[-1] is innermost else f"{text}; raised in {_frame_text(innermost)}"


class _SyncWorker:
    """One daemon thread running sync reward calls one at a time, in submission order.

    Each call reports its start and its outcome to the event loop through futures; after `stop()`
    (or once the loop is closed) queued calls are skipped and the thread ends. A call that never
    returns keeps the thread; being a daemon, it does not keep the process alive.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._jobs: queue.SimpleQueue[tuple[Callable[..., Any], Any, asyncio.Future, asyncio.Future]] = (
            queue.SimpleQueue()
        )
        self._stopped = threading.Event()
        threading.Thread(target=self._work, name="grpolab-reward", daemon=True).start()

    def submit(self, fn: Callable[..., Any], argument: Any) -> tuple[asyncio.Future, asyncio.Future]:
        """Queue `fn(argument)`; return (started, done) futures of the loop."""
        started, done = self._loop.create_future(), self._loop.create_future()
        self._jobs.put((fn, argument, started, done))
        return started, done

    def stop(self) -> None:
        self._stopped.set()
        self._jobs.put(None)  # type: ignore[arg-type]  # wakes the thread when it is idle

    def _work(self) -> None:
        while (job := self._jobs.get()) is not None and not self._stopped.is_set():
            fn, argument, started, done = job
            if not self._settle(started, result=None):
                return
            try:
                result = fn(argument)
            except BaseException as error:  # the user's SystemExit too: it fails the call, not the thread
                self._settle(done, error=error)
            else:
                self._settle(done, result=result)

    def _settle(
        self, future: asyncio.Future, *, result: Any = None, error: BaseException | None = None
    ) -> bool:
        """Resolve `future` on the loop's thread; False when the loop is closed (the batch is over)."""

        def settle() -> None:
            if future.done():  # cancelled: its call timed out or the batch failed
                return
            if error is not None:
                future.set_exception(error)
            else:
                future.set_result(result)

        try:
            self._loop.call_soon_threadsafe(settle)
        except RuntimeError:
            return False
        return True


async def within(awaitable: Any, timeout: float, *, name: str | None = None) -> tuple[bool, Any]:
    """(finished, result) of awaiting `awaitable` for at most `timeout` s; cancels it when not finished.
    `name` names its task (what a blocked event loop was running: core/turns/watched.py).

    asyncio.wait is used rather than wait_for so that a TimeoutError the user's code raises is an
    error of the function, never mistaken for our timeout (rewards here, the multi-turn functions in
    core/turns/tools.py)."""
    task = asyncio.ensure_future(awaitable)
    if name is not None:
        task.set_name(name)
    done, _ = await asyncio.wait({task}, timeout=timeout)
    if not done:
        task.cancel()
        return False, None
    return True, task.result()


class RewardCaller:
    """Calls one reward function for one batch; use inside a running event loop, then `close()`."""

    def __init__(self, fn: Callable[..., Any]) -> None:
        """
        Args:
            fn: the reward function; a `CustomReward` brings its timeout, anything else has none.
        """
        self.fn = fn.fn if isinstance(fn, CustomReward) else fn
        self.timeout = fn.timeout if isinstance(fn, CustomReward) else None
        self.name = function_name(fn)
        self._worker: _SyncWorker | None = None
        if self.timeout is not None and not is_async(self.fn):
            self._worker = _SyncWorker(asyncio.get_running_loop())

    def close(self) -> None:
        """Stop the worker thread (a stuck call keeps it; it is a daemon)."""
        if self._worker is not None:
            self._worker.stop()

    async def call(self, argument: Any, *, what: str, context: str) -> Any:
        """`fn(argument)`, awaited when it returns an awaitable; what it returned.

        Args:
            argument: the sample dict (or the group's list of them).
            what: the sample(s) in messages, e.g. "sample index 3" or "sample indices 4..7".
            context: what ends a message, e.g. "response: '...'" (the response, shortened).

        Raises:
            RewardTimeout: no result within the timeout; names the function, `what` and the timeout.
            RewardError: the function raised; names the function, `what`, the exception, where it
                was raised (`error_location`) and `context`; the exception is chained.
        """
        try:
            finished, result = await self._run(argument)
        except (Exception, SystemExit) as error:
            hint = ""
            if isinstance(error, ValueError) and "main thread" in str(error):
                hint = " (sync rewards run on a worker thread under --reward-timeout; 0 runs them on the main thread)"
            raise RewardError(
                f"reward function {self.name} failed on {what} ({type(error).__name__}: {error})"
                f"{error_location(self.fn, error)}{hint}; {context}"
            ) from error
        if not finished:
            where = "its worker thread is abandoned (a thread cannot be killed), " if self._worker else ""
            raise RewardTimeout(
                f"reward function {self.name} did not return within --reward-timeout {self.timeout:g} s "
                f"on {what}; {where}the run ends; {context}"
            )
        return result

    async def _run(self, argument: Any) -> tuple[bool, Any]:
        if self._worker is not None:
            started, done = self._worker.submit(self.fn, argument)
            await started  # the timeout counts from the call's start, not from its place in the queue
            finished, result = await within(done, self.timeout)  # type: ignore[arg-type]
        else:
            finished, result = True, self.fn(argument)
        if finished and inspect.isawaitable(result):
            if self.timeout is None:
                return True, await result
            return await within(result, self.timeout)
        return finished, result

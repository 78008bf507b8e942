"""The trainer's side of a rollout engine: retry while the engine recovers, never forever.

A run whose engine died must not send requests to it for an hour: the Miles 101 manual (section
1.2) shows a run that logged 200,533 "503 Service Unavailable" errors in 63 minutes and never
failed. `EngineClient` wraps any `RolloutEngine`. When a call raises, it polls the engine's
`health()` every `poll_interval` seconds and repeats the call once the engine reports ok again. A
failure shorter than `failure_timeout` seconds (`--engine-failure-timeout`, default 60) is
tolerated; a longer one raises `EngineDeadError`, naming the engine, how long it failed, the last
error and the engine's last log lines.

The failure is timed from the start of the call that failed (or from the engine's last answer, when the
error carries it as `failing_since`: see `_failure_start`), so a call that hung until its own
timeout counts in full: an engine that accepts a request and never answers stops the run within
`failure_timeout` (plus one call's timeout, which `HttpEngine` caps at it), not after a retry on top.

An `EngineGoneError` (the engine's process exited, or it stopped answering: nothing can recover)
raises `EngineDeadError` at once, its message starting `rollout engine '<name>' is gone: ` and what
went (the log doctor's `engine_gone` verdict reads that prefix). Errors that describe the request rather than the engine (`ValueError`, `KeyError`, `TypeError`: an
empty prompt, an unknown tensor name, a shape mismatch) are raised at once, unchanged: repeating
the same request cannot fix them.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

from grpolab.core.engine.base import (
    EngineHealth,
    GenerationRequest,
    GenerationResult,
    RolloutEngine,
    SamplingParams,
)

if TYPE_CHECKING:  # annotations only: preflight reaches this module through the engine factory
    import torch

log = logging.getLogger("grpolab")

T = TypeVar("T")

REQUEST_ERRORS: tuple[type[BaseException], ...] = (ValueError, KeyError, TypeError)
"""Exceptions about the request itself: raised at once, never retried."""

DEFAULT_POLL_INTERVAL_S = 1.0
"""Seconds between health checks while the engine is failing (grpolab's: a 60 s timeout gets about
60 polls, each cheap; the wait is capped by the time left before the timeout)."""

LOG_TAIL_LINES = 10
"""How many of the engine's last log lines `EngineDeadError` quotes."""


class EngineGoneError(RuntimeError):
    """The engine cannot come back (the process grpolab launched for it exited, or it has not answered for
    `--engine-failure-timeout` seconds): `EngineClient` raises `EngineDeadError` at once. The message says
    what went, e.g. "engine 0 (http://127.0.0.1:P) exited (killed by SIGKILL)"."""


class EngineRestarted(RuntimeError):
    """An engine exited and was restarted and checked (--use-fault-tolerance, core/engine/restart.py): the
    call that found it is repeated at once, without waiting for health (the restart checked it); a generate
    call then sends only the requests not yet answered. The message says what went and how it came back."""


class EngineDeadError(RuntimeError):
    """The rollout engine failed for longer than `--engine-failure-timeout` seconds.

    The message is "rollout engine '<name>' failed for S s (--engine-failure-timeout T), ...; last error:
    ..." or, for an engine that is gone (`gone=True`), "rollout engine '<name>' is gone: <what went>";
    then "last engine log lines:" and the lines.

    Attributes:
        engine_name: the engine's `name`.
        failed_for: seconds from the start of the first failed call to giving up.
        last_error: the last exception a call or health check raised, or the last not-ok health; for a
            gone engine, what went (the `EngineGoneError`'s message).
        log_tail: the engine's last log lines, oldest first.
        gone: the engine cannot come back (an `EngineGoneError`), so no retry was tried.
    """

    def __init__(
        self,
        engine_name: str,
        failed_for: float,
        timeout: float,
        last_error: str,
        log_tail: list[str],
        *,
        gone: bool = False,
    ) -> None:
        self.engine_name = engine_name
        self.failed_for = failed_for
        self.last_error = last_error
        self.log_tail = log_tail
        self.gone = gone
        tail = "\n".join(f"  {line}" for line in log_tail) if log_tail else "  (the engine logged nothing)"
        if gone:
            head = f"rollout engine {engine_name!r} is gone: {last_error}"
        else:
            head = (
                f"rollout engine {engine_name!r} failed for {failed_for:.1f} s "
                f"(--engine-failure-timeout {timeout:g}), the run stops instead of retrying forever; "
                f"last error: {last_error}"
            )
        super().__init__(f"{head}\nlast engine log lines:\n{tail}")


class EngineClient:
    """A `RolloutEngine` that forwards every call to `engine`, retrying while the engine recovers.

    Args:
        engine: the engine to call.
        failure_timeout: seconds of failed calls and not-ok health checks after which a call raises
            `EngineDeadError` (`--engine-failure-timeout`); must be > 0.
        poll_interval: seconds between health checks while failing (capped by the time left); > 0.
        clock: monotonic seconds (injectable for tests).
        sleep: sleeps for the given seconds (injectable for tests).

    Raises:
        ValueError: a non-positive `failure_timeout` or `poll_interval`.
    """

    def __init__(
        self,
        engine: RolloutEngine,
        *,
        failure_timeout: float,
        poll_interval: float = DEFAULT_POLL_INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if not failure_timeout > 0:
            raise ValueError(f"--engine-failure-timeout must be > 0 seconds, got {failure_timeout}")
        if not poll_interval > 0:
            raise ValueError(f"poll_interval must be > 0 seconds, got {poll_interval}")
        self.engine = engine
        self.failure_timeout = failure_timeout
        self.poll_interval = poll_interval
        self._clock, self._sleep = clock, sleep

    @property
    def name(self) -> str:
        """The wrapped engine's name."""
        return _engine_name(self.engine)

    @property
    def wrapped(self) -> RolloutEngine:
        """The engine every call is forwarded to (`base.capability` looks there for optional capabilities)."""
        return self.engine

    # ------------------------------------------------------------------ the protocol
    def generate(self, requests: list[GenerationRequest], params: SamplingParams) -> list[GenerationResult]:
        """`engine.generate`, retried while the engine recovers (raises `EngineDeadError`)."""
        return self._call("generate", lambda: self.engine.generate(requests, params))

    def update_weights(self, named_tensors: list[tuple[str, torch.Tensor]], *, weight_version: int) -> int:
        """`engine.update_weights` (one bucket), retried while the engine recovers."""
        return self._call(
            "update_weights", lambda: self.engine.update_weights(named_tensors, weight_version=weight_version)
        )

    def release_memory(self) -> None:
        """`engine.release_memory`, retried while the engine recovers."""
        self._call("release_memory", self.engine.release_memory)

    def resume_memory(self) -> None:
        """`engine.resume_memory`, retried while the engine recovers."""
        self._call("resume_memory", self.engine.resume_memory)

    def flush_cache(self) -> None:
        """`engine.flush_cache`, retried while the engine recovers."""
        self._call("flush_cache", self.engine.flush_cache)

    def health(self) -> EngineHealth:
        """One health check, no retry; an exception from the engine reads as not ok (detail: the error)."""
        try:
            return self._probe()
        except EngineGoneError as e:
            return EngineHealth(ok=False, weight_version=-1, memory_released=False, detail=_describe(e))

    def log_tail(self, n: int = 20) -> list[str]:
        """The wrapped engine's last `n` log lines; a note instead when it cannot give them."""
        try:
            return list(self.engine.log_tail(n))
        except Exception as e:  # only used in error messages: never hide the real error
            return [f"(no log from the engine: {_describe(e)})"]

    # ------------------------------------------------------------------ retrying
    def _call(self, what: str, fn: Callable[[], T]) -> T:
        """Run `fn`; on an engine failure wait for health ok and repeat, until `failure_timeout`."""
        first_failure: float | None = None
        while True:
            started = self._clock()
            try:
                result = fn()
            except REQUEST_ERRORS:
                raise
            except EngineGoneError as e:
                start = _failure_start(started, e) if first_failure is None else first_failure
                raise self._gone(e, what, start) from None
            except EngineRestarted as e:  # bounded: each one used a restart of --max-engine-restarts
                log.warning(f"rollout engine {self.name!r}: {e}; repeating {what}")
                continue
            except Exception as e:
                last_error = f"{what} raised {_describe(e)}"
                if first_failure is None:
                    first_failure = _failure_start(started, e)
                    log.warning(
                        f"rollout engine {self.name!r}: {last_error}; waiting up to "
                        f"{self.failure_timeout:g} s (--engine-failure-timeout) for it to recover"
                    )
                try:
                    self._wait_until_healthy(first_failure, last_error)
                except EngineGoneError as gone:  # a health check found the process exited
                    raise self._gone(gone, what, first_failure) from None
                continue
            if first_failure is not None:
                log.warning(
                    f"rollout engine {self.name!r} recovered: {what} succeeded "
                    f"{self._clock() - first_failure:.1f} s after the first failure"
                )
            return result

    def _gone(self, error: EngineGoneError, what: str, start: float) -> EngineDeadError:
        """The `EngineDeadError` (gone=True) for an engine that cannot come back, failing since `start`."""
        return EngineDeadError(
            self.name, self._clock() - start, self.failure_timeout,
            f"{error} (during {what}; it cannot come back)", self.log_tail(LOG_TAIL_LINES), gone=True,
        )  # fmt: skip

    def _probe(self) -> EngineHealth:
        """`health()`, except that an `EngineGoneError` is raised: a gone engine is not waited for."""
        try:
            return self.engine.health()
        except EngineGoneError:
            raise
        except Exception as e:  # a health check reports, it does not raise
            return EngineHealth(ok=False, weight_version=-1, memory_released=False, detail=_describe(e))

    def _wait_until_healthy(self, first_failure: float, call_error: str) -> None:
        """Poll the engine's health until ok; raise `EngineDeadError` once `failure_timeout` has passed.

        The last wait ends exactly at the timeout; a not-ok health check after it raises at once.

        Raises:
            EngineGoneError: a health check found that the engine cannot come back (its process exited).
        """
        health_note = ""
        while True:
            remaining = self.failure_timeout - (self._clock() - first_failure)
            if remaining <= 0:
                break
            last_wait = remaining <= self.poll_interval
            self._sleep(min(self.poll_interval, remaining))
            status = self._probe()
            if status.ok:
                return
            health_note = f"; health: not ok ({status.detail or 'no detail'})"
            if last_wait:
                break
        raise EngineDeadError(
            self.name,
            self._clock() - first_failure,
            self.failure_timeout,
            call_error + health_note,
            self.log_tail(LOG_TAIL_LINES),
        )


def _failure_start(started: float, e: BaseException) -> float:
    """When a failure began: the failed call's start (a call that hung until its timeout failed from its
    start), or earlier, the `failing_since` the error carries: the engine's last answer before it was seen
    silent (`HttpEngine`: an engine killed mid-rollout behind a router that re-sent its requests elsewhere
    fails from then, not from the next call to it, ~14 s later). Both are `clock` seconds (monotonic)."""
    since = getattr(e, "failing_since", None)
    return started if since is None else min(started, since)


def _describe(e: BaseException) -> str:
    return f"{type(e).__name__}: {e}"


def _engine_name(engine: object) -> str:
    return str(getattr(engine, "name", type(engine).__name__))

"""Is each engine still answering while its /generate requests run? A hung engine is a dead one.

A /generate may legitimately take minutes (`--sglang-router-request-timeout-secs`, default 600), so its
own timeout cannot tell a busy engine from a hung one (SIGSTOPped, deadlocked, swapped out: the kernel
still accepts its connections, nothing answers). `LivenessWatch` asks every engine `GET /server_info`
(`PROBE_PATH`: SGLang's scheduler answers it, so a stuck scheduler is seen; `grpolab serve` answers in
~1 ms, also while it decodes) every `PROBE_INTERVAL_S` seconds (a
quarter of the failure timeout when that is shorter, so an engine that answers is never late), each
probe in its own thread so the caller's wait loop never blocks, and raises `EngineGoneError` for an
engine that has not answered 200 for `failure_timeout` seconds (`--engine-failure-timeout`), naming it,
its URL, how long, and its last answer if it gave one (an error status counts as not answering).

Not `/health`: on an idle engine (SGLang's and `grpolab serve`'s) it runs a one-token generation, so a
probe still in flight when the rollout's answers are in made the engine busy, and the
`/release_memory_occupation` that follows a rollout was refused (found by the 2-rank fleet test).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future

from grpolab.core.engine.client import EngineGoneError
from grpolab.core.engine.http_calls import EngineRequestError, HttpCallError, call_json

log = logging.getLogger("grpolab")

PROBE_PATH = "/server_info"
"""What a probe asks (GET): side-effect free, answered by the engine's scheduler."""
PROBE_INTERVAL_S = 1.0
"""Seconds between two `/health` probes of one engine (grpolab's: a probe costs ~1 ms; a hung engine is
declared within `failure_timeout` + this)."""


class LivenessWatch:
    """Probes each engine's `/health` while requests run; `check()` raises for one silent too long.

    Args:
        engine_urls: each engine's "http://HOST:PORT".
        numbers: the engines' numbers in the fleet, for `hung` and messages (default 0, 1, ...: all of
            them; fewer while one restarts).
        failure_timeout: seconds without an answer after which an engine counts as hung; > 0.
        clock: monotonic seconds (injectable for tests).
        probe: one liveness call `(url) -> None`, raising when it fails (default: `GET url` +
            `PROBE_PATH` with `failure_timeout` as its timeout; any answer but a 2xx fails).

    Raises:
        ValueError: a non-positive `failure_timeout`.
    """

    def __init__(
        self,
        engine_urls: list[str],
        *,
        failure_timeout: float,
        numbers: list[int] | None = None,
        clock: Callable[[], float] = time.monotonic,
        probe: Callable[[str], None] | None = None,
    ) -> None:
        if not failure_timeout > 0:
            raise ValueError(f"--engine-failure-timeout must be > 0 seconds, got {failure_timeout}")
        self.urls, self.failure_timeout, self._clock = list(engine_urls), failure_timeout, clock
        self._probe = probe or self._health
        self.numbers = list(numbers) if numbers is not None else list(range(len(self.urls)))
        now = clock()
        self._answered = dict.fromkeys(self.urls, now)  # when each engine last answered (or the watch began)
        self.interval = min(PROBE_INTERVAL_S, failure_timeout / 4)
        self._sent = dict.fromkeys(self.urls, now - self.interval)  # the first probes go out at once
        self._in_flight: dict[str, Future] = {}
        self._last_error: dict[str, str] = {}  # each engine's last failed probe, for the message
        self.hung: int | None = None  # the number (`numbers`) of the engine `check` found hung
        self.answered: dict[str, float] = {}  # each engine's last real answer (clock seconds)
        self.silent: set[str] = set()  # engines whose latest probe failed (warned once each)
        self._closed = False

    def check(self) -> None:
        """Collect finished probes, start due ones, and raise for an engine silent for `failure_timeout` s.

        Raises:
            EngineGoneError: "engine i (URL) has not answered GET /server_info for S s (hung: ...)".
        """
        now = self._clock()
        for i, url in zip(self.numbers, self.urls, strict=True):
            future = self._in_flight.get(url)
            if future is not None and future.done():
                del self._in_flight[url]
                if (error := future.exception()) is None:
                    self._answered[url] = max(self._answered[url], future.result())
                    self.answered[url] = self._answered[url]
                    self.silent.discard(url)
                else:
                    self._note_silent(i, url, error)
            silent = now - self._answered[url]
            if silent >= self.failure_timeout:
                self.hung = i
                raise EngineGoneError(
                    f"engine {i} ({url}) has not answered GET {PROBE_PATH} for {silent:.1f} s (hung: "
                    f"--engine-failure-timeout {self.failure_timeout:g} treats it as dead)"
                    + self._last_error.get(url, "")
                )
            if url not in self._in_flight and now - self._sent[url] >= self.interval:
                self._sent[url] = now
                self._in_flight[url] = self._start_probe(url)

    def _note_silent(self, i: int, url: str, error: BaseException) -> None:
        """Warn once when engine `i` stops answering (a kill -9'd engine behind a router that re-sends its
        requests elsewhere: the rollout goes on, and the console said nothing until the next call to it)."""
        if isinstance(error, HttpCallError) and error.status is not None:
            self._last_error[url] = f"; its last answer: HTTP {error.status}: {error.text}"
        elif isinstance(error, EngineRequestError):
            self._last_error[url] = f"; its last answer: {error}"
        if url not in self.silent:
            self.silent.add(url)
            log.warning(
                f"engine {i} ({url}) stopped answering GET {PROBE_PATH} ({error}); the run fails if it stays "
                f"silent for {self.failure_timeout:g} s (--engine-failure-timeout)"
            )

    def close(self) -> None:
        """Stop watching: no probe starts after this; one in flight ends at its own timeout, in a daemon
        thread (a ThreadPoolExecutor's are joined at exit: a probe of a hung engine of an already running
        fleet held the trainer's exit for up to --engine-failure-timeout after the run had failed)."""
        self._closed = True

    def _start_probe(self, url: str) -> Future:
        """The probe of `url` in a daemon thread; its Future gives the answer time or the error."""
        future: Future = Future()

        def probe() -> None:
            try:
                future.set_result(self._timed_probe(url))
            except BaseException as e:  # handed to check(), which reads it as "not answering"
                future.set_exception(e)

        if not self._closed:
            threading.Thread(target=probe, name=f"liveness {url}", daemon=True).start()
        return future

    def _timed_probe(self, url: str) -> float:
        """The probe; returns when it was answered (the clock's seconds)."""
        self._probe(url)
        return self._clock()

    def _health(self, url: str) -> None:
        call_json("GET", url + PROBE_PATH, None, timeout=self.failure_timeout)  # raises unless 2xx


class LastAnswers:
    """When each engine last answered (`time.monotonic` seconds), and which a liveness probe has found silent
    since: a failed call to such an engine failed from its last answer, not from the call (an engine killed
    mid-rollout behind a router that re-sends its requests elsewhere is only called again ~14 s later)."""

    def __init__(self) -> None:
        self._at: dict[str, float] = {}
        self._silent: set[str] = set()

    def take(self, watch: LivenessWatch | None) -> None:
        """Note `watch`'s probe answers (clock: time.monotonic) and the engines it found silent."""
        if watch is None:
            return
        for url, at in watch.answered.items():
            if at > self._at.get(url, float("-inf")):
                self._at[url] = at
                self._silent.discard(url)
        self._silent |= watch.silent

    def failing_since(self, url: str) -> float | None:
        """The engine's last answer when a probe found it silent since (else None: no sign it failed before)."""
        return self._at.get(url) if url in self._silent else None

    def call(self, method: str, url: str, path: str, body: object, *, timeout: float) -> object:
        """`call_json(method, url + path, ...)` to one engine, noting its answer (a 400 is an answer too).

        Raises:
            EngineRequestError: HTTP 400 (as `call_json`).
            HttpCallError: as `call_json`, with `failing_since` set (`failing_since(url)`, read by
                `client.EngineClient`).
        """
        try:
            answer = call_json(method, url + path, body, timeout=timeout)
        except EngineRequestError:
            self._answered(url)
            raise
        except HttpCallError as e:
            e.failing_since = self.failing_since(url)  # type: ignore[attr-defined]
            raise
        self._answered(url)
        return answer

    def _answered(self, url: str) -> None:
        self._at[url] = time.monotonic()
        self._silent.discard(url)

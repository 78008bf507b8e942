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

import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

from grpolab.core.engine.client import EngineGoneError
from grpolab.core.engine.http_calls import EngineRequestError, HttpCallError, call_json

PROBE_PATH = "/server_info"
"""What a probe asks (GET): side-effect free, answered by the engine's scheduler."""
PROBE_INTERVAL_S = 1.0
"""Seconds between two `/health` probes of one engine (grpolab's: a probe costs ~1 ms; a hung engine is
declared within `failure_timeout` + this)."""


class LivenessWatch:
    """Probes each engine's `/health` while requests run; `check()` raises for one silent too long.

    Args:
        engine_urls: each engine's "http://HOST:PORT".
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
        clock: Callable[[], float] = time.monotonic,
        probe: Callable[[str], None] | None = None,
    ) -> None:
        if not failure_timeout > 0:
            raise ValueError(f"--engine-failure-timeout must be > 0 seconds, got {failure_timeout}")
        self.urls, self.failure_timeout, self._clock = list(engine_urls), failure_timeout, clock
        self._probe = probe or self._health
        now = clock()
        self._answered = dict.fromkeys(self.urls, now)  # when each engine last answered (or the watch began)
        self.interval = min(PROBE_INTERVAL_S, failure_timeout / 4)
        self._sent = dict.fromkeys(self.urls, now - self.interval)  # the first probes go out at once
        self._in_flight: dict[str, Future] = {}
        self._last_error: dict[str, str] = {}  # each engine's last failed probe, for the message
        self.hung: int | None = None  # the index of the engine `check` found hung
        self._pool = ThreadPoolExecutor(max_workers=max(1, len(self.urls)), thread_name_prefix="liveness")

    def check(self) -> None:
        """Collect finished probes, start due ones, and raise for an engine silent for `failure_timeout` s.

        Raises:
            EngineGoneError: "engine i (URL) has not answered GET /server_info for S s (hung: ...)".
        """
        now = self._clock()
        for i, url in enumerate(self.urls):
            future = self._in_flight.get(url)
            if future is not None and future.done():
                del self._in_flight[url]
                if (error := future.exception()) is None:
                    self._answered[url] = max(self._answered[url], future.result())
                elif isinstance(error, HttpCallError) and error.status is not None:
                    self._last_error[url] = f"; its last answer: HTTP {error.status}: {error.text}"
                elif isinstance(error, EngineRequestError):
                    self._last_error[url] = f"; its last answer: {error}"
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
                self._in_flight[url] = self._pool.submit(self._timed_probe, url)

    def close(self) -> None:
        """Stop watching (a probe still in flight ends at its own timeout, in the background)."""
        self._pool.shutdown(wait=False, cancel_futures=True)

    def _timed_probe(self, url: str) -> float:
        """The probe; returns when it was answered (the clock's seconds)."""
        self._probe(url)
        return self._clock()

    def _health(self, url: str) -> None:
        call_json("GET", url + PROBE_PATH, None, timeout=self.failure_timeout)  # raises unless 2xx

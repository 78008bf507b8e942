"""How one generate call's requests reach the engines of `http_engine.HttpEngine` (its `FleetSending` part).

Every request is one /generate, all in flight at once over kept-alive connections (`http_pool`). With a
fleet grpolab launched, the call's requests are held (`/pause_generation` in_place) until all reached
the engines (`/server_info`), then released (`/continue_generation`), so one decode takes them all, as
in-process. An engine of several that exits while the requests are out, under --use-fault-tolerance,
leaves the call: it restarts in the background (`restart.Restarter.bring_back_in_background`, checked
before it rejoins the router) while its unanswered requests go to the next engine up as one batch of
their own, decoded as their home engine would have (per-sample seeds: the same answers, bit for bit);
the call ends once it rejoined. When no other engine is left, the restart comes first and the call is
repeated (`client.EngineRestarted`).
"""

from __future__ import annotations

import logging
import time
from concurrent.futures import FIRST_EXCEPTION, Future, wait

from grpolab.core.engine.http_calls import HttpCallError, call_json
from grpolab.core.engine.http_pool import KeepAlivePool

log = logging.getLogger("grpolab")

CONTROL_TIMEOUT_S = 120.0
"""Seconds a control call (weights, memory, cache, checker) may take, at most --engine-failure-timeout
(grpolab's: a bucket of SmolLM2-135M loads in < 1 s on CPU)."""
HEALTH_TIMEOUT_S = 20.0
"""Seconds `/health_generate` or `/server_info` may take, at most --engine-failure-timeout: SGLang's own
SGLANG_HEALTH_CHECK_TIMEOUT (20 s)."""
MAX_IN_FLIGHT = 256
"""Concurrent /generate requests (the kept-alive pool's connections, kept between rollouts; the in-process
engine's max batch is 256 too)."""
GATHER_TIMEOUT_S = 30.0
"""Seconds the paused engines of a launched fleet may take to receive a rollout's requests before they
decode what they hold (grpolab's: 64 requests arrive within ~0.5 s on a busy 2-core machine)."""
RESUME_TIMEOUT_S = 1.0
"""Seconds the best-effort `/continue_generation` after a failed held rollout may take per engine (grpolab
serve answers in ms; one left paused is resumed by the next rollout's own pause/continue): a hung engine
must not add a whole failure timeout to the failure."""
WATCH_INTERVAL_S = 0.5
"""Seconds between checks of the fleet's processes while requests run."""


class FleetSending:
    """The sending part of `HttpEngine` (a mixin: the engine's own state and checks are used as they are).

    It uses the engine's `engine_urls`, `router_url`, `fleet`, `restarter`, `request_timeout_s`,
    `_requests` (the pool), `_sending`, `_retried`, `_kill_when_queued`, `_answers`, `_suspect` and its
    `_check_processes`, `_after_failed_call`, `_watch_liveness`, `_end_watch`, `_rejoin` and `_cap`.
    """

    def _target(self, direct: bool, i: int, *, moved: bool = False) -> str | None:
        """Request `i`'s URL: the router, or with `direct` engine i mod N, its home (the same engine for the
        same request when a call is repeated, so each engine decodes the batch it would have). A home that
        is restarting (`Restarter.underway`) gives None, and with `moved` the next engine up that is not:
        all of one engine's requests go to one other engine, which decodes them as the batch their home
        would have (per-sample seeds: the same answers)."""
        if not direct:
            return self.router_url
        n, out = len(self.engine_urls), self._out()
        home = i % n
        if home not in out:
            return self.engine_urls[home]
        if not moved:
            return None
        return next(self.engine_urls[k % n] for k in range(home + 1, home + n) if k % n not in out)

    def _out(self) -> set[int]:
        """The engines restarting in the background while the others carry their requests."""
        return self.restarter.underway if self.restarter is not None else set()

    def _live_urls(self) -> list[str]:
        out = self._out()
        return [url for k, url in enumerate(self.engine_urls) if k not in out]

    def _went_out(self, error: HttpCallError) -> bool:
        """The failed request went to an engine that is now restarting (through the router: any is)."""
        if error.url.startswith(self.router_url + "/"):
            return bool(self._out())
        return any(error.url.startswith(self.engine_urls[k] + "/") for k in self._out())

    def _send_all(self, bodies: dict[int, dict], direct: bool, answers: dict[int, object]) -> None:
        """POST every body (request index → body; all in flight at once through the kept-alive pool) and put
        each answer in `answers`, by index; fail at the first error or when a fleet process exits. An engine
        of several that exits with --use-fault-tolerance is restarted in the background while its requests
        go to the others (`_send_round`'s lost ones, sent again as one batch) and this call ends once it
        rejoined. A failed rollout drops the pool: its calls still in flight must not delay the retry's."""
        pool = self._requests
        if pool is None or pool.closed:
            pool = self._requests = KeepAlivePool(MAX_IN_FLIGHT)
        ok = False
        self._sending = True
        try:
            lost = self._send_round(pool, bodies, direct, answers, moved=False)
            if lost:
                self._retried.update({i: self._target(direct, i, moved=True) or "" for i in lost})
                self._send_round(pool, {i: bodies[i] for i in lost}, direct, answers, moved=True)
            ok = True
        finally:
            self._sending = False
            self._end_watch()
            if not ok:
                pool.close()
            self._rejoin()

    def _send_round(
        self,
        pool: KeepAlivePool,
        bodies: dict[int, dict],
        direct: bool,
        answers: dict[int, object],
        *,
        moved: bool,
    ) -> set[int]:
        """One round of `_send_all`: the indices whose engine went out (restarting) before answering."""
        gate = self.fleet is not None  # our engines: hold the rollout's requests, then decode them together
        lost: set[int] = set()
        try:
            if gate:
                self._each_live("/pause_generation", {"mode": "in_place"})
            futures: dict[Future, int] = {}
            for i, body in bodies.items():
                url = self._target(direct, i, moved=moved)
                if url is None:
                    lost.add(i)
                    continue
                futures[pool.submit("POST", url + "/generate", body, timeout=self.request_timeout_s)] = i
            if gate:
                self._await_queued(len(futures), pool, list(futures))
                if self._kill_when_queued is not None:  # the kill_engine_in_rollout fault
                    self.fleet.kill(self._kill_when_queued)
                    self._kill_when_queued = None
                    self._check_processes()
                gate = False
                self._each_live("/continue_generation", {})
            pending = set(futures)
            while pending:
                done, pending = wait(pending, timeout=WATCH_INTERVAL_S, return_when=FIRST_EXCEPTION)
                for f in done:
                    if (error := f.exception()) is None:
                        answers[futures[f]] = f.result()
                        continue
                    if isinstance(error, HttpCallError):  # nothing answered: a dead engine first
                        if not self._went_out(error):
                            self._after_failed_call(error)
                        if self._went_out(error):
                            lost.add(futures[f])
                            continue
                    raise error
                self._check_processes()
                self._watch_liveness()
        finally:
            if gate:  # failed while holding: let the engines generate again
                for url in self._live_urls():
                    try:
                        call_json(
                            "POST", url + "/continue_generation", {}, timeout=self._cap(RESUME_TIMEOUT_S)
                        )
                    except (HttpCallError, ValueError):
                        pass
        return lost

    def _each_live(self, path: str, body: object) -> None:
        """POST `path` to every engine not restarting; one that fails because it just went out is skipped."""
        for k, url in enumerate(self.engine_urls):
            if k in self._out():
                continue
            try:
                self._answers.call("POST", url, path, body, timeout=self._cap(CONTROL_TIMEOUT_S))
            except HttpCallError as e:
                self._suspect = k
                self._after_failed_call(e)
                if k not in self._out():
                    raise

    def _await_queued(self, n: int, pool: KeepAlivePool, futures: list[Future]) -> None:
        """Wait until the paused engines hold all `n` requests (`/server_info` of `grpolab serve`, polled
        over `pool`'s kept-alive connection), so that one decode takes them all, as the in-process engine
        does; stop early when one of the requests (`futures`) already failed (the caller raises its
        error), give up after `GATHER_TIMEOUT_S` (at most --engine-failure-timeout)."""
        limit = self._cap(GATHER_TIMEOUT_S)
        deadline = time.monotonic() + limit
        while time.monotonic() < deadline:
            if any(f.done() and f.exception() is not None for f in futures):
                return
            self._check_processes()
            queued = 0
            for url in self._live_urls():
                try:
                    info = (
                        pool.call("GET", url + "/server_info", None, timeout=self._cap(HEALTH_TIMEOUT_S))
                        or {}
                    )
                except HttpCallError as e:
                    self._after_failed_call(e)
                    if url in self._live_urls():
                        raise
                    continue
                states = info.get("internal_states") or [{}]
                queued += int(states[0].get("waiting_requests", 0))
            if queued >= n:
                return
            time.sleep(0.002)  # each poll is one /server_info per engine (~1 ms)
        log.warning(f"only part of the rollout's {n} requests reached the engines within {limit:g} s")

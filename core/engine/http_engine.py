"""The trainer's HTTP engine: a `RolloutEngine` over SGLang's native API, through a router, as Miles does.

Generation: one `/generate` request per sample (as Miles sends them), all sent concurrently to the
router, each with `input_ids`, `sampling_params` (temperature, top_p, top_k (-1 = off),
max_new_tokens, stop_token_ids and the sample's `sampling_seed`, always sent: `grpolab serve`
honours it; a real SGLang only with `--enable-deterministic-inference`), `return_logprob` and, when
top-p/top-k filter the support, `return_sampling_mask`. sglang-router 0.3.2 drops
`return_sampling_mask` on its way to the engine (its request type has no such field; Miles' router
fork forwards it), so such requests go straight to the engines, round-robin by sample. The answer's
`meta_info.output_token_logprobs` triples give the log-probs (float32 values written as JSON
doubles: exact), `finish_reason.type` the finish, `weight_version` the version.

Control calls go to every engine directly (what the router would fan out): weight sync writes each
bucket as safetensors into a fresh directory under /dev/shm (`weight_bucket`) and calls
`/update_weights_from_disk {model_path, weight_version}`; memory goes through
`/release_memory_occupation` / `/resume_memory_occupation` (all tags); `--ci-test`'s checker through
`/weights_checker`. How a generate call's requests reach the engines (held until all arrived, then
decoded together; an engine that exits meanwhile) is `http_sending.FleetSending`'s. Every HTTP call has a
timeout; a failure raises, and `client.EngineClient` retries until `--engine-failure-timeout`. A rollout
more than `HEALTH_FRESH_S` after the last answered one (or after a failure) first needs every engine to
pass `/health_generate` (Miles' health monitor). While requests run, an engine process of the fleet that
exits fails the call at once instead of waiting for the request timeout, and since a launched process
cannot come back, as `client.EngineGoneError`: the run fails at once, not after --engine-failure-timeout
(with --use-fault-tolerance it is restarted and checked first, `restart.py`). No health, control or info
call waits longer than --engine-failure-timeout, and while /generate requests run (legitimately long)
`liveness.LivenessWatch` probes every engine's `/server_info`; one
that has not answered for --engine-failure-timeout seconds is hung, and fails the call as gone (named, URL).
"""

from __future__ import annotations

import itertools
import logging
import time
import uuid

import torch

from grpolab.core.engine.base import (
    EngineHealth,
    GenerationRequest,
    GenerationResult,
    SamplingParams,
    TensorMismatch,
)
from grpolab.core.engine.client import EngineGoneError, EngineRestarted
from grpolab.core.engine.fleet import Fleet
from grpolab.core.engine.http_calls import MAX_QUOTED, EngineRequestError, HttpCallError
from grpolab.core.engine.http_pool import KeepAlivePool
from grpolab.core.engine.http_sending import CONTROL_TIMEOUT_S, HEALTH_TIMEOUT_S, FleetSending
from grpolab.core.engine.liveness import LastAnswers, LivenessWatch
from grpolab.core.engine.restart import CallAnswers, Restarter, RestartRecord, WeightSource
from grpolab.core.engine.sglang_api import generate_body, parse_generate_answer, parse_mismatches, request_rid
from grpolab.core.engine.weight_bucket import bucket_on_disk

log = logging.getLogger("grpolab")

HEALTH_FRESH_S = 30.0
"""Seconds after a rollout's last answer during which the next rollout skips `/health_generate` (Miles'
health monitor probes every --rollout-health-check-interval, 30 s; a dead engine still fails the rollout
through the process check, its requests' errors and the liveness watch)."""
EXIT_GRACE_S = 1.0
"""Seconds a failed call waits for a fleet process to be seen as exited before it is reported as an
HTTP failure (a kill -9'd engine resets its connections a moment before its parent can reap it)."""


class HttpEngine(FleetSending):
    """SGLang-API engines behind a router, seen as one `RolloutEngine` (plus the checker, stats, stop).

    Args:
        router_url: "http://HOST:PORT" of the router (every /generate goes there).
        engine_urls: each engine's "http://HOST:PORT" (control calls, health, sampling-mask requests).
        fleet: the processes grpolab launched (None for an already running fleet: left running at close).
        request_timeout_s: seconds one /generate request may take (`--sglang-router-request-timeout-secs`).
        failure_timeout_s: `--engine-failure-timeout`: the longest any other call may wait, and how long
            an engine may leave `/server_info` unanswered while its requests run before it is hung.

    Raises:
        ValueError: no engine URL, or a non-positive `failure_timeout_s`.
    """

    def __init__(
        self,
        *,
        router_url: str,
        engine_urls: list[str],
        fleet: Fleet | None,
        request_timeout_s: float,
        failure_timeout_s: float = 60.0,
    ) -> None:
        if not engine_urls:
            raise ValueError(f"the router at {router_url} has no engines registered (GET /workers is empty)")
        if not failure_timeout_s > 0:
            raise ValueError(f"--engine-failure-timeout must be > 0 seconds, got {failure_timeout_s}")
        self.router_url, self.engine_urls, self.fleet = router_url, list(engine_urls), fleet
        self.request_timeout_s, self.failure_timeout_s = request_timeout_s, failure_timeout_s
        self._watch: LivenessWatch | None = None  # while /generate requests run
        self.weight_version = 0
        self.memory_released = False
        self._stopped: str | None = None
        self._stats = {"tokens": 0.0, "seconds": 0.0, "tokens_per_s": 0.0}
        self._suspect: int | None = None  # the engine that failed last, for log_tail
        self._session = uuid.uuid4().hex[:12]  # rids: unique per engine object, numbered per call
        self._calls = itertools.count()
        self._requests: KeepAlivePool | None = None  # /generate calls (kept-alive; see _send_all)
        self._answered_at: float | None = None  # when the last rollout's requests were all answered
        self._answers = LastAnswers()  # when each engine last answered (failures are timed from there)
        self.restarter: Restarter | None = None  # --use-fault-tolerance (`enable_fault_tolerance`)
        self._partial = CallAnswers()  # the running generate call's answers, by request index
        self._sending = False  # a generate call's requests are out (`_send_all`)
        self._control = CallAnswers()  # the running control call's answers, by engine URL
        self._retried: dict[int, str] = {}  # a restarting engine's requests: index → the URL they went to
        self._kill_when_queued: int | None = None  # the kill_engine_in_rollout fault: this engine

    @property
    def name(self) -> str:
        """e.g. "sglang fleet (2 engines behind http://127.0.0.1:30000)"."""
        n = len(self.engine_urls)
        return f"sglang fleet ({n} engine{'s' if n != 1 else ''} behind {self.router_url})"

    @property
    def last_stats(self) -> dict[str, float]:
        """`tokens`, `seconds`, `tokens_per_s` of the last `generate` (0 before any)."""
        return dict(self._stats)

    # ------------------------------------------------------------------ generation
    def generate(self, requests: list[GenerationRequest], params: SamplingParams) -> list[GenerationResult]:
        """One concurrent /generate per request, results in request order.

        Raises:
            EngineRequestError: an engine answered 400 (its error quoted).
            HttpCallError / RuntimeError: an engine or the router failed, or a fleet process exited.
        """
        self._check_usable()
        key = (params, [(r.prompt_ids, r.seed) for r in requests])
        # the answers of this same call before it failed (the client repeats it), kept until it succeeds:
        # what was answered before an engine died is not asked again
        kept = self._partial.begin(key)
        self._check_health_unless_fresh()
        start = time.perf_counter()
        call = next(self._calls)
        todo = [i for i in range(len(requests)) if i not in kept]
        bodies = {
            i: generate_body(requests[i], params, rid=request_rid(self._session, call, i)) for i in todo
        }
        if self.restarter is not None:  # the first call after a restart: what it sends again
            self.restarter.count_retried(key, len(todo))
        self._send_all(bodies, params.filters_support, kept)
        self._partial.end()
        results = [parse_generate_answer(kept[i], params, self.weight_version) for i in range(len(requests))]
        seconds = time.perf_counter() - start
        tokens = float(sum(len(r.response_ids) for r in results))
        self._stats = {"tokens": tokens, "seconds": seconds, "tokens_per_s": tokens / max(seconds, 1e-9)}
        self._answered_at = time.monotonic()
        return results

    def _check_health_unless_fresh(self) -> None:
        """`check_health` (a generation on every engine), unless the last rollout's requests were all
        answered less than `HEALTH_FRESH_S` ago: then only the fleet's processes are checked (as Miles,
        whose health monitor probes between rollouts, not in their path). Any failure since (a call
        that raised) clears that, so the rollout after a failure checks every engine first."""
        answered, self._answered_at = self._answered_at, None  # set again once this rollout succeeds
        if answered is not None and time.monotonic() - answered < HEALTH_FRESH_S:
            self._check_processes()
            return
        self.check_health()

    # ------------------------------------------------------------------ weights and memory
    def update_weights(self, named_tensors: list[tuple[str, torch.Tensor]], *, weight_version: int) -> int:
        """Write the bucket as safetensors (tmpfs, `weight_bucket`) and load it into every engine as
        `weight_version`."""
        self._check_usable()
        with bucket_on_disk(named_tensors) as folder:
            body = {"model_path": str(folder), "weight_version": str(weight_version)}
            for answer in self._each_engine("POST", "/update_weights_from_disk", body):
                if not (isinstance(answer, dict) and answer.get("success")):
                    raise RuntimeError(f"/update_weights_from_disk did not succeed: {answer!r}")
        self.weight_version = weight_version
        return weight_version

    def release_memory(self) -> None:
        """`/release_memory_occupation` (all tags) on every engine."""
        self._check_usable()
        self._each_engine("POST", "/release_memory_occupation", {})
        self.memory_released = True

    def resume_memory(self) -> None:
        """`/resume_memory_occupation` (all tags) on every engine."""
        self._check_usable()
        self._each_engine("POST", "/resume_memory_occupation", {})
        self.memory_released = False

    def flush_cache(self) -> None:
        """`/flush_cache` on every engine (SGLang refuses while requests run: raised as a failure, retried)."""
        self._check_usable()
        try:
            self._each_engine("POST", "/flush_cache", None)
        except EngineRequestError as e:
            raise RuntimeError(str(e)) from None

    def weights_checker(self, action: str, *, seed: int = 0) -> list[TensorMismatch]:
        """SGLang's `/weights_checker` on every engine; "compare" lists the differing tensors it names.

        A failed compare names the tensors its quoted 400 lists in full (the server lists 10, the quote keeps
        `MAX_QUOTED` characters); the others count as `sglang_api.UNNAMED` entries (see `parse_mismatches`).

        Raises:
            ValueError: an unknown action, or "compare" before "snapshot" (the engine's error quoted).
        """
        if action not in ("snapshot", "reset_tensors", "compare", "checksum"):
            raise ValueError(f"unknown weights_checker action {action!r}")
        self._check_usable()
        mismatches: list[TensorMismatch] = []
        for i, url in enumerate(self.engine_urls):
            try:
                self._answers.call(
                    "POST", url, "/weights_checker", {"action": action}, timeout=self._cap(CONTROL_TIMEOUT_S)
                )
            except EngineRequestError as e:
                if action != "compare" or "differ from the snapshot" not in str(e):
                    raise
                mismatches += parse_mismatches(str(e), engine=i, quoted=MAX_QUOTED)
        return mismatches

    # ------------------------------------------------------------------ fault tolerance
    def enable_fault_tolerance(self, source: WeightSource, *, max_restarts: int) -> None:
        """--use-fault-tolerance: restart a launched engine that exits (`restart.Restarter`: loaded from
        `source` and checked before it rejoins the router) instead of failing the call.

        Raises:
            ValueError: this engine did not launch its fleet (an already running one cannot be restarted),
                or `max_restarts` < 1.
        """
        if self.fleet is None:
            raise ValueError(
                "--use-fault-tolerance needs --rollout-num-engines: grpolab restarts only engines it launched"
            )
        self.restarter = Restarter(self.fleet, max_restarts=max_restarts, source=source)

    def take_restarts(self) -> list[RestartRecord] | None:
        """The restarts since the last call; None without --use-fault-tolerance."""
        return self.restarter.take() if self.restarter is not None else None

    def kill_engine(self, i: int, *, when_queued: bool = False) -> None:
        """The kill_engine_* faults: SIGKILL engine `i` now, or once the next call's requests reached the engines.

        Raises:
            ValueError: this engine did not launch its fleet, or has no engine `i`.
        """
        if self.fleet is None or not 0 <= i < len(self.fleet.engines):
            raise ValueError(f"no launched engine {i} to kill (--rollout-num-engines launches the fleet)")
        if when_queued:
            self._kill_when_queued = i
        else:
            self.fleet.kill(i)

    # ------------------------------------------------------------------ health, logs, stop
    def check_health(self) -> None:
        """Every fleet process alive and every engine's `/health_generate` 200 (raises otherwise)."""
        self._check_processes()
        for i, url in enumerate(self.engine_urls):
            try:
                self._answers.call("GET", url, "/health_generate", None, timeout=self._cap(HEALTH_TIMEOUT_S))
            except (HttpCallError, EngineRequestError) as e:
                self._suspect = i
                self._after_failed_call(e if isinstance(e, HttpCallError) else None)
                failed = RuntimeError(f"engine {i} ({url}) failed its health check: {e}")
                failed.failing_since = getattr(e, "failing_since", None)  # type: ignore[attr-defined]
                raise failed from None

    def health(self) -> EngineHealth:
        """ok when every engine answers `/health_generate`; the detail names the first that does not.

        Raises:
            EngineGoneError: a process of the fleet grpolab launched has exited (it cannot come back).
        """
        try:
            if self._stopped:
                raise RuntimeError(f"the engines were stopped: {self._stopped}")
            self.check_health()
        except EngineGoneError:
            raise  # a launched process that exited: EngineClient stops waiting for it
        except RuntimeError as e:
            return EngineHealth(
                ok=False, weight_version=-1, memory_released=self.memory_released, detail=str(e)
            )
        return EngineHealth(ok=True, weight_version=self.weight_version, memory_released=self.memory_released)

    def log_tail(self, n: int = 20) -> list[str]:
        """The last log lines of the engine that failed (else engine 0), then the router's last 3 ERROR/WARN
        lines about that engine's URL (what explains the failure), or a line saying it logged none."""
        if self.fleet is None:
            return [
                f"(an already running fleet: the engines' logs are where they run; router {self.router_url})"
            ]
        return self.fleet.failure_log(self._suspect or 0, n)

    def shutdown(self, reason: str = "shutdown() was called") -> None:
        """Stop the engines grpolab launched (an external fleet keeps running); later calls fail."""
        self._stopped = reason
        self.close()

    def close(self) -> None:
        """End the processes grpolab launched and the kept-alive connections (idempotent); an external
        fleet keeps running."""
        if self._requests is not None:
            self._requests.close()
        if self.fleet is not None:
            self.fleet.close()

    # ------------------------------------------------------------------ helpers
    def _check_usable(self) -> None:
        if self._stopped:
            raise RuntimeError(f"the engines were stopped: {self._stopped}")

    def _cap(self, timeout_s: float) -> float:
        """`timeout_s`, at most --engine-failure-timeout: no call may wait longer than a dead engine may."""
        return min(timeout_s, self.failure_timeout_s)

    def _watch_liveness(self) -> None:
        """While /generate requests run: probe each engine's /server_info (`LivenessWatch`); raise if one hangs."""
        if self._watch is None:
            live = [k for k in range(len(self.engine_urls)) if k not in self._out()]
            self._watch = LivenessWatch([self.engine_urls[k] for k in live], failure_timeout=self.failure_timeout_s,
                                        numbers=live)  # fmt: skip
        try:
            self._watch.check()
        except EngineGoneError as hung:
            self._suspect = self._watch.hung
            if self.restarter is not None and self._suspect is not None:
                self._end_watch()
                self.restarter.kill_hung(self._suspect, self.engine_urls[self._suspect], str(hung))
                if self._check_processes():  # restarting while the others go on; else EngineRestarted
                    return
            raise
        finally:
            if self._watch is not None:
                self._answers.take(self._watch)

    def _end_watch(self) -> None:
        if self._watch is not None:
            self._answers.take(self._watch)
            self._watch.close()
            self._watch = None

    def _check_processes(self, grace_s: float = 0.0, answer: HttpCallError | None = None) -> bool:
        """EngineGoneError naming the first fleet process that exited (grpolab-launched fleets only);
        with `grace_s`, wait up to that many seconds for one to exit (after a failed call, whose error
        `answer` is then quoted as what the router or engine answered). With --use-fault-tolerance the
        engine is restarted instead: in the background while a generate call's requests are out and
        another engine can take its requests (True: `_put_out`), else first (`EngineRestarted`)."""
        if self.fleet is None:
            return False
        out = self._out()
        deadline = time.monotonic() + grace_s
        dead = self.fleet.dead(skip=out)
        while not dead and time.monotonic() < deadline:
            time.sleep(0.05)
            dead = self.fleet.dead(skip=out)
        if dead:
            what = dead[0].describe_exit() + self._answer_note(answer)
            if dead[0] in self.fleet.engines:
                self._suspect = self.fleet.engines.index(dead[0])
                if self.restarter is not None:  # --use-fault-tolerance: back, checked, or gone
                    if self._sending and len(self.engine_urls) - len(out) > 1:
                        self._put_out(self._suspect, what)
                        return True
                    self._rejoin()  # one restarting in the background comes back first
                    call = self._partial.key if self._sending else None  # the call whose requests were out
                    record = self.restarter.bring_back(self._suspect, what, weight_version=self.weight_version,
                                                       released=self.memory_released, call=call)  # fmt: skip
                    self.engine_urls[self._suspect] = record.new_url
                    raise EngineRestarted(f"{record.reason}; {record.describe()}")
            raise EngineGoneError(what)
        return False

    def _put_out(self, i: int, what: str) -> None:
        """Engine `i` exited while a generate call's requests were out: it leaves the router at once (no
        request is routed to it again) and restarts in the background (`Restarter.bring_back_in_background`,
        checked before it rejoins), while the other engines take its requests (`_send_all`)."""
        assert self.fleet is not None and self.restarter is not None
        self._end_watch()  # the next watch probes the engines still up
        self.fleet.unregister(self.engine_urls[i])
        log.warning(f"{what}: its requests go to the other engines while it restarts")
        self.restarter.bring_back_in_background(
            i, what, weight_version=self.weight_version, released=self.memory_released
        )

    def _rejoin(self) -> None:
        """Wait for the engines restarting in the background, take their new URLs and note on each record
        how many of the call's requests went elsewhere and where (`_retried`).

        Raises:
            EngineGoneError: one could not come back (--max-engine-restarts, or its restart failed).
        """
        if self.restarter is None or not self.restarter.underway:
            return
        n, retried, self._retried = len(self.engine_urls), self._retried, {}
        records = self.restarter.finish_background()
        for i, record in records.items():
            self.engine_urls[i] = record.new_url
            went = [url for k, url in retried.items() if k % n == i or url == self.router_url]
            record.retried_requests = len(went)
            where = sorted({self.engine_urls.index(url) for url in went if url in self.engine_urls})
            record.retried_on = (
                "the router" if self.router_url in went else ", ".join(f"engine {k}" for k in where)
            )

    def _after_failed_call(self, error: HttpCallError | None) -> None:
        """EngineGoneError when a fleet process exited, quoting `error`; waits `EXIT_GRACE_S` for one to be
        seen exiting unless the call timed out (a hung engine, not an exited one: no time to lose)."""
        timed_out = error is not None and error.timed_out
        if timed_out and self.restarter is not None:  # a launched engine that does not answer is dead to us
            assert error is not None
            hung = [i for i, url in enumerate(self.engine_urls) if error.url.startswith(url + "/")]
            if hung:
                self.restarter.kill_hung(hung[0], self.engine_urls[hung[0]], str(error))
        self._check_processes(grace_s=0.0 if timed_out else EXIT_GRACE_S, answer=error)

    def _answer_note(self, error: HttpCallError | None) -> str:
        """ "; the router answered HTTP 502: ..." (or "did not answer") for a gone engine's message."""
        if error is None:
            return ""
        who = "the router" if error.url.startswith(self.router_url + "/") else f"{error.url}"
        if error.status is None:
            return f"; {who} did not answer ({error.text})"
        return f"; {who} answered HTTP {error.status}: {error.text}"

    def _each_engine(self, method: str, path: str, body: object) -> list[object]:
        """`method path` with `body` on every engine, in order; their answers. The same call repeated after
        it failed part-way (`client.EngineClient` repeats it once a restart brought an engine back) skips
        the engines that already answered it: `/release_memory_occupation` twice is refused (SGLang's
        rule), and the restarted engine was brought to the fleet's state before it rejoined."""
        done = self._control.begin((method, path, repr(body)))
        for i, url in enumerate(self.engine_urls):
            if url in done:
                continue
            try:
                done[url] = self._answers.call(method, url, path, body, timeout=self._cap(CONTROL_TIMEOUT_S))
            except HttpCallError as e:  # an engine failure: the client may repeat the call
                self._suspect = i
                self._after_failed_call(e)
                raise
            except EngineRequestError:  # the request itself was refused: nothing to resume
                self._control.end()
                raise
        self._control.end()
        return [done[url] for url in self.engine_urls]

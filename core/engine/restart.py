"""Rollout fault tolerance (`--use-fault-tolerance`): a dead engine of a launched fleet comes back only with
the trainer's weights, checked, before the router sends it a request.

The order matters (Miles #1724: a recovered engine joined the router before it had the current weights,
and served the checkpoint's weights under the run's version):

1. the dead engine's URL leaves the router (`Fleet.unregister`: `DELETE /workers/{id}`);
2. its process is launched again (`Fleet.relaunch`: the same `grpolab serve` argv, a new port);
3. the trainer's current weights are loaded into it, in the buckets of a sync (`--update-weight-buffer-size`
   bytes, `/update_weights_from_disk` with the current weight version);
4. it is checked (`check_restarted`): `/model_info`'s `weight_version` is the trainer's, and
   `/weights_checker` "checksum" gives, for every tensor the trainer holds, the checksum of the trainer's
   tensor cast to the engine's dtype (`weight_bucket.tensor_checksum`, as the server computes it);
5. only then is it registered with the router again (`Fleet.register`, waited until listed healthy), and
   released again when the fleet's memory was released (colocated: the trainer holds the device).

A check that fails raises `EngineRestartRefused` naming the engine, the field or tensor and both values:
the engine stays out of the router and `HttpEngine` fails the run as a gone engine.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import torch

from grpolab.core.dtypes import parse_dtype
from grpolab.core.engine.client import EngineGoneError
from grpolab.core.engine.fleet import Fleet, FleetError
from grpolab.core.engine.http_calls import call_json
from grpolab.core.engine.weight_bucket import bucket_on_disk, tensor_checksum
from grpolab.core.weight_sync import iter_buckets

log = logging.getLogger("grpolab")
NamedTensors = Iterable[tuple[str, torch.Tensor]]
CONTROL_TIMEOUT_S = 120.0
"""Seconds one load, checksum or release call to the restarted engine may take (grpolab's: SmolLM2-135M's
buckets load in < 1 s and its checksum takes ~0.3 s on CPU)."""


class CallAnswers:
    """The answers one call got from part of its targets before it failed, kept for the same call repeated
    (`client.EngineClient` repeats a failed call; after a restart only what was not answered is asked
    again). `begin(key)` gives the answers kept for `key` (empty for another call), `end()` forgets them
    once the call succeeded or must not be resumed. `key` is the running call's, else None."""

    def __init__(self) -> None:
        self.key: object = None
        self.answers: dict = {}

    def begin(self, key: object) -> dict:
        """The answers kept for the call `key` (filled in by the caller as they come), empty for a new call."""
        if key != self.key:
            self.key, self.answers = key, {}
        return self.answers

    def end(self) -> None:
        """Nothing to resume: the call succeeded, or failed for a reason a repeat would not change."""
        self.key, self.answers = None, {}


class EngineRestartRefused(RuntimeError):
    """A restarted engine failed its check (weight version or a tensor's checksum): it is not registered."""


@dataclass(frozen=True, kw_only=True)
class WeightSource:
    """Where a restarted engine's weights come from: the trainer's (HF name, tensor) pairs, read anew at
    each restart (`Actor.named_weights` on one rank), sent in buckets of `buffer_bytes` bytes."""

    named: Callable[[], NamedTensors]
    buffer_bytes: int


@dataclass(kw_only=True)
class RestartRecord:
    """One restart: engine index, why (its exit or hang), old and new URL, the version it was loaded and
    checked with, how many tensors were checked, the seconds it took (exit seen → registered, failed starts
    included), how many requests of the call it broke were sent again and where (`retried_on`: "engine 1"
    while it restarted, "the router" (its other engines), "the restarted engine" when none other was
    left), and how many starts died first."""

    engine: int
    reason: str
    old_url: str
    new_url: str
    weight_version: int
    tensors: int
    seconds: float
    retried_requests: int = 0
    retried_on: str = ""  # where those requests went ("" when none were out)
    failed_starts: int = 0  # starts that died before this one listened (each used a restart)
    call: object = dataclasses.field(default=None, repr=False, compare=False)  # the generate call it broke

    def describe(self) -> str:
        """ "restarted at URL in 3.4 s, its weight version 2 and 46 tensor checksums checked before it
        rejoined the router" for messages."""
        return (
            f"restarted at {self.new_url} in {self.seconds:.1f} s, its weight version {self.weight_version} and "
            f"{self.tensors} tensor checksums checked before it rejoined the router"
        )


def load_weights(url: str, source: WeightSource, weight_version: int) -> None:
    """Load `source`'s tensors into the engine at `url` bucket by bucket, as `weight_version`.

    Raises:
        HttpCallError / EngineRequestError: the engine did not take a bucket; RuntimeError: it answered
            without success.
    """
    for bucket in iter_buckets(source.named(), source.buffer_bytes):
        with bucket_on_disk(bucket) as folder:
            body = {"model_path": str(folder), "weight_version": str(weight_version)}
            answer = call_json("POST", url + "/update_weights_from_disk", body, timeout=CONTROL_TIMEOUT_S)
        if not (isinstance(answer, dict) and answer.get("success")):
            raise RuntimeError(f"{url}/update_weights_from_disk did not succeed: {answer!r}")


def expected_checksums(named: NamedTensors, dtype: torch.dtype) -> dict[str, str]:
    """`tensor_checksum` of each trainer tensor cast to the engine's `dtype` (as the engine's load casts
    it: `copy_`, round to nearest), by HF name."""
    return {name: tensor_checksum(t.detach().to(device="cpu", dtype=dtype)) for name, t in named}


def check_restarted(url: str, *, engine: int, weight_version: int, expected: dict[str, str]) -> None:
    """The engine at `url` holds `weight_version` and, tensor by tensor, the checksums in `expected`.

    Raises:
        EngineRestartRefused: "engine 0 restarted at URL reports weight version 0, the trainer's is 3",
            or names the first tensor whose checksum differs (both values) or that the engine lacks, and
            how many differ.
        HttpCallError: the engine did not answer.
    """
    who = f"engine {engine} restarted at {url}"
    info = call_json("GET", url + "/model_info", None, timeout=CONTROL_TIMEOUT_S) or {}
    reported = info.get("weight_version") if isinstance(info, dict) else None
    if str(reported) != str(weight_version):
        raise EngineRestartRefused(
            f"{who} reports weight version {reported}, the trainer's is {weight_version}: not registered"
        )
    answer = call_json("POST", url + "/weights_checker", {"action": "checksum"}, timeout=CONTROL_TIMEOUT_S)
    ranks = answer.get("ranks") if isinstance(answer, dict) else None
    sums = ranks[0].get("checksums", {}) if ranks else {}
    wrong = [name for name, want in expected.items() if sums.get(name) != want]
    if wrong:
        name = wrong[0]
        got = sums.get(name, "no such tensor")
        raise EngineRestartRefused(
            f"{who} does not hold the trainer's weights of version {weight_version}: {name!r} has checksum "
            f"{got}, the trainer's is {expected[name]} ({len(wrong)} of {len(expected)} tensors differ): "
            "not registered"
        )


class Restarter:
    """Restarts the engines of `fleet` (at most `max_restarts` in the run), each checked before it rejoins.

    Args:
        fleet: the fleet grpolab launched (its engines are relaunched in place).
        max_restarts: `--max-engine-restarts`, over the whole run and every engine; >= 1.
        source: the trainer's weights (`WeightSource`).
        load: how the weights get into the restarted engine (`load_weights`; a test plants one that skips).

    Raises:
        ValueError: `max_restarts` < 1.
    """

    def __init__(
        self,
        fleet: Fleet,
        *,
        max_restarts: int,
        source: WeightSource,
        load: Callable[[str, WeightSource, int], None] = load_weights,
    ) -> None:
        if max_restarts < 1:
            raise ValueError(f"--max-engine-restarts must be >= 1, got {max_restarts}")
        self.fleet, self.max_restarts, self.source, self._load = fleet, max_restarts, source, load
        self.done: list[RestartRecord] = []  # every restart of the run
        self.attempts = 0  # restarts begun, those that failed included
        self.hung: dict[int, str] = {}  # engines `kill_hung` killed, and why
        self._unretried: RestartRecord | None = None  # the last restart, until the call it broke is repeated
        self._untaken: list[RestartRecord] = []  # the restarts `take` has not returned yet
        self._budget = threading.Lock()  # background restarts of two engines share --max-engine-restarts
        self._background: dict[int, Future[RestartRecord]] = {}  # engine → its restart in `_threads`
        self._threads: ThreadPoolExecutor | None = None

    @property
    def left(self) -> int:
        """Restarts the run may still begin."""
        return self.max_restarts - self.attempts

    def restart(self, i: int, *, reason: str, weight_version: int, memory_released: bool) -> RestartRecord:
        """Bring engine `i` back (the module docstring's five steps) and return the record.

        Raises:
            EngineRestartRefused: it failed its check (it is not registered; its process keeps running
                until the fleet closes, for its log).
            FleetError / HttpCallError / RuntimeError: it did not start, or a call to it or the router failed.
        """
        with self._budget:
            self.attempts += 1
        return self._restart(i, reason=reason, weight_version=weight_version, memory_released=memory_released)

    def _restart(self, i: int, *, reason: str, weight_version: int, memory_released: bool) -> RestartRecord:
        start = time.monotonic()
        old = self.fleet.engines[i].url
        self.fleet.unregister(old)
        new = self.fleet.relaunch(i).url
        self._load(new, self.source, weight_version)
        dtype = parse_dtype(self.fleet.dtype, "--dtype")
        expected = expected_checksums(self.source.named(), dtype)
        check_restarted(new, engine=i, weight_version=weight_version, expected=expected)
        self.fleet.register(new)
        if memory_released:
            call_json("POST", new + "/release_memory_occupation", {}, timeout=CONTROL_TIMEOUT_S)
        record = RestartRecord(
            engine=i, reason=reason, old_url=old, new_url=new, weight_version=weight_version,
            tensors=len(expected), seconds=time.monotonic() - start,
        )  # fmt: skip
        self.done.append(record)
        self._untaken.append(record)
        return record

    def kill_hung(self, i: int, url: str, why: str) -> None:
        """SIGKILL engine `i` (at `url`), which hangs (`why`: what did not answer), so that the next process
        check brings it back (Miles' health monitor restarts an engine that fails its checks)."""
        self.hung[i] = f"engine {i} ({url}) hung ({why.splitlines()[0]})"  # `bring_back` says it, once
        self.fleet.kill(i)

    def count_retried(self, call: object, sent: int) -> None:
        """The first generate call after a restart sends `sent` requests: retried ones when it is `call`, the
        call the restart broke (the record's `retried_requests`)."""
        if self._unretried is not None and self._unretried.call == call:
            self._unretried.retried_requests += sent
            self._unretried.retried_on = "the restarted engine"
        self._unretried = None

    def bring_back(
        self, i: int, what: str, *, weight_version: int, released: bool, call: object = None
    ) -> RestartRecord:
        """`restart` engine `i`, which went as `what` says ("engine 0 (URL) exited (killed by SIGKILL)"; one
        `kill_hung` killed says it hung), or say why it cannot come back. `call`: the generate call whose
        requests were out when it went (None: no requests were), for `count_retried`.

        Raises:
            EngineGoneError: no restart left (--max-engine-restarts), or the restart failed or was refused
                (the run fails as without fault tolerance, saying why).
        """
        if i in self.hung:
            what = f"{self.hung.pop(i)} and was killed"
        start, failed = time.monotonic(), 0
        while True:
            with self._budget:
                if self.left < 1:
                    raise EngineGoneError(f"{what}; --max-engine-restarts {self.max_restarts}: none left")
                self.attempts += 1
            again = f" (start {failed + 1}: {failed} failed)" if failed else ""
            log.warning(f"{what}: restarting it{again} (--use-fault-tolerance; {self.left} restart(s) left)")
            try:
                record = self._restart(
                    i, reason=what, weight_version=weight_version, memory_released=released
                )
            except FleetError as e:  # the new process died or never listened: another start may do
                first = str(e).splitlines()[0].split("; the last lines of ")[0]
                if self.left < 1:
                    raise EngineGoneError(f"{what}; its restart failed: {e}") from None
                log.warning(f"engine {i}'s restart failed: {first}")
                failed += 1
                self.fleet.kill(i)  # a start that never listened may still run: it goes before the next
                continue
            except RuntimeError as e:  # refused, HttpCallError, a failed load: another start would not help
                raise EngineGoneError(f"{what}; its restart failed: {e}") from None
            if call is not None:
                record.call, self._unretried = call, record
            record.failed_starts, record.seconds = failed, time.monotonic() - start
            return record

    @property
    def underway(self) -> set[int]:
        """The engines `bring_back_in_background` is restarting (until `finish_background`)."""
        return set(self._background)

    def bring_back_in_background(self, i: int, what: str, *, weight_version: int, released: bool) -> None:
        """`bring_back` engine `i` in a thread, while the other engines carry its requests (a generate call
        with more than one engine: the issue's "its unfinished requests are retried on the others").
        `finish_background` waits for it; until then engine `i` is not the caller's to use."""
        if self._threads is None:
            self._threads = ThreadPoolExecutor(max_workers=4, thread_name_prefix="grpolab-engine-restart")
        self._background[i] = self._threads.submit(
            self.bring_back, i, what, weight_version=weight_version, released=released
        )

    def finish_background(self) -> dict[int, RestartRecord]:
        """Wait for every restart `bring_back_in_background` began; their records by engine (empty: none).

        Raises:
            EngineGoneError: one could not come back (the first such, once all have ended).
        """
        records: dict[int, RestartRecord] = {}
        failed: EngineGoneError | None = None
        for i, future in self._background.items():
            try:
                records[i] = future.result()
            except EngineGoneError as e:
                failed = failed or e
            except Exception as e:  # the thread's own failure: the engine did not come back either
                failed = failed or EngineGoneError(f"engine {i}'s restart failed: {type(e).__name__}: {e}")
        self._background = {}
        if failed is not None:
            raise failed
        return records

    def take(self) -> list[RestartRecord]:
        """The restarts since the last `take` (for the rollout's events and metrics)."""
        new, self._untaken = self._untaken, []
        return new

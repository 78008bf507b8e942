"""The server's one engine thread and its batching loop: concurrent requests share one decode.

Every engine call (generation, weight loads, memory release, weight checks) runs on a single worker
thread, one at a time, so HTTP handlers never touch the engine concurrently. Generation requests wait
in a queue; the loop takes everything queued (after a short gather window, `batch_wait_s`, that lets
requests sent together arrive) and decodes it as one batch: one `engine.generate` call per distinct
set of sampling settings, its rows ordered by rid (`rid_order`: digit runs compared as numbers, ties
in arrival order). Arrival order varies from run to run (threads, the router), and a decode's row
order changes CPU matmul rounding, so ordering by rid makes log-probs repeatable: a client that numbers
its rids in request order (grpolab's HTTP engine: `grpolab-<session>-<call>-<index>`) gets the rows of
the in-process engine's single `generate` call, bitwise. Requests that arrive while a batch runs join
the next one.

Control operations (`exclusive`) wait for the running batch to finish and block the next one while
they run. `pause(mode)` stops new batches: "abort" answers every queued request with an abort,
"retract" and "in_place" keep them queued until `resume()` (a running batch always finishes: this
engine decodes a batch as one call, so SGLang's mid-decode retraction has no counterpart here).
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar

from grpolab.core.engine.base import GenerationRequest, GenerationResult, RolloutEngine
from grpolab.serve.protocol import GenerateItem

T = TypeVar("T")
BATCH_WAIT_S = 0.01
"""Default gather window, seconds: a request arriving on an idle server waits this long for others
sent with it (grpolab's choice: far below one decode step of the tiny model, ~1% of a real rollout)."""
HISTORY = 64
"""How many recent batch sizes `stats()` reports."""
_DIGITS = re.compile(r"(\d+)")


def rid_order(rid: str) -> tuple[tuple[int, int | str], ...]:
    """Sort key of a request id: text parts as text, digit runs as numbers ("r_2" < "r_10").

    Every part is tagged (0: text, 1: number), so any two rids compare without a TypeError.
    """
    return tuple((1, int(part)) if i % 2 else (0, part) for i, part in enumerate(_DIGITS.split(rid)))


@dataclass
class Pending:
    """One queued request and the future its HTTP handler awaits (result or abort message)."""

    item: GenerateItem
    future: asyncio.Future
    arrived: float = field(default_factory=time.perf_counter)


class Aborted(Exception):
    """Set on a pending request's future when it is aborted before running; args[0] says why."""


class Batcher:
    """Owns the engine thread, the request queue and the batching loop (start it inside the event loop).

    Attributes:
        engine: the wrapped rollout engine (only ever called from the engine thread).
        paused: True between `pause()` and `resume()`.
        batches: number of `engine.generate` calls made so far.
        requests_done: requests answered with generated tokens.
        last_batch_seconds: wall seconds of the last batch's `engine.generate` calls (0.0 before any), so a
            client can tell the decode from its HTTP overhead (benchmarks/bench_http_engine.py).
    """

    def __init__(self, engine: RolloutEngine, *, batch_wait_s: float = BATCH_WAIT_S) -> None:
        self.engine = engine
        self.batch_wait_s = batch_wait_s
        self.paused = False
        self.blocked_reason = ""  # non-empty while generation is refused (memory released)
        self.batches = 0
        self.requests_done = 0
        self.batch_sizes: list[int] = []
        self.last_batch_seconds = 0.0
        self._queue: list[Pending] = []
        self._running: list[Pending] = []
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="engine")
        self._lock: asyncio.Lock | None = None
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task | None = None
        self._held = False  # resume() after a pause: the queued requests were gathered while held

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        """Create the loop's primitives and its task (call from inside the running event loop)."""
        self._lock = asyncio.Lock()
        self._wake = asyncio.Event()
        self._task = asyncio.get_running_loop().create_task(self._loop())

    async def stop(self) -> None:
        """Abort queued requests, stop the loop, and let the engine thread finish its call."""
        self._abort_queued("the server is shutting down")
        if self._task is not None:
            self._task.cancel()
        self._executor.shutdown(wait=True)

    async def on_engine_thread(self, fn: Callable[..., T], *args: Any) -> T:
        """Run `fn(*args)` on the engine thread (queued behind its current call) and return its result."""
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    # ------------------------------------------------------------------ requests
    async def submit(self, items: list[GenerateItem]) -> list[GenerationResult | str]:
        """Queue `items` (kept together, in order) and wait for each: a result, or the abort message.

        Raises:
            RuntimeError: generation is refused now (memory released), naming why.
        """
        if self.blocked_reason:
            raise RuntimeError(self.blocked_reason)
        loop = asyncio.get_running_loop()
        pending = [Pending(item, loop.create_future()) for item in items]
        self._queue.extend(pending)
        assert self._wake is not None, "Batcher.start() was not called"
        self._wake.set()
        out: list[GenerationResult | str] = []
        for p in pending:
            try:
                out.append(await p.future)
            except Aborted as e:
                out.append(str(e.args[0]))
        return out

    @property
    def running(self) -> int:
        """Requests in the batch being decoded now."""
        return len(self._running)

    @property
    def waiting(self) -> int:
        """Requests queued for the next batch."""
        return len(self._queue)

    def abort(self, rid: str = "", *, abort_all: bool = False, message: str = "Abort requested.") -> int:
        """Abort queued requests whose rid is `rid` (or starts with `rid` + "_", a batch's items), or
        all with `abort_all`; return how many. A request already decoding finishes normally."""
        keep, n = [], 0
        for p in self._queue:
            if abort_all or p.item.rid == rid or (rid and p.item.rid.startswith(rid + "_")):
                if not p.future.done():
                    p.future.set_exception(Aborted(message))
                n += 1
            else:
                keep.append(p)
        self._queue = keep
        return n

    def _abort_queued(self, message: str) -> int:
        return self.abort(abort_all=True, message=message)

    async def pause(self, mode: str) -> None:
        """Stop starting batches; "abort" also aborts the queue. Returns once no batch is running.

        Raises:
            ValueError: `mode` is not abort, retract or in_place.
        """
        if mode not in ("abort", "retract", "in_place"):
            raise ValueError(f"pause_generation: mode must be abort, retract or in_place, got {mode!r}")
        self.paused = True
        if mode == "abort":
            self._abort_queued("Generation paused (abort mode); the request was aborted.")
        assert self._lock is not None
        async with self._lock:  # waits for the running batch
            pass

    def resume(self) -> None:
        """Allow batches again: queued requests run next, at once (no gather window: they were held)."""
        self.paused = False
        self._held = bool(self._queue)
        if self._wake is not None:
            self._wake.set()

    async def exclusive(self, fn: Callable[..., T], *args: Any) -> T:
        """Run `fn(*args)` on the engine thread while no batch runs (after the current one)."""
        assert self._lock is not None, "Batcher.start() was not called"
        async with self._lock:
            return await self.on_engine_thread(fn, *args)

    def stats(self) -> dict[str, Any]:
        """Counters for `/server_info`: batches, requests answered, queue, recent batch sizes, the last
        batch's decode seconds."""
        return {
            "batches": self.batches,
            "requests_done": self.requests_done,
            "running_requests": self.running,
            "waiting_requests": self.waiting,
            "recent_batch_sizes": list(self.batch_sizes),
            "last_batch_seconds": self.last_batch_seconds,
            "paused": self.paused,
        }

    # ------------------------------------------------------------------ the loop
    async def _loop(self) -> None:
        assert self._wake is not None and self._lock is not None
        while True:
            await self._wake.wait()
            self._wake.clear()
            if not self._queue or self.paused:
                continue
            if not self._held:
                await asyncio.sleep(self.batch_wait_s)  # let requests sent together arrive
            self._held = False
            async with self._lock:
                if self.paused or not self._queue:
                    continue
                self._running, self._queue = self._queue, []
                try:
                    await self._run_batch(self._running)
                finally:
                    self._running = []
            if self._queue:
                self._wake.set()

    async def _run_batch(self, batch: list[Pending]) -> None:
        """Decode `batch`: one `engine.generate` per distinct sampling settings, rows in `rid_order`."""
        groups: dict[Any, list[Pending]] = {}
        for p in sorted(batch, key=lambda p: rid_order(p.item.rid)):  # stable: equal rids keep arrival order
            groups.setdefault(p.item.params, []).append(p)
        self.batch_sizes = (self.batch_sizes + [len(batch)])[-HISTORY:]
        start = time.perf_counter()
        for params, members in groups.items():
            reqs = [GenerationRequest(prompt_ids=p.item.prompt_ids, seed=p.item.seed) for p in members]
            try:
                results = await self.on_engine_thread(self.engine.generate, reqs, params)
            except Exception as e:  # the engine failed: every request of the group gets the error
                for p in members:
                    if not p.future.done():
                        p.future.set_exception(e)
                continue
            finally:
                self.batches += 1
            for p, r in zip(members, results):
                if not p.future.done():
                    p.future.set_result(r)
                    self.requests_done += 1
        self.last_batch_seconds = time.perf_counter() - start

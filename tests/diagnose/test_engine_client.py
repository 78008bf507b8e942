"""EngineClient: a transient engine failure is tolerated, a persistent one stops the run with EngineDeadError.

Unit tests use a fake engine and a fake clock (sleep advances it), so no test sleeps; the end-to-end
test kills the real torch engine with the fault action `stop_engine_at_end`.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from runs import SMALL, events

from grpolab.cli import main
from grpolab.core.engine.base import EngineHealth, GenerationRequest, GenerationResult, SamplingParams
from grpolab.core.engine.client import EngineClient, EngineDeadError


class FakeClock:
    """Monotonic seconds that only move when the client sleeps."""

    def __init__(self) -> None:
        self.now = 100.0
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        assert seconds > 0
        self.sleeps.append(seconds)
        self.now += seconds


class FlakyEngine:
    """Down (calls raise, health not ok) until the clock reaches `down_until`; then healthy."""

    name = "fake engine (flaky)"

    def __init__(self, clock: FakeClock, down_until: float) -> None:
        self.clock, self.down_until = clock, down_until
        self.calls = 0
        self.health_checks = 0
        self.version = 0

    def _down(self) -> bool:
        return self.clock() < self.down_until

    def generate(self, requests: list[GenerationRequest], params: SamplingParams) -> list[GenerationResult]:
        self.calls += 1
        if self._down():
            raise ConnectionError("503 Service Unavailable")
        if any(not r.prompt_ids for r in requests):
            raise ValueError("empty prompt")
        return [
            GenerationResult(response_ids=[1], log_probs=torch.zeros(1), finish_reason="stop")
            for _ in requests
        ]

    def update_weights(self, named_tensors, *, weight_version: int) -> int:
        self.calls += 1
        if self._down():
            raise ConnectionError("connection refused")
        self.version = weight_version
        return weight_version

    def release_memory(self) -> None:
        self.calls += 1

    def resume_memory(self) -> None:
        self.calls += 1

    def flush_cache(self) -> None:
        self.calls += 1

    def health(self) -> EngineHealth:
        self.health_checks += 1
        if self._down():
            raise ConnectionError("health endpoint unreachable")
        return EngineHealth(ok=True, weight_version=self.version, memory_released=False)

    def log_tail(self, n: int = 20) -> list[str]:
        return ["started", "router lost its last worker"][-n:]


REQ = [GenerationRequest(prompt_ids=[1, 2], seed=0)]
PARAMS = SamplingParams(max_new_tokens=4)


def _client(engine: FlakyEngine, clock: FakeClock, timeout: float = 0.5, poll: float = 0.125) -> EngineClient:
    """Binary fractions for timeout and poll keep the fake clock's sums exact."""
    return EngineClient(engine, failure_timeout=timeout, poll_interval=poll, clock=clock, sleep=clock.sleep)


def test_transient_failure_shorter_than_the_timeout_is_tolerated() -> None:
    clock = FakeClock()
    engine = FlakyEngine(clock, down_until=clock.now + 0.35)
    client = _client(engine, clock)
    out = client.generate(REQ, PARAMS)
    assert len(out) == 1 and out[0].response_ids == [1]
    assert engine.calls == 2  # the failed call and the retry after health came back
    assert 0.35 <= clock.now - 100.0 < 0.5  # it waited for the engine, not for the whole timeout
    assert engine.health_checks == 3  # polls at 0.125, 0.25 (down) and 0.375 (ok)
    assert client.update_weights([], weight_version=3) == 3  # healthy again: no waiting
    assert clock.now - 100.0 < 0.5


def test_persistent_failure_raises_after_the_timeout() -> None:
    clock = FakeClock()
    engine = FlakyEngine(clock, down_until=float("inf"))
    client = _client(engine, clock, timeout=0.5, poll=0.1875)
    with pytest.raises(EngineDeadError) as info:
        client.generate(REQ, PARAMS)
    err = info.value
    assert isinstance(err, RuntimeError)  # the CLI maps RuntimeError to exit 2
    assert err.engine_name == "fake engine (flaky)"
    assert err.failed_for == pytest.approx(0.5)
    assert clock.sleeps == [0.1875, 0.1875, 0.125]  # the last wait is capped by the time left
    assert engine.calls == 1  # never healthy, so never retried
    text = str(err)
    assert "'fake engine (flaky)' failed for 0.5 s (--engine-failure-timeout 0.5)" in text
    assert "generate raised ConnectionError: 503 Service Unavailable" in text
    assert "health: not ok (ConnectionError: health endpoint unreachable)" in text
    assert text.endswith("last engine log lines:\n  started\n  router lost its last worker")


def test_failures_across_retries_count_from_the_first_one() -> None:
    """Health flaps ok but every call fails: the timeout still ends it (no retrying forever)."""

    class HealthyButFailing(FlakyEngine):
        def health(self) -> EngineHealth:
            self.health_checks += 1
            return EngineHealth(ok=True, weight_version=0, memory_released=False)

    clock = FakeClock()
    engine = HealthyButFailing(clock, down_until=float("inf"))
    client = _client(engine, clock, timeout=0.5, poll=0.125)
    with pytest.raises(EngineDeadError, match=r"failed for 0\.5 s"):
        client.update_weights([], weight_version=1)
    assert engine.calls == 5  # at 0, 0.125, 0.25, 0.375 and 0.5 s: one retry per ok health check


def test_request_errors_are_not_retried() -> None:
    clock = FakeClock()
    engine = FlakyEngine(clock, down_until=0.0)
    client = _client(engine, clock)
    with pytest.raises(ValueError, match="empty prompt"):
        client.generate([GenerationRequest(prompt_ids=[], seed=0)], PARAMS)
    assert engine.calls == 1 and clock.sleeps == []


def test_bad_timeout_and_forwarded_name() -> None:
    clock = FakeClock()
    engine = FlakyEngine(clock, down_until=0.0)
    with pytest.raises(ValueError, match="--engine-failure-timeout must be > 0"):
        EngineClient(engine, failure_timeout=0)
    client = _client(engine, clock)
    assert client.name == "fake engine (flaky)"
    assert client.log_tail(1) == ["router lost its last worker"]
    assert client.health().ok


def test_torch_engine_logs_what_it_did(tiny_model_dir: Path) -> None:
    from grpolab.core.engine.torch_engine import TorchEngine

    engine = TorchEngine(tiny_model_dir, show_progress=False)
    assert engine.name == "torch engine (tiny-qwen3, cpu)"
    engine.release_memory()
    engine.resume_memory()
    engine.shutdown(reason="a test")
    tail = engine.log_tail(5)
    assert "started with model" in tail[0] and "dtype torch.float32, device cpu" in tail[0]
    assert [line.split(" ", 1)[1] for line in tail[1:]] == [
        "decoding with grpolab's own forward",
        "memory released",
        "memory resumed",
        "shut down by a test",
    ]
    assert not engine.health().ok and "shut down by a test" in engine.health().detail
    with pytest.raises(RuntimeError, match=r"the engine was shut down \(a test\)"):
        engine.generate(REQ, PARAMS)


def test_a_stopped_engine_stops_the_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The real fault: the engine shuts down after rollout 0; rollout 1 fails after 2 s, not forever."""
    code = main(
        [
            "train",
            *SMALL,
            "--num-rollout",
            "3",
            "--ci-ft-test-actions",
            '[{"at_rollout": 0, "action": "stop_engine_at_end"}]',
            "--engine-failure-timeout",
            "2",
            "--run-dir",
            str(tmp_path / "r"),
        ]
    )
    err = capsys.readouterr().err
    assert code == 1
    assert "grpolab train: error: rollout engine 'torch engine (tiny-qwen3, cpu)' failed for" in err
    seconds = float(re.search(r"failed for ([0-9.]+) s \(--engine-failure-timeout 2\)", err).group(1))
    assert 2.0 <= seconds < 30.0  # it gave up after the timeout (the default would be 60 s)
    assert "last engine log lines:" in err and "shut down by fault injection stop_engine_at_end" in err
    assert "engine was shut down" in err  # the last error: what the dead engine answered
    status = events(tmp_path / "r")[-1]
    assert status["event"] == "status" and status["status"] == "failed" and status["rollout_id"] == 1
    assert status["error"].startswith("EngineDeadError: rollout engine 'torch engine (tiny-qwen3, cpu)'")
    assert "shut down by fault injection stop_engine_at_end" in status["error"]

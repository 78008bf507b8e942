from __future__ import annotations

import pytest
import torch

from grpolab.core.engine.base import EngineHealth
from grpolab.core.weight_sync import WeightSyncError, plan_buckets, sync_weights


def test_buckets_respect_the_buffer_and_order() -> None:
    assert plan_buckets([4, 4, 4, 4], 8) == [[0, 1], [2, 3]]
    assert plan_buckets([4, 20, 4], 8) == [[0], [1], [2]]  # an oversized tensor travels alone
    assert plan_buckets([1, 2, 3], 1 << 30) == [[0, 1, 2]]
    with pytest.raises(ValueError, match="--update-weight-buffer-size"):
        plan_buckets([1], 0)


class RecordingEngine:
    def __init__(self, echo_offset: int = 0) -> None:
        self.calls: list[list[str]] = []
        self.flushed = 0
        self.echo_offset = echo_offset

    def update_weights(self, named, *, weight_version):
        self.calls.append([n for n, _ in named])
        return weight_version + self.echo_offset

    def flush_cache(self) -> None:
        self.flushed += 1

    def health(self) -> EngineHealth:
        return EngineHealth(ok=True, weight_version=0, memory_released=False)


def test_sync_sends_every_tensor_once_in_buckets() -> None:
    named = [(f"w{i}", torch.zeros(4)) for i in range(5)]  # 16 bytes each
    engine = RecordingEngine()
    stats = sync_weights(named, engine, weight_version=3, buffer_bytes=32)
    assert engine.calls == [["w0", "w1"], ["w2", "w3"], ["w4"]]
    assert (stats.buckets, stats.tensors, stats.bytes, stats.weight_version) == (3, 5, 80, 3)
    assert engine.flushed == 1


def test_sync_fails_when_engine_echoes_another_version() -> None:
    with pytest.raises(WeightSyncError, match="version 4 after a sync to version 3"):
        sync_weights(
            [("w", torch.zeros(1))], RecordingEngine(echo_offset=1), weight_version=3, buffer_bytes=8
        )

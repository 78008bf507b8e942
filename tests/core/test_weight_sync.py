from __future__ import annotations

import weakref
from collections.abc import Iterator

import pytest
import torch

from grpolab.core.engine.base import EngineHealth
from grpolab.core.weight_sync import WeightSyncError, iter_buckets, sync_weights


def names_of(sizes: list[int], buffer: int) -> list[list[str]]:
    """Bucket names for float32 tensors of `sizes` elements (4 bytes each)."""
    named = ((f"w{i}", torch.zeros(n)) for i, n in enumerate(sizes))
    return [[name for name, _ in bucket] for bucket in iter_buckets(named, buffer)]


def test_buckets_respect_the_buffer_and_order() -> None:
    assert names_of([1, 1, 1, 1], 8) == [["w0", "w1"], ["w2", "w3"]]
    assert names_of([1, 5, 1], 8) == [["w0"], ["w1"], ["w2"]]  # an oversized tensor travels alone
    assert names_of([1, 2, 3], 1 << 30) == [["w0", "w1", "w2"]]
    assert names_of([], 8) == []
    with pytest.raises(ValueError, match="--update-weight-buffer-size"):
        iter_buckets(iter([]), 0)


class RecordingEngine:
    def __init__(self, echo_offset: int = 0, on_update=None) -> None:
        self.calls: list[list[str]] = []
        self.flushed = 0
        self.echo_offset = echo_offset
        self.on_update = on_update

    def update_weights(self, named, *, weight_version):
        self.calls.append([n for n, _ in named])
        if self.on_update is not None:
            self.on_update()
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


class GatheredWeights:
    """Yields fresh tensors (as an FSDP2 gather does) and tracks how many bytes of them are alive."""

    def __init__(self, sizes: list[int]) -> None:
        self.sizes = sizes
        self.refs: list[weakref.ref] = []
        self.peak_bytes = 0

    def live_bytes(self) -> int:
        return sum(t.numel() * 4 for t in (r() for r in self.refs) if t is not None)

    def note(self) -> None:
        self.peak_bytes = max(self.peak_bytes, self.live_bytes())

    def __iter__(self) -> Iterator[tuple[str, torch.Tensor]]:
        for i, n in enumerate(self.sizes):
            tensor = torch.full((n,), float(i))
            self.refs.append(weakref.ref(tensor))
            self.note()  # what is held right after this tensor was gathered
            yield f"w{i}", tensor
            del tensor


def test_sync_holds_at_most_one_bucket_plus_one_tensor() -> None:
    sizes = [8, 8, 8, 8, 24, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8]  # float32 elements: 32 or 96 bytes
    weights = GatheredWeights(sizes)
    engine = RecordingEngine(on_update=weights.note)
    stats = sync_weights(weights, engine, weight_version=1, buffer_bytes=64)
    assert stats.tensors == len(sizes) and stats.bytes == 4 * sum(sizes)
    # the whole model is 576 bytes; held at most: a full 64-byte bucket plus the 96-byte tensor that
    # did not fit into it (or that tensor alone plus the next 32 bytes), never the model
    assert weights.peak_bytes == 64 + 96 < 4 * sum(sizes)
    assert weights.peak_bytes >= 64  # a full bucket is really held (the tracking sees the tensors)
    assert weights.live_bytes() == 0  # nothing survives the sync

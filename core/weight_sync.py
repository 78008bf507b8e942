"""Trainer → engine weight sync in buckets of at most `--update-weight-buffer-size` bytes.

Mirrors Miles' colocated `UpdateWeightFromTensor` (notes 6.2): pack named tensors into buckets by
byte size (a tensor larger than the buffer travels alone), send each bucket with the new weight
version, and require the engine to echo that version.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import torch

from grpolab.core.engine.base import RolloutEngine


class WeightSyncError(RuntimeError):
    """The engine did not acknowledge a weight bucket with the expected version."""


@dataclass(frozen=True, kw_only=True)
class SyncStats:
    """What one sync moved: bucket count, tensors, bytes, and the acknowledged version."""

    buckets: int
    tensors: int
    bytes: int
    weight_version: int


def plan_buckets(sizes_bytes: list[int], buffer_bytes: int) -> list[list[int]]:
    """Group tensor indices, in order, into buckets whose byte sizes sum to at most `buffer_bytes`.

    A tensor larger than the buffer forms a bucket by itself. Raises ValueError for buffer_bytes < 1.
    """
    if buffer_bytes < 1:
        raise ValueError(f"--update-weight-buffer-size must be >= 1 byte, got {buffer_bytes}")
    buckets: list[list[int]] = []
    current: list[int] = []
    used = 0
    for i, size in enumerate(sizes_bytes):
        if current and used + size > buffer_bytes:
            buckets.append(current)
            current, used = [], 0
        current.append(i)
        used += size
    if current:
        buckets.append(current)
    return buckets


def sync_weights(
    named: Iterable[tuple[str, torch.Tensor]],
    engine: RolloutEngine,
    *,
    weight_version: int,
    buffer_bytes: int,
) -> SyncStats:
    """Send every (HF name, tensor) to `engine` in buckets; return what moved.

    Raises:
        WeightSyncError: when the engine answers a bucket with another weight version.
    """
    items = list(named)
    sizes = [t.numel() * t.element_size() for _, t in items]
    buckets = plan_buckets(sizes, buffer_bytes)
    engine.flush_cache()
    for bucket in buckets:
        echoed = engine.update_weights([items[i] for i in bucket], weight_version=weight_version)
        if echoed != weight_version:
            raise WeightSyncError(
                f"engine acknowledged weight version {echoed} after a sync to version {weight_version}"
            )
    return SyncStats(
        buckets=len(buckets), tensors=len(items), bytes=sum(sizes), weight_version=weight_version
    )

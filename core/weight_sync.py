"""Trainer → engine weight sync in buckets of at most `--update-weight-buffer-size` bytes.

Mirrors Miles' colocated `UpdateWeightFromTensor` (notes 6.2): pack named tensors into buckets by
byte size (a tensor larger than the buffer travels alone), send each bucket with the new weight
version, and require the engine to echo that version.

Memory: the (name, tensor) pairs are consumed lazily, one at a time, and a bucket is sent as soon
as the next tensor would overflow it; its tensors are dropped before the next one is gathered. On
a multi-rank (FSDP2) run `Actor.named_weights` gathers one full parameter per step of its
iterator, so a rank holds at most one bucket plus one full tensor of gathered weights during a
sync, never the whole model: the buffer size bounds the sync's extra memory.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
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


def tensor_bytes(t: torch.Tensor) -> int:
    """Bytes of `t`'s elements (numel × element size), whatever its storage."""
    return t.numel() * t.element_size()


def iter_buckets(
    named: Iterable[tuple[str, torch.Tensor]], buffer_bytes: int
) -> Iterator[list[tuple[str, torch.Tensor]]]:
    """Pack (name, tensor) pairs, in order, into buckets of at most `buffer_bytes` bytes, lazily.

    Greedy as the tensors arrive: a bucket is yielded when the next tensor would overflow it (so
    the iterator holds that one tensor while the caller sends the bucket); a tensor larger than the
    buffer forms a bucket by itself. `named` is read no further ahead than that one tensor, and a
    yielded bucket is not referenced again by the iterator once the caller asks for the next.

    Raises:
        ValueError: buffer_bytes < 1 (names `--update-weight-buffer-size`), at the call.
    """
    if buffer_bytes < 1:
        raise ValueError(f"--update-weight-buffer-size must be >= 1 byte, got {buffer_bytes}")
    return _pack(named, buffer_bytes)


def _pack(
    named: Iterable[tuple[str, torch.Tensor]], buffer_bytes: int
) -> Iterator[list[tuple[str, torch.Tensor]]]:
    current: list[tuple[str, torch.Tensor]] = []
    used = 0
    for name, tensor in named:
        size = tensor_bytes(tensor)
        if current and used + size > buffer_bytes:
            yield current
            current, used = [], 0  # drop the sent bucket before the next tensor is gathered
        current.append((name, tensor))
        used += size
    if current:
        yield current


def sync_weights(
    named: Iterable[tuple[str, torch.Tensor]],
    engine: RolloutEngine,
    *,
    weight_version: int,
    buffer_bytes: int,
) -> SyncStats:
    """Send every (HF name, tensor) of `named` to `engine` in buckets; return what moved.

    `named` is consumed lazily (see `iter_buckets`): pass a generator such as
    `Actor.named_weights()` so that at most one bucket plus one tensor is held at a time.

    Raises:
        WeightSyncError: when the engine answers a bucket with another weight version.
        ValueError: buffer_bytes < 1.
    """
    packed = iter_buckets(named, buffer_bytes)
    engine.flush_cache()
    buckets = tensors = total = 0
    for bucket in packed:
        echoed = engine.update_weights(bucket, weight_version=weight_version)
        if echoed != weight_version:
            raise WeightSyncError(
                f"engine acknowledged weight version {echoed} after a sync to version {weight_version}"
            )
        buckets += 1
        tensors += len(bucket)
        total += sum(tensor_bytes(t) for _, t in bucket)
        del bucket  # the sent tensors are freed before the next bucket is gathered
    return SyncStats(buckets=buckets, tensors=tensors, bytes=total, weight_version=weight_version)

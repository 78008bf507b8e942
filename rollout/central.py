"""The `central` rollout path: on a multi-rank run with one engine fleet, rank 0 drives the engines for
every rank (as Miles does).

With an engine kind in `CENTRAL_ENGINES` (the HTTP engine over servers behind a router) and more
than one trainer rank, only rank 0 builds the engine: it launches or connects to the fleet,
generates the WHOLE rollout through the router (every sample with the seed a one-rank run gives
it), syncs the weights (rank 0's full weights equal every rank's: FSDP2 gathers them on all ranks),
releases/resumes engine memory, runs the weights checker and the evals. `broadcast_samples` sends
the rollout to the other ranks as the bytes of a `.grz` recording (replay/wire.py; no pickle), and
every rank keeps its contiguous share, exactly as a replayed rollout is split. A rank > 0 holds no
engine but joins every collective: the broadcast and the weight gathers of each sync
(`join_weight_sync`). Rank 0 generates only after it synced, so no rollout sees stale weights.
`builds_engine` and `joins_engine_of_rank_zero` tell the run's start-up and loop which rank does what.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Protocol

import torch
import torch.distributed as dist

from grpolab.core.batch import Sample
from grpolab.core.config import Config
from grpolab.core.dist import DistContext
from grpolab.replay.wire import decode_samples, encode_samples
from grpolab.rollout.base import newest_weight_version, rank_share
from grpolab.rollout.live import LivePath, generate, rollout_indices

CENTRAL_ENGINES = frozenset({"sglang"})
"""`--rollout-engine` kinds that serve every trainer rank from rank 0 (one fleet behind one router)."""


class WeightSource(Protocol):
    """The trainer's side of a sync (core.actor.Actor)."""

    def named_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """(HF name, full tensor) per weight; multi-rank, a collective per step."""
        ...


SOURCE_RANK = 0
"""The rank that owns the engine and sends each rollout."""


def is_central(config: Config, world_size: int) -> bool:
    """Whether rank 0 generates every rollout for all `world_size` ranks (a multi-rank server run)."""
    return world_size > 1 and config.rollout.rollout_engine in CENTRAL_ENGINES


def builds_engine(config: Config, ctx: DistContext) -> bool:
    """Whether this rank builds a rollout engine: none with `--debug-train-only`, and on a central run
    (`is_central`) only rank 0 does; otherwise every rank drives its own in-process engine."""
    if config.debug.debug_train_only:
        return False
    return ctx.rank == SOURCE_RANK or not is_central(config, ctx.world_size)


def _comm_device(ctx: DistContext) -> torch.device:
    """Where the broadcast's tensors live: NCCL (and det_nccl) moves only CUDA tensors, gloo CPU ones."""
    if ctx.backend is not None and "nccl" in ctx.backend:
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def broadcast_samples(
    samples: list[Sample] | None, ctx: DistContext, *, rollout_id: int, weight_version: int = 0
) -> list[Sample]:
    """Rank 0's whole rollout on every rank: a collective every rank must call, in the same order.

    Rank 0 passes its `samples` and gets them back unchanged; the others pass None and get the
    decoded copy (`replay.wire`: equal field by field, log-probs bit for bit). On the wire: an int64
    [1] tensor with the payload's byte count, then the payload as a uint8 [n] tensor.

    Raises:
        ValueError: rank 0 passed None, or another rank passed samples.
        RuntimeError: the bytes received name another rollout than `rollout_id` (ranks out of step).
        replay.format.RecordingError: the bytes are corrupt.
    """
    source = ctx.rank == SOURCE_RANK
    if source != (samples is not None):
        raise ValueError(f"rank {ctx.rank}: only rank {SOURCE_RANK} passes samples to broadcast_samples")
    if not ctx.distributed:
        assert samples is not None
        return samples
    device = _comm_device(ctx)
    if source:
        assert samples is not None
        payload = encode_samples(samples, rollout_id=rollout_id, weight_version=weight_version)
        length = torch.tensor([len(payload)], dtype=torch.int64, device=device)
        dist.broadcast(length, src=SOURCE_RANK)
        data = torch.frombuffer(bytearray(payload), dtype=torch.uint8).to(device)
        dist.broadcast(data, src=SOURCE_RANK)
        return samples
    length = torch.zeros(1, dtype=torch.int64, device=device)
    dist.broadcast(length, src=SOURCE_RANK)
    data = torch.empty(int(length.item()), dtype=torch.uint8, device=device)
    dist.broadcast(data, src=SOURCE_RANK)
    received, sent_id = decode_samples(data.cpu().numpy().tobytes(), name=f"rollout {rollout_id} from rank 0")
    if sent_id != rollout_id:
        raise RuntimeError(
            f"rank {ctx.rank} expected rollout {rollout_id} from rank 0 and received {sent_id}"
        )
    return received


def join_weight_sync(actor: WeightSource, weight_version: int) -> int:
    """A rank without an engine takes part in rank 0's sync to `weight_version`: iterate
    `actor.named_weights()` fully (each step gathers one FSDP2 parameter, a collective every rank
    must join) and drop every tensor. Returns `weight_version`, which rank 0's engine echoes (or
    rank 0 fails the run, and with it this rank)."""
    for _name, tensor in actor.named_weights():
        del tensor
    return weight_version


def joins_engine_of_rank_zero(config: Config, ctx: DistContext) -> bool:
    """Whether this rank has no engine of its own but takes part in rank 0's syncs (a central run's rank > 0)."""
    central = is_central(config, ctx.world_size) and not config.debug.debug_train_only
    return central and ctx.rank != SOURCE_RANK


class CentralPath(LivePath):
    """Rank 0 generates the whole rollout through the fleet and every rank keeps its share (see the module)."""

    name = "central"

    @staticmethod
    def chosen(config: Config, world_size: int) -> bool:
        """A multi-rank run on an engine kind in `CENTRAL_ENGINES` (`is_central`)."""
        return is_central(config, world_size)

    def rollout(self, rollout_id: int) -> list[Sample]:
        """This rank's share of rollout `rollout_id`: rank 0 generates it all (`perf/rollout_time`) and
        broadcasts it (a collective every rank joins); the same samples, indices and groups as the
        per-rank way."""
        inputs, dist_ctx = self.inputs, self.inputs.dist
        with inputs.timer("rollout"):
            whole = None
            if dist_ctx.is_primary:
                assert inputs.engine is not None  # rank 0 builds the engine (`builds_engine`)
                whole = generate(
                    self.config,
                    inputs.engine,
                    inputs.dataset,
                    inputs.sampling,
                    rollout_id=rollout_id,
                    indices=rollout_indices(self.config, inputs.dataset, rollout_id),
                    first=0,
                    tools=inputs.tools,
                    custom=inputs.custom,
                )
            version = newest_weight_version(whole or [])
            received = broadcast_samples(whole, dist_ctx, rollout_id=rollout_id, weight_version=version)
            return rank_share(received, dist_ctx)

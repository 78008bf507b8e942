"""Process groups for multi-rank runs (torchrun), FSDP2 sharding and the few collectives the loop needs.

`torchrun --nproc-per-node N -m grpolab train ...` starts N ranks; each rank runs its own engine on
its contiguous share of the rollout's prompts (data-parallel rollout; with engine servers rank 0 drives
the fleet for every rank and broadcasts the rollout: rollout/central.py), the actor is sharded with
FSDP2 (`fully_shard` per decoder layer plus the root), and full weights are gathered for each
rank's engine sync. Loss denominators are global counts and gradients are SUM-reduced (FSDP2's
divide factor set to 1), so the world size does not change the objective. gloo on CPU, NCCL on
CUDA; `--debug-deterministic-collective` uses det_gloo/det_nccl (det_backend.py) instead.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from grpolab.core import det_backend


@dataclass(frozen=True)
class DistContext:
    """This process's place in the run: rank, world size and the backend in use (None: no group)."""

    rank: int = 0
    world_size: int = 1
    backend: str | None = None

    @property
    def is_primary(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.backend is not None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def init_distributed(device: str, *, deterministic: bool) -> DistContext:
    """Join the torchrun world (RANK/WORLD_SIZE/MASTER_* env vars), or stay single-process.

    A single process with `deterministic` still gets a one-rank det group, so the same code path
    (and the same reduction order) runs at every world size.
    """
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    if world == 1 and not deterministic:
        return DistContext()
    device_type = torch.device(device).type
    if deterministic:
        det_backend.register()
        backend = det_backend.backend_for(device_type)
    else:
        backend = "nccl" if device_type == "cuda" else "gloo"
    if not dist.is_initialized():
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(_free_port()))
        dist.init_process_group(backend, rank=rank, world_size=world)
    return DistContext(rank=rank, world_size=world, backend=backend)


def all_reduce_sum(values: dict[str, float], ctx: DistContext) -> dict[str, float]:
    """Sum each value over ranks (float64; keys must be the same on every rank, in the same order)."""
    if not ctx.distributed or not values:
        return dict(values)
    keys = list(values)
    t = torch.tensor([values[k] for k in keys], dtype=torch.float64)
    dist.all_reduce(t)
    return dict(zip(keys, t.tolist()))


def all_gather_objects(obj: Any, ctx: DistContext) -> list[Any]:
    """Every rank's `obj`, in rank order (pickled over the process group: for our own small objects only)."""
    if not ctx.distributed:
        return [obj]
    out: list[Any] = [None] * ctx.world_size
    dist.all_gather_object(out, obj)
    return out


def barrier(ctx: DistContext) -> None:
    if ctx.distributed:
        dist.barrier()


def shard_model(model: torch.nn.Module, ctx: DistContext, device: str) -> torch.nn.Module:
    """FSDP2: one shard group per decoder layer plus the root, SUM-reduced gradients (divide factor 1)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import FSDPModule, fully_shard

    mesh = init_device_mesh(torch.device(device).type, (ctx.world_size,))
    layers = getattr(getattr(model, "model", model), "layers", [])
    for layer in layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.set_gradient_divide_factor(1.0)
            if hasattr(module, "set_force_sum_reduction_for_comms"):
                module.set_force_sum_reduction_for_comms(True)
    return model


def full_tensor(t: torch.Tensor) -> torch.Tensor:
    """The whole tensor of a (possibly FSDP-sharded) DTensor; a collective on every rank."""
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def shutdown(ctx: DistContext) -> None:
    """Leave the world after a finished run: a barrier first, so no rank closes its connections
    while a peer is still inside the run's last collective (gloo then fails that peer with
    "Connection closed by peer"), then `destroy_process_group`."""
    if ctx.distributed and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()

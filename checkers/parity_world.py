"""The parity ladder's world-size rung: the trainer's log-probs from 2 gloo ranks against 1 rank.

Each of `world` spawned processes joins a gloo world (core/dist.py, as `grpolab train
--nproc-per-node` does), loads the trainer (core/actor.py) sharded with FSDP2, and scores its
contiguous share of the samples (equal shares: FSDP's gathers are collective, so the last share is
filled up with copies of the first sample, whose scores are dropped), one sample per micro-batch, so the only difference from the
one-process trainer at micro-batch 1 is the world: the parameters FSDP gathers for each forward.
They are the same bits as the loaded ones, so the rung is bitwise; a difference means the sharded
model is not the model the one-process trainer loaded (a cast while sharding, a gather that
reduces). Ranks use the parent's thread count (CPU matmuls may round differently on another one)
and write their log-probs as safetensors into a temporary directory the parent reads back.
"""

from __future__ import annotations

import os
import socket
import tempfile
from pathlib import Path

import torch

from grpolab.core.batch import Sample


def world_log_probs(checkpoint: str, dtype: torch.dtype, temperature: float, samples: list[Sample], *,
                    world: int = 2) -> list[torch.Tensor]:  # fmt: skip
    """Each sample's float32 [T] log-probs from `world` FSDP2 ranks over gloo, in sample order.

    Raises:
        ValueError: fewer samples than ranks. RuntimeError: a rank failed (torch.multiprocessing's
            ProcessRaisedException / ProcessExitedException carry its traceback).
    """
    if len(samples) < world:
        raise ValueError(f"the world-size rung needs at least {world} samples, got {len(samples)}")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory(prefix="grpolab-parity-world-") as tmp:
        torch.multiprocessing.start_processes(
            _rank, args=(world, port, tmp, checkpoint, dtype, temperature, samples, torch.get_num_threads()),
            nprocs=world, start_method="spawn",
        )  # fmt: skip
        from safetensors.torch import load_file

        out: list[torch.Tensor] = []
        for rank in range(world):
            scores = load_file(str(Path(tmp) / f"rank{rank}.safetensors"))
            out += [scores[str(i)] for i in range(len(scores))]
    return out[: len(samples)]


def _rank(rank: int, world: int, port: int, tmp: str, checkpoint: str, dtype: torch.dtype, temperature: float,
          samples: list[Sample], threads: int) -> None:  # fmt: skip
    """One spawned rank: join the world, score this rank's share, write it, leave."""
    from safetensors.torch import save_file

    from grpolab.core.actor import Actor
    from grpolab.core.config import AlgorithmConfig, OptimizerConfig
    from grpolab.core.dist import init_distributed, shutdown

    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))  # fmt: skip
    torch.set_num_threads(threads)
    ctx = init_distributed("cpu", deterministic=False)
    per_rank = -(-len(samples) // world)
    filled = samples + samples[:1] * (per_rank * world - len(samples))
    share = filled[rank * per_rank : (rank + 1) * per_rank]
    opt = OptimizerConfig(global_batch_size=len(share) * world, micro_batch_size=1)
    actor = Actor(checkpoint, dtype=dtype, device="cpu", optimizer=opt, algorithm=AlgorithmConfig(),
                  temperature=temperature, build_optimizer=False, with_reference=False, train_forward="padded",
                  dist_ctx=ctx)  # fmt: skip
    scores = actor.compute_log_probs(share).log_probs
    save_file(
        {str(i): t.float().contiguous() for i, t in enumerate(scores)},
        str(Path(tmp) / f"rank{rank}.safetensors"),
    )
    shutdown(ctx)

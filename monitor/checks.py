"""The profiling flags checked against this machine and this run's world, torch-free (no torch import
unless `--memory-recorder torch` asks whether CUDA is there).

`grpolab train`'s preflight (train/preflight.py) calls `check_profiling_start` before any run directory is
made: an error is exit 2 naming the flag. `RunProfiling.check` (monitor/profiler.py) logs the warnings
of `profiling_warnings` once the run directory exists, so they are in console.log.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from grpolab.core.config import Config
    from grpolab.core.config.monitoring import ProfilingConfig


def check_profile_ranks(cfg: ProfilingConfig, *, world_size: int) -> None:
    """Every `--profile-ranks` rank exists in a world of `world_size` ranks (1 without torchrun).

    Raises:
        ValueError: naming --profile-ranks, the missing ranks and the world size.
    """
    if not cfg.use_pytorch_profiler:
        return
    missing = [r for r in cfg.profile_ranks if r >= world_size]
    if missing:
        raise ValueError(
            f"--profile-ranks {' '.join(map(str, missing))}: no such rank in a world of {world_size} "
            f"(ranks are 0..{world_size - 1}; the world is --nproc-per-node, or torchrun's WORLD_SIZE)"
        )


def check_memory_recorder(cfg: ProfilingConfig, *, cuda_available: bool | None = None) -> None:
    """Refuse a recorder this machine cannot run (`cuda_available`: default torch.cuda.is_available(),
    asked only for `--memory-recorder torch`).

    Raises:
        ValueError: `--memory-recorder torch` (the default) without CUDA; memray not installed.
    """
    if not cfg.record_memory_history:
        return
    if cfg.memory_recorder == "torch":
        if cuda_available is None:
            import torch

            cuda_available = torch.cuda.is_available()
        if not cuda_available:
            raise ValueError(
                "--record-memory-history --memory-recorder torch records CUDA memory and this machine has no "
                "CUDA; use --memory-recorder memray on CPU"
            )
    if cfg.memory_recorder == "memray":
        try:
            importlib.import_module("memray")
        except ImportError as e:
            raise ValueError(
                f"--memory-recorder memray needs the memray package, which does not import ({e}): "
                "pip install 'grpolab[monitoring]'"
            ) from e


def check_profiling_start(config: Config, *, world_size: int) -> None:
    """Preflight: `check_profile_ranks` and `check_memory_recorder` (exit 2 before a run directory).

    Raises:
        ValueError: as those two.
    """
    check_profile_ranks(config.profiling, world_size=world_size)
    check_memory_recorder(config.profiling)


def profiling_warnings(cfg: ProfilingConfig, *, num_rollout: int) -> list[str]:
    """Warnings about windows that do not fit `--num-rollout` (rollout ids 0..num_rollout-1).

    - train_overall: the window starts at or past the last rollout (nothing traced), or ends past it
      (only rollouts start..num_rollout-1 are traced);
    - `--memory-snapshot-num-steps` > --num-rollout: the snapshot after rollout N-1 never comes (the
      recording still ends with the run: memray's file is written with reason run_ended).
    """
    out = []
    start, end = cfg.profile_step_start, cfg.profile_step_end
    if cfg.use_pytorch_profiler and cfg.profile_target == "train_overall":
        if start >= num_rollout:
            out.append(
                f"warning: --use-pytorch-profiler: --profile-step-start {start} is at or past --num-rollout "
                f"{num_rollout} (rollout ids 0..{num_rollout - 1}); nothing will be traced"
            )
        elif end > num_rollout:
            out.append(
                f"warning: --use-pytorch-profiler: --profile-step-end {end} is past --num-rollout "
                f"{num_rollout}; only rollouts {start}..{num_rollout - 1} will be traced"
            )
    if cfg.record_memory_history and cfg.memory_snapshot_num_steps > num_rollout:
        out.append(
            f"warning: --record-memory-history: --memory-snapshot-num-steps {cfg.memory_snapshot_num_steps} "
            f"is past --num-rollout {num_rollout}; the snapshot after rollout "
            f"{cfg.memory_snapshot_num_steps - 1} will never be written"
        )
    return out

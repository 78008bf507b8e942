"""Colocation: who holds the device in each phase of a step (`--colocate`, `--offload-train`, `--offload-rollout`).

Engine and trainer take turns on one device (Miles' colocated mode). With `--colocate`:
- `after_rollout`: `--offload-rollout` releases the engine's memory (KV cache, weights off the
  accelerator) once generation is done (`perf/engine_release_time`);
- `before_train`: `--offload-train` brings the trainer's weights, reference and optimizer state
  back when they were offloaded (`perf/wake_up_time`);
- `before_sync`: `--offload-train` moves the trainer's state to CPU (`perf/sleep_time`), then
  `--offload-rollout` gives the engine its memory back (`perf/engine_resume_time`), so the weight
  sync and the next rollout run with the engine resident.
Without `--colocate` nothing moves. A missing side (rollout-only or train-only runs) is skipped.
"""

from __future__ import annotations

from typing import Protocol

from grpolab.core.config import ColocateConfig
from grpolab.core.engine.base import RolloutEngine
from grpolab.core.metrics import PhaseTimer


class Offloadable(Protocol):
    """The trainer's side (core.actor.Actor): state that can leave the device and come back."""

    offloaded: bool

    def offload(self) -> None:
        """Move weights, reference and optimizer state to CPU."""
        ...

    def onload(self) -> None:
        """Move them back to the training device."""
        ...


class Colocation:
    """Moves engine memory and trainer state around the phases of a step, timing each move.

    Args:
        config: the `--colocate` / `--offload-train` / `--offload-rollout` settings.
        engine: the rollout engine, or None when the run builds none (`--debug-train-only`).
        actor: the trainer, or None when the run builds none (`--debug-rollout-only`).
        timer: where `sleep`, `wake_up`, `engine_release` and `engine_resume` seconds go
            (`perf/<name>_time`).
    """

    def __init__(
        self,
        config: ColocateConfig,
        *,
        engine: RolloutEngine | None,
        actor: Offloadable | None,
        timer: PhaseTimer,
    ) -> None:
        self.offload_rollout = config.colocate and config.offload_rollout and engine is not None
        self.offload_train = config.colocate and config.offload_train and actor is not None
        self.engine, self.actor, self.timer = engine, actor, timer

    def after_rollout(self) -> None:
        """Generation is done: release the engine's memory for the trainer."""
        if self.offload_rollout:
            assert self.engine is not None
            with self.timer("engine_release"):
                self.engine.release_memory()

    def before_train(self) -> None:
        """The trainer runs next: bring its state back if it was offloaded."""
        if self.offload_train:
            assert self.actor is not None
            if self.actor.offloaded:
                with self.timer("wake_up"):
                    self.actor.onload()

    def before_sync(self) -> None:
        """Training is done: offload the trainer's state, give the engine its memory back."""
        if self.offload_train:
            assert self.actor is not None
            with self.timer("sleep"):
                self.actor.offload()
        if self.offload_rollout:
            assert self.engine is not None
            with self.timer("engine_resume"):
                self.engine.resume_memory()

"""The trainer's part of a step: the log-prob forwards it needs, the `rollout N:` line, the optimizer steps.

Issue 12 (the trainer ran three forwards per rollout; TRL runs one) decides which forwards run.

- The reference forward runs only when something reads it (`reference_needed`): `--use-kl-loss`
  (the loss and `train/kl_loss`, whatever `--kl-loss-coef`: Miles' reproducibility recipe logs
  kl_loss with coefficient 0), or the `--ci-test` log-prob checker, whose rollout-0 check compares
  `rollout/log_probs` with `rollout/ref_log_probs`. Without a reader the reference model is not
  built (one model less in memory) and, as in Miles, whose timers and metrics exist only for what
  ran, `perf/ref_log_probs_time` and `rollout/ref_log_probs` are absent.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch

from grpolab.checkers.faults import FaultInjector
from grpolab.checkers.harness import CheckHarness
from grpolab.core.actor import Actor, LogProbs
from grpolab.core.batch import Sample
from grpolab.core.colocation import Colocation
from grpolab.core.config import Config
from grpolab.core.dist import DistContext
from grpolab.core.metrics import PhaseTimer, rollout_metrics
from grpolab.core.step_report import StepReporter
from grpolab.rundir.writer import RunDirectory

log = logging.getLogger("grpolab")


def reference_needed(cfg: Config) -> bool:
    """Whether anything reads reference log-probs: `--use-kl-loss` or the `--ci-test` log-prob checker."""
    ci = cfg.ci
    return cfg.algorithm.use_kl_loss or (ci.ci_test and not ci.ci_disable_logprobs_checker)


class TrainPhase:
    """Runs the trainer's part of each step (see the module); `run` is called once per rollout.

    Args:
        cfg: the run's config; actor: the trainer (None under `--debug-rollout-only`).
        harness / faults / reporter / timer / colocation / run_dir / dist: the run's parts (core/loop.py).
        gather: concatenates every rank's list in rank order (a collective on multi-rank runs).
    """

    def __init__(
        self,
        cfg: Config,
        actor: Actor | None,
        *,
        harness: CheckHarness,
        faults: FaultInjector,
        reporter: StepReporter,
        timer: PhaseTimer,
        colocation: Colocation,
        run_dir: RunDirectory,
        dist: DistContext,
        gather: Callable[[list], list],
    ) -> None:
        self.cfg, self.actor, self.harness, self.faults = cfg, actor, harness, faults
        self.reporter, self.timer, self.colocation = reporter, timer, colocation
        self.run_dir, self.dist, self.gather = run_dir, dist, gather
        self.reference = reference_needed(cfg)
        if actor is not None:
            log.info(
                f"reference log-probs: {'computed' if self.reference else 'skipped (nothing reads them)'}"
            )

    def run(
        self, rollout_id: int, samples: list[Sample], everyone: list[Sample]
    ) -> tuple[dict[str, float], list[dict[str, float]]]:
        """Log-probs, the `rollout N:` line over `everyone` (checked), then the optimizer steps on
        this rank's `samples`, one `step N:` line each; returns the rollout line and the steps."""
        if self.actor is None:
            line = rollout_metrics(
                everyone, log_probs=None, ref_log_probs=None, entropy=None, rollout_id=rollout_id
            )
            self.reporter.emit("rollout", rollout_id, line, samples=everyone)
            return line, []
        self.colocation.before_train()
        self.run_dir.heartbeat("train", rollout_id)
        with self.timer("log_probs"):
            old = self.actor.compute_log_probs(samples, with_entropy=True)
        ref = self._reference(samples)
        line = self._rollout_line(rollout_id, everyone, old, ref)
        steps = self._train(rollout_id, samples, old.log_probs, ref)
        for step_in_rollout, step_metrics in enumerate(steps):
            self.reporter.emit("step", int(step_metrics["train/step"]), step_metrics, rollout_id=rollout_id)
            self.harness.after_step(rollout_id, step_in_rollout, step_metrics)
        return line, steps

    def _reference(self, samples: list[Sample]) -> LogProbs | None:
        if not self.reference:
            return None
        assert self.actor is not None
        with self.timer("ref_log_probs"):
            return self.actor.compute_log_probs(samples, reference=True)

    def _rollout_line(
        self, rollout_id: int, everyone: list[Sample], old: LogProbs, ref: LogProbs | None
    ) -> dict[str, float]:
        """The `rollout N:` line over the whole rollout, written, then checked by the log-prob checker."""
        all_old = self.gather(old.log_probs)
        all_ref = None if ref is None else self.gather(ref.log_probs)
        all_entropy = self.gather(old.entropy or [])
        line = rollout_metrics(
            everyone, log_probs=all_old, ref_log_probs=all_ref, entropy=all_entropy, rollout_id=rollout_id
        )
        self.reporter.emit("rollout", rollout_id, line, samples=everyone)
        self.harness.after_rollout_line(rollout_id, line, everyone, all_old, all_ref)
        return line

    def _train(
        self,
        rollout_id: int,
        samples: list[Sample],
        old: list[torch.Tensor],
        ref: LogProbs | None,
    ) -> list[dict[str, float]]:
        """The optimizer steps on this rank's samples."""
        assert self.actor is not None
        self.faults.maybe_fire("train", rollout_id)
        self.faults.maybe_fire("before_allreduce", rollout_id)  # the first backward reduces gradients
        with self.timer("actor_train"):
            return self.actor.train(
                samples,
                old,
                None if ref is None else ref.log_probs,
                step_offset=rollout_id * self.cfg.steps_per_rollout,
                apply_update=not self.cfg.debug.debug_disable_optimizer,
                after_step=self.harness.step_hasher(self.actor, world_size=self.dist.world_size),
            )

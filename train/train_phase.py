"""The trainer's part of a step: the log-prob forwards it needs, the `rollout N:` line, the optimizer steps.

Issue 12 (the trainer ran three forwards per rollout; TRL runs one) decides which forwards run:

- The reference forward runs only when something reads it (`reference_needed`): `--use-kl-loss`
  (the loss and `train/kl_loss`, whatever `--kl-loss-coef`: Miles' reproducibility recipe logs
  kl_loss with coefficient 0), or the `--ci-test` log-prob checker, whose rollout-0 check compares
  `rollout/log_probs` with `rollout/ref_log_probs`. Without a reader the reference model is not
  built (one model less in memory) and, as in Miles, whose timers and metrics exist only for what
  ran, `perf/ref_log_probs_time` and `rollout/ref_log_probs` are absent.
- The old (pre-update) log-probs are the training forward's own, detached, when that is provably
  the same numbers (`separate_forward_reason` is None): exactly one optimizer step per rollout (same
  weights), the same micro-batches and code (core/actor.py), no dropout (train mode is then the same
  function), and the first trained rollout of the process computed both ways and found them
  `torch.equal` on every rank (kernels picked differently with gradients on would show there). Then
  `perf/log_probs_time` is absent (no such forward runs) and the `rollout N:` line is computed after
  training, still written before the step lines, with the same values.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch

from grpolab.checkers.faults import FaultInjector
from grpolab.checkers.harness import CheckHarness
from grpolab.core.actor import Actor, LogProbs
from grpolab.core.batch import Sample
from grpolab.core.config import Config
from grpolab.core.dist import DistContext, all_reduce_sum
from grpolab.core.metrics import PhaseTimer, rollout_metrics
from grpolab.rundir.writer import RunDirectory
from grpolab.train.colocation import Colocation
from grpolab.train.step_report import StepReporter

log = logging.getLogger("grpolab")


def reference_needed(cfg: Config) -> bool:
    """Whether anything reads reference log-probs: `--use-kl-loss` or the `--ci-test` log-prob checker."""
    return cfg.algorithm.use_kl_loss or cfg.ci.logprobs_checker_on


def active_dropout(model: torch.nn.Module) -> list[str]:
    """Names of the dropout modules (p > 0) and `*dropout*` config values (> 0) of `model`."""
    found = [
        f"{name} (p={m.p})"
        for name, m in model.named_modules()
        if isinstance(m, torch.nn.modules.dropout._DropoutNd) and m.p > 0
    ]
    config = getattr(model, "config", None)
    for key, value in (vars(config) if config is not None else {}).items():
        if "dropout" in key and isinstance(value, int | float) and value > 0:
            found.append(f"config.{key}={value}")
    return found


def separate_forward_reason(cfg: Config, model: torch.nn.Module) -> str | None:
    """Why the old log-probs need a forward of their own, or None when the training forward's are the
    same numbers (still verified once per process, see the module). Every rank must decide the same
    (the verification is a collective), so only the config and the model's own layers count."""
    steps, ci = cfg.steps_per_rollout, cfg.ci
    if steps != 1:
        gbs = cfg.optimizer.global_batch_size
        return f"{steps} optimizer steps per rollout (--global-batch-size {gbs}): later steps see updated weights"
    if ci.kl_checker_on or ci.logprobs_checker_on:
        return "--ci-test checks them against the training forward (ppo_kl == 0) and before training"
    if cfg.profiling.use_pytorch_profiler and cfg.profiling.profile_target == "train_log_probs":
        return "--profile-target train_log_probs traces that forward"
    if cfg.ci.ci_ft_test_actions:  # any rank's: a rank that decided alone would miss the others' collective
        return "--ci-ft-test-actions: a fault at `train` must find the rollout line written"
    dropout = active_dropout(model)
    if dropout:
        return f"the model drops out in train mode: {', '.join(dropout[:3])}"
    return None


def same_log_probs(a: LogProbs, b: LogProbs) -> bool:
    """Whether two LogProbs hold bitwise equal per-sample log-probs and entropies (`torch.equal`)."""
    pairs = [(a.log_probs, b.log_probs), (a.entropy or [], b.entropy or [])]
    return all(len(x) == len(y) and all(torch.equal(s, t) for s, t in zip(x, y)) for x, y in pairs)


class TrainPhase:
    """Runs the trainer's part of each step (see the module); `run` is called once per rollout.

    Args:
        cfg: the run's config; actor: the trainer (None under `--debug-rollout-only`).
        harness / faults / reporter / timer / colocation / run_dir / dist: the run's parts (train/loop.py).
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
        self.reason = "no trainer" if actor is None else separate_forward_reason(cfg, actor.model)
        self.from_training_forward = False  # set once the first trained rollout verified it
        self.extra: dict[str, float] = {}  # the rollout path's keys for the current rollout line
        # the shared-prefix forward's counts are said once, after the first trained rollout
        self.packing_reported = False
        if actor is not None:
            ref = "computed" if self.reference else "skipped (nothing reads them)"
            old = (
                f"a separate forward ({self.reason})"
                if self.reason
                else "the training forward, once verified"
            )
            log.info(f"reference log-probs: {ref}; old log-probs: {old}")

    def run(
        self,
        rollout_id: int,
        samples: list[Sample],
        everyone: list[Sample],
        extra: dict[str, float] | None = None,
    ) -> tuple[dict[str, float], list[dict[str, float]]]:
        """Log-probs, the `rollout N:` line over `everyone` (checked; `extra` keys from the rollout path
        added: the dynamic sampling ledger), then the optimizer steps on this rank's `samples`, one
        `step N:` line each; returns the rollout line and the steps."""
        self.extra = extra or {}
        if self.actor is None:
            line = (
                rollout_metrics(
                    everyone, log_probs=None, ref_log_probs=None, entropy=None, rollout_id=rollout_id
                )
                | self.extra
            )
            self.reporter.emit("rollout", rollout_id, line, samples=everyone)
            return line, []
        self.colocation.before_train()
        self.run_dir.heartbeat("train", rollout_id)
        forward = LogProbs(log_probs=[], entropy=[])
        if self.from_training_forward:
            ref = self._reference(samples)
            steps = self._train(rollout_id, samples, None, ref, forward)
            line = self._rollout_line(rollout_id, everyone, forward, ref)
        else:
            with self.timer("log_probs"):
                old = self.actor.compute_log_probs(samples, with_entropy=True)
            ref = self._reference(samples)
            line = self._rollout_line(rollout_id, everyone, old, ref)
            verify = self.reason is None
            steps = self._train(rollout_id, samples, old.log_probs, ref, forward if verify else None)
            if verify:
                self._verify(rollout_id, old, forward)
        if self.actor.shared_prefix and not self.packing_reported:
            self._report_packing(rollout_id)
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
        line = (
            rollout_metrics(
                everyone, log_probs=all_old, ref_log_probs=all_ref, entropy=all_entropy, rollout_id=rollout_id
            )
            | self.extra
        )
        self.reporter.emit("rollout", rollout_id, line, samples=everyone)
        self.harness.after_rollout_line(rollout_id, line, everyone, all_old, all_ref)
        return line

    def _train(
        self,
        rollout_id: int,
        samples: list[Sample],
        old: list[torch.Tensor] | None,
        ref: LogProbs | None,
        forward: LogProbs | None,
    ) -> list[dict[str, float]]:
        """The optimizer steps on this rank's samples (`old` None: the training forward's own)."""
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
                forward=forward,
            )

    def _report_packing(self, rollout_id: int) -> None:
        """Say (console and a `train_forward` event) how many of the micro-batch forwards the trainer ran
        up to the end of the first trained rollout (its old-log-prob, reference and training forwards)
        ran packed, summed over ranks (a collective): the start line names the mode, this what it did
        (none packed: no prompt repeats in a micro-batch, or packing would not pay)."""
        assert self.actor is not None
        counts = all_reduce_sum({k: float(v) for k, v in self.actor.forwards.items()}, self.dist)
        packed, total = int(counts["packed"]), int(counts["packed"] + counts["padded"])
        log.info(
            f"the trainer's forward: {packed} of {total} micro-batch forwards packed by prompt at rollout {rollout_id}"
        )
        self.run_dir.event("train_forward", rollout_id=rollout_id, packed=packed, forwards=total)
        self.packing_reported = True

    def _verify(self, rollout_id: int, old: LogProbs, forward: LogProbs) -> None:
        """Switch to the training forward's log-probs when they equal the separate forward's on every
        rank (a collective); an `old_log_probs` event says which way the run goes."""
        differs = all_reduce_sum({"ranks": 0.0 if same_log_probs(old, forward) else 1.0}, self.dist)["ranks"]
        self.from_training_forward = differs == 0
        if self.from_training_forward:
            # not "rollout N: ..." at the start of a line: that is the metrics line's shape (log readers parse it)
            log.info(
                f"old log-probs: the training forward's equal the separate forward's at rollout {rollout_id}"
            )
        else:
            self.reason = (
                f"at rollout {rollout_id} they differed from the training forward's on {differs:.0f} rank(s)"
            )
            log.info(f"old log-probs: a separate forward ({self.reason})")
        source = "training_forward" if self.from_training_forward else "separate_forward"
        self.run_dir.event("old_log_probs", rollout_id=rollout_id, source=source, reason=self.reason)

"""The in-run checker harness: which checkers run under the flags, and where in the loop.

The loop calls one hook per point of a step; each hook runs the enabled checkers, writes a
`check` event (checker, verdict, details) into events.jsonl, and raises `CheckFailure` where an
invariant breaks, so the run fails at the step that broke it. Numeric-guard findings are warnings
without `--ci-test` and failures with it.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from grpolab.checkers import (
    grad_norm,
    group_seeds,
    kl,
    logprobs,
    model_hash,
    numeric_guard,
    step_hash,
    true_on_policy,
    turns,
    weight_update,
    weight_version,
)
from grpolab.checkers.errors import CheckFailure
from grpolab.checkers.metric import MetricChecker
from grpolab.core.atomic import atomic_write_json
from grpolab.core.batch import Sample
from grpolab.core.config import Config
from grpolab.core.engine.base import ChecksWeights, RolloutEngine, capability
from grpolab.core.turns.episode import episode_of
from grpolab.rundir.writer import RunDirectory

if TYPE_CHECKING:
    from grpolab.core.actor import Actor

log = logging.getLogger("grpolab")


class CheckHarness:
    """Runs the checkers `config` enables; every verdict lands in the run directory's events."""

    def __init__(self, config: Config, run_dir: RunDirectory) -> None:
        ci, debug = config.ci, config.debug
        self.ci = ci
        self.run_dir = run_dir
        one_side_only = debug.debug_rollout_only or debug.debug_train_only
        self.kl_enabled = ci.kl_checker_on
        self.exact_gap = ci.ci_test and config.model.true_on_policy_mode
        """Under --ci-test and --true-on-policy-mode: every trained token's gap is 0 (true_on_policy.py)."""
        self.logprobs_enabled = ci.logprobs_checker_on
        self.logprobs = logprobs.LogprobChecker(
            abs_tol=ci.ci_logprobs_checker_abs_tol,
            entropy_range=(ci.ci_entropy_range[0], ci.ci_entropy_range[1]),
            facts=logprobs.RunFacts(weight_sync_skipped=debug.debug_skip_weight_update),
        )
        wants_weight_check = (
            ci.ci_test and not ci.ci_disable_weight_update_checker
        ) or ci.check_weight_update_equal
        self.weight_update_enabled = wants_weight_check and not one_side_only
        self.metric = None
        if ci.ci_metric_checker_key is not None and run_dir.rank == 0:  # rank 0 runs the evals
            assert ci.ci_metric_checker_threshold is not None
            self.metric = MetricChecker(
                ci.ci_metric_checker_key, ci.ci_metric_checker_threshold, ci.ci_metric_checker_expect_num
            )
        self._first_step_seen = False
        self.tokenizer: object = None

    def _verdict(self, checker: str, ok: bool, **details: object) -> None:
        self.run_dir.event("check", checker=checker, ok=ok, **details)

    def _run(self, checker: str, fn: Callable[[], None], **details: object) -> None:
        try:
            fn()
        except CheckFailure as e:
            self._verdict(checker, False, message=str(e), **details)
            raise
        self._verdict(checker, True, **details)

    def know_run(
        self,
        *,
        vocab_size: int,
        chat_template_unapplied: bool,
        filters_support: bool,
        tokenizer: object = None,
    ) -> None:
        """What the log-prob checker learns once the run's parts are built (see `logprobs.RunFacts`), and
        the tokenizer the turns audit renders multi-turn samples with."""
        self.tokenizer = tokenizer
        self.logprobs.facts = dataclasses.replace(
            self.logprobs.facts,
            vocab_size=vocab_size,
            chat_template_unapplied=chat_template_unapplied,
            filters_support=filters_support,
        )

    # ------------------------------------------------------------------ hooks
    def first_sync(self, engine: RolloutEngine | None, sync: Callable[[], None], *, resumed: bool) -> None:
        """The startup sync, wrapped by the weight-update checker when it is on.

        Raises:
            CheckFailure: an engine tensor is not bitwise equal to the trainer's after the sync.
            ValueError: the checker is on but the engine has no weights checker (`base.ChecksWeights`).
        """
        if not self.weight_update_enabled:
            sync()
            return
        if resumed:
            # the engine loads --hf-checkpoint while the trainer resumed other weights: a snapshot
            # of the engine cannot be the expected value, so the bitwise check does not apply
            self.run_dir.event(
                "check", checker="weight_update", ok=None, message="skipped: resumed from --load"
            )
            sync()
            return
        checkable = capability(engine, ChecksWeights)
        if checkable is None:
            name = getattr(engine, "name", "the engine")
            raise ValueError(
                f"--ci-test / --check-weight-update-equal: {name} has no weights checker to compare its "
                "tensors with the trainer's; pass --ci-disable-weight-update-checker"
            )
        self._run("weight_update", lambda: weight_update.check_weight_update(checkable, sync))
        log.info("weight-update checker: every engine tensor equals the trainer's after the first sync")

    def after_generate(
        self, rollout_id: int, samples: list[Sample], acknowledged: int, gather: Callable[[list], list]
    ) -> None:
        """Weight-version check of this rank's generated samples, in every run from its first sync on
        (on-policy: one sync per rollout). `gather` concatenates every rank's list (one collective), so
        every rank fails together.

        Raises:
            CheckFailure: a sample was generated with another version than `acknowledged`.
        """
        ranks = gather([(len(samples), weight_version.find_stale(samples, acknowledged))])
        stale = [s for _, rank_stale in ranks for s in rank_stale]
        total = sum(n for n, _ in ranks)
        self._run(
            "weight_version",
            lambda: weight_version.check_weight_versions(
                stale, rollout_id=rollout_id, acknowledged=acknowledged, total=total
            ),
            rollout_id=rollout_id,
            weight_version=acknowledged,
        )

    def after_advantages(self, rollout_id: int, samples: list[Sample]) -> None:
        """GRPO numeric guard: warn, and under --ci-test fail; under --ci-test the turns audit of the
        rollout's multi-turn samples (checkers/turns.py)."""
        findings = numeric_guard.guard_rewards(
            torch.tensor([s.reward for s in samples], dtype=torch.float64),
            torch.tensor([s.group_index for s in samples]),
            torch.tensor([s.advantage for s in samples], dtype=torch.float64),
            max_abs_advantage=self.ci.ci_max_abs_advantage,
        )
        for f in findings:
            log.info(f"numeric guard (rollout {rollout_id}): {f.code}: {f.message}")
            self.run_dir.event("numeric_guard", rollout_id=rollout_id, code=f.code, message=f.message)
        if findings and self.ci.ci_test:
            self._run(
                "numeric_guard",
                lambda: numeric_guard.raise_on_findings(findings, rollout_id=rollout_id),
                rollout_id=rollout_id,
            )
        self._check_group_seeds(rollout_id, samples)
        if self.ci.ci_test and self.tokenizer is not None and any(episode_of(s.metadata) for s in samples):
            self._run(
                "turns",
                lambda: turns.check_turns(samples, self.tokenizer, rollout_id=rollout_id),
                rollout_id=rollout_id,
            )

    def _check_group_seeds(self, rollout_id: int, samples: list[Sample]) -> None:
        """Shared seeds and identical answers in a group (group_seeds.py): a `group_seeds` event and a
        warning per finding, and under --ci-test the verdict."""
        findings = group_seeds.group_findings(samples)
        for f in findings:  # identical answers: a confident policy's easy prompt, so only a note
            if f.code == "shared_seed":
                log.warning(f"warning: rollout {rollout_id}: {f.message}")
            else:
                log.info(f"note (rollout {rollout_id}): {f.message}")
            self.run_dir.event(
                group_seeds.CHECKER,
                rollout_id=rollout_id,
                code=f.code,
                group=f.group,
                samples=list(f.samples),
            )
        if self.ci.ci_test:
            self._run(
                group_seeds.CHECKER,
                lambda: group_seeds.check_groups(rollout_id, samples, findings),
                rollout_id=rollout_id,
            )

    def after_rollout_line(
        self,
        rollout_id: int,
        line: dict[str, float],
        samples: list[Sample],
        trainer: list[torch.Tensor],
        reference: list[torch.Tensor] | None,
    ) -> None:
        """Under --ci-test and --true-on-policy-mode, the exact trainer = engine check; the log-prob
        checker on the rollout's means, with per-token detail on failure."""
        if self.exact_gap and samples:
            self._run(
                true_on_policy.CHECKER,
                lambda: true_on_policy.check_exact(rollout_id, samples, trainer),
                rollout_id=rollout_id,
            )
        if not self.logprobs_enabled:
            return
        self._run(
            "logprobs",
            lambda: self.logprobs.check(
                rollout_id,
                line,
                trainer=trainer,
                reference=reference,
                engine=[s.rollout_log_probs for s in samples],
                response_ids=[s.response_ids for s in samples],
                kept_token_ids=[s.kept_token_ids for s in samples],
            ),
            rollout_id=rollout_id,
        )

    def after_step(self, rollout_id: int, step_in_rollout: int, metrics: dict[str, float]) -> None:
        """KL checker, and grad-norm save/compare."""
        first = not self._first_step_seen
        self._first_step_seen = True
        if self.kl_enabled and step_in_rollout == 0:
            self._run(
                "kl",
                lambda: kl.check_kl(
                    metrics, rollout_id=rollout_id, step_in_rollout=step_in_rollout, first_step_of_run=first
                ),
                rollout_id=rollout_id,
                step=int(metrics["train/step"]),
            )
        where = {"role": "actor", "rollout_id": rollout_id, "step_id": step_in_rollout}
        if self.ci.ci_save_grad_norm:
            grad_norm.save_grad_norm(self.ci.ci_save_grad_norm, metrics["train/grad_norm"], **where)
        elif self.ci.ci_load_grad_norm:
            tol = self.ci.ci_grad_norm_rtol
            self._run(
                "grad_norm",
                lambda: grad_norm.check_grad_norm(
                    self.ci.ci_load_grad_norm, metrics["train/grad_norm"], rtol=tol, atol=tol, **where
                ),
                rollout_id=rollout_id,
                step_id=step_in_rollout,
            )

    def step_hasher(self, actor: Actor, *, world_size: int) -> Callable[[int], None] | None:
        """`--save-model-hash-every-step`: the callback `Actor.train` calls with `train/step` after each
        optimizer step (writes `checks/model_hash_step_<N>.json`, rank 0); None when off or not rank 0."""
        if not self.ci.save_model_hash_every_step or self.run_dir.rank != 0:
            return None

        def write(step: int) -> None:
            step_hash.save_step_hashes(
                self.run_dir.path, step, actor.local_named_weights(), world_size=world_size
            )

        return write

    def after_eval(self, rollout_id: int, metrics: dict[str, float]) -> None:
        if self.metric is not None:
            ok = self.metric.record(rollout_id, metrics)
            self._verdict(
                "metric", ok, rollout_id=rollout_id, key=self.metric.key, value=metrics[self.metric.key]
            )

    def after_checkpoint(self, iter_dir: Path, weights: Callable[[], list[tuple[str, torch.Tensor]]]) -> None:
        if self.ci.ci_save_model_hash:
            path = model_hash.save_model_hash(
                iter_dir, model_hash.layer_hashes(weights()), rank=self.run_dir.rank
            )
            self.run_dir.event("model_hash_saved", path=str(path))

    def after_load(self, iter_dir: Path, weights: Callable[[], list[tuple[str, torch.Tensor]]]) -> None:
        if self.ci.ci_check_model_hash:
            self._run(
                "model_hash",
                lambda: model_hash.check_model_hash(
                    iter_dir, model_hash.layer_hashes(weights()), rank=self.run_dir.rank
                ),
                path=str(iter_dir),
            )

    def final_weights(self, weights: list[tuple[str, torch.Tensor]]) -> None:
        """`--ci-save-model-hash`: per-layer hashes of the final full weights in `checks/model_hash_final.json`.

        Written at every world size (checkpoints are not), so runs on different world sizes compare bitwise.
        """
        if self.run_dir.rank != 0:
            return
        path = self.run_dir.path / "checks" / "model_hash_final.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_json(path, model_hash.layer_hashes(weights))
        self.run_dir.event("model_hash_saved", path=str(path))

    def finish(self) -> None:
        """End-of-run verdicts (the metric gate needs at least one eval)."""
        if self.metric is not None:
            self._run("metric", self.metric.finish, key=self.metric.key)

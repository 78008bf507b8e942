"""KL checker (`--ci-test`, off with `--ci-disable-kl-checker`).

At the first optimizer step of every rollout the policy still equals the "old" policy that
produced the log-probs, so `train/ppo_kl` and `train/pg_clipfrac` must be zero; at the very first
step of the run the policy equals the reference, so `train/kl_loss` must be zero. Thresholds are
Miles' `ci_utils.check_kl` (notes-miles-slime-areal.md 3.1): |ppo_kl| < 1e-9, |pg_clipfrac| < 1e-10,
|kl_loss| < 1e-9.
"""

from __future__ import annotations

from grpolab.checkers.errors import CheckFailure

PPO_KL_TOL = 1e-9
PG_CLIPFRAC_TOL = 1e-10
KL_LOSS_TOL = 1e-9


def check_kl(
    step_metrics: dict[str, float], *, rollout_id: int, step_in_rollout: int, first_step_of_run: bool
) -> None:
    """Assert the on-policy invariants of one optimizer step.

    Args:
        step_metrics: the `step N` dict (`train/*` keys).
        step_in_rollout: 0 for the first optimizer step of the rollout (only then is anything checked).
        first_step_of_run: True for the run's very first step (also checks `train/kl_loss`).

    Raises:
        CheckFailure: naming the metric, its value, the threshold and the likely cause.
    """
    if step_in_rollout != 0:
        return
    step = int(step_metrics.get("train/step", -1))
    where = f"rollout {rollout_id}, step {step} (first optimizer step of the rollout)"
    ppo_kl = step_metrics.get("train/ppo_kl")
    if ppo_kl is not None and not abs(ppo_kl) < PPO_KL_TOL:
        raise CheckFailure(
            "kl",
            f"train/ppo_kl = {ppo_kl!r} at {where}; expected |ppo_kl| < {PPO_KL_TOL}. The log-probs the loss sees "
            "differ from the ones computed before training: the two forwards are not the same computation "
            "(different micro-batching or padding, dropout on, nondeterministic kernels).",
        )
    clipfrac = step_metrics.get("train/pg_clipfrac")
    if clipfrac is not None and not abs(clipfrac) < PG_CLIPFRAC_TOL:
        raise CheckFailure(
            "kl", f"train/pg_clipfrac = {clipfrac!r} at {where}; expected < {PG_CLIPFRAC_TOL}."
        )
    kl_loss = step_metrics.get("train/kl_loss")
    if first_step_of_run and kl_loss is not None and not abs(kl_loss) < KL_LOSS_TOL:
        raise CheckFailure(
            "kl",
            f"train/kl_loss = {kl_loss!r} at the run's first step; expected |kl_loss| < {KL_LOSS_TOL}: the reference "
            "model is not the initial policy (loaded from another checkpoint, or its weights changed).",
        )

"""KL checker (`--ci-test`, off with `--ci-disable-kl-checker`): the step-0 rule (`checkers/step0.py`),
applied in the run.

At the first optimizer step of every rollout the policy still equals the "old" policy that
produced the log-probs, so `train/ppo_kl` and `train/pg_clipfrac` must be zero; at the run's first
step (step 0: the first step record of its metrics) the policy also equals the reference, so
`train/kl_loss` must be zero when logged. Thresholds are Miles' `ci_utils.check_kl`
(notes-miles-slime-areal.md 3.1), kept in `checkers/step0.py`: |ppo_kl| < 1e-9, |pg_clipfrac| <
1e-10, |kl_loss| < 1e-9. A key the step did not log is not checked.
"""

from __future__ import annotations

from grpolab.checkers.errors import CheckFailure
from grpolab.checkers.step0 import CLIPFRAC_KEY, KL_LOSS_KEY, PPO_KL_KEY, step0_checks

_CAUSE = {
    PPO_KL_KEY: "The log-probs the loss sees differ from the ones computed before training: the two "
    "forwards are not the same computation (different micro-batching or padding, dropout on, "
    "nondeterministic kernels).",
    CLIPFRAC_KEY: "",
    KL_LOSS_KEY: "the reference model is not the initial policy (loaded from another checkpoint, or its "
    "weights changed).",
}


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
    for check in step0_checks(step_metrics, first_of_run=first_step_of_run):
        if not check.logged or check.passed:
            continue
        if check.key == KL_LOSS_KEY:
            raise CheckFailure(
                "kl",
                f"{check.key} = {check.value!r} at the run's first step; expected |kl_loss| < "
                f"{check.limit}: {_CAUSE[check.key]}",
            )
        short = check.key.split("/")[-1]
        message = f"{check.key} = {check.value!r} at {where}; expected |{short}| < {check.limit}."
        raise CheckFailure("kl", f"{message} {_CAUSE[check.key]}".rstrip())

"""`--true-on-policy-mode` under `--ci-test`: the trainer's log-probs equal the engine's bit for bit.

Miles' true-on-policy CI asserts `train/train_rollout_logprob_abs_diff == 0` exactly; a mean can hide
one differing token among thousands, so this check compares every trained token (loss mask 1) and
names the first one that differs: the sample, the token's position in the answer, its id and both
values. Causes, in the order they are worth ruling out: the engine holds other weights (a weight sync
that was skipped or partial), the engine did not re-score by prefill (a server without the mode), the
samples' tokens or kept sets changed between generation and training.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from grpolab.checkers.errors import CheckFailure
from grpolab.core.batch import Sample

CHECKER = "true_on_policy"


@dataclass(frozen=True)
class Mismatch:
    """The first trained token whose trainer log-prob differs from the engine's.

    Attributes:
        sample: the sample's index in the rollout; token: its position in the answer (0-based).
        token_id: the token; trainer / engine: the two log-probs (nats).
        differing / total: trained tokens that differ, of all trained tokens compared.
    """

    sample: int
    token: int
    token_id: int
    trainer: float
    engine: float
    differing: int
    total: int


def first_mismatch(samples: list[Sample], trainer: list[torch.Tensor]) -> Mismatch | None:
    """The first trained token (loss mask > 0) where `trainer[i]` ([R] float32) differs from
    `samples[i].rollout_log_probs` ([R] float32) in any bit, or None when all are equal.

    Raises:
        ValueError: the lists differ in length, or a sample's tensors differ in length.
    """
    if len(samples) != len(trainer):
        raise ValueError(f"{len(samples)} samples but {len(trainer)} trainer log-prob tensors")
    first: tuple[int, int, int, float, float] | None = None
    differing = total = 0
    for s, lp in zip(samples, trainer):
        engine = s.rollout_log_probs.float()
        if lp.shape != engine.shape or s.loss_mask.shape != engine.shape:
            raise ValueError(
                f"sample {s.index}: trainer {tuple(lp.shape)}, engine {tuple(engine.shape)}, loss mask "
                f"{tuple(s.loss_mask.shape)} log-probs"
            )
        trained = s.loss_mask > 0
        diff = (lp.float() != engine) & trained
        total += int(trained.sum())
        differing += int(diff.sum())
        if first is None and bool(diff.any()):
            t = int(diff.nonzero()[0, 0])
            first = (s.index, t, int(s.response_ids[t]), float(lp[t]), float(engine[t]))
    if first is None:
        return None
    return Mismatch(*first, differing=differing, total=total)


def check_exact(rollout_id: int, samples: list[Sample], trainer: list[torch.Tensor]) -> None:
    """Fail when any trained token's trainer log-prob differs from the engine's (see the module docstring).

    Raises:
        CheckFailure: naming the rollout, the first differing sample and token, both values, the count.
    """
    m = first_mismatch(samples, trainer)
    if m is None:
        return
    raise CheckFailure(
        CHECKER,
        f"rollout {rollout_id}: under --true-on-policy-mode the trainer's log-probs must equal the engine's "
        f"bit for bit, but {m.differing} of {m.total} trained tokens differ; the first is sample {m.sample}, "
        f"answer token {m.token} (id {m.token_id}): trainer {m.trainer!r}, engine {m.engine!r} "
        f"(|diff| {abs(m.trainer - m.engine):.3g}). Likely causes: the engine holds other weights (a weight "
        "sync skipped or partial), the engine did not re-score by prefill (a server started without "
        "--true-on-policy-mode), or the tokens changed between generation and training",
    )

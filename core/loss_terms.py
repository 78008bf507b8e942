"""The per-token loss terms and metrics of one training micro-batch (pure tensor math, no state).

The formulas are `algorithms.py`'s (PPO-clip policy loss, TIS weights, the KL estimators, each with
its source there); this module only assembles them per token, by Miles' metric names, for
`actor.Actor` to reduce and back-propagate.
"""

from __future__ import annotations

import torch

from grpolab.core import algorithms
from grpolab.core.batch import MicroBatch, Sample
from grpolab.core.config import AlgorithmConfig


def token_terms(
    algo: AlgorithmConfig,
    mb: MicroBatch,
    chunk: list[Sample],
    current: tuple[torch.Tensor, torch.Tensor],
    old: list[torch.Tensor],
    ref: list[torch.Tensor] | None,
) -> dict[str, torch.Tensor]:
    """The per-token [B, L] float32 loss terms and metrics of one micro-batch, by metric name (pure).

    `algo`: the loss settings (`--eps-clip*`, `--use-tis`, `--use-kl-loss`, `--kl-loss-type`).
    `current`: the training forward's log-probs and entropies [B, L] (with their graph).
    `train/pg_loss` (× TIS weights with `--use-tis`), `train/entropy_loss` and `train/kl_loss`
    (with `--use-kl-loss`) carry the gradient; the rest are metrics. `old`/`ref` hold the
    chunk's float32 [R] log-probs.
    """
    old_BL = mb.scatter(old)
    adv_BL = mb.scatter([torch.full_like(s.loss_mask, s.advantage) for s in chunk])
    rollout_BL = mb.scatter([s.rollout_log_probs for s in chunk])
    log_probs_BL, entropy_BL = current
    pg_BL, clipfrac_BL, ppo_kl_BL = algorithms.policy_loss(
        log_probs_BL,
        old_BL,
        adv_BL,
        eps_clip=algo.eps_clip,
        eps_clip_high=algo.eps_clip_high,
        eps_clip_c=algo.eps_clip_c,
    )
    per_token = {
        "train/entropy_loss": entropy_BL,
        "train/pg_clipfrac": clipfrac_BL,
        "train/ppo_kl": ppo_kl_BL,
    }
    if algo.use_tis:
        clip = {"clip_low": algo.tis_clip_low, "clip_high": algo.tis_clip}
        tis_BL, tis_raw_BL = algorithms.tis_weights(old_BL, rollout_BL, **clip)
        pg_BL = pg_BL * tis_BL
        per_token |= {f"train/{k}": v for k, v in algorithms.tis_metrics(tis_raw_BL, **clip).items()}
    per_token["train/pg_loss"] = pg_BL
    if algo.use_kl_loss:
        assert ref is not None, "--use-kl-loss needs reference log-probs"
        kl = algorithms.get_kl_estimator(algo.kl_loss_type)
        per_token["train/kl_loss"] = kl(log_probs_BL, mb.scatter(ref))
    with torch.no_grad():
        per_token["train/train_rollout_logprob_abs_diff"] = (old_BL - rollout_BL).abs()
        per_token["train/train_rollout_kl"] = algorithms.get_kl_estimator("low_var_kl")(old_BL, rollout_BL)
    return per_token

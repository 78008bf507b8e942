"""GRPO math as pure tensor functions: advantages, PPO-clip loss, KL estimators, TIS, reductions.

What is really computed (Miles semantics, `reference/notes-miles-slime-areal.md` section 5):
1. Advantage: one scalar per sample, (r - group mean) / group std (unbiased, NO epsilon), in
   float64; groups whose rewards are all equal (one-sample groups included) get exactly 0.0.
2. Policy loss: per-token PPO clipped surrogate with asymmetric clip and optional dual clip.
3. KL estimators k1 / k2 / k3 / low_var_kl over (log_probs, ref_log_probs).
4. TIS: truncated importance weights exp(old - rollout), clamped.
5. Token log-probs from logits (temperature, optional kept-support mask) and entropy.
6. Loss aggregation with an explicit denominator (tokens or samples in the optimizer window), so the
   sum over micro-batches of one window is the window mean whatever the micro-batch size.

No I/O, no config objects. Estimators are registered by name (`--advantage-estimator`,
`--kl-loss-type`); an unknown name lists the valid ones.

Shape legend: B samples, T tokens (response positions), L sequence positions, V vocab, G groups.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Literal

import torch
from torch import Tensor

from grpolab.core.registry import Registry

LOG_RATIO_CLAMP = 20.0  # Miles clamps log-ratios to [-20, 20] before exp.


ADVANTAGE_ESTIMATORS: Registry[Callable[..., Tensor]] = Registry(
    "advantage estimator", "--advantage-estimator"
)
KL_ESTIMATORS: Registry[Callable[[Tensor, Tensor], Tensor]] = Registry("KL estimator", "--kl-loss-type")

register_advantage_estimator = ADVANTAGE_ESTIMATORS.register
get_advantage_estimator = ADVANTAGE_ESTIMATORS.get
register_kl_estimator = KL_ESTIMATORS.register
get_kl_estimator = KL_ESTIMATORS.get


def _check_same_shape(**tensors: Tensor) -> None:
    shapes = {name: tuple(t.shape) for name, t in tensors.items()}
    if len(set(shapes.values())) > 1:
        raise ValueError(f"shape mismatch: {shapes}")


# ---------------------------------------------------------------------------------------------
# Advantages


def _check_rewards(rewards_B: Tensor, group_ids_B: Tensor) -> None:
    if rewards_B.dim() != 1 or group_ids_B.dim() != 1 or rewards_B.shape != group_ids_B.shape:
        raise ValueError(
            f"rewards_B and group_ids_B must be 1-D of equal length, got {tuple(rewards_B.shape)} "
            f"and {tuple(group_ids_B.shape)}"
        )
    if not rewards_B.is_floating_point():
        raise ValueError(f"rewards_B must be floating point, got {rewards_B.dtype}")
    if group_ids_B.is_floating_point() or group_ids_B.is_complex():
        raise ValueError(f"group_ids_B must be integer, got {group_ids_B.dtype}")
    bad_B = ~torch.isfinite(rewards_B)
    if bool(bad_B.any()):
        index = int(bad_B.nonzero()[0, 0])
        raise ValueError(f"reward at sample index {index} is not finite ({rewards_B[index].item()})")


@register_advantage_estimator("grpo")
def grpo_advantages(rewards_B: Tensor, group_ids_B: Tensor, *, std_normalize: bool = True) -> Tensor:
    """GRPO advantage: reward normalized within its group, one scalar per sample.

    Source: Miles `miles/ray/rollout/train_data_conversion.py` (GRPO reward normalization);
    Dr.GRPO (arXiv:2503.20783) when `std_normalize=False` (`--disable-grpo-std-normalization`).

    adv_i = (r_i - mean_g) / std_g with the unbiased std, or r_i - mean_g without std
    normalization. Deviation from Miles: no `+ 1e-6` in the denominator and statistics in float64
    (Miles: float32), so bfloat16 rewards [1, 1, 1, 1.0078125] give exactly [-0.5, -0.5, -0.5, 1.5].
    A group whose rewards are all exactly equal (max == min, which covers one-sample groups) gets
    exactly 0.0, never NaN.

    Args:
        rewards_B: [B] bf16/fp16/fp32/fp64 rewards.
        group_ids_B: [B] integer group id per sample (any values, need not be contiguous).
        std_normalize: divide by the group std (GRPO) or not (Dr.GRPO).

    Returns:
        [B] float32 advantages on the rewards' device.

    Raises:
        ValueError: shapes/dtypes are wrong, or a reward is NaN/inf (names the sample index).
    """
    _check_rewards(rewards_B, group_ids_B)
    r_B = rewards_B.detach().to(torch.float64)
    if r_B.numel() == 0:
        return torch.zeros(0, dtype=torch.float32, device=r_B.device)
    _, group_B = torch.unique(group_ids_B, return_inverse=True)
    num_groups = int(group_B.max()) + 1
    zeros_G = torch.zeros(num_groups, dtype=torch.float64, device=r_B.device)
    count_G = zeros_G.index_add(0, group_B, torch.ones_like(r_B))
    mean_G = zeros_G.index_add(0, group_B, r_B) / count_G
    adv_B = r_B - mean_G[group_B]
    if std_normalize:
        var_G = zeros_G.index_add(0, group_B, adv_B.square()) / (count_G - 1).clamp(min=1)
        adv_B = adv_B / var_G.sqrt()[group_B]
    max_G = zeros_G.scatter_reduce(0, group_B, r_B, reduce="amax", include_self=False)
    min_G = zeros_G.scatter_reduce(0, group_B, r_B, reduce="amin", include_self=False)
    constant_B = (max_G == min_G)[group_B]
    return torch.where(constant_B, 0.0, adv_B).to(torch.float32)


def advantages_always_zero(estimator: str, group_size: int, *, std_normalize: bool) -> bool:
    """Whether the advantage estimator `estimator` gives every sample an advantage of exactly 0 whatever
    the rewards, for groups of `group_size` samples (`--n-samples-per-prompt`): then the policy-gradient
    loss has no gradient and only a KL or entropy term can move the weights.

    Probed, not assumed, so it holds for any registered estimator: two groups of `group_size` distinct
    float64 rewards (0, 1, ..., n-1 and n-1, ..., 0 scaled by 2.5) go through the estimator, and the
    answer is whether every advantage came back 0. For GRPO this is exactly `group_size == 1` (a sample
    is its own group's mean).

    Raises:
        ValueError: an unknown `estimator` (lists the registered ones) or `group_size` < 1.
    """
    if group_size < 1:
        raise ValueError(f"group_size must be >= 1, got {group_size}")
    fn = get_advantage_estimator(estimator)
    ramp = torch.arange(group_size, dtype=torch.float64)
    rewards_B = torch.cat([ramp, ramp.flip(0) * 2.5])
    group_ids_B = torch.arange(2).repeat_interleave(group_size)
    return bool((fn(rewards_B, group_ids_B, std_normalize=std_normalize) == 0).all())


def grpo_advantages_reference(
    rewards_B: Tensor, group_ids_B: Tensor, *, std_normalize: bool = True
) -> Tensor:
    """Slow plain-Python loop over groups computing exactly what `grpo_advantages` computes."""
    _check_rewards(rewards_B, group_ids_B)
    rewards = rewards_B.detach().to(torch.float64).tolist()
    group_ids = group_ids_B.tolist()
    out = [0.0] * len(rewards)
    for group in dict.fromkeys(group_ids):
        members = [i for i, g in enumerate(group_ids) if g == group]
        values = [rewards[i] for i in members]
        if max(values) == min(values):
            continue
        mean = sum(values) / len(values)
        std = math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))
        for i in members:
            out[i] = (rewards[i] - mean) / std if std_normalize else rewards[i] - mean
    return torch.tensor(out, dtype=torch.float32, device=rewards_B.device)


# ---------------------------------------------------------------------------------------------
# Policy loss


def policy_loss(
    log_probs_BT: Tensor,
    old_log_probs_BT: Tensor,
    advantages_BT: Tensor,
    *,
    eps_clip: float,
    eps_clip_high: float,
    eps_clip_c: float | None,
) -> tuple[Tensor, Tensor, Tensor]:
    """Per-token PPO clipped surrogate (asymmetric clip, optional dual clip).

    Source: Miles `math_utils.py::compute_policy_loss`; dual clip from Ye et al. 2020
    (arXiv:1912.09729).

        ppo_kl = old - new;  ratio = exp(clamp(new - old, -20, 20))   (NaN log-ratio -> 0)
        pg1 = -ratio * A;  pg2 = -clamp(ratio, 1 - eps_clip, 1 + eps_clip_high) * A
        loss = max(pg1, pg2);  clipfrac = (pg2 > pg1)
        dual clip (eps_clip_c = c): where A < 0, loss = min(loss, -c * A)

    clipfrac counts the ordinary clip only, as Miles does (tokens cut by the dual clip are not
    counted separately).

    Args:
        log_probs_BT: [B, T] current-policy log-probs (carries the gradient).
        old_log_probs_BT: [B, T] behaviour log-probs.
        advantages_BT: [B, T] advantages (a GRPO scalar broadcast over the sample's tokens).
        eps_clip, eps_clip_high: lower / upper clip widths (`--eps-clip`, `--eps-clip-high`).
        eps_clip_c: dual-clip constant (`--eps-clip-c`), > 1, or None.

    Returns:
        (pg_loss_BT, clipfrac_BT, ppo_kl_BT), each float32 [B, T]; ppo_kl is old - new, unclamped
        and detached (a metric).

    Raises:
        ValueError: shape mismatch, or eps_clip_c <= 1.
    """
    _check_same_shape(
        log_probs_BT=log_probs_BT, old_log_probs_BT=old_log_probs_BT, advantages_BT=advantages_BT
    )
    if eps_clip_c is not None and not eps_clip_c > 1.0:
        raise ValueError(f"--eps-clip-c must be > 1 for dual-clip PPO, got {eps_clip_c}")
    log_probs_BT = log_probs_BT.float()
    old_log_probs_BT = old_log_probs_BT.float()
    adv_BT = advantages_BT.float()
    ppo_kl_BT = old_log_probs_BT - log_probs_BT
    log_ratio_BT = torch.nan_to_num(-ppo_kl_BT, nan=0.0).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    ratio_BT = log_ratio_BT.exp()
    pg1_BT = -ratio_BT * adv_BT
    pg2_BT = -ratio_BT.clamp(1.0 - eps_clip, 1.0 + eps_clip_high) * adv_BT
    loss_BT = torch.maximum(pg1_BT, pg2_BT)
    clipfrac_BT = (pg2_BT > pg1_BT).float()
    if eps_clip_c is not None:
        dual_BT = torch.minimum(loss_BT, -eps_clip_c * adv_BT)
        loss_BT = torch.where(adv_BT < 0, dual_BT, loss_BT)
    return loss_BT, clipfrac_BT, ppo_kl_BT.detach()


# ---------------------------------------------------------------------------------------------
# KL estimators. Source: Miles `math_utils.py::compute_approx_kl`; Schulman, "Approximating KL
# divergence" (http://joschu.net/blog/kl-approx.html). All take (log_probs_BT, ref_log_probs_BT),
# [B, T] any float dtype, and return float32 [B, T]; d = log_probs - ref_log_probs.


@register_kl_estimator("k1")
def kl_k1(log_probs_BT: Tensor, ref_log_probs_BT: Tensor) -> Tensor:
    """k1 = d."""
    _check_same_shape(log_probs_BT=log_probs_BT, ref_log_probs_BT=ref_log_probs_BT)
    return log_probs_BT.float() - ref_log_probs_BT.float()


@register_kl_estimator("k2")
def kl_k2(log_probs_BT: Tensor, ref_log_probs_BT: Tensor) -> Tensor:
    """k2 = d^2 / 2."""
    return kl_k1(log_probs_BT, ref_log_probs_BT).square() / 2


@register_kl_estimator("k3")
def kl_k3(log_probs_BT: Tensor, ref_log_probs_BT: Tensor) -> Tensor:
    """k3 = exp(-d) - 1 + d (unclamped)."""
    d_BT = kl_k1(log_probs_BT, ref_log_probs_BT)
    return torch.expm1(-d_BT) + d_BT


@register_kl_estimator("low_var_kl")
def kl_low_var(log_probs_BT: Tensor, ref_log_probs_BT: Tensor) -> Tensor:
    """low_var_kl: r = clamp(-d, -20, 20); exp(r) - 1 - r, clamped to [-10, 10]."""
    r_BT = (-kl_k1(log_probs_BT, ref_log_probs_BT)).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    return (torch.expm1(r_BT) - r_BT).clamp(-10.0, 10.0)


# ---------------------------------------------------------------------------------------------
# Truncated importance sampling


def tis_weights(
    old_log_probs_BT: Tensor, rollout_log_probs_BT: Tensor, *, clip_low: float = 0.0, clip_high: float = 2.0
) -> tuple[Tensor, Tensor]:
    """Truncated importance-sampling weights between trainer and engine log-probs.

    Source: Miles `loss_hub/corrections.py` (`--use-tis`, `--tis-clip-low`, `--tis-clip`).
    raw = exp(old - rollout); weight = clamp(raw, clip_low, clip_high). Multiply pg_loss by weight.

    Args:
        old_log_probs_BT: [B, T] trainer (old policy) log-probs.
        rollout_log_probs_BT: [B, T] engine log-probs of the same tokens.

    Returns:
        (weights_BT, raw_ratio_BT), float32 [B, T], both detached.

    Raises:
        ValueError: shape mismatch or clip_low > clip_high.
    """
    _check_same_shape(old_log_probs_BT=old_log_probs_BT, rollout_log_probs_BT=rollout_log_probs_BT)
    if clip_low > clip_high:
        raise ValueError(f"--tis-clip-low ({clip_low}) must be <= --tis-clip ({clip_high})")
    raw_BT = (old_log_probs_BT.detach().float() - rollout_log_probs_BT.detach().float()).exp()
    return raw_BT.clamp(clip_low, clip_high), raw_BT


def tis_metrics(raw_ratio_BT: Tensor, *, clip_low: float = 0.0, clip_high: float = 2.0) -> dict[str, Tensor]:
    """Per-token TIS metrics, to be reduced over the loss mask like the loss (`aggregate_loss`).

    Source: Miles `loss_hub/corrections.py` metric names. Keys, in this order: `tis` (the pre-clamp
    ratio), `tis_abs` (|ratio - 1|), `tis_clipfrac` (1.0 where the ratio is outside
    [clip_low, clip_high], else 0.0).

    Args:
        raw_ratio_BT: [B, T] float32 pre-clamp ratio, the second value of `tis_weights`.
        clip_low, clip_high: `--tis-clip-low`, `--tis-clip`.

    Returns:
        name -> float32 [B, T] tensor.
    """
    clipped_BT = (raw_ratio_BT < clip_low) | (raw_ratio_BT > clip_high)
    return {"tis": raw_ratio_BT, "tis_abs": (raw_ratio_BT - 1).abs(), "tis_clipfrac": clipped_BT.float()}


# ---------------------------------------------------------------------------------------------
# Log-probs and entropy from logits


def entropy_from_logits(logits_BTV: Tensor) -> Tensor:
    """Entropy of softmax(logits) over the last dim, float32 [B, T] (log_softmax based, stable).

    Tokens with -inf logits contribute exactly 0 and no NaN gradient.
    """
    log_p_BTV = torch.log_softmax(logits_BTV.float(), dim=-1)
    p_BTV = log_p_BTV.exp()
    log_p_BTV = torch.where(p_BTV > 0, log_p_BTV, 0.0)
    return -(p_BTV * log_p_BTV).sum(dim=-1)


def token_log_probs(
    logits_BLV: Tensor, input_ids_BL: Tensor, *, temperature: float, keep_mask_BLV: Tensor | None = None
) -> Tensor:
    """Log-prob of each token input_ids[:, t] under the logits row t - 1 (next-token scoring).

    Source: Miles `loss_hub/logit_processors.py` (divide by `--rollout-temperature`); kept-support
    renormalization from slime `loss.py::_build_topp_keep_mask` (top-p/top-k sampling replay).

    Logits are cast to float32 and divided by `temperature`. With `keep_mask_BLV`, logits outside
    the kept set are -inf before the softmax (the target token is always kept), so the result is
    log(p_tok / sum of kept p). Position 0 has no predicting row and gets 0.0. Memory: one float32
    [B, L-1, V] copy of the logits is kept (the logsumexp has its own transient buffer).

    Args:
        logits_BLV: [B, L, V] logits, any float dtype; row t predicts token t + 1.
        input_ids_BL: [B, L] int token ids.
        temperature: > 0.
        keep_mask_BLV: optional [B, L, V] bool; keep_mask[:, t] is the support of the token AT
            position t (it masks logits row t - 1); keep_mask[:, 0] is ignored.

    Returns:
        [B, L] float32 log-probs, column 0 = 0.0.

    Raises:
        ValueError: temperature <= 0, or shapes/dtypes that do not line up.
    """
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    if logits_BLV.dim() != 3 or tuple(input_ids_BL.shape) != tuple(logits_BLV.shape[:2]):
        raise ValueError(
            f"expected logits [B, L, V] and input_ids [B, L], got {tuple(logits_BLV.shape)} "
            f"and {tuple(input_ids_BL.shape)}"
        )
    scaled_BLV = logits_BLV[:, :-1].to(torch.float32, copy=True)
    scaled_BLV.div_(temperature)
    target_BL1 = input_ids_BL[:, 1:].long().unsqueeze(-1)
    if keep_mask_BLV is not None:
        if keep_mask_BLV.dtype != torch.bool or keep_mask_BLV.shape != logits_BLV.shape:
            raise ValueError(
                f"keep_mask_BLV must be bool {tuple(logits_BLV.shape)}, got "
                f"{keep_mask_BLV.dtype} {tuple(keep_mask_BLV.shape)}"
            )
        drop_BLV = ~keep_mask_BLV[:, 1:]
        drop_BLV.scatter_(-1, target_BL1, False)
        scaled_BLV.masked_fill_(drop_BLV, -math.inf)
    token_logit_BL = scaled_BLV.gather(-1, target_BL1).squeeze(-1)
    log_probs_BL = token_logit_BL - torch.logsumexp(scaled_BLV, dim=-1)
    return torch.nn.functional.pad(log_probs_BL, (1, 0), value=0.0)


# ---------------------------------------------------------------------------------------------
# Reductions

AggregationMode = Literal["token_mean", "sample_mean"]


def masked_mean_per_sample(values_BT: Tensor, mask_BT: Tensor) -> Tensor:
    """Per-sample masked mean [B]; a sample with no kept token gets 0.0 (count floor 1).

    Miles' `get_sum_of_sample_mean` takes these per-sample means and sums them over samples
    (`aggregate_loss`, sample_mean). The result has the values' dtype when it is floating point,
    float32 for integer or bool values. Masked positions may hold inf/NaN: they are selected away
    with torch.where (no NaN value or gradient leaks).

    Raises:
        ValueError: shape mismatch.
    """
    _check_same_shape(values_BT=values_BT, mask_BT=mask_BT)
    keep_BT = mask_BT.bool()
    return torch.where(keep_BT, values_BT, 0.0).sum(dim=-1) / keep_BT.sum(dim=-1).clamp(min=1)


def aggregate_loss(
    values_BT: Tensor, mask_BT: Tensor, *, mode: AggregationMode, denominator: float
) -> Tensor:
    """Reduce per-token losses of one micro-batch with an explicit window denominator.

    Source: Miles `training_utils/loss.py` and `cp_utils.py::get_sum_of_sample_mean`; denominator
    passed explicitly as in torchtitan's RL losses (`global_valid_tokens`).

    token_mean: sum of kept values / denominator, denominator = number of loss tokens in the whole
        optimizer window (`--calculate-per-token-loss`).
    sample_mean: sum over samples of (masked sample sum / that sample's kept count, floor 1) /
        denominator, denominator = number of samples in the optimizer window (Miles default).

    Summing the results of all micro-batches of a window gives the window mean, independent of
    the micro-batch size. Masked positions get exactly zero gradient even when they hold inf/NaN.

    Args:
        values_BT: [B, T] per-token loss, float.
        mask_BT: [B, T] loss mask (bool or 0/1).

    Returns:
        0-dim tensor in values' dtype (float32 for integer or bool values).

    Raises:
        ValueError: unknown mode, denominator <= 0, shape mismatch.
    """
    _check_same_shape(values_BT=values_BT, mask_BT=mask_BT)
    if not denominator > 0:
        raise ValueError(f"denominator must be > 0, got {denominator}")
    if mode == "token_mean":
        return torch.where(mask_BT.bool(), values_BT, 0.0).sum() / denominator
    if mode == "sample_mean":
        return masked_mean_per_sample(values_BT, mask_BT).sum() / denominator
    raise ValueError(f"unknown loss aggregation mode {mode!r}; valid: sample_mean, token_mean")

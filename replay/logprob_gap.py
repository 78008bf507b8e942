"""The trainer-vs-engine log-prob gap reduced as the trainer logs it (pure numpy, no I/O).

`train/train_rollout_logprob_abs_diff` is |old log-prob − engine log-prob| over loss tokens, reduced
by `algorithms.aggregate_loss` per optimizer window: a per-sample token mean averaged over samples
(Miles' default), or a token mean with `--calculate-per-token-loss`. `replay/logprobs.py` uses these
on a recomputed rollout.
"""

from __future__ import annotations

import math

import numpy as np


def sample_gaps(
    engine: list[np.ndarray], trainer: list[np.ndarray], masks: list[np.ndarray]
) -> tuple[np.ndarray, np.ndarray]:
    """Per sample: (sum over loss tokens of |trainer − engine|, number of loss tokens), float64 [S] each.

    Args:
        engine / trainer: float32 [R_i] log-probs of sample i; masks: float32 [R_i] loss masks (0/1).

    Raises:
        ValueError: a sample whose three arrays differ in length.
    """
    sums, counts = np.zeros(len(engine)), np.zeros(len(engine))
    for i, (e, t, m) in enumerate(zip(engine, trainer, masks, strict=True)):
        if not len(e) == len(t) == len(m):
            raise ValueError(f"sample {i}: engine {len(e)}, trainer {len(t)}, mask {len(m)} tokens")
        sums[i] = float((np.abs(t.astype(np.float64) - e.astype(np.float64)) * (m > 0)).sum())
        counts[i] = float((m > 0).sum())
    return sums, counts


def reduce_gap(sums: np.ndarray, counts: np.ndarray, reduction: str) -> float:
    """One optimizer window's gap as `algorithms.aggregate_loss` reduces it (denominators floored at 1).

    sample_mean: mean over samples of sum_i / max(count_i, 1); token_mean: sum(sums) / max(sum(counts), 1).
    NaN for an empty window.
    """
    if len(sums) == 0:
        return math.nan
    if reduction == "sample_mean":
        return float(np.mean(sums / np.maximum(counts, 1.0)))
    if reduction == "token_mean":
        return float(sums.sum() / max(float(counts.sum()), 1.0))
    raise ValueError(f"unknown reduction {reduction!r}; expected sample_mean or token_mean")


def step_windows(n_samples: int, global_batch_size: int, world_size: int) -> list[list[int]]:
    """Sample indices of each optimizer window of a rollout of `n_samples`, in step order.

    Each of `world_size` ranks trains a contiguous share of the rollout (`rollout.base.rank_share`)
    in windows of global_batch_size / world_size samples; window k is the k-th window of every share.
    [] when the sizes do not divide (e.g. a recording subsampled after the run).
    """
    if (
        world_size < 1
        or global_batch_size < 1
        or n_samples % global_batch_size
        or global_batch_size % world_size
    ):
        return []
    share, local = n_samples // world_size, global_batch_size // world_size
    return [
        [r * share + k * local + j for r in range(world_size) for j in range(local)]
        for k in range(share // local)
    ]

"""The engine's sampling distribution: temperature, the top-k / top-p kept set, log-probs over it.

Pure tensor functions (no engine state), used by `torch_engine.TorchEngine` at every decode step.

Kept-set rule (SGLang's `top_k_top_p_min_p_sampling_from_probs_torch`, slime's top-p mask, notes
5.6): sort the temperature-scaled probabilities once, descending; top-k keeps the first k; top-p
keeps the smallest prefix whose cumulative probability (over the full, unfiltered distribution)
reaches `top_p`, i.e. tokens whose exclusive prefix mass is < top_p (SGLang keeps `<= top_p`,
which differs only at exact float ties); the kept set is the intersection, always >= 1 token.

Tensor legend: A rows of the decode batch, V vocab size, K kept ids (per row, padded).
"""

from __future__ import annotations

import torch

from grpolab.core.engine.base import SamplingParams


def filtered_log_probs(
    logits_AV: torch.Tensor, params: SamplingParams
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """Log-probs of the sampling distribution, and the kept support when top-k/top-p filter.

    Args:
        logits_AV: [A, V] next-token logits, any float dtype.
        params: temperature, top_k, top_p.

    Returns:
        logp_AV: [A, V] float32; log_softmax of logits/temperature over the kept support,
            -inf outside it.
        n_A: [A] int64 number of kept tokens per row, or None when nothing is filtered.
        order_AV: [A, V] int64 vocab ids sorted by descending probability (the kept set of row a is
            `order_AV[a, :n_A[a]]`), or None when nothing is filtered.
    """
    scaled_AV = logits_AV.float() / params.temperature
    if not params.filters_support:
        return torch.log_softmax(scaled_AV, dim=-1), None, None
    A, V = scaled_AV.shape
    sorted_AV, order_AV = scaled_AV.sort(dim=-1, descending=True)
    n_A = torch.full((A,), V, dtype=torch.long, device=scaled_AV.device)
    if params.top_k > 0:
        n_A.clamp_(max=params.top_k)
    if params.top_p < 1.0:
        probs_AV = torch.softmax(sorted_AV, dim=-1)
        before_AV = torch.cumsum(probs_AV, dim=-1) - probs_AV  # exclusive prefix mass, non-decreasing
        before_AV[:, 0] = 0.0
        n_A = torch.minimum(n_A, (before_AV < params.top_p).sum(dim=-1))
    n_A.clamp_(min=1)
    keep_AV = torch.arange(V, device=scaled_AV.device) < n_A[:, None]
    logp_sorted_AV = torch.log_softmax(sorted_AV.masked_fill(~keep_AV, float("-inf")), dim=-1)
    logp_AV = torch.empty_like(logp_sorted_AV).scatter_(1, order_AV, logp_sorted_AV)
    return logp_AV, n_A, order_AV


def kept_ids(n_A: torch.Tensor, order_AV: torch.Tensor, V: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Kept ids per row, ascending, as CPU tensors: (n_A [A], ids_AK [A, K]); row a is ids_AK[a, :n_A[a]]."""
    K = int(n_A.max().item())
    ids_AK = order_AV[:, :K].clone()
    ids_AK.masked_fill_(torch.arange(K, device=ids_AK.device) >= n_A[:, None], V)
    return n_A.cpu(), ids_AK.sort(dim=-1).values.cpu()

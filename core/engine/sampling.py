"""The engine's sampling distribution: temperature, the top-k / top-p kept set, log-probs over it.

Pure tensor functions (no engine state), used by `torch_engine.TorchEngine` at every decode step.

Kept-set rule (SGLang's `top_k_top_p_min_p_sampling_from_probs_torch`, slime's top-p mask, notes
5.6), on the temperature-scaled float32 probabilities sorted once, descending, by a stable sort (so
tied tokens are ordered by ascending vocab id, the same on every device):
- top-k keeps exactly the first k: of tokens tied at the k-th probability, the lower ids are kept
  (SGLang also keeps exactly k, tie order unspecified; transformers' `TopKLogitsWarper` keeps every
  token tied with the k-th, so it can keep more than k).
- top-p keeps token i iff the mass before it, the float32 running sum `cumsum(p)[i-1]` of the
  tokens ranked above it (over the full, unfiltered distribution), is < top_p (rounded to float32):
  the smallest prefix whose running sum reaches top_p. A token whose predecessors reach top_p
  exactly is dropped: probabilities [0.5, 0.3, 0.1, 0.1] with top_p 0.8 keep {0, 1}. The mass is the
  shifted inclusive sum, not `cumsum(p) - p`, which rounds 0.9 - 0.1 to 0.79999995 < 0.8 and kept a
  third token (issue 15 item 20).
- the kept set is the intersection, always >= 1 token.
At the exact boundary the engines differ: SGLang masks `(probs_sum - probs_sort) > top_p`
(sgl-project/sglang python/sglang/srt/layers/sampler.py), i.e. keeps mass-before <= top_p: it also
keeps the token reached exactly, {0, 1, 2} on the example (its `cumsum - p` rounds the same way).
transformers' `TopPLogitsWarper` (huggingface/transformers
src/transformers/generation/logits_process.py) sorts ascending and removes tokens whose cumulative
probability is <= 1 - top_p, which in exact arithmetic is this rule (keep mass-before < top_p); it
keeps {0, 1} on the example. Away from the boundary (mass-before not within float rounding of
top_p) all three keep the same set.
The trainer does not re-derive the set: it scores over the kept ids the engine returns
(`GenerationResult.kept_token_ids`, batch.collate's keep mask), so both sides use this rule.

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
    scaled_AV = logits_AV.float()
    if params.temperature != 1.0:  # x / 1.0 == x: skip the pass
        scaled_AV = scaled_AV / params.temperature
    if not params.filters_support:
        return torch.log_softmax(scaled_AV, dim=-1), None, None
    A, V = scaled_AV.shape
    sorted_AV, order_AV = scaled_AV.sort(dim=-1, descending=True, stable=True)
    n_A = torch.full((A,), V, dtype=torch.long, device=scaled_AV.device)
    if params.top_k > 0:
        n_A.clamp_(max=params.top_k)
    if params.top_p < 1.0:
        n_A = torch.minimum(n_A, top_p_kept_count(torch.softmax(sorted_AV, dim=-1), params.top_p))
    n_A.clamp_(min=1)
    keep_AV = torch.arange(V, device=scaled_AV.device) < n_A[:, None]
    logp_sorted_AV = torch.log_softmax(sorted_AV.masked_fill(~keep_AV, float("-inf")), dim=-1)
    logp_AV = torch.empty_like(logp_sorted_AV).scatter_(1, order_AV, logp_sorted_AV)
    return logp_AV, n_A, order_AV


def top_p_kept_count(probs_sorted_AV: torch.Tensor, top_p: float) -> torch.Tensor:
    """How many of the most likely tokens top-p keeps: those whose mass before them is < `top_p`.

    Args:
        probs_sorted_AV: [A, V] float32 probabilities, each row sorted descending.
        top_p: nucleus mass in (0, 1]; compared in the probabilities' dtype (0.8 -> float32 0.8).

    Returns:
        [A] int64 counts in [1, V]: 1 + the number of running sums `cumsum(p)[:V-1]` below `top_p`, i.e.
        the length of the smallest prefix whose running sum reaches `top_p` (all V when none does).
        The running sums are non-decreasing, so the kept tokens are a prefix.
    """
    running_AV = torch.cumsum(probs_sorted_AV, dim=-1)  # running_AV[:, i-1] is the mass before token i
    return 1 + (running_AV[:, :-1] < top_p).sum(dim=-1)


def kept_ids(n_A: torch.Tensor, order_AV: torch.Tensor, V: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Kept ids per row, ascending, as CPU tensors: (n_A [A], ids_AK [A, K]); row a is ids_AK[a, :n_A[a]]."""
    K = int(n_A.max().item())
    ids_AK = order_AV[:, :K].clone()
    ids_AK.masked_fill_(torch.arange(K, device=ids_AK.device) >= n_A[:, None], V)
    return n_A.cpu(), ids_AK.sort(dim=-1).values.cpu()

"""The one forward that scores response tokens: the trainer's padded layout, and a sequence alone.

`padded_log_probs` is the trainer's padded forward (core/actor.py). `alone_log_probs` scores one
prompt + answer as a micro-batch of its own (no padding, no companions), by the same function: under
`--true-on-policy-mode` the trainer scores every sample this way and the engine re-scores each answer it
sampled this way with its own copy of the weights (a prefill pass, as Miles'
`--recompute-logprobs-via-prefill`), so both sides run the same operations in the same order on the same
shapes and their log-probs are equal bit for bit whenever their weights are (Miles-101 manual, section 8:
"numbers"). Pure tensor math: no I/O.

Legend: `B` rows, `L` padded length, `K` positions that get logits, `V` vocabulary, `T` answer tokens.
"""

from __future__ import annotations

import torch

from grpolab.core import algorithms
from grpolab.core.batch import MicroBatch, ScoredSequence, collate


def logits_window(mb: MicroBatch) -> int:
    """K = L − (earliest response start) + 1: the last K positions are all that score response tokens."""
    B, L = mb.input_ids_BL.shape
    starts = mb.response_mask_BL.float().argmax(dim=1)  # first response position per row
    return min(L, L - int(starts.min()) + 1)


def padded_log_probs(
    model: torch.nn.Module, mb: MicroBatch, *, temperature: float
) -> tuple[torch.Tensor, torch.Tensor, int]:
    """(log-probs [B, L] float32, logits [B, K, V] in the model's dtype, K) of one padded micro-batch.

    Only the last K positions get logits (`logits_to_keep`, as TRL does; `logits_window`); positions
    before them hold 0.0. Log-probs follow `algorithms.token_log_probs` (temperature, kept support).
    Runs under the caller's grad mode.
    """
    B, L = mb.input_ids_BL.shape
    K = logits_window(mb)
    logits_BKV = model(
        input_ids=mb.input_ids_BL, attention_mask=mb.attention_mask_BL, position_ids=mb.position_ids_BL,
        use_cache=False, logits_to_keep=K,
    ).logits  # fmt: skip
    return window_log_probs(logits_BKV, mb, K, temperature=temperature), logits_BKV, K


def window_log_probs(logits_BKV: torch.Tensor, mb: MicroBatch, K: int, *, temperature: float) -> torch.Tensor:
    """Log-probs [B, L] float32 of `mb`'s tokens from the logits of its last K positions (0.0 before them)."""
    B, L = mb.input_ids_BL.shape
    keep_BKV = None if mb.keep_mask_BLV is None else mb.keep_mask_BLV[:, L - K :]
    log_probs_BL = logits_BKV.new_zeros((B, L), dtype=torch.float32)
    log_probs_BL[:, L - K :] = algorithms.token_log_probs(
        logits_BKV, mb.input_ids_BL[:, L - K :], temperature=temperature, keep_mask_BLV=keep_BKV
    )
    return log_probs_BL


def alone_log_probs(
    model: torch.nn.Module, sequence: ScoredSequence, *, temperature: float, vocab_size: int,
    device: str | torch.device,
) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """(log-probs [T] float32, logits [1, T + 1, V]) of one prompt + answer scored as a micro-batch of its own.

    The batch-invariant forward of `--true-on-policy-mode`: its numbers depend on the sequence and the
    weights only, never on companions or padding. `vocab_size` is the model config's (the width of the
    kept-support masks). Raises ValueError on an empty answer (nothing to score).
    """
    if not sequence.response_ids:
        raise ValueError("alone_log_probs: an empty answer has no token to score")
    mb = collate([sequence], pad_id=0, vocab_size=vocab_size, device=device)  # one row: no padding
    log_probs_1L, logits_1KV, _ = padded_log_probs(model, mb, temperature=temperature)
    return mb.gather(log_probs_1L)[0], logits_1KV

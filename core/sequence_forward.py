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

from collections.abc import Callable
from dataclasses import dataclass

import torch

from grpolab.core import algorithms
from grpolab.core.batch import MicroBatch, ScoredSequence, collate


@dataclass
class Answer:
    """A prompt + answer to score (`batch.ScoredSequence`): the engine's own answers, the parity ladder's."""

    prompt_ids: list[int]
    response_ids: list[int]
    kept_token_ids: list[torch.Tensor] | None


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


def alone_rows(
    model: torch.nn.Module, mb: MicroBatch, *, temperature: float, vocab_size: int, device: str | torch.device,
    entropy: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:  # fmt: skip
    """(log-probs [B, L] float32, entropies [B, L] or None) of `mb` with every row scored alone
    (`alone_log_probs`) and put back in `mb`'s layout: the trainer's forward under
    `--true-on-policy-mode`. `entropy` maps a row's logits [1, K, V] to its window entropies [1, K]."""
    B, L = mb.input_ids_BL.shape
    log_probs_BL = torch.zeros((B, L), dtype=torch.float32, device=device)
    entropy_BL = torch.zeros((B, L), dtype=torch.float32, device=device) if entropy is not None else None
    for b, sample in enumerate(mb.samples):
        if not sample.response_ids:
            continue
        lp_T, logits_1KV = alone_log_probs(model, sample, temperature=temperature, vocab_size=vocab_size,
                                           device=device)  # fmt: skip
        log_probs_BL[b, mb.response_mask_BL[b]] = lp_T
        if entropy_BL is not None and entropy is not None:  # the window's first position precedes the answer
            entropy_BL[b, mb.response_mask_BL[b]] = entropy(logits_1KV)[0, 1:]
    return log_probs_BL, entropy_BL


def window_entropy(logits_BKV: torch.Tensor, temperature: float) -> torch.Tensor:
    """Entropy [B, K] float32 at each window position: the distribution that scores token t lives in
    logits row t − 1 (unmasked support, as slime); position 0 repeats row 0."""
    shifted_BKV = torch.cat([logits_BKV[:, :1], logits_BKV[:, :-1]], dim=1).float() / temperature
    return algorithms.entropy_from_logits(shifted_BKV)


def rescored(model: torch.nn.Module, answers: list[Answer], *, temperature: float, vocab_size: int,
             device: str | torch.device) -> list[torch.Tensor]:  # fmt: skip
    """Each answer's log-probs [T] float32 (CPU) from a prefill of it alone; an empty answer gives [0]."""
    out = []
    for a in answers:
        if not a.response_ids:
            out.append(torch.zeros(0, dtype=torch.float32))
            continue
        lp_T, _ = alone_log_probs(model, a, temperature=temperature, vocab_size=vocab_size, device=device)
        out.append(lp_T.float().cpu())
    return out

"""Samples of a rollout and their collation into padded micro-batches.

Legend: `B` samples in a micro-batch, `L` padded sequence length (prompt + response),
`R` one sample's response length, `V` vocabulary size.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

import torch

PaddingSide = Literal["left", "right"]


@dataclass(kw_only=True)
class Sample:
    """One generated answer and everything training needs about it.

    Attributes:
        index: position in the rollout (0 .. samples_per_rollout-1).
        prompt_index: row of the prompt file.
        group_index: which prompt of the rollout (GRPO group id).
        sample_index: answer number within its group.
        seed: the sampling seed the engine used for this answer.
        prompt_ids / response_ids: token ids (response length R).
        rollout_log_probs: float32 [R], the engine's log-probs of the response tokens.
        loss_mask: float32 [R], 1 for tokens that count in the loss.
        finish_reason: "stop" or "length" (truncated).
        kept_token_ids: per response token, the sorted kept vocabulary ids (top-p/top-k), or None.
        reward: raw reward; advantage: GRPO advantage (filled after the group is scored).
        weight_version: engine weight version that generated the answer.
    """

    index: int
    prompt_index: int
    group_index: int
    sample_index: int
    seed: int
    prompt_ids: list[int]
    response_ids: list[int]
    rollout_log_probs: torch.Tensor
    loss_mask: torch.Tensor
    finish_reason: str
    prompt_text: str = ""
    response_text: str = ""
    label: str = ""
    kept_token_ids: list[torch.Tensor] | None = None
    reward: float = 0.0
    advantage: float = 0.0
    weight_version: int = 0
    metadata: dict = field(default_factory=dict)

    def get_reward_value(self, args: Any = None) -> float:
        """The scalar reward (Miles' `Sample.get_reward_value(args)`, so Miles' group filters run on these
        samples; `--reward-key` was applied when the reward was scored)."""
        return self.reward

    @property
    def response_length(self) -> int:
        return len(self.response_ids)

    @property
    def truncated(self) -> bool:
        return self.finish_reason == "length"


class ScoredSequence(Protocol):
    """What `collate` reads of a sample: its ids and kept-token sets (a `Sample`, or the engine's own
    prompt + answer when it scores its answers by prefill: core/sequence_forward.py)."""

    prompt_ids: list[int]
    response_ids: list[int]
    kept_token_ids: list[torch.Tensor] | None


@dataclass(kw_only=True)
class MicroBatch:
    """Padded tensors for one forward pass.

    Attributes:
        input_ids_BL: int64 [B, L] prompt + response tokens, padded with `pad_id`.
        attention_mask_BL: int64 [B, L], 1 on real tokens.
        position_ids_BL: int64 [B, L], 0-based positions of real tokens (padding gets 0).
        response_mask_BL: bool [B, L], True at positions holding response tokens.
        keep_mask_BLV: bool [B, L, V] or None; keep_mask[b, t] is the support the token at t was
            sampled from (all True where nothing was recorded).
        samples: the samples in row order.
    """

    input_ids_BL: torch.Tensor
    attention_mask_BL: torch.Tensor
    position_ids_BL: torch.Tensor
    response_mask_BL: torch.Tensor
    keep_mask_BLV: torch.Tensor | None
    samples: Sequence[ScoredSequence]

    def scatter(self, per_sample: list[torch.Tensor], dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """Place per-sample response values ([R] each) at the response positions of a [B, L] tensor (0 elsewhere)."""
        out_BL = torch.zeros(self.response_mask_BL.shape, dtype=dtype, device=self.input_ids_BL.device)
        out_BL[self.response_mask_BL] = torch.cat([v.reshape(-1) for v in per_sample]).to(out_BL)
        return out_BL

    def gather(self, values_BL: torch.Tensor) -> list[torch.Tensor]:
        """Inverse of `scatter`: per-sample [R] tensors from a [B, L] tensor."""
        return [values_BL[b][self.response_mask_BL[b]] for b in range(values_BL.shape[0])]


def collate(
    samples: Sequence[ScoredSequence],
    *,
    pad_id: int,
    padding_side: PaddingSide = "right",
    vocab_size: int | None = None,
    device: str | torch.device = "cpu",
) -> MicroBatch:
    """Pad samples into a MicroBatch.

    Args:
        pad_id: token id used for padding (never scored: masks exclude it).
        padding_side: "right" (default) or "left"; response log-probs do not depend on it.
        vocab_size: V; needed to build keep masks when any sample has kept_token_ids.

    Raises:
        ValueError: when kept-token sets are present but vocab_size is not given.
    """
    lengths = [len(s.prompt_ids) + len(s.response_ids) for s in samples]
    B, L = len(samples), max(lengths)
    input_ids_BL = torch.full((B, L), pad_id, dtype=torch.long)
    attention_mask_BL = torch.zeros((B, L), dtype=torch.long)
    position_ids_BL = torch.zeros((B, L), dtype=torch.long)
    response_mask_BL = torch.zeros((B, L), dtype=torch.bool)
    has_keep = any(s.kept_token_ids is not None for s in samples)
    if has_keep and vocab_size is None:
        raise ValueError("collate: samples carry kept-token sets but vocab_size was not given")
    keep_mask_BLV = torch.ones((B, L, vocab_size), dtype=torch.bool) if has_keep else None
    for b, (s, n) in enumerate(zip(samples, lengths)):
        start = 0 if padding_side == "right" else L - n
        P = len(s.prompt_ids)
        input_ids_BL[b, start : start + n] = torch.tensor(s.prompt_ids + s.response_ids, dtype=torch.long)
        attention_mask_BL[b, start : start + n] = 1
        position_ids_BL[b, start : start + n] = torch.arange(n)
        response_mask_BL[b, start + P : start + n] = True
        if keep_mask_BLV is not None and s.kept_token_ids is not None:
            for r, kept in enumerate(s.kept_token_ids):
                row = keep_mask_BLV[b, start + P + r]
                row.fill_(False)
                row[kept.long()] = True
    dev = torch.device(device)
    return MicroBatch(
        input_ids_BL=input_ids_BL.to(dev),
        attention_mask_BL=attention_mask_BL.to(dev),
        position_ids_BL=position_ids_BL.to(dev),
        response_mask_BL=response_mask_BL.to(dev),
        keep_mask_BLV=None if keep_mask_BLV is None else keep_mask_BLV.to(dev),
        samples=samples,
    )


def split(items: list, size: int) -> list[list]:
    """Consecutive chunks of at most `size` items."""
    return [items[i : i + size] for i in range(0, len(items), size)]

"""The two forwards `TorchEngine` decodes with: grpolab's own `Decoder` and transformers' model call.

Both keep a batch of left-padded rows and their KV cache between calls, with one interface:
`prefill(ids, mask, capacity)` -> next-token logits, `step(tokens)` -> next-token logits,
`select_rows(index)` to drop finished rows or repeat a shared prompt's row for each of its samples.
`DecoderRunner` is the fast path (Llama, Qwen2, Qwen3; see `decoder.py`); `TransformersRunner`
runs any causal LM and is the reference the fast path is tested against.

Tensor legend: B prompt rows, L padded prompt length, A rows in the decode batch, V vocab size.
"""

from __future__ import annotations

import inspect
from typing import Protocol

import torch
from torch import nn
from transformers import DynamicCache

from grpolab.core.engine.base import DecodePath
from grpolab.core.engine.decoder import Decoder, unsupported_reason


class ModelRunner(Protocol):
    """A batch of decoding rows and their KV cache (see module doc)."""

    def prefill(self, ids_BL: torch.Tensor, mask_BL: torch.Tensor, capacity: int) -> torch.Tensor:
        """Start a batch: prompts ids [B, L] int64, left-padded (mask [B, L], 1 = token); room for
        `capacity` positions per row. Returns next-token logits [B, V] (model dtype)."""
        ...

    def step(self, tok_A: torch.Tensor) -> torch.Tensor:
        """Append one token per row ([A] int64); returns next-token logits [A, V]."""
        ...

    def select_rows(self, index_A: torch.Tensor) -> None:
        """Keep or repeat rows: row a becomes the current row `index_A[a]` ([A] int64)."""
        ...


class DecoderRunner:
    """`ModelRunner` over grpolab's `Decoder` (preallocated cache of `capacity` columns)."""

    def __init__(self, decoder: Decoder) -> None:
        self.decoder = decoder
        self._cache = None
        self._next_pos_A = torch.empty(0, dtype=torch.long)

    def prefill(self, ids_BL: torch.Tensor, mask_BL: torch.Tensor, capacity: int) -> torch.Tensor:
        """See `ModelRunner.prefill`."""
        self.decoder.refresh()
        self._cache = self.decoder.new_cache(mask_BL, capacity)
        self._next_pos_A = mask_BL.sum(-1)
        return self.decoder.prefill(ids_BL, mask_BL, self._cache)

    def step(self, tok_A: torch.Tensor) -> torch.Tensor:
        """See `ModelRunner.step`."""
        assert self._cache is not None, "prefill() first"
        logits_AV = self.decoder.step(tok_A, self._next_pos_A, self._cache)
        self._next_pos_A = self._next_pos_A + 1
        return logits_AV

    def select_rows(self, index_A: torch.Tensor) -> None:
        """See `ModelRunner.select_rows`."""
        assert self._cache is not None, "prefill() first"
        self._cache.select_rows(index_A)
        self._next_pos_A = self._next_pos_A[index_A]


class TransformersRunner:
    """`ModelRunner` over the transformers model's own forward and a `DynamicCache`."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        forward_args = inspect.signature(model.forward).parameters
        # transformers 5.x renamed `past_key_values` to `cache`.
        self._cache_kw = "cache" if "cache" in forward_args else "past_key_values"
        self._logits_to_keep = "logits_to_keep" in forward_args
        layer_types = getattr(model.config, "layer_types", None) or ["full_attention"]
        # Decode steps pass a ready 4D boolean mask (skips transformers' per-step mask building);
        # only for SDPA with full attention in every layer, else the 2D padding mask is passed.
        self._bool_decode_mask = getattr(model.config, "_attn_implementation", None) == "sdpa" and all(
            lt == "full_attention" for lt in layer_types
        )
        self._cache: DynamicCache | None = None
        self._mask_AL = torch.empty(0, dtype=torch.long)
        self._next_pos_A = torch.empty(0, dtype=torch.long)

    def _forward(self, ids: torch.Tensor, mask: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        """One model call with the KV cache; returns [A, V] logits at the last position."""
        kwargs = {self._cache_kw: self._cache}
        if self._logits_to_keep:
            kwargs["logits_to_keep"] = 1
        out = self.model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True, **kwargs)
        return out.logits[:, -1]

    def prefill(self, ids_BL: torch.Tensor, mask_BL: torch.Tensor, capacity: int) -> torch.Tensor:
        """See `ModelRunner.prefill` (the cache grows as needed; `capacity` is not used)."""
        self._cache = DynamicCache(config=self.model.config)
        self._mask_AL = mask_BL
        self._next_pos_A = mask_BL.sum(-1)
        return self._forward(ids_BL, mask_BL, (mask_BL.cumsum(-1) - 1).clamp_(min=0))

    def step(self, tok_A: torch.Tensor) -> torch.Tensor:
        """See `ModelRunner.step`."""
        mask = torch.cat([self._mask_AL, self._mask_AL.new_ones((self._mask_AL.shape[0], 1))], dim=1)
        self._mask_AL = mask
        step_mask = mask[:, None, None, :].bool() if self._bool_decode_mask else mask
        logits_AV = self._forward(tok_A[:, None], step_mask, self._next_pos_A[:, None])
        self._next_pos_A = self._next_pos_A + 1
        return logits_AV

    def select_rows(self, index_A: torch.Tensor) -> None:
        """See `ModelRunner.select_rows`."""
        assert self._cache is not None, "prefill() first"
        self._cache.batch_select_indices(index_A)
        self._mask_AL = self._mask_AL[index_A]
        self._next_pos_A = self._next_pos_A[index_A]


def make_runner(
    model: nn.Module, path: DecodePath, decoder: Decoder | None
) -> tuple[ModelRunner, Decoder | None]:
    """The runner for `path`, reusing `decoder` (returned for the next call; None on the
    transformers path).

    Raises:
        ValueError: path "grpolab" for a model `Decoder` does not implement (the reason is named).
    """
    if path == "transformers":
        return TransformersRunner(model), None
    reason = unsupported_reason(model)
    if reason is not None:
        if path == "grpolab":
            raise ValueError(
                f"decode path grpolab (--rollout-decode-path, grpolab serve --decode-path): grpolab's decoder "
                f"does not run this model: {reason}"
            )
        return TransformersRunner(model), None
    if decoder is None or decoder.model is not model:
        decoder = Decoder(model)
    return DecoderRunner(decoder), decoder

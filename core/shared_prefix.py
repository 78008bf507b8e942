"""Shared-prefix packing of a training micro-batch: each prompt is run once for all its samples.

Why: in GRPO every prompt has `--n-samples-per-prompt` answers, and in a padded micro-batch the
model runs the prompt once per answer. The prompt's positions see only the prompt (causal
attention), so those runs are identical. Packing puts one prompt and all its answers in one row,
[prompt | answer 1 | answer 2 | ...], with an attention mask that lets each answer see the prompt
and itself only, and position ids that restart after the prompt for every answer. Each token then
gets the same logits as in its own padded row (in exact arithmetic: the matmuls and the prompt's
gradient, now summed over the answers inside one backward, round differently). This is the
shared-prefix forward of Prefix Grouper (Liu et al. 2025, "Prefix Grouper: Efficient GRPO
Training through Shared-Prefix Forward", arXiv:2506.05433); SGLang's radix cache does the same
for the rollout's prefill.

Pure tensor code: `pack_shared_prefix` builds the packed inputs from a `MicroBatch`, and
`PackedBatch.unpack` places the packed logits back in the micro-batch's own [B, K, V] layout, so
log-probs, keep masks and entropies are computed exactly as for a padded forward.

Legend: B samples, L the micro-batch's padded length, K logits kept per sample row (its last K
positions), G packed rows (distinct prompts), T packed row length, Kp logits kept per packed
row, N logits rows the loss reads, V vocabulary.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from grpolab.core.batch import MicroBatch
from grpolab.core.engine.decode_support import unsupported_config_reason


def unsupported_reason(model: nn.Module) -> str | None:
    """Why the packed forward cannot run `model`, or None when it can: the decoder's model rules
    (`decode_support.unsupported_config_reason`: Llama/Qwen2/Qwen3, full attention, RoPE) and SDPA
    attention (transformers passes an SDPA model a ready 4D boolean mask as it is; eager attention
    would need an additive float mask, flash attention takes none)."""
    impl = getattr(model.config, "_attn_implementation", None)
    if impl != "sdpa":
        return f"attention implementation {impl!r} (needs sdpa, which takes a 4D boolean mask)"
    return unsupported_config_reason(model.config.to_dict())


@dataclass(frozen=True)
class PackingCost:
    """A Llama-family model's work in units of one attention query-key pair of one layer (FLOPs with a
    multiply-add counted as 2, the per-term count of Kaplan et al. 2020, "Scaling Laws for Neural
    Language Models", Table 1): a pair's q·k and p·v cost 4 Hq D.

    Attributes:
        token: a token through one layer's projections, 2 (H (Hq + 2 Hk) D + Hq D H + 3 H I), in pairs
            (tiny fixture model 768, SmolLM2-135M 3,072).
        logit: one kept logits row (the lm_head, 2 H V, once for the Y layers), in pairs of one layer
            (tiny 128, SmolLM2 819).
    """

    token: float
    logit: float

    def of(self, rows: int, length: int, kept: int) -> float:
        """Cost of `rows` rows of `length` tokens whose masked attention computes every query-key pair
        (SDPA's CPU kernel skips none) and whose last `kept` positions get logits."""
        return rows * length * (self.token + length) + rows * kept * self.logit


def packing_cost(config: object) -> PackingCost:
    """`PackingCost` of a transformers Llama/Qwen2/Qwen3 config (hidden_size H, heads Hq / Hk, head_dim
    D, intermediate_size I, vocab_size V, num_hidden_layers Y)."""
    H, Hq = int(config.hidden_size), int(config.num_attention_heads)
    Hk = int(getattr(config, "num_key_value_heads", None) or Hq)
    D = int(getattr(config, "head_dim", None) or H // Hq)
    pair = 4 * Hq * D
    token = 2 * (H * (Hq + 2 * Hk) * D + Hq * D * H + 3 * H * int(config.intermediate_size)) / pair
    return PackingCost(
        token=token, logit=2 * H * int(config.vocab_size) / (pair * int(config.num_hidden_layers))
    )


def planned_cost(model: nn.Module, train_forward: str, checkpoint: str) -> PackingCost | None:
    """The `PackingCost` to pack `model`'s micro-batches with under `--train-forward train_forward`, or
    None for the padded forward ("padded", or "auto" on a model `unsupported_reason` names).

    Raises:
        ValueError: "shared-prefix" for a model the packed forward does not run (naming `checkpoint`).
    """
    reason = unsupported_reason(model)
    if train_forward == "shared-prefix" and reason is not None:
        raise ValueError(f"--train-forward shared-prefix: {checkpoint}: {reason}")
    if train_forward == "padded" or reason is not None:
        return None
    return packing_cost(model.config)


@dataclass(kw_only=True)
class PackedBatch:
    """One micro-batch packed by prompt (see module doc).

    Attributes:
        input_ids_GT: int64 [G, T] prompt then answers, right-padded with the micro-batch's pad id.
        position_ids_GT: int64 [G, T]; each answer's positions continue from its prompt's length.
        attention_mask_G1TT: bool [G, 1, T, T], True where query t may attend to key s.
        logits_to_keep: Kp; the model computes logits for the last Kp positions of each row.
        source_BK: int64 [B * K]: for each cell of the micro-batch's [B, K] logits layout, its row in
            the packed logits flattened to [G * Kp]; cells no loss term reads (prompt positions, a
            sample's last token, padding) point at row 0.
    """

    input_ids_GT: torch.Tensor
    position_ids_GT: torch.Tensor
    attention_mask_G1TT: torch.Tensor
    logits_to_keep: int
    source_BK: torch.Tensor

    def inputs(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]:
        """The model call's `input_ids`, `attention_mask`, `position_ids` and `logits_to_keep`."""
        return self.input_ids_GT, self.attention_mask_G1TT, self.position_ids_GT, self.logits_to_keep

    def unpack(self, logits_GKV: torch.Tensor, B: int, K: int) -> torch.Tensor:
        """Packed logits [G, Kp, V] -> [B, K, V] in the micro-batch's layout, one differentiable gather
        (no zero-filled copy); the cells no loss term reads hold a copy of packed row 0 (finite)."""
        V = logits_GKV.shape[-1]
        return logits_GKV.reshape(-1, V).index_select(0, self.source_BK).view(B, K, V)


def pack_shared_prefix(
    mb: MicroBatch, K: int, pad_id: int, *, cost: PackingCost | None = None
) -> PackedBatch | None:
    """Pack `mb` one row per distinct prompt, or None when packing would not pay: no two samples share
    a prompt (the padded forward then repeats no work), an empty prompt, or, with `cost`, packed rows
    that cost more than the padded ones (`PackingCost.of` of G rows of length T keeping Kp logits
    against B rows of length L keeping K): a row of n answers computes (n R)² attention pairs against n
    R² padded, so long answers to short prompts stay padded.

    `K`: the logits the caller keeps per sample row (its last K positions of L), as for
    `logits_to_keep`; every position a response token is scored from (a sample's last prompt position
    up to its second-to-last token) must lie among them. `pad_id`: the token id of packed rows' padding.

    Raises:
        ValueError: a scored position falls outside the last K (K too small).
    """
    groups: dict[tuple[int, ...], list[int]] = {}
    for b, s in enumerate(mb.samples):
        groups.setdefault(tuple(s.prompt_ids), []).append(b)
    if len(groups) == len(mb.samples) or any(len(prompt) == 0 for prompt in groups):
        return None
    B, L = mb.input_ids_BL.shape
    lengths = [
        len(p) + sum(len(mb.samples[b].response_ids) for b in members) for p, members in groups.items()
    ]
    G, T = len(groups), max(lengths)
    keep = T - min(len(p) for p in groups) + 1  # from the shortest prompt's last position; <= T
    if cost is not None and cost.of(G, T, keep) >= cost.of(B, L, K):
        return None
    starts_B = mb.attention_mask_BL.argmax(dim=1).tolist()  # each row's first token (either padding side)
    ids_GT = torch.full((G, T), pad_id, dtype=torch.long)
    pos_GT = torch.zeros((G, T), dtype=torch.long)
    seg_GT = torch.full((G, T), -1, dtype=torch.long)  # 0 prompt, k >= 1 the group's k-th answer, -1 padding
    source_BK = torch.zeros((B, K), dtype=torch.long)
    for g, (prompt, members) in enumerate(groups.items()):
        P, end = len(prompt), len(prompt)
        ids_GT[g, :P] = torch.tensor(prompt, dtype=torch.long)
        pos_GT[g, :P] = torch.arange(P)
        seg_GT[g, :P] = 0
        for k, b in enumerate(members, start=1):
            response = mb.samples[b].response_ids
            R, offset = len(response), end
            end += R
            ids_GT[g, offset:end] = torch.tensor(response, dtype=torch.long)
            pos_GT[g, offset:end] = torch.arange(P, P + R)
            seg_GT[g, offset:end] = k
            for u in range(P - 1, P + R - 1):  # local position u scores token u + 1
                column = starts_B[b] + u - (L - K)
                if column < 0:
                    raise ValueError(f"pack_shared_prefix: K={K} misses a scored position of sample row {b}")
                packed = u if u < P else offset + u - P
                source_BK[b, column] = g * keep + packed - (T - keep)
    q_GT1, k_G1T = seg_GT[:, :, None], seg_GT[:, None, :]
    causal_TT = torch.ones((T, T), dtype=torch.bool).tril_()
    same = (k_G1T == 0) & (q_GT1 >= 0) | (k_G1T == q_GT1) & (q_GT1 > 0)
    mask_GTT = (causal_TT & same) | torch.eye(T, dtype=torch.bool)  # padding queries see themselves only
    dev = mb.input_ids_BL.device
    return PackedBatch(
        input_ids_GT=ids_GT.to(dev),
        position_ids_GT=pos_GT.to(dev),
        attention_mask_G1TT=mask_GTT[:, None].to(dev),
        logits_to_keep=keep,
        source_BK=source_BK.reshape(-1).to(dev),
    )

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


def tokens_per_attention_pair(config: object) -> float:
    """How many query-key pairs of attention cost as much as one token through a layer's linear
    projections, from a Llama-family config (FLOPs per layer, multiply-adds counted as 2):
    a token's projections 2 (H (Hq + 2 Hk) D + Hq D H + 3 H I), a pair's q·k and p·v 4 Hq D.
    Tiny fixture model: 768; SmolLM2-135M: 3,072. `pack_shared_prefix` weighs rows with it."""
    H = int(config.hidden_size)
    Hq = int(config.num_attention_heads)
    Hk = int(getattr(config, "num_key_value_heads", None) or Hq)
    D = int(getattr(config, "head_dim", None) or H // Hq)
    intermediate = int(config.intermediate_size)
    return 2 * (H * (Hq + 2 * Hk) * D + Hq * D * H + 3 * H * intermediate) / (4 * Hq * D)


def planned_pair_weight(model: nn.Module, train_forward: str, checkpoint: str) -> float | None:
    """The `pair_weight` to pack `model`'s micro-batches with under `--train-forward train_forward`,
    or None for the padded forward ("padded", or "auto" on a model `unsupported_reason` names).

    Raises:
        ValueError: "shared-prefix" for a model the packed forward does not run (naming `checkpoint`).
    """
    reason = unsupported_reason(model)
    if train_forward == "shared-prefix" and reason is not None:
        raise ValueError(f"--train-forward shared-prefix: {checkpoint}: {reason}")
    if train_forward == "padded" or reason is not None:
        return None
    return tokens_per_attention_pair(model.config)


@dataclass(kw_only=True)
class PackedBatch:
    """One micro-batch packed by prompt (see module doc).

    Attributes:
        input_ids_GT: int64 [G, T] prompt then answers, right-padded with the micro-batch's pad id.
        position_ids_GT: int64 [G, T]; each answer's positions continue from its prompt's length.
        attention_mask_G1TT: bool [G, 1, T, T], True where query t may attend to key s.
        logits_to_keep: Kp; the model computes logits for the last Kp positions of each row.
        src_row_N, src_col_N: int64 [N]: the packed row and kept column of each logits row the loss reads.
        dst_row_N, dst_col_N: int64 [N]: where that logits row sits in the [B, K] layout.
    """

    input_ids_GT: torch.Tensor
    position_ids_GT: torch.Tensor
    attention_mask_G1TT: torch.Tensor
    logits_to_keep: int
    src_row_N: torch.Tensor
    src_col_N: torch.Tensor
    dst_row_N: torch.Tensor
    dst_col_N: torch.Tensor

    def inputs(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]:
        """The model call's `input_ids`, `attention_mask`, `position_ids` and `logits_to_keep`."""
        return self.input_ids_GT, self.attention_mask_G1TT, self.position_ids_GT, self.logits_to_keep

    def unpack(self, logits_GKV: torch.Tensor, B: int, K: int) -> torch.Tensor:
        """Packed logits [G, Kp, V] -> [B, K, V] in the micro-batch's layout (differentiable); the rows
        no loss term reads (prompt positions, the last token, padding) are 0."""
        out_BKV = logits_GKV.new_zeros((B, K, logits_GKV.shape[-1]))
        return out_BKV.index_put((self.dst_row_N, self.dst_col_N), logits_GKV[self.src_row_N, self.src_col_N])


def pack_shared_prefix(
    mb: MicroBatch, K: int, pad_id: int, *, pair_weight: float | None = None
) -> PackedBatch | None:
    """Pack `mb` one row per distinct prompt, or None when packing would not pay: no two samples
    share a prompt (the padded forward then repeats no work), or, with `pair_weight` (see
    `tokens_per_attention_pair`), the packed rows cost more: attention over a mask computes every
    query-key pair of a row (SDPA's CPU kernel skips none), so a row of G answers of length R costs
    (G R)² pairs against G R² padded, and packing is chosen only if G' T (w + T) < B L (w + L) for
    G' packed rows of length T, B padded rows of length L and w = `pair_weight` (linear work per
    token plus attention per token, in pairs). Long answers to short prompts are left padded.

    `K`: the logits the caller keeps per sample row (its last K positions of L), as for
    `logits_to_keep`; every position a response token is scored from (a sample's last prompt
    position up to its second-to-last token) must lie among them.

    Raises:
        ValueError: a scored position falls outside the last K (K too small).
    """
    groups: dict[tuple[int, ...], list[int]] = {}
    for b, s in enumerate(mb.samples):
        groups.setdefault(tuple(s.prompt_ids), []).append(b)
    if len(groups) == len(mb.samples):
        return None
    B, L = mb.input_ids_BL.shape
    starts_B = mb.attention_mask_BL.argmax(dim=1).tolist()  # each row's first token (either padding side)
    rows: list[list[int]] = []
    segments: list[list[int]] = []  # 0 prompt, k >= 1 the group's k-th answer
    positions: list[list[int]] = []
    src: list[tuple[int, int]] = []  # (packed row, packed position) per scored logits row
    dst: list[tuple[int, int]] = []  # (sample row, column in the last K)
    for g, (prompt, members) in enumerate(groups.items()):
        P = len(prompt)
        row, seg, pos = list(prompt), [0] * P, list(range(P))
        for k, b in enumerate(members, start=1):
            response = mb.samples[b].response_ids
            offset = len(row)
            row += response
            seg += [k] * len(response)
            pos += range(P, P + len(response))
            for u in range(P - 1, P + len(response) - 1):  # local position u scores token u + 1
                column = starts_B[b] + u - (L - K)
                if column < 0:
                    raise ValueError(f"pack_shared_prefix: K={K} misses a scored position of sample row {b}")
                src.append((g, u if u < P else offset + u - P))
                dst.append((b, column))
        rows.append(row)
        segments.append(seg)
        positions.append(pos)
    G, T = len(rows), max(len(r) for r in rows)
    if pair_weight is not None and G * T * (pair_weight + T) >= B * L * (pair_weight + L):
        return None
    dev = mb.input_ids_BL.device
    ids_GT = torch.full((G, T), pad_id, dtype=torch.long)
    pos_GT = torch.zeros((G, T), dtype=torch.long)
    seg_GT = torch.full((G, T), -1, dtype=torch.long)  # -1 padding
    for g in range(G):
        n = len(rows[g])
        ids_GT[g, :n] = torch.tensor(rows[g], dtype=torch.long)
        pos_GT[g, :n] = torch.tensor(positions[g], dtype=torch.long)
        seg_GT[g, :n] = torch.tensor(segments[g], dtype=torch.long)
    q_GT1, k_G1T = seg_GT[:, :, None], seg_GT[:, None, :]
    causal_TT = torch.ones((T, T), dtype=torch.bool).tril_()
    same = (k_G1T == 0) & (q_GT1 >= 0) | (k_G1T == q_GT1) & (q_GT1 > 0)
    mask_GTT = (causal_TT & same) | torch.eye(T, dtype=torch.bool)  # padding queries see themselves only
    keep = T - min(len(p) for p in groups) + 1
    src_t = torch.tensor(src, dtype=torch.long).reshape(-1, 2)
    dst_t = torch.tensor(dst, dtype=torch.long).reshape(-1, 2)
    return PackedBatch(
        input_ids_GT=ids_GT.to(dev),
        position_ids_GT=pos_GT.to(dev),
        attention_mask_G1TT=mask_GTT[:, None].to(dev),
        logits_to_keep=keep,
        src_row_N=src_t[:, 0].to(dev),
        src_col_N=(src_t[:, 1] - (T - keep)).to(dev),
        dst_row_N=dst_t[:, 0].to(dev),
        dst_col_N=dst_t[:, 1].to(dev),
    )

"""grpolab's own forward for Llama-family decoders (Llama, Qwen2, Qwen3): prefill and one-token decode.

Why: on CPU a transformers decode step is mostly framework overhead on small models (issue 12: 1,127
aten calls per step on the tiny model, the KV cache's `torch.cat` alone 36 % of it). This path does
the same arithmetic with fewer, larger calls:
- fused projections: one q|k|v matmul and one gate|up matmul per layer. They are copies of the
  model's weights, prepacked for oneDNN on CPU (on this project's CPUs 1.4-2.5x faster than
  `F.linear` for SmolLM2-135M's projections with 8 rows, about equal for the tiny model's), rebuilt by `Decoder.refresh()` once the model's parameters were
  written (a weight sync) or moved; the model itself is not modified. Memory: one more copy of the
  projection and lm_head weights while the decoder exists (the engine drops it when it releases
  memory);
- a KV cache preallocated for prompt + max_new_tokens, written in place and read only up to the
  filled length (no per-step concatenation);
- q and k normalised together (Qwen3: one RMSNorm, weights [Hq + Hk, D]) and rotated together; rotary
  cos and sign-folded sin read from a table;
- on CPU in float32, each residual add is the post-op of the projection before it (one oneDNN call);
- single-token attention as two batched matmuls over the kv-head groups (no repeat of k/v).
The math is transformers' (`modeling_llama.py` / `modeling_qwen3.py` in transformers 5.x): RMSNorm
in float32, `weight * x.to(dtype)`; rotate-half RoPE with transformers' own `inv_freq` and
`attention_scaling`; softmax(q k^T / sqrt(head_dim)) v; SiLU-gated MLP. Results agree with the
transformers forward to float rounding (fused matmuls round differently), measured in
tests/core/test_decoder.py.

Tensor legend: B prompt rows, L padded prompt length, A rows in the decode batch, N filled cache
length, C cache capacity (L + max new tokens), H hidden size, Hq query heads, Hk kv heads, D head
dim, G = Hq / Hk, I intermediate size, V vocab size, Y layers.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from grpolab.core.engine.decode_support import unsupported_config_reason


def unsupported_reason(model: nn.Module) -> str | None:
    """Why `Decoder` cannot run `model`, or None when it can: `decode_support.unsupported_config_reason`
    on its config, and a rotary embedding module with `inv_freq` at `model.model.rotary_emb`."""
    reason = unsupported_config_reason(model.config.to_dict())
    if reason is not None:
        return reason
    rope = getattr(getattr(model, "model", None), "rotary_emb", None)
    if rope is None or not hasattr(rope, "inv_freq"):
        return "no rotary embedding module at model.model.rotary_emb"
    return None


class _Linear:
    """y = x W^T + b with W (and b) the concatenation of source nn.Linear weights [out_i, in] along the
    output dim: a copy when there are several sources, the source itself when one (the model's
    tensors are never written); prepacked for oneDNN on CPU when `pack` (another copy, in oneDNN's
    layout: torch's `mkldnn._reorder_linear_weight` / `_linear_pointwise`, the ops Inductor's CPU
    backend uses; see the module doc for what it gains).

    Raises:
        ValueError: some sources have a bias and others not.
    """

    def __init__(self, sources: list[torch.Tensor], biases: list[torch.Tensor | None], pack: bool) -> None:
        if any(b is None for b in biases) and not all(b is None for b in biases):
            raise ValueError("Decoder: fused projections disagree on having a bias")
        self.weight = sources[0].detach() if len(sources) == 1 else torch.cat([w.detach() for w in sources])
        self.bias = None if biases[0] is None else torch.cat([b.detach() for b in biases if b is not None])
        self.packed = torch.ops.mkldnn._reorder_linear_weight(self.weight, None) if pack else None

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """x [..., in] -> [..., out] in x's dtype."""
        if self.packed is None:
            return F.linear(x, self.weight, self.bias)
        return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")

    def plus(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        """`self(x) + residual` ([..., out]). Packed float32: one oneDNN call with the add as its post-op,
        bitwise equal to the two ops (the float32 product is added as the separate add would); bfloat16
        keeps the two ops (the post-op would add before rounding the product to bfloat16)."""
        if self.packed is None or x.dtype != torch.float32:
            return self(x) + residual
        return torch.ops.mkldnn._linear_pointwise.binary(x, residual, self.packed, self.bias, "add")


@dataclass
class _Layer:
    """One decoder layer: norms are the model's own parameters (read live), projections `_Linear`s."""

    in_norm: torch.Tensor  # [H]
    qkv: _Linear  # [(Hq + 2 Hk) D, H]
    qk_norm: torch.Tensor | None  # [Hq + Hk, D]: Qwen3's q_norm weight per query head, k_norm per kv head
    o: _Linear  # [H, Hq D]
    post_norm: torch.Tensor  # [H]
    gate_up: _Linear  # [2 I, H]
    down: _Linear  # [H, I]


@dataclass
class KVCache:
    """Keys and values of every layer, preallocated; rows are samples, columns positions.

    Attributes:
        k, v: [Y, A, Hk, C, D] in the model dtype; columns [0, length) are written.
        key_bias: [A, C] model dtype, 0 where a column is a real token, -inf for left padding.
        length: N, the number of written columns.
    """

    k: torch.Tensor
    v: torch.Tensor
    key_bias: torch.Tensor
    length: int = 0

    def select_rows(self, index_A: torch.Tensor) -> None:
        """Keep (or repeat) rows: row a of the result is row `index_A[a]` now ([A] int64)."""
        self.k = self.k.index_select(1, index_A)
        self.v = self.v.index_select(1, index_A)
        self.key_bias = self.key_bias.index_select(0, index_A)


def packing_available(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether prepacked oneDNN linears can run here (CPU with oneDNN, float32 or bfloat16)."""
    return (
        device.type == "cpu"
        and dtype in (torch.float32, torch.bfloat16)
        and torch.backends.mkldnn.is_available()
        and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")
    )


def _attention_linears(block: nn.Module) -> tuple[nn.Linear, nn.Linear, nn.Linear, nn.Linear]:
    """A decoder layer's q, k, v, o projections."""
    attn = block.self_attn
    return attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj


def _mlp_linears(block: nn.Module) -> tuple[nn.Linear, nn.Linear, nn.Linear]:
    """A decoder layer's gate, up, down projections."""
    return block.mlp.gate_proj, block.mlp.up_proj, block.mlp.down_proj


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """transformers' LlamaRMSNorm/Qwen3RMSNorm over x's last dim: float32 statistics, `weight * x.to(input
    dtype)`; `weight` [last dim], or [..., last dim] broadcast over x (several norms' weights at once).

    float32 goes through torch's fused `F.rms_norm` (one op; bitwise equal to the formula here, also
    when a broadcast weight multiplies its unweighted result)."""
    if x.dtype == torch.float32 and weight.dtype == torch.float32:
        if weight.dim() == 1:
            return F.rms_norm(x, (x.shape[-1],), weight, eps)
        return F.rms_norm(x, (x.shape[-1],), None, eps) * weight
    x32 = x.float()
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x32.to(x.dtype)


class Decoder:
    """Prefill and decode with a transformers Llama/Qwen2/Qwen3 model's weights (see module doc).

    The model is not modified. Norm weights and embeddings are read from it at every call; the
    projections are fused (and on CPU prepacked) copies, rebuilt by `refresh()` when a source
    parameter was written in place (its `_version` changed: `copy_`, `update_weights`) or
    re-allocated (its `data_ptr` changed: `model.to(...)`). Runs under the caller's
    `torch.inference_mode()`.

    Raises (constructor):
        ValueError: `unsupported_reason(model)` is not None (the reason is in the message).
    """

    def __init__(self, model: nn.Module, *, pack: bool | None = None) -> None:
        """`pack`: prepack projections for oneDNN (default: where `packing_available`)."""
        reason = unsupported_reason(model)
        if reason is not None:
            raise ValueError(f"Decoder: unsupported model: {reason}")
        cfg = model.config
        self.model = model
        self.n_heads = int(cfg.num_attention_heads)
        self.n_kv = int(getattr(cfg, "num_key_value_heads", None) or self.n_heads)
        self.head_dim = int(getattr(cfg, "head_dim", None) or cfg.hidden_size // self.n_heads)
        self.eps = float(cfg.rms_norm_eps)
        self.scale = self.head_dim**-0.5
        body = model.model
        self.embed = body.embed_tokens.weight
        self.final_norm = body.norm.weight
        self.dtype = self.embed.dtype
        self.device = self.embed.device
        self.pack = packing_available(self.device, self.dtype) if pack is None else pack
        rope = body.rotary_emb
        self._inv_freq = rope.inv_freq.detach().float()
        self._rope_scale = float(getattr(rope, "attention_scaling", 1.0))
        self._cos = self._sin = torch.empty(0)  # sin with its first half negated (see `_block`)
        self.layers: list[_Layer] = []
        self.lm_head = _Linear([model.lm_head.weight], [None], False)
        self._stamp: list[tuple[int, int]] = []
        self.refresh()

    def _sources(self) -> list[torch.Tensor]:
        """Every parameter the decoder copies: projections (weights, biases), the lm_head, q/k norms."""
        out = [self.model.lm_head.weight]
        for block in self.model.model.layers:
            for lin in (*_attention_linears(block), *_mlp_linears(block)):
                out.append(lin.weight)
                if lin.bias is not None:
                    out.append(lin.bias)
            if hasattr(block.self_attn, "q_norm"):
                out += [block.self_attn.q_norm.weight, block.self_attn.k_norm.weight]
        return out

    def refresh(self) -> bool:
        """Rebuild the fused/packed projections if any source parameter changed since they were
        built; returns whether it rebuilt (costs one copy of the projection weights)."""
        stamp = [(t.data_ptr(), t._version) for t in self._sources()]
        if stamp == self._stamp:
            return False
        self.layers = [self._layer(block) for block in self.model.model.layers]
        self.lm_head = _Linear([self.model.lm_head.weight], [None], self.pack)
        self._stamp = stamp
        return True

    def _layer(self, block: nn.Module) -> _Layer:
        attn = block.self_attn
        q, k, v, o = _attention_linears(block)
        gate, up, down = _mlp_linears(block)
        qk_norm = None
        if hasattr(attn, "q_norm"):
            D = self.head_dim
            qk_norm = torch.cat(
                (
                    attn.q_norm.weight.detach().expand(self.n_heads, D),
                    attn.k_norm.weight.detach().expand(self.n_kv, D),
                )
            )
        return _Layer(
            in_norm=block.input_layernorm.weight,
            qkv=_Linear([q.weight, k.weight, v.weight], [q.bias, k.bias, v.bias], self.pack),
            qk_norm=qk_norm,
            o=_Linear([o.weight], [o.bias], self.pack),
            post_norm=block.post_attention_layernorm.weight,
            gate_up=_Linear([gate.weight, up.weight], [gate.bias, up.bias], self.pack),
            down=_Linear([down.weight], [down.bias], self.pack),
        )

    # ------------------------------------------------------------------ cache and positions
    def new_cache(self, mask_BL: torch.Tensor, capacity: int) -> KVCache:
        """An empty cache for B left-padded prompts (`mask_BL` [B, L], 1 = token, 0 = padding) and
        `capacity` >= L columns (prompt + new tokens)."""
        B, L = mask_BL.shape
        if capacity < L:
            raise ValueError(f"Decoder.new_cache: capacity {capacity} < prompt length {L}")
        shape = (len(self.layers), B, self.n_kv, capacity, self.head_dim)
        key_bias = torch.zeros((B, capacity), dtype=self.dtype, device=self.device)
        key_bias[:, :L].masked_fill_(mask_BL == 0, float("-inf"))
        return KVCache(
            k=torch.empty(shape, dtype=self.dtype, device=self.device),
            v=torch.empty(shape, dtype=self.dtype, device=self.device),
            key_bias=key_bias,
        )

    def _rope(self, pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, ±sin [*pos.shape, 1, D] in the model dtype for int64 positions, from a table computed
        as transformers' rotary embedding does (float32 `pos * inv_freq`, doubled, cos/sin, scaled);
        the sin's first half negated (rotate-half's sign, folded into the table)."""
        need = int(pos.max()) + 1
        if self._cos.shape[0] < need:
            n = max(need, 2 * self._cos.shape[0], 256)
            freqs = torch.arange(n, device=self.device).float()[:, None] * self._inv_freq.to(self.device)
            emb = torch.cat((freqs, freqs), dim=-1)
            self._cos = (emb.cos() * self._rope_scale).to(self.dtype)
            sin = (emb.sin() * self._rope_scale).to(self.dtype)
            self._sin = torch.cat((-sin[:, : sin.shape[1] // 2], sin[:, sin.shape[1] // 2 :]), dim=-1)
        return self._cos[pos].unsqueeze(-2), self._sin[pos].unsqueeze(-2)

    # ------------------------------------------------------------------ forward
    def prefill(self, ids_BL: torch.Tensor, mask_BL: torch.Tensor, cache: KVCache) -> torch.Tensor:
        """Run left-padded prompts ids [B, L] int64 (mask [B, L], 1 = token) through the model, write
        their keys/values into columns [0, L) of `cache` (from `new_cache(mask_BL, ...)`), and return
        the next-token logits [B, V] (model dtype) at the last position."""
        B, L = ids_BL.shape
        pos_BL = (mask_BL.cumsum(-1) - 1).clamp_(min=0)
        cos, sin = self._rope(pos_BL)
        valid_BL = mask_BL.bool()
        causal_LL = torch.ones((L, L), dtype=torch.bool, device=self.device).tril_()
        # Padding queries attend to themselves only (their outputs are never read), so no row is empty.
        attend_B1LL = (causal_LL & valid_BL[:, None, None, :]) | torch.eye(
            L, dtype=torch.bool, device=self.device
        )
        x = F.embedding(ids_BL, self.embed)
        for y, layer in enumerate(self.layers):
            x = self._block(
                x, layer, cos, sin, lambda q, k, v, y=y: self._attend_prompt(q, k, v, y, cache, attend_B1LL)
            )
        cache.length = L
        return self.lm_head(_rms_norm(x[:, -1], self.final_norm, self.eps))

    def step(self, tok_A: torch.Tensor, pos_A: torch.Tensor, cache: KVCache) -> torch.Tensor:
        """Decode one token per row: tokens [A] int64 at positions [A] int64; appends one column to
        `cache` and returns the next-token logits [A, V] (model dtype).

        Raises:
            ValueError: the cache is full.
        """
        n = cache.length
        if n >= cache.k.shape[3]:
            raise ValueError(f"Decoder.step: the KV cache is full ({n} columns)")
        cos, sin = self._rope(pos_A[:, None])
        x = F.embedding(tok_A[:, None], self.embed)
        for y, layer in enumerate(self.layers):
            x = self._block(x, layer, cos, sin, lambda q, k, v, y=y: self._attend_one(q, k, v, y, cache))
        cache.length = n + 1
        return self.lm_head(_rms_norm(x[:, 0], self.final_norm, self.eps))

    def _block(
        self, x: torch.Tensor, layer: _Layer, cos: torch.Tensor, sin: torch.Tensor, attend
    ) -> torch.Tensor:
        """One decoder layer on x [A, S, H]; `attend(q [A,S,Hq,D], k [A,S,Hk,D], v [A,S,Hk,D])` returns
        the attention output [A, S, Hq D]."""
        A, S, _ = x.shape
        Hq, Hk, D = self.n_heads, self.n_kv, self.head_dim
        qkv = layer.qkv(_rms_norm(x, layer.in_norm, self.eps)).view(A, S, Hq + 2 * Hk, D)
        qk, v = qkv[:, :, : Hq + Hk], qkv[:, :, Hq + Hk :]
        if layer.qk_norm is not None:
            qk = _rms_norm(qk, layer.qk_norm, self.eps)
        # rotate-half RoPE: x cos + cat(-x2, x1) sin, with the sign in the table (-x2 * s == x2 * -s, exactly)
        half = D // 2
        qk = qk * cos + torch.cat((qk[..., half:], qk[..., :half]), dim=-1) * sin
        x = layer.o.plus(attend(qk[:, :, :Hq], qk[:, :, Hq:], v), x)
        gate, up = layer.gate_up(_rms_norm(x, layer.post_norm, self.eps)).chunk(2, -1)
        return layer.down.plus(F.silu(gate).mul_(up), x)

    def _attend_prompt(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        y: int,
        cache: KVCache,
        attend_B1LL: torch.Tensor,
    ) -> torch.Tensor:
        """Prompt attention (SDPA, grouped kv heads); stores k/v in the cache's columns [0, L)."""
        B, L = q.shape[:2]
        k, v = k.transpose(1, 2), v.transpose(1, 2)  # [B, Hk, L, D]
        cache.k[y, :, :, :L] = k
        cache.v[y, :, :, :L] = v
        out = F.scaled_dot_product_attention(
            q.transpose(1, 2), k, v, attn_mask=attend_B1LL, scale=self.scale, enable_gqa=True
        )
        return out.transpose(1, 2).reshape(B, L, -1)

    def _attend_one(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, y: int, cache: KVCache
    ) -> torch.Tensor:
        """One query per row against the cache's filled columns plus this step's (two batched
        matmuls over [A, Hk] with the G query heads of each kv head as rows)."""
        A, n = q.shape[0], cache.length
        cache.k[y, :, :, n] = k[:, 0]
        cache.v[y, :, :, n] = v[:, 0]
        keys, values = cache.k[y, :, :, : n + 1], cache.v[y, :, :, : n + 1]  # [A, Hk, N, D]
        q_AKGD = q.reshape(A, self.n_kv, -1, self.head_dim)
        scores = torch.matmul(q_AKGD, keys.transpose(-1, -2)).mul_(self.scale)  # [A, Hk, G, N]
        scores += cache.key_bias[:, None, None, : n + 1]
        probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(values.dtype)
        return torch.matmul(probs, values).reshape(A, 1, -1)

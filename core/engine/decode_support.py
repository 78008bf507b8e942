"""Which models grpolab's own decoder (`decoder.py`) and the trainer's shared-prefix forward
(`core/shared_prefix.py`) run, decided from the model's config alone.

Torch-free, so that `grpolab train`'s preflight and `grpolab serve` refuse `--rollout-decode-path
grpolab` / `--decode-path grpolab` and `--train-forward shared-prefix` for an unsupported model before
anything heavy is imported or a run directory exists. `decoder.unsupported_reason` and
`shared_prefix.unsupported_reason` apply the same rules to a loaded model. The rules are the
decoder's; the packed forward needs less (position ids, a 4D mask passed through, no sliding window)
and borrows them as a conservative subset of the models it was tested on.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

SUPPORTED_MODEL_TYPES = ("llama", "qwen2", "qwen3")
"""`config.model_type`s the decoder implements (their transformers classes share one module layout)."""
STATIC_ROPE_TYPES = ("default", "linear", "llama3", "yarn")
"""RoPE types whose frequencies do not depend on the sequence length (transformers' `inv_freq` and
`attention_scaling` are then all the decoder needs)."""


def unsupported_config_reason(config: Mapping[str, Any]) -> str | None:
    """Why the decoder cannot run a model with this config.json content, or None when it can.

    Checks `model_type` (SUPPORTED_MODEL_TYPES), a SiLU MLP (`hidden_act`), full attention in every
    layer (`layer_types`, `use_sliding_window`), `pretraining_tp` 1, and a static RoPE type
    (`rope_parameters` or the older `rope_scaling`: `rope_type` / `type`).
    """
    kind = config.get("model_type")
    if kind not in SUPPORTED_MODEL_TYPES:
        return f"model_type {kind!r} (the decoder implements {', '.join(SUPPORTED_MODEL_TYPES)})"
    act = config.get("hidden_act", "silu")
    if act != "silu":
        return f"hidden_act {act!r} (needs silu)"
    if any(t != "full_attention" for t in config.get("layer_types") or ["full_attention"]):
        return "sliding-window layers"
    if config.get("use_sliding_window") and config.get("sliding_window"):
        return "sliding-window attention"
    if config.get("pretraining_tp", 1) != 1:
        return f"pretraining_tp {config['pretraining_tp']}"
    rope = config.get("rope_parameters") or config.get("rope_scaling") or {}
    rope_type = rope.get("rope_type", rope.get("type", "default")) if isinstance(rope, Mapping) else "default"
    if rope_type not in STATIC_ROPE_TYPES:
        return f"rope_type {rope_type!r} (needs one of {', '.join(STATIC_ROPE_TYPES)})"
    return None


def check_decode_path(decode_path: str, checkpoint: str, flag: str) -> None:
    """Refuse decode path "grpolab" for a model directory whose config.json the decoder does not run.

    `flag` names the option in the message (`--rollout-decode-path`, `grpolab serve --decode-path`).

    Raises:
        ValueError: naming `flag`, the checkpoint and the reason; FileNotFoundError / ValueError naming
            --hf-checkpoint when config.json is missing or unreadable (`model_files.model_config`).
    """
    if decode_path != "grpolab":
        return
    from grpolab.core.model_files import model_config

    config = model_config(checkpoint)
    reason = None if config is None else unsupported_config_reason(config)
    if reason is not None:
        raise ValueError(
            f"{flag} grpolab: grpolab's decoder does not run {checkpoint}: {reason}; "
            f"use {flag} auto (transformers' forward for this model) or transformers"
        )


def check_train_forward(train_forward: str, checkpoint: str) -> None:
    """Refuse `--train-forward shared-prefix` for a model directory outside the families the packed
    forward is written for: the decoder's (its attention masks are full-attention, its answers'
    positions RoPE position ids), checked by the same rules, on SDPA attention (an
    `attn_implementation` other than sdpa in config.json is refused; `shared_prefix.unsupported_reason`
    checks the loaded model).

    Raises:
        ValueError: naming the flag, the checkpoint and the reason; FileNotFoundError / ValueError naming
            --hf-checkpoint when config.json is missing or unreadable (`model_files.model_config`).
    """
    if train_forward != "shared-prefix":
        return
    from grpolab.core.model_files import model_config

    config = model_config(checkpoint)
    reason = None if config is None else unsupported_config_reason(config)
    attention = (
        None if config is None else config.get("attn_implementation", config.get("_attn_implementation"))
    )
    if reason is None and attention not in (None, "sdpa"):
        reason = f"attention implementation {attention!r} in config.json (needs sdpa, which takes a 4D boolean mask)"
    if reason is not None:
        raise ValueError(
            f"--train-forward shared-prefix: the packed forward does not run {checkpoint}: {reason}; "
            "use --train-forward auto (the padded forward for this model) or padded"
        )

"""Loading causal LMs and tokenizers from a local HF directory or a GGUF file, never from a hub.

`--hf-checkpoint` may name a directory written by `save_pretrained` or a single `.gguf` file
(transformers dequantizes GGUF on load; that needs the `gguf` and `accelerate` packages).
Everything runs with `local_files_only=True`, so a missing path fails at once instead of
reaching for the network.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, PreTrainedModel
from transformers.utils import logging as hf_logging

from grpolab.core.dtypes import parse_dtype  # noqa: F401 (the loop and the UI import it here)

hf_logging.disable_progress_bar()  # "Loading weights" bars would drown the run's own output


def _split_checkpoint(path: str | Path) -> tuple[Path, dict]:
    """Return (directory, extra from_pretrained kwargs) for a checkpoint directory or GGUF file."""
    p = Path(path).expanduser()
    if not p.exists():
        raise FileNotFoundError(
            f"--hf-checkpoint: {p} does not exist (expected a model directory or a .gguf file)"
        )
    if p.is_file():
        if p.suffix != ".gguf":
            raise ValueError(
                f"--hf-checkpoint: {p} is a file but not a .gguf file; pass a model directory instead"
            )
        return p.parent, {"gguf_file": p.name}
    if not (p / "config.json").exists():
        raise ValueError(
            f"--hf-checkpoint: {p} has no config.json; expected a directory written by save_pretrained"
        )
    return p, {}


def load_tokenizer(path: str | Path):
    """Load the tokenizer that belongs to a checkpoint directory or GGUF file (offline)."""
    directory, extra = _split_checkpoint(path)
    return AutoTokenizer.from_pretrained(str(directory), local_files_only=True, **extra)


def load_causal_lm(
    path: str | Path, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu"
) -> PreTrainedModel:
    """Load a fresh, independent causal LM (its own parameter storage) in eval mode.

    A GGUF-loaded model is rebuilt as a plain model from its config and state dict, so it can be
    saved and its parameters copied like any other (transformers refuses to serialize GGUF models).

    Args:
        path: model directory or `.gguf` file.
        dtype: parameter dtype (float32 default; bfloat16 supported).
        device: where the parameters live.

    Raises:
        FileNotFoundError / ValueError: naming `--hf-checkpoint` when the path is not a model.
    """
    directory, extra = _split_checkpoint(path)
    model = AutoModelForCausalLM.from_pretrained(str(directory), local_files_only=True, dtype=dtype, **extra)
    if extra:  # GGUF: copy into a plain model so it is serializable and has ordinary parameters
        config = model.config
        if hasattr(config, "quantization_config"):
            del config.quantization_config
        plain = AutoModelForCausalLM.from_config(config, dtype=dtype)
        plain.load_state_dict(model.state_dict(), strict=False)
        plain.tie_weights()
        model = plain
    model.to(device)
    model.eval()
    return model


def model_fingerprint(path: str | Path) -> str:
    """SHA-256 (hex, first 16 chars) over the checkpoint's config.json, or the GGUF file's first 1 MiB."""
    directory, extra = _split_checkpoint(path)
    h = hashlib.sha256()
    if extra:
        with open(directory / extra["gguf_file"], "rb") as f:
            h.update(f.read(1 << 20))
    else:
        config = AutoConfig.from_pretrained(str(directory), local_files_only=True).to_dict()
        for key in ("transformers_version", "_name_or_path", "name_or_path", "_commit_hash"):
            config.pop(key, None)  # where the model lives is not what the model is
        h.update(json.dumps(config, sort_keys=True, default=str).encode())
    return h.hexdigest()[:16]


def stop_token_ids(path: str | Path, tokenizer) -> tuple[int, ...]:
    """Token ids that end a response: the tokenizer's eos and the generation config's eos (either may be a list)."""
    from transformers import GenerationConfig

    directory, _ = _split_checkpoint(path)
    candidates = [tokenizer.eos_token_id]
    try:
        candidates.append(
            GenerationConfig.from_pretrained(str(directory), local_files_only=True).eos_token_id
        )
    except (OSError, ValueError):
        pass  # no generation_config.json (e.g. a GGUF file): the tokenizer's eos decides
    flat: set[int] = set()
    for c in candidates:
        flat.update(c if isinstance(c, list) else [c] if c is not None else [])
    return tuple(sorted(flat))

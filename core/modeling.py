"""Loading causal LMs and tokenizers from a local HF directory or a GGUF file, never from a hub.

`--hf-checkpoint` may name a directory written by `save_pretrained` or a single `.gguf` file
(transformers dequantizes GGUF on load; that needs the `gguf` and `accelerate` packages).
Everything runs with `local_files_only=True`, so a missing path fails at once instead of
reaching for the network; what a model folder must hold is checked first, without transformers
(core/model_files.py), so a missing or truncated file is named instead of a transformers traceback.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, PreTrainedModel
from transformers.utils import logging as hf_logging

from grpolab.core.dtypes import parse_dtype  # noqa: F401 (the loop and the UI import it here)
from grpolab.core.file_hash import file_sha256
from grpolab.core.model_files import check_model, weight_files

hf_logging.disable_progress_bar()  # "Loading weights" bars would drown the run's own output


def _split_checkpoint(path: str | Path, *, tokenizer: bool, weights: bool) -> tuple[Path, dict]:
    """(directory, extra from_pretrained kwargs) after `model_files.check_model` checked what is needed.

    Raises:
        FileNotFoundError / ValueError: naming `--hf-checkpoint` and the missing or broken files.
    """
    directory, gguf = check_model(path, tokenizer=tokenizer, weights=weights)
    return directory, {} if gguf is None else {"gguf_file": gguf}


def load_tokenizer(path: str | Path):
    """Load the tokenizer that belongs to a checkpoint directory or GGUF file (offline).

    Raises:
        FileNotFoundError / ValueError: naming `--hf-checkpoint` when there is no config or tokenizer.
    """
    directory, extra = _split_checkpoint(path, tokenizer=True, weights=False)
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
        FileNotFoundError / ValueError: naming `--hf-checkpoint` when the path is not a model or its
            weights are missing or truncated (`model_files.check_model`), or transformers cannot load
            the weights into the model config.json describes (another model's, other shapes).
    """
    directory, extra = _split_checkpoint(path, tokenizer=False, weights=True)
    try:
        model = AutoModelForCausalLM.from_pretrained(
            str(directory), local_files_only=True, dtype=dtype, **extra
        )
    except (RuntimeError, NotImplementedError) as e:  # e.g. weights of another model than config.json's
        first = next((line.strip() for line in str(e).splitlines() if line.strip()), type(e).__name__)
        raise ValueError(
            f"--hf-checkpoint {path}: transformers could not load its weights into the model config.json "
            f"describes (are they another model's?): {first[:300]}"
        ) from e
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
    """What the model is, independent of where it lives: "<config part>-w<weights part>", 16 hex digits each.

    The config part is the SHA-256 of config.json as transformers reads it (without its version and
    path fields), or of a GGUF file's first 1 MiB: the whole fingerprint before weights were covered,
    so stored fingerprints of that age still compare (`model_files.compare_model_fingerprints`). The
    weights part is the SHA-256 over the SHA-256 of each weight file (`model_files.weight_files`, or the
    GGUF file), cached by path, size and mtime (`core/file_hash.py`), so a large model is read once.

    Raises:
        FileNotFoundError / ValueError: naming `--hf-checkpoint` when config or weights are missing or broken.
    """
    directory, extra = _split_checkpoint(path, tokenizer=False, weights=True)
    h = hashlib.sha256()
    if extra:
        files = [directory / extra["gguf_file"]]
        with open(files[0], "rb") as f:
            h.update(f.read(1 << 20))
    else:
        files = weight_files(directory)
        config = AutoConfig.from_pretrained(str(directory), local_files_only=True).to_dict()
        for key in ("transformers_version", "_name_or_path", "name_or_path", "_commit_hash"):
            config.pop(key, None)  # where the model lives is not what the model is
        h.update(json.dumps(config, sort_keys=True, default=str).encode())
    weights = hashlib.sha256("\n".join(file_sha256(files)).encode()).hexdigest()
    return f"{h.hexdigest()[:16]}-w{weights[:16]}"


def stop_token_ids(path: str | Path, tokenizer) -> tuple[int, ...]:
    """Token ids that end a response: the tokenizer's eos and the generation config's eos (either may be a list)."""
    from transformers import GenerationConfig

    directory, _ = _split_checkpoint(path, tokenizer=False, weights=False)
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

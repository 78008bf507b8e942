"""What makes two rollouts comparable: the fingerprints a recording stores (model, tokenizer, chat
template) and the comparison a replay makes against the current run (`replay.replayer`).

The model's fingerprint is `core.modeling.model_fingerprint`; the tokenizer's and the chat template's
are here (`train/startup.py` stamps all three into every recording).
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

FINGERPRINT_FIELDS = ("model_fingerprint", "tokenizer_fingerprint", "chat_template_hash")
"""The header fields of a recording that say which model, tokenizer and chat template made it."""


def tokenizer_fingerprint(tokenizer: Any) -> str:
    """SHA-256 hex of a tokenizer's vocabulary, merges, normalizer and added tokens.

    Uses `tokenizer.backend_tokenizer.to_str()` (HF fast tokenizers) or `tokenizer.to_str()`
    (`tokenizers.Tokenizer`) with the runtime `padding`/`truncation` settings dropped; otherwise
    the vocabulary from `get_vocab()` sorted by id.

    Raises:
        TypeError: the object offers neither `to_str` nor `get_vocab`.
    """
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None and hasattr(tokenizer, "to_str"):
        backend = tokenizer
    if backend is not None:
        spec = json.loads(backend.to_str())
        spec.pop("padding", None)
        spec.pop("truncation", None)
        blob = json.dumps(spec, sort_keys=True, ensure_ascii=False)
    elif hasattr(tokenizer, "get_vocab"):
        blob = json.dumps(
            sorted(tokenizer.get_vocab().items(), key=lambda kv: (kv[1], kv[0])), ensure_ascii=False
        )
    else:
        raise TypeError(
            f"cannot fingerprint tokenizer of type {type(tokenizer).__name__} (no to_str or get_vocab)"
        )
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


def chat_template_hash(tokenizer: Any) -> str:
    """SHA-256 hex of `tokenizer.chat_template` (str, or dict of named templates); "none" when absent."""
    template = getattr(tokenizer, "chat_template", None)
    if not template:
        return "none"
    blob = template if isinstance(template, str) else json.dumps(template, sort_keys=True, ensure_ascii=False)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


def _flatten(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def compare_fingerprints(recorded: dict[str, Any], current: dict[str, Any]) -> list[str]:
    """Human-readable lines, one per field that differs between a recording and the current run.

    Nested dicts (e.g. `train_config`) are compared field by field under dotted names; a field
    present on one side only is reported as missing on the other. Empty list: everything matches.
    """
    rec, cur = _flatten(recorded), _flatten(current)
    lines = []
    for key in list(rec) + [k for k in cur if k not in rec]:
        a, b = rec.get(key, _MISSING), cur.get(key, _MISSING)
        if a is _MISSING or b is _MISSING or a != b:
            lines.append(f"{key}: recording has {_show(a)}, this run has {_show(b)}")
    return lines


_MISSING = object()


def _show(v: Any) -> str:
    return "(missing)" if v is _MISSING else repr(v)

"""What `--hf-checkpoint` must hold, checked from the files alone (no torch, no transformers).

A model directory (the `save_pretrained` layout) needs config.json, a tokenizer and whole weights. A
tokenizer is tokenizer.json or a slow tokenizer's vocabulary (tokenizer.model, vocab.json, vocab.txt,
spiece.model, sentencepiece.bpe.model). The weights are the first of these that exists, the order in
which transformers' `from_pretrained` looks for them: model.safetensors, model.safetensors.index.json
(with every shard its weight_map names), pytorch_model.bin, pytorch_model.bin.index.json (with its
shards). A safetensors file is whole when its size is what its header says: 8 bytes of header length
N, N bytes of JSON header, then the tensor data, whose byte ranges (`data_offsets`) the header lists
(the safetensors format specification); the safetensors library refuses a header over 100 MB
(`MAX_HEADER_SIZE` in safetensors/src/tensor.rs), so a larger length means the file is not safetensors.
config.json, tokenizer.json and tokenizer_config.json must be JSON objects (transformers parses them
and would fail with a traceback naming no file). A `.gguf` file holds config, tokenizer and weights:
the magic bytes `GGUF`, a uint32 version (2 or 3, what the `gguf` package reads), a uint64 tensor
count and a uint64 metadata key-value count, little-endian (the GGUF specification, ggml/docs/gguf.md);
with the `gguf` package installed (extra `gguf`) its whole header is read as transformers would.

The model fingerprint (core/modeling.py) hashes the same weight files, so what is checked here is
what is fingerprinted; `compare_model_fingerprints` says how a stored fingerprint compares with one
computed now, including those stored before the weights were fingerprinted.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import re
import struct
import zipfile
from pathlib import Path
from typing import Literal

TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "vocab.txt", "spiece.model")
"""A directory holds a tokenizer when it has any of these (or sentencepiece.bpe.model)."""
WEIGHT_FILES = (
    "model.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
)
"""The weights transformers loads, in the order it looks for them; the first that exists is used."""
GGUF_MAGIC = b"GGUF"
GGUF_VERSIONS = (2, 3)
"""GGUF versions the `gguf` package (and so transformers) reads; version 1 had 32-bit counts."""
SAFETENSORS_MAX_HEADER = 100_000_000
"""Bytes; the safetensors library's MAX_HEADER_SIZE (safetensors/src/tensor.rs)."""
JSON_FILES = ("config.json", "tokenizer.json", "tokenizer_config.json")
"""Files of a model directory that must be JSON objects when present (config.json must be)."""

_EXPECTED_TOKENIZER = "tokenizer.json, or a slow tokenizer's tokenizer.model, vocab.json or vocab.txt"
_EXPECTED_WEIGHTS = (
    "model.safetensors or pytorch_model.bin, or a sharded model.safetensors.index.json or "
    "pytorch_model.bin.index.json with its shards"
)


def split_checkpoint(path: str | Path) -> tuple[Path, str | None]:
    """(directory, GGUF file name or None) of an `--hf-checkpoint` value: a model directory or a .gguf file.

    Raises:
        FileNotFoundError: the path does not exist (naming `--hf-checkpoint` and what was expected).
        ValueError: a file that is not a .gguf.
    """
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
        return p.parent, p.name
    if not p.is_dir():
        raise ValueError(f"--hf-checkpoint: {p} is neither a directory nor a .gguf file")
    return p, None


def weight_files(directory: Path) -> list[Path]:
    """The weight files transformers would load from `directory` (see the module docstring); [] if none.

    For a sharded index, the shards its weight_map names (sorted), missing ones included, so that
    `check_model` can name them.

    Raises:
        ValueError: an index file that is not JSON with a weight_map object (naming the file).
    """
    for name in WEIGHT_FILES:
        path = directory / name
        if not path.is_file():
            continue
        if not name.endswith(".index.json"):
            return [path]
        try:
            weight_map = json.loads(path.read_text(encoding="utf-8"))["weight_map"]
            return [directory / shard for shard in sorted(set(weight_map.values()))]
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
            raise ValueError(
                f"--hf-checkpoint: {path} is not a weight index (JSON with a weight_map object): {e}"
            ) from None
    return []


def has_tokenizer(directory: Path) -> bool:
    """Whether `directory` holds a tokenizer's vocabulary (TOKENIZER_FILES or sentencepiece.bpe.model)."""
    return any((directory / name).is_file() for name in (*TOKENIZER_FILES, "sentencepiece.bpe.model"))


def has_chat_template(directory: Path) -> bool:
    """Whether a tokenizer directory holds a default chat template where transformers' tokenizer reads
    one: chat_template.jinja, or a non-empty "chat_template" in tokenizer_config.json (chat_template.json
    is a processor's file, not read for a tokenizer)."""
    if (directory / "chat_template.jinja").is_file():
        return True
    try:
        config = json.loads((directory / "tokenizer_config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(config, dict) and bool(config.get("chat_template"))


def missing_gguf_packages() -> list[str]:
    """The packages transformers needs to load a .gguf (`gguf`, `accelerate`) that are not installed."""
    return [m for m in ("gguf", "accelerate") if importlib.util.find_spec(m) is None]


def check_model(path: str | Path, *, tokenizer: bool = True, weights: bool = True) -> tuple[Path, str | None]:
    """Check that `--hf-checkpoint` holds a config, a tokenizer (if `tokenizer`) and whole weights (if
    `weights`); return `split_checkpoint(path)`.

    Raises:
        FileNotFoundError / ValueError: naming `--hf-checkpoint`, the directory or file and every
            expected file that is missing; a config.json, tokenizer.json or tokenizer_config.json
            that is not a JSON object; a truncated weight file with the size its header states and
            the size it has, or one that is not the format its name says; a .gguf whose header is not
            GGUF's (`gguf_problem`), or one whose loading packages (`gguf`, `accelerate`: transformers
            dequantizes with them) are not installed, when `weights`.
    """
    directory, gguf = split_checkpoint(path)
    if gguf is not None:
        problem = gguf_problem(directory / gguf)
        if problem:
            raise ValueError(f"--hf-checkpoint: {directory / gguf} {problem}")
        missing_packages = missing_gguf_packages()
        if weights and missing_packages:
            raise ValueError(
                f"--hf-checkpoint: {directory / gguf} is a GGUF file; loading it needs the "
                f"{' and '.join(missing_packages)} package(s): pip install -e '.[gguf]'"
            )
        return directory, gguf
    missing = [] if (directory / "config.json").is_file() else ["config.json"]
    if tokenizer and not has_tokenizer(directory):
        missing.append(f"the tokenizer (expected {_EXPECTED_TOKENIZER})")
    files = weight_files(directory) if weights else []
    if weights and not files:
        missing.append(f"the weights (expected {_EXPECTED_WEIGHTS})")
    if missing:
        raise ValueError(
            f"--hf-checkpoint: {directory} is not a complete model directory (a save_pretrained folder): "
            "missing " + "; missing ".join(missing)
        )
    for name in JSON_FILES if tokenizer else JSON_FILES[:1]:
        problem = json_object_problem(directory / name)
        if problem:
            raise ValueError(f"--hf-checkpoint: {directory / name} {problem}")
    for file in files:
        problem = weight_file_problem(file)
        if problem:
            raise ValueError(f"--hf-checkpoint: {file} {problem}")
    return directory, None


def padding_id(config: dict) -> int:
    """The token id the trainer pads micro-batches with: config.json's `pad_token_id`, else its
    `eos_token_id` (the first of a list), else 0 (what `actor.Actor` uses)."""
    pad = config.get("pad_token_id")
    pad = config.get("eos_token_id") if pad is None else pad
    if isinstance(pad, list):
        pad = pad[0] if pad else None
    return int(pad) if isinstance(pad, int) and not isinstance(pad, bool) else 0


def padding_id_problem(config: dict) -> str | None:
    """Why `padding_id(config)` cannot index the model's `vocab_size` embedding rows, or None (no
    top-level `vocab_size`: nested text configs are not checked). A pad id past the embedding ended
    the first training forward with an IndexError (a GPT-2 eos, 50256, in a 1,024-token model)."""
    vocab = config.get("vocab_size")
    if not isinstance(vocab, int) or isinstance(vocab, bool):
        return None
    pad = padding_id(config)
    if 0 <= pad < vocab:
        return None
    source = "pad_token_id" if config.get("pad_token_id") is not None else "eos_token_id"
    return (
        f"the trainer pads with {source} {pad}, outside the vocabulary (vocab_size {vocab}: ids 0..{vocab - 1}); "
        "set pad_token_id in config.json to a token id below vocab_size"
    )


def json_object_problem(path: Path) -> str | None:
    """Why `path` (if it exists) is not a UTF-8 JSON object, with the line and column, or None."""
    if not path.is_file():
        return None
    try:
        value = json.loads(path.read_bytes().decode("utf-8"))
    except UnicodeDecodeError as e:
        return f"is not UTF-8 (byte {e.start}); expected a JSON object"
    except json.JSONDecodeError as e:
        return f"is not valid JSON (line {e.lineno} column {e.colno}: {e.msg}); expected a JSON object"
    if not isinstance(value, dict):
        return f"is a JSON {type(value).__name__}, expected a JSON object"
    return None


def model_config(path: str | Path) -> dict | None:
    """A model directory's config.json as a dict; None for a .gguf file (its config is inside it).

    Raises:
        FileNotFoundError / ValueError: as `check_model(path, tokenizer=False, weights=False)`.
    """
    directory, gguf = check_model(path, tokenizer=False, weights=False)
    if gguf is not None:
        return None
    return json.loads((directory / "config.json").read_text(encoding="utf-8"))


def max_position_embeddings(path: str | Path) -> int | None:
    """The model's longest sequence in tokens (prompt + response), from config.json's
    `max_position_embeddings` (or its `text_config`'s); None for a .gguf file or a config without one.

    Raises:
        FileNotFoundError / ValueError: as `check_model(path, tokenizer=False, weights=False)`.
    """
    config = model_config(path)
    if config is None:
        return None
    value = config.get(
        "max_position_embeddings", (config.get("text_config") or {}).get("max_position_embeddings")
    )
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def weight_file_problem(path: Path) -> str | None:
    """What is wrong with one weight file (missing, truncated, not the format its name says), or None."""
    if not path.is_file():
        return "is missing (the weight index names it)"
    if path.suffix == ".safetensors":
        return safetensors_problem(path)
    with open(path, "rb") as f:
        zipped = f.read(2) == b"PK"
    if zipped and not zipfile.is_zipfile(path):  # torch.save's zip archive lost its end (directory)
        return f"is truncated or corrupt: a torch zip archive without its central directory ({_size(path)})"
    return None


def safetensors_problem(path: Path) -> str | None:
    """Why `path` is not a whole safetensors file (see the module docstring), or None."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            return f"is truncated: {size} bytes, shorter than the 8-byte header length of a safetensors file"
        header_len = int.from_bytes(head, "little")
        if header_len > SAFETENSORS_MAX_HEADER or f.read(1) not in (b"{", b""):
            return (
                "is not a safetensors file: its first 8 bytes do not give the length of a JSON header "
                f"(they say {header_len} bytes; a safetensors header is JSON of at most "
                f"{SAFETENSORS_MAX_HEADER} bytes)"
            )
        f.seek(8)
        if 8 + header_len > size:
            return (
                f"is truncated: its header says {8 + header_len} bytes of header, the file has {size} bytes"
            )
        try:
            header = json.loads(f.read(header_len))
            end = max((t["data_offsets"][1] for k, t in header.items() if k != "__metadata__"), default=0)
        except (ValueError, TypeError, KeyError, IndexError):
            return "is not a safetensors file (its header is not the JSON table of tensors)"
    expected = 8 + header_len + int(end)
    if size < expected:
        return f"is truncated: header says {expected} bytes, file has {size}"
    if size > expected:
        return f"is not a whole safetensors file: header says {expected} bytes, file has {size}"
    return None


def gguf_problem(path: Path) -> str | None:
    """Why `path` is not a GGUF file transformers can read (see the module docstring), or None.

    A tensor's entry in the header takes at least 24 bytes and a metadata entry at least 13 (their
    fixed-size fields), so counts a file of its size cannot hold mean a corrupt header.
    """
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(24)
    if head[:4] != GGUF_MAGIC:
        return f"is not a GGUF file: it starts with {head[:4]!r}, a GGUF file with {GGUF_MAGIC!r}"
    if len(head) < 24:
        return f"is truncated: {size} bytes, shorter than the 24-byte GGUF header (magic, version, counts)"
    version, tensors, kvs = struct.unpack("<IQQ", head[4:])
    if version not in GGUF_VERSIONS:
        return f"is not a readable GGUF file: version {version}, expected one of {GGUF_VERSIONS}"
    if 24 + 24 * tensors + 13 * kvs > size:
        return (
            f"is truncated or corrupt: its header says {tensors} tensors and {kvs} metadata entries, "
            f"more than its {size} bytes can hold"
        )
    st = path.stat()
    return _gguf_reader_problem(path.resolve(), st.st_size, st.st_mtime_ns)


@functools.lru_cache(maxsize=8)
def _gguf_reader_problem(path: Path, size: int, mtime_ns: int) -> str | None:
    """What the `gguf` package's reader (transformers' GGUF loader) says is wrong, or None (also when
    the package is not installed: transformers then names the missing package itself).

    Cached by path, size and mtime: reading SmolLM2-135M's header (its 49k-token vocabulary) takes
    ~2.5 s on a loaded 2-core machine, and a run checks the model several times."""
    try:
        from gguf import GGUFReader
    except ImportError:
        return None
    try:
        GGUFReader(path, "r")
    except Exception as e:  # noqa: BLE001 (any reader failure is a corrupt file; named, not a traceback)
        return f"is not a readable GGUF file (the gguf reader says {type(e).__name__}: {e})"
    return None


def _size(path: Path) -> str:
    return f"{path.stat().st_size} bytes"


# ------------------------------------------------------------------------------- fingerprints
_LEGACY = re.compile(r"[0-9a-f]{16}")

FingerprintMatch = Literal["same", "different", "config-only"]
"""How a stored model fingerprint compares with this run's: "config-only" is one stored before the
weights were fingerprinted (config hash only) whose config matches; the weights could not be compared."""


def compare_model_fingerprints(stored: str, current: str) -> FingerprintMatch:
    """Compare a model fingerprint stored in a recording or checkpoint with the current model's.

    A fingerprint is "<config part>-w<weights part>" (core/modeling.py). One stored before weights
    were fingerprinted is the config part alone (16 hex digits): it matches as "config-only" when it
    equals the current config part, so old recordings and checkpoints still load (with a warning,
    `config_only_warning`) unless their config differs.
    """
    if stored == current:
        return "same"
    if _LEGACY.fullmatch(stored) and current.split("-w", 1)[0] == stored:
        return "config-only"
    return "different"


def config_only_warning(what: str) -> str:
    """The warning for a "config-only" match; `what` names the recording or checkpoint."""
    return (
        f"warning: {what} predates weight fingerprints: only the model's config matched, so weights "
        "changed since it was made would go unnoticed; record (or save) it again to store the full fingerprint"
    )

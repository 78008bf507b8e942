"""Per-layer SHA-256 model hashes: `--ci-save-model-hash`, `--ci-check-model-hash`, `grpolab hash diff`.

What is computed (Miles `miles/backends/megatron_utils/ci_utils.py`, notes section 3.6): parameters
sorted by name are put in buckets by layer (`...layers.N.` → `layer_{N:04d}`, anything else →
`non_layer`); each bucket's SHA-256 is fed, per parameter, the name bytes, `str(tuple(shape))`,
`str(dtype)` and the raw contiguous CPU bytes. The JSON is `{"layer_0000": hex, ..., "non_layer": hex}`
with sorted keys and indent 2, one file per rank. Deviations from Miles: names are the HF names
(Miles prefixes `pp<chunk>.`), the file is `model_hash_rank{rank}.json` (Miles:
`model_hash_tp*_pp*_dp*_cp*.json`; we only shard data-parallel), and a missing file names its path.
Like Miles, a rank hashes what it holds: a DTensor (FSDP2) contributes its local shard, so saved and
checked hashes must come from the same world size.

`diff_checkpoints` streams two checkpoints (safetensors, tensor by tensor) and names the first
differing layer and, per differing tensor, the max abs difference and the shapes (the command itself:
`checkers/hash_command.py`).
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from grpolab.checkers.errors import CheckFailure
from grpolab.core.atomic import atomic_write_json

NON_LAYER = "non_layer"
HASH_FILE = "model_hash_rank{rank}.json"
# Miles parses `encoder.layers.N`, `decoder.layers.N`, `layers.N` and `layer.N`; HF uses `model.layers.N`.
_LAYER_RE = re.compile(r"(?:^|\.)layers?\.(\d+)(?:\.|$)")
_ITER_RE = re.compile(r"^iter_\d+$")


# ---------------------------------------------------------------------------------------------
# Pure hashing


def layer_bucket(name: str) -> str:
    """`model.layers.3.mlp.up_proj.weight` → `layer_0003`; names outside a layer → `non_layer`."""
    match = _LAYER_RE.search(name)
    return f"layer_{int(match.group(1)):04d}" if match else NON_LAYER


def layer_order(bucket: str) -> tuple[int, int]:
    """Sort key: `layer_0000` … `layer_N` by number, then `non_layer` (embeddings, final norm, head)."""
    if bucket.startswith("layer_") and bucket[6:].isdigit():
        return (0, int(bucket[6:]))
    return (1, 0)


def _feed(hasher: Any, name: str, tensor: Tensor) -> None:
    """Name bytes, `str(tuple(shape))`, `str(dtype)`, then the raw contiguous CPU bytes (any dtype)."""
    if hasattr(tensor, "to_local"):  # DTensor (FSDP2): the local shard and its shape, as Miles does
        tensor = tensor.to_local()
    hasher.update(name.encode())
    hasher.update(str(tuple(tensor.shape)).encode())
    hasher.update(str(tensor.dtype).encode())
    hasher.update(tensor.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy())


def layer_hashes(named_params: Iterable[tuple[str, Tensor]]) -> dict[str, str]:
    """SHA-256 hex digest per layer bucket, keys in layer order (Miles' JSON shape).

    Args:
        named_params: (HF name, tensor) pairs, e.g. `Actor.named_weights()`; any order, sorted here.

    Raises:
        ValueError: when a name appears twice.
    """
    params = list(named_params)
    names = [name for name, _ in params]
    if len(set(names)) != len(names):
        dup = sorted({n for n in names if names.count(n) > 1})
        raise ValueError(f"layer_hashes: duplicate parameter names {dup[:5]}")
    hashers: dict[str, Any] = {}
    for name, tensor in sorted(params, key=lambda p: p[0]):
        _feed(hashers.setdefault(layer_bucket(name), hashlib.sha256()), name, tensor)
    return {k: hashers[k].hexdigest() for k in sorted(hashers, key=layer_order)}


@dataclass(frozen=True)
class HashComparison:
    """Layer keys that differ between expected (saved) and actual (recomputed) hashes, in layer order."""

    mismatched: list[str]
    missing: list[str]
    """In the expected hashes but not in the actual ones."""
    extra: list[str]
    """In the actual hashes but not in the expected ones."""

    @property
    def equal(self) -> bool:
        return not (self.mismatched or self.missing or self.extra)


def compare_hashes(expected: dict[str, str], actual: dict[str, str]) -> HashComparison:
    """Compare two `layer_hashes` results key by key."""
    return HashComparison(
        mismatched=sorted((k for k in expected if k in actual and expected[k] != actual[k]), key=layer_order),
        missing=sorted(set(expected) - set(actual), key=layer_order),
        extra=sorted(set(actual) - set(expected), key=layer_order),
    )


def _listing(keys: list[str], limit: int = 20) -> str:
    shown = ", ".join(keys[:limit])
    return shown + (f", … and {len(keys) - limit} more" if len(keys) > limit else "")


# ---------------------------------------------------------------------------------------------
# Hash files next to checkpoints


def hash_file_path(ckpt_iter_dir: str | Path, *, rank: int) -> Path:
    """`<ckpt_iter_dir>/model_hash_rank{rank}.json`."""
    return Path(ckpt_iter_dir) / HASH_FILE.format(rank=rank)


def save_model_hash(ckpt_iter_dir: str | Path, hashes: dict[str, str], *, rank: int) -> Path:
    """Write `hashes` as `model_hash_rank{rank}.json` (indent 2, sorted, atomic) into an `iter_<N>` dir.

    Raises:
        ValueError: `ckpt_iter_dir` is not named `iter_<N>` or `rank` < 0 (names `--ci-save-model-hash`).
    """
    ckpt_iter_dir = Path(ckpt_iter_dir)
    if not _ITER_RE.match(ckpt_iter_dir.name):
        raise ValueError(
            f"--ci-save-model-hash: {ckpt_iter_dir} is not a checkpoint iteration directory (iter_<N>)"
        )
    if rank < 0:
        raise ValueError(f"--ci-save-model-hash: rank must be >= 0, got {rank}")
    path = hash_file_path(ckpt_iter_dir, rank=rank)
    atomic_write_json(path, {k: hashes[k] for k in sorted(hashes, key=layer_order)})
    return path


def check_model_hash(ckpt_iter_dir: str | Path, hashes: dict[str, str], *, rank: int) -> None:
    """Compare recomputed `hashes` with `<ckpt_iter_dir>/model_hash_rank{rank}.json` (`--ci-check-model-hash`).

    Raises:
        CheckFailure: the file is missing or unreadable (names the path), or layers differ (lists the
            mismatched, missing and extra layers).
    """
    path = hash_file_path(ckpt_iter_dir, rank=rank)
    if not path.is_file():
        raise CheckFailure(
            "model_hash",
            f"hash file missing: {path} (--ci-check-model-hash needs a checkpoint saved with "
            "--ci-save-model-hash by the same number of ranks)",
        )
    try:
        expected = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CheckFailure("model_hash", f"hash file {path} is unreadable: {e}") from e
    if not isinstance(expected, dict) or not all(isinstance(v, str) for v in expected.values()):
        raise CheckFailure("model_hash", f"hash file {path} is not a {{layer: sha256}} JSON object")
    result = compare_hashes(expected, hashes)
    if result.equal:
        return
    lines = [f"rank {rank}: the loaded weights do not match {path}"]
    for label, keys in (
        ("mismatched layers", result.mismatched),
        ("missing layers (in the file, not in the model)", result.missing),
        ("extra layers (in the model, not in the file)", result.extra),
    ):
        if keys:
            lines.append(f"  {label} ({len(keys)}): {_listing(keys)}")
    lines.append(
        f"  `grpolab hash diff {Path(ckpt_iter_dir)} OTHER` names the differing tensors between checkpoints."
    )
    raise CheckFailure("model_hash", "\n".join(lines))


# ---------------------------------------------------------------------------------------------
# Diffing two checkpoints


class HashInputError(ValueError):
    """A path `grpolab hash diff` cannot read as a checkpoint or model (names the path)."""


@dataclass(frozen=True)
class TensorDiff:
    """One tensor that differs between A and B."""

    name: str
    layer: str
    shape_a: tuple[int, ...] | None
    """None when the tensor is missing in A."""
    shape_b: tuple[int, ...] | None
    dtype_a: str | None
    dtype_b: str | None
    max_abs_diff: float | None
    """max |a − b| in float64 when shapes match; None when missing or shapes differ."""

    @property
    def what(self) -> str:
        """One of: values, missing in A, missing in B, shape, dtype."""
        if self.shape_a is None:
            return "missing in A"
        if self.shape_b is None:
            return "missing in B"
        if self.shape_a != self.shape_b:
            return "shape"
        return "dtype" if self.dtype_a != self.dtype_b else "values"


@dataclass(frozen=True)
class HashDiff:
    """Result of `diff_checkpoints`: per-layer hashes of both sides and every differing tensor."""

    a: Path
    b: Path
    hashes_a: dict[str, str]
    hashes_b: dict[str, str]
    differing_layers: list[str]
    """Layers whose hash differs or that exist on one side only, in layer order."""
    tensors: list[TensorDiff]
    """Differing tensors in layer order, then by name."""
    num_tensors: int
    """Distinct tensor names over both sides."""

    @property
    def identical(self) -> bool:
        return not self.differing_layers

    @property
    def first_differing_layer(self) -> str | None:
        return self.differing_layers[0] if self.differing_layers else None


def safetensors_files(path: str | Path) -> list[Path]:
    """The safetensors files that hold the model at `path`.

    `path` may be a `.safetensors` file, a checkpoint iteration dir (`iter_<N>/model.safetensors`),
    or an HF model dir (`model.safetensors`, or shards listed in `model.safetensors.index.json`).

    Raises:
        HashInputError: naming the path and what was expected there.
    """
    path = Path(path)
    if not path.exists():
        raise HashInputError(f"{path}: no such file or directory")
    if path.is_file():
        if path.suffix != ".safetensors":
            raise HashInputError(
                f"{path}: expected a .safetensors file, a checkpoint iter_<N> dir or an HF model dir"
            )
        return [path]
    if (path / "model.safetensors").is_file():
        return [path / "model.safetensors"]
    index = path / "model.safetensors.index.json"
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise HashInputError(f"{index}: unreadable safetensors index ({e})") from e
        files = [path / f for f in sorted(set(weight_map.values()))]
        missing = [str(f) for f in files if not f.is_file()]
        if missing:
            raise HashInputError(f"{index} lists shards that do not exist: {missing[:3]}")
        return files
    shards = sorted(path.glob("*.safetensors"))
    if shards:
        return shards
    iters = sorted(p.name for p in path.glob("iter_*") if p.is_dir())
    hint = f" (it holds checkpoints; pass one of them, e.g. {path / iters[-1]})" if iters else ""
    raise HashInputError(f"{path}: no model.safetensors or *.safetensors inside{hint}")


class _TensorSource:
    """Read-by-name access to the tensors of one or more safetensors files (streamed, not all in memory)."""

    def __init__(self, path: str | Path) -> None:
        from safetensors import safe_open

        self.path = Path(path)
        self._where: dict[str, Any] = {}  # tensor name → open safe_open handle
        for file in safetensors_files(path):
            try:
                handle = safe_open(str(file), framework="pt")
            except Exception as e:  # safetensors raises its own error types for corrupt headers
                raise HashInputError(f"{file}: not a readable safetensors file ({e})") from e
            for name in handle.keys():
                if name in self._where:
                    raise HashInputError(f"{self.path}: tensor {name!r} appears in more than one shard")
                self._where[name] = handle

    def names(self) -> set[str]:
        return set(self._where)

    def get(self, name: str) -> Tensor | None:
        handle = self._where.get(name)
        try:
            return None if handle is None else handle.get_tensor(name)
        except Exception as e:  # a truncated or corrupt data section
            raise HashInputError(f"{self.path}: cannot read tensor {name!r} ({e})") from e


def _max_abs_diff(a: Tensor, b: Tensor) -> float:
    return float((a.to(torch.float64) - b.to(torch.float64)).abs().max()) if a.numel() else 0.0


def diff_checkpoints(a: str | Path, b: str | Path) -> HashDiff:
    """Per-layer hashes of two checkpoints/models and every tensor that differs (`grpolab hash diff`).

    Both sides are read tensor by tensor in name order; the hashes equal `layer_hashes` of the same
    tensors, so they can be compared with `model_hash_rank0.json` of a one-rank run.

    Raises:
        HashInputError: a path is not a safetensors file, checkpoint iteration dir or HF model dir.
    """
    src_a, src_b = _TensorSource(a), _TensorSource(b)
    names = sorted(src_a.names() | src_b.names())
    hashers_a: dict[str, Any] = {}
    hashers_b: dict[str, Any] = {}
    diffs: list[TensorDiff] = []
    for name in names:
        layer = layer_bucket(name)
        ta, tb = src_a.get(name), src_b.get(name)
        if ta is not None:
            _feed(hashers_a.setdefault(layer, hashlib.sha256()), name, ta)
        if tb is not None:
            _feed(hashers_b.setdefault(layer, hashlib.sha256()), name, tb)
        if ta is None or tb is None or ta.shape != tb.shape or ta.dtype != tb.dtype:
            diffs.append(_tensor_diff(name, layer, ta, tb))
        elif not torch.equal(_as_bytes(ta), _as_bytes(tb)):
            diffs.append(_tensor_diff(name, layer, ta, tb))
    hashes_a = {k: hashers_a[k].hexdigest() for k in sorted(hashers_a, key=layer_order)}
    hashes_b = {k: hashers_b[k].hexdigest() for k in sorted(hashers_b, key=layer_order)}
    cmp = compare_hashes(hashes_a, hashes_b)
    differing = sorted(cmp.mismatched + cmp.missing + cmp.extra, key=layer_order)
    diffs.sort(key=lambda d: (layer_order(d.layer), d.name))
    return HashDiff(
        a=Path(a),
        b=Path(b),
        hashes_a=hashes_a,
        hashes_b=hashes_b,
        differing_layers=differing,
        tensors=diffs,
        num_tensors=len(names),
    )


def _as_bytes(t: Tensor) -> Tensor:
    return t.contiguous().reshape(-1).view(torch.uint8)


def _tensor_diff(name: str, layer: str, ta: Tensor | None, tb: Tensor | None) -> TensorDiff:
    comparable = ta is not None and tb is not None and ta.shape == tb.shape
    return TensorDiff(
        name=name,
        layer=layer,
        shape_a=None if ta is None else tuple(ta.shape),
        shape_b=None if tb is None else tuple(tb.shape),
        dtype_a=None if ta is None else str(ta.dtype),
        dtype_b=None if tb is None else str(tb.dtype),
        max_abs_diff=_max_abs_diff(ta, tb) if comparable else None,  # type: ignore[arg-type]
    )


# ---------------------------------------------------------------------------------------------
# `grpolab hash diff A B`


def format_diff(diff: HashDiff) -> Iterator[str]:
    """Readable report lines: verdict, first differing layer, and a table of differing tensors."""
    layers = sorted(set(diff.hashes_a) | set(diff.hashes_b), key=layer_order)
    yield f"A: {diff.a}"
    yield f"B: {diff.b}"
    if diff.identical:
        yield f"identical: {len(layers)} layers, {diff.num_tensors} tensors, same per-layer SHA-256"
        return
    yield f"{len(diff.differing_layers)} of {len(layers)} layers differ; first differing layer: {diff.first_differing_layer}"
    rows = [("layer", "tensor", "what", "shape A", "shape B", "max |A-B|")]
    for d in diff.tensors:
        mad = "-" if d.max_abs_diff is None else f"{d.max_abs_diff:.3e}"
        what = f"dtype ({d.dtype_a} vs {d.dtype_b})" if d.what == "dtype" else d.what
        rows.append((d.layer, d.name, what, str(d.shape_a or "-"), str(d.shape_b or "-"), mad))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for row in rows:
        yield "  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip()


def diff_to_json(diff: HashDiff) -> dict[str, Any]:
    """JSON-ready dict of a `HashDiff` (a NaN max abs diff becomes the string "nan")."""
    tensors = []
    for d in diff.tensors:
        row = {**asdict(d), "what": d.what}
        if d.max_abs_diff is not None and not math.isfinite(d.max_abs_diff):
            row["max_abs_diff"] = str(d.max_abs_diff)
        tensors.append(row)
    keys = ("hashes_a", "hashes_b", "differing_layers")
    return {
        "a": str(diff.a),
        "b": str(diff.b),
        "identical": diff.identical,
        "first_differing_layer": diff.first_differing_layer,
        **{k: getattr(diff, k) for k in keys},
        "tensors": tensors,
    }

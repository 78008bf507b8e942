"""`--save-model-hash-every-step`: each parameter's SHA-256 after every optimizer step, in the run directory.

File: `RUN_DIR/checks/model_hash_step_<N>.json` (N = `train/step`), written atomically by rank 0:
{"step": N, "rank": 0, "world_size": W, "parameters": {name: sha256 hex}} with the parameters in
layer order (Miles' `model_hash.layer_order`: the decoder layers by number, then embeddings, final
norm and head; by name within a layer). A parameter's digest covers its name, shape, dtype and raw
bytes (`model_hash._feed`, the bytes `layer_hashes` hashes per layer); on several ranks (FSDP) it is
rank 0's local shard. `grpolab diff` (diff/layers.py) reads these files through
`read_step_hashes` and names the first parameter whose digest differs.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable
from pathlib import Path

from torch import Tensor

from grpolab.checkers.model_hash import _feed, layer_bucket, layer_order
from grpolab.core.atomic import atomic_write_json

CHECKS_DIR = "checks"
STEP_FILE = "model_hash_step_{step}.json"
_STEP_RE = re.compile(r"model_hash_step_(\d+)\.json")


def parameter_order(name: str) -> tuple[int, int, str]:
    """Sort key of a parameter: its layer bucket's order (`model_hash.layer_order`), then its name."""
    return (*layer_order(layer_bucket(name)), name)


def parameter_hashes(named_params: Iterable[tuple[str, Tensor]]) -> dict[str, str]:
    """SHA-256 hex digest per parameter, keys in layer order.

    Args:
        named_params: (name, tensor) pairs of any dtype/device, e.g. `Actor.local_named_weights()`.

    Raises:
        ValueError: a name appears twice.
    """
    out: dict[str, str] = {}
    for name, tensor in named_params:
        if name in out:
            raise ValueError(f"parameter_hashes: duplicate parameter name {name}")
        hasher = hashlib.sha256()
        _feed(hasher, name, tensor)
        out[name] = hasher.hexdigest()
    return {k: out[k] for k in sorted(out, key=parameter_order)}


def step_hash_path(run_dir: str | Path, step: int) -> Path:
    """`RUN_DIR/checks/model_hash_step_<step>.json`."""
    return Path(run_dir) / CHECKS_DIR / STEP_FILE.format(step=step)


def save_step_hashes(
    run_dir: str | Path, step: int, named_params: Iterable[tuple[str, Tensor]], *, world_size: int = 1
) -> Path:
    """Hash every parameter and write the step's file atomically; returns its path.

    Raises:
        ValueError: `step` < 0 or a duplicate parameter name.
    """
    if step < 0:
        raise ValueError(f"--save-model-hash-every-step: step must be >= 0, got {step}")
    path = step_hash_path(run_dir, step)
    body = {"step": step, "rank": 0, "world_size": world_size, "parameters": parameter_hashes(named_params)}
    atomic_write_json(path, body)
    return path


def step_hash_files(run_dir: str | Path) -> dict[int, Path]:
    """step → file of the run's `checks/model_hash_step_<N>.json`, sorted by step ({} when none)."""
    folder = Path(run_dir) / CHECKS_DIR
    if not folder.is_dir():
        return {}
    found = {int(m.group(1)): f for f in folder.iterdir() if (m := _STEP_RE.fullmatch(f.name))}
    return dict(sorted(found.items()))


def read_step_hashes(path: str | Path) -> dict[str, str]:
    """The {parameter: digest} map of one step file.

    Raises:
        ValueError: the file is not JSON or has no "parameters" object of strings (the message names it).
        OSError: the file cannot be read.
    """
    try:
        body = json.loads(Path(path).read_text(encoding="utf-8"))
    except ValueError as e:
        raise ValueError(f"{path}: not valid JSON ({e})") from None
    params = body.get("parameters") if isinstance(body, dict) else None
    if not isinstance(params, dict) or not all(isinstance(v, str) for v in params.values()):
        raise ValueError(f"{path}: expected a 'parameters' object of hex digests")
    return params

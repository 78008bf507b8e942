"""Which config fields name files or folders, and those values resolved against a working folder.

run.json stores every flag as the user gave it, and `cwd` (the folder `grpolab train` started in),
so `grpolab diff` can tell `fixtures/tiny-qwen3` from `/repo/fixtures/tiny-qwen3` started in
`/repo`: the same folder, not a set-up difference. Pure: nothing here reads the filesystem.
"""

from __future__ import annotations

import copy
import os
from typing import Any

PATH_FIELDS: tuple[tuple[str, str], ...] = (
    ("model", "hf_checkpoint"),
    ("data", "prompt_data"),
    ("checkpoint", "save"),
    ("checkpoint", "load"),
    ("debug", "save_debug_rollout_data"),
    ("debug", "load_debug_rollout_data"),
    ("debug", "ci_inject_rollout_data_path"),
    ("debug", "save_debug_event_data"),
    ("ci", "ci_save_grad_norm"),
    ("ci", "ci_load_grad_norm"),
    ("monitoring", "wandb_dir"),
    ("monitoring", "tensorboard_dir"),
    ("profiling", "memory_snapshot_dir"),
    ("run", "run_dir"),
)
"""(section, field) of the `Config.to_dict()` values that name a file, folder or path template.
Module paths (`--custom-rm-path pkg.mod.fn`) are not file paths and are left out."""
EVAL_PATHS = ("eval", "eval_prompt_data")
"""`--eval-prompt-data NAME PATH [NAME PATH ...]`: the PATHs are the odd-numbered items."""


def _resolved(value: Any, cwd: str) -> Any:
    if not isinstance(value, str) or not value:
        return value
    return os.path.normpath(os.path.join(cwd, os.path.expanduser(value)))


def resolve_config_paths(config: dict[str, Any], cwd: str) -> dict[str, Any]:
    """A copy of a `Config.to_dict()`-shaped dict whose path values (PATH_FIELDS, EVAL_PATHS) are
    absolute, normalised paths joined onto `cwd` (an absolute folder); an absolute value stays as it
    is (normalised). Symlinks are not followed; sections or fields that are absent are skipped."""
    out = copy.deepcopy(config)
    for section, name in PATH_FIELDS:
        block = out.get(section)
        if isinstance(block, dict) and name in block:
            block[name] = _resolved(block[name], cwd)
    block = out.get(EVAL_PATHS[0])
    pairs = block.get(EVAL_PATHS[1]) if isinstance(block, dict) else None
    if isinstance(pairs, list):
        block[EVAL_PATHS[1]] = [_resolved(v, cwd) if i % 2 else v for i, v in enumerate(pairs)]
    return out


__all__ = ["EVAL_PATHS", "PATH_FIELDS", "resolve_config_paths"]

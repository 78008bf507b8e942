"""Rollout paths: how a rollout's samples are produced, behind one protocol and one registry.

Today's paths (rollout/paths.py, asked in this order): `replay` (recorded rollouts, no engine),
`inject` (generate, compare with a recording, train on it), `central` (a multi-rank fleet run: rank 0
generates for every rank) and `engine` (each rank generates its share; the default). The door:
`build_rollout_path` (the run's path from its `RolloutInputs`), the `RolloutPath` protocol,
`assign_advantages` (the same for every path), `load_reward`, and the run plan
(`planned_rollout_ids`, `planned_eval_ids`, `check_recordings`). A room above `core`, `rundir` and
`replay`; the run's orchestration (`train/`) composes it.
"""

import importlib
from typing import Any

_DOOR = {
    "RolloutInputs": "base", "RolloutPath": "base", "ROLLOUT_PATHS": "paths", "build_rollout_path": "paths",
    "chosen_path": "paths", "check_recordings": "plan", "planned_eval_ids": "plan", "planned_rollout_ids": "plan",
    "assign_advantages": "scoring", "load_reward": "scoring", "candidates_rollout_id": "dynamic_path",
}  # fmt: skip
"""Each public name and its module: imported on first use (PEP 562), so the command parsers that live in
this package (`agent_command.py`) load without torch."""


def __getattr__(name: str) -> Any:
    if name in _DOOR:
        return getattr(importlib.import_module(f"grpolab.rollout.{_DOOR[name]}"), name)
    raise AttributeError(f"module 'grpolab.rollout' has no attribute {name!r}")


__all__ = [
    "ROLLOUT_PATHS",
    "RolloutInputs",
    "RolloutPath",
    "assign_advantages",
    "build_rollout_path",
    "candidates_rollout_id",
    "check_recordings",
    "chosen_path",
    "load_reward",
    "planned_eval_ids",
    "planned_rollout_ids",
]

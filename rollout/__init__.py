"""Rollout paths: how a rollout's samples are produced, behind one protocol and one registry.

Today's paths (rollout/paths.py, asked in this order): `replay` (recorded rollouts, no engine),
`inject` (generate, compare with a recording, train on it), `central` (a multi-rank fleet run: rank 0
generates for every rank) and `engine` (each rank generates its share; the default). The door:
`build_rollout_path` (the run's path from its `RolloutInputs`), the `RolloutPath` protocol,
`assign_advantages` (the same for every path), `load_reward`, and the run plan
(`planned_rollout_ids`, `planned_eval_ids`, `check_recordings`). A room above `core`, `rundir` and
`replay`; the run's orchestration (`train/`) composes it.
"""

from grpolab.rollout.base import RolloutInputs, RolloutPath
from grpolab.rollout.paths import ROLLOUT_PATHS, build_rollout_path, chosen_path
from grpolab.rollout.plan import check_recordings, planned_eval_ids, planned_rollout_ids
from grpolab.rollout.scoring import assign_advantages, load_reward

__all__ = [
    "ROLLOUT_PATHS",
    "RolloutInputs",
    "RolloutPath",
    "assign_advantages",
    "build_rollout_path",
    "check_recordings",
    "chosen_path",
    "load_reward",
    "planned_eval_ids",
    "planned_rollout_ids",
]

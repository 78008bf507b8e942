"""The rollout paths by name, and the one a run takes.

`ROLLOUT_PATHS` holds each path's class (rollout/base.py: `RolloutPath`, plus a static
`chosen(config, world_size)`), in the order they are asked: the first whose `chosen` holds runs. A
path with `wraps_live = True` (inject) is built around the live path the run would otherwise take
(the first chosen path that wraps none). Adding a path is one module with its class plus one
`ROLLOUT_PATHS.register(...)` line here, in its place in the order.
"""

from __future__ import annotations

from grpolab.core.config import Config
from grpolab.core.registry import Registry
from grpolab.rollout.base import RolloutInputs, RolloutPath
from grpolab.rollout.central import CentralPath
from grpolab.rollout.dynamic_path import DynamicSamplingPath
from grpolab.rollout.engine_path import EnginePath
from grpolab.rollout.inject_path import InjectPath
from grpolab.rollout.replay_path import ReplayPath

ROLLOUT_PATHS: Registry[type] = Registry("rollout path")
"""The rollout paths, in the order `chosen_path` asks them."""
ROLLOUT_PATHS.register("replay")(ReplayPath)  # --load-debug-rollout-data
ROLLOUT_PATHS.register("inject")(InjectPath)  # --ci-inject-rollout-data-path, around a live path
ROLLOUT_PATHS.register("dynamic")(DynamicSamplingPath)  # --dynamic-sampling-filter-path (one rank)
ROLLOUT_PATHS.register("central")(CentralPath)  # rank 0 generates for every rank (a multi-rank fleet)
ROLLOUT_PATHS.register("engine")(EnginePath)  # each rank generates its share (the default)


def chosen_path(config: Config, world_size: int, *, live_only: bool = False) -> str:
    """The name of the path a run of `world_size` ranks with `config` takes (with `live_only`, among
    the paths that wrap none)."""
    for name, cls in ROLLOUT_PATHS.items():
        if live_only and getattr(cls, "wraps_live", False):
            continue
        if cls.chosen(config, world_size):
            return name
    raise AssertionError("the engine path is always chosen")


def build_rollout_path(inputs: RolloutInputs) -> RolloutPath:
    """The rollout path the run's config chooses, built from `inputs`.

    Raises:
        ValueError / FileNotFoundError: from the path's constructor (a recording template, a reward).
    """
    world = inputs.dist.world_size
    cls = ROLLOUT_PATHS.get(chosen_path(inputs.config, world))
    if getattr(cls, "wraps_live", False):
        live = ROLLOUT_PATHS.get(chosen_path(inputs.config, world, live_only=True))
        return cls(inputs, live=live(inputs))
    return cls(inputs)

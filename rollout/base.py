"""The rollout path protocol: how one rollout's samples are produced, whichever way that is.

A rollout path turns a rollout id into this rank's scored samples in two phases the loop calls in
order (the engine's memory goes back to the trainer between them, `train/colocation.py`):

- `rollout(rollout_id)`: this rank's contiguous share of the rollout's samples (`Sample`, with the
  response ids, engine log-probs and weight version; rewards not yet filled for live samples);
- `rewards(rollout_id, samples)`: fill the rewards and return the samples to train on (a path may
  hand back other samples than it generated: inject trains on the recording).

Before the first rollout, `check_ready(rollout_ids)` checks whatever the path reads (recordings), so a
missing file fails the run in a second, not after minutes of work. `generates` says whether the
samples come from this run's engine, so the checks on freshly generated samples (the weight-version
check, checkers/weight_version.py) run on them. GRPO advantages come after, from the rewards, the same
way for every path (`scoring.assign_advantages`).

A path may also define `extra_metrics(rollout_id) -> dict[str, float]` (keys added to the rollout's
`rollout N:` line) and a `data_position` attribute (the prompt stream's next position, saved in
checkpoints and restored on resume): the dynamic sampling path does (dynamic_path.py).

The paths are registered by name in `paths.py` (`ROLLOUT_PATHS`); the first whose `chosen(config,
world_size)` holds runs. A new path is one module with a class of this shape plus one registry line.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

if TYPE_CHECKING:
    from grpolab.core.batch import Sample
    from grpolab.core.config import Config
    from grpolab.core.data import PromptDataset
    from grpolab.core.dist import DistContext
    from grpolab.core.engine.base import RolloutEngine, SamplingParams
    from grpolab.core.metrics import PhaseTimer
    from grpolab.core.turns.tools import ToolSet
    from grpolab.replay.replayer import RunIdentity
    from grpolab.rollout.custom_generate import CustomGeneration
    from grpolab.rundir.writer import RunDirectory


@dataclass(kw_only=True)
class RolloutInputs:
    """What every rollout path is built from (`train/startup.py` builds it once per run).

    `engine` is None where this rank builds none (`--debug-train-only`, or a rank > 0 of a run whose
    rank 0 generates for everyone: central.py). `custom_reward` is the loaded `--custom-rm-path`
    function, or None for `--rm-type`.
    """

    config: Config
    engine: RolloutEngine | None
    dataset: PromptDataset
    sampling: SamplingParams
    identity: RunIdentity
    run_dir: RunDirectory
    timer: PhaseTimer
    dist: DistContext
    custom_reward: Any | None
    tools: ToolSet | None = None
    custom: CustomGeneration | None = None


class RolloutPath(Protocol):
    """One way to produce a rollout's samples (see the module docstring)."""

    name: ClassVar[str]
    """The path's registry name (`paths.ROLLOUT_PATHS`), as the run's start line names it."""
    generates: ClassVar[bool]
    """Whether `rollout` returns samples this run's engine generated (checked as fresh samples)."""

    def check_ready(self, rollout_ids: list[int]) -> None:
        """Before the first rollout: what the rollouts `rollout_ids` will read is there and usable.

        Raises:
            FileNotFoundError / ValueError: naming the flag and the file.
        """
        ...

    def rollout(self, rollout_id: int) -> list[Sample]:
        """This rank's samples of rollout `rollout_id` (a contiguous share of the whole rollout)."""
        ...

    def rewards(self, rollout_id: int, samples: list[Sample]) -> list[Sample]:
        """Fill the rewards of `samples` (in place) and return the samples to train on."""
        ...


def rank_share(samples: list[Sample], dist: DistContext) -> list[Sample]:
    """This rank's contiguous share of a whole rollout (whole groups when groups divide evenly): ranks
    split a recorded or broadcast rollout exactly as they split the prompts of a generated one."""
    share = len(samples) // dist.world_size
    return samples[dist.rank * share : (dist.rank + 1) * share]


def newest_weight_version(samples: list[Sample]) -> int:
    """The newest engine weight version among `samples` (0 for none)."""
    return max((s.weight_version for s in samples), default=0)

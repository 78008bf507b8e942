"""On-policy weight-version check: every generated sample comes from the weights of the last sync.

The loop syncs the trainer's weights into the engine once per rollout (and once before the first),
each time as a new version that the engine must echo (core/weight_sync.py), and every generated
sample records the version the engine held when it generated it (`GenerationResult.weight_version`).
In an on-policy run the two are equal for every sample of every rollout. A sample with another
version was generated with other weights than the trainer believes (a weight update that never
reached the engine, an engine restarted from the checkpoint on disk, a router that sent the update to
another engine): its log-probs and rewards then train the policy on someone else's data.

The check is pure: `find_stale` lists the offending samples of a rank, `check_weight_versions` fails
with the first of them (rollout, prompt index, sample index, both versions). It runs on generated
samples only, from the first acknowledged sync on: no sync (`--debug-rollout-only`,
`--debug-skip-weight-update`) or replayed samples (`--load-debug-rollout-data`) leave nothing to
compare with.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from grpolab.checkers.errors import CheckFailure
from grpolab.core.batch import Sample


@dataclass(frozen=True, kw_only=True)
class StaleSample:
    """A generated sample whose weight version is not the acknowledged one (picklable: ranks gather it)."""

    index: int
    """Position in the rollout."""
    prompt_index: int
    """Row of the prompt file."""
    sample_index: int
    """Answer number within its group."""
    weight_version: int
    """The version the engine reported for this sample."""


def find_stale(samples: Sequence[Sample], acknowledged: int) -> list[StaleSample]:
    """The samples whose `weight_version` differs from `acknowledged`, in order.

    Args:
        samples: this rank's generated samples of one rollout.
        acknowledged: the version the engine echoed at the last weight sync.
    """
    return [
        StaleSample(
            index=s.index,
            prompt_index=s.prompt_index,
            sample_index=s.sample_index,
            weight_version=s.weight_version,
        )
        for s in samples
        if s.weight_version != acknowledged
    ]


def check_weight_versions(
    stale: Sequence[StaleSample], *, rollout_id: int, acknowledged: int, total: int
) -> None:
    """Fail when any sample of rollout `rollout_id` was generated with another weight version.

    Args:
        stale: every rank's `find_stale` result for the rollout.
        rollout_id: the rollout the samples belong to.
        acknowledged: the version the engine echoed at the last weight sync.
        total: how many samples the rollout generated (for the message).

    Raises:
        CheckFailure("weight_version"): naming the first stale sample (rollout, prompt index, sample
            index, its version and the acknowledged one), how many are stale and the likely causes.
    """
    if not stale:
        return
    first = stale[0]
    versions = sorted({s.weight_version for s in stale})
    raise CheckFailure(
        "weight_version",
        f"rollout {rollout_id}: {len(stale)} of {total} samples were generated with weight version(s) "
        f"{versions}, not version {acknowledged}, which the engine acknowledged at the last weight sync; "
        f"first: rollout {rollout_id}, prompt index {first.prompt_index}, sample index {first.sample_index} "
        f"(rollout position {first.index}) has weight_version {first.weight_version} != {acknowledged}. "
        "The engine generated with other weights than the trainer sent: a weight update that did not reach "
        "it, an engine restarted from the checkpoint on disk, or an update sent to another engine. The run "
        "is no longer on-policy, so it stops here.",
    )

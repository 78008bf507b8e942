"""Groups that cannot have an advantage: samples that share a seed, answers that are all the same.

GRPO's advantage is a sample's reward against its group's; when the samples of a group are sampled
with one seed they are one answer repeated, every reward equal and every advantage 0, and the run
trains on nothing while looking healthy (UniRL PR #208 gave every sample of a group the same seed).
Every rollout is checked, in every run:

- `shared_seed`: two samples of a group carry the same sampling seed. A definite bug: a warning, and
  under `--ci-test` the run fails naming the group and the samples.
- `identical_responses`: every answer of a group (2 or more samples) is the same token list. A
  confident policy does this for easy prompts, so one such group is a note only; under
  `--ci-test` the run fails when *every* group of the rollout is so (the symptom of shared seeds
  or a sampler that ignores its seed, with all advantages 0).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from grpolab.checkers.errors import CheckFailure
from grpolab.core.batch import Sample

CHECKER = "group_seeds"


@dataclass(frozen=True)
class SeedFinding:
    """One group's problem: `code` is "shared_seed" or "identical_responses"; `samples` the indices."""

    code: str
    group: int
    samples: tuple[int, ...]
    message: str


def group_findings(samples: list[Sample]) -> list[SeedFinding]:
    """Findings of one rollout's samples, in group order (see the module docstring)."""
    groups: dict[int, list[Sample]] = defaultdict(list)
    for s in samples:
        groups[s.group_index].append(s)
    out = []
    for g, members in groups.items():
        by_seed: dict[int, list[int]] = defaultdict(list)
        for s in members:
            by_seed[s.seed].append(s.index)
        for seed, indices in by_seed.items():
            if len(indices) > 1:
                out.append(SeedFinding("shared_seed", g, tuple(indices),
                                       f"group {g}: samples {indices} share sampling seed {seed}"))  # fmt: skip
        if len(members) > 1 and len({tuple(s.response_ids) for s in members}) == 1:
            out.append(SeedFinding("identical_responses", g, tuple(s.index for s in members),
                                   f"group {g}: all {len(members)} answers are the same "
                                   f"{len(members[0].response_ids)} tokens"))  # fmt: skip
    return out


def check_groups(rollout_id: int, samples: list[Sample], findings: list[SeedFinding]) -> None:
    """The `--ci-test` verdict on `findings` (see the module docstring).

    Raises:
        CheckFailure: a shared seed, or every group of the rollout with identical answers.
    """
    shared = [f for f in findings if f.code == "shared_seed"]
    if shared:
        raise CheckFailure(
            CHECKER,
            f"rollout {rollout_id}: {shared[0].message} ({len(shared)} group(s) with a shared seed): their "
            "answers are one answer repeated, so their advantages are 0. Each sample needs its own seed "
            "(grpolab derives one per (run seed, rollout, prompt, sample): core/seeding.py); a custom "
            "generate function or engine that reuses the request's seed gives this",
        )
    groups = {s.group_index for s in samples}
    same = {f.group for f in findings if f.code == "identical_responses"}
    if groups and same == groups:  # a group is only found identical when it has 2 or more samples
        raise CheckFailure(
            CHECKER,
            f"rollout {rollout_id}: in every one of its {len(groups)} groups all answers are identical, so "
            "every advantage is 0: the sampler ignores its seeds or the temperature (or every prompt is "
            "one the policy answers with certainty)",
        )

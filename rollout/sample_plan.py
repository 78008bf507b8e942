"""Which samples a share of a rollout holds: each prompt's `--n-samples-per-prompt` answers, numbered and
seeded the same way whichever way they are generated (single-turn, the tool loop, a custom generate
function, an agent), so a sample's seed and indices never depend on the path (core/seeding.py)."""

from __future__ import annotations

from dataclasses import dataclass

from grpolab.core.config import Config
from grpolab.core.data import Prompt, PromptDataset
from grpolab.core.seeding import derive_sample_seed


@dataclass(frozen=True)
class PlannedSample:
    """One answer to generate: `index` in the rollout, `group` (the prompt's number in the rollout),
    `k` (the answer's number in its group), the prompt and the sampling seed."""

    index: int
    group: int
    k: int
    prompt: Prompt
    seed: int


def plan_samples(
    config: Config, dataset: PromptDataset, *, rollout_id: int, indices: list[int], first: int
) -> list[PlannedSample]:
    """The samples for the prompts at `indices` (rows of `dataset`), the first being prompt `first` of
    the rollout, in prompt order."""
    n, seed = config.rollout.n_samples_per_prompt, config.run.seed
    out = []
    for g, i in enumerate(indices):
        p = dataset[i]
        for k in range(n):
            out.append(
                PlannedSample(
                    (first + g) * n + k, first + g, k, p, derive_sample_seed(seed, rollout_id, p.index, k)
                )
            )
    return out

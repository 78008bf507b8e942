"""Live samples from the run's engine: the prompts of a rollout, their answers, their rewards.

`rollout_indices` picks the rollout's `--rollout-batch-size` prompts (seeded order, core/data.py);
`generate` asks the engine for `--n-samples-per-prompt` answers to each, every answer with its own
seed (core/seeding.py: the same sample gets the same seed whichever rank or path generates it), and
builds the samples with their indices, groups, engine log-probs (float32 [T]), kept-token sets and
weight versions. `LivePath` is what the live paths (engine_path.py, central.py) share; inject wraps one.
"""

from __future__ import annotations

import torch

from grpolab.core.batch import Sample
from grpolab.core.config import Config
from grpolab.core.data import PromptDataset, rollout_prompt_indices
from grpolab.core.engine.base import GenerationRequest, RolloutEngine, SamplingParams, generate_within
from grpolab.core.turns.tools import ToolSet
from grpolab.rollout.base import RolloutInputs
from grpolab.rollout.custom_generate import CustomGeneration
from grpolab.rollout.multi_turn import generate_episodes
from grpolab.rollout.sample_plan import plan_samples
from grpolab.rollout.scoring import score


def rollout_indices(config: Config, dataset: PromptDataset, rollout_id: int) -> list[int]:
    """The rows of `dataset` that rollout `rollout_id` prompts with, in the rollout's order."""
    return rollout_prompt_indices(
        num_rows=len(dataset),
        rollout_id=rollout_id,
        rollout_batch_size=config.rollout.rollout_batch_size,
        seed=config.run.seed,
        shuffle=config.data.rollout_shuffle,
    )


def generate(
    config: Config,
    engine: RolloutEngine,
    dataset: PromptDataset,
    sampling: SamplingParams,
    *,
    rollout_id: int,
    indices: list[int],
    first: int,
    tools: ToolSet | None = None,
    custom: CustomGeneration | None = None,
) -> list[Sample]:
    """Answers for the prompts at `indices` (rows of `dataset`), the first being prompt `first` of the
    rollout (sample and group indices count from there): `--n-samples-per-prompt` samples per prompt,
    in prompt order.

    With `tools` (`--generate-execute-tool-function-path`) each answer is a multi-turn episode
    (rollout/multi_turn.py); with `custom`, the user's generate or agent function makes it
    (rollout/custom_generate.py); numbered the same way.

    Raises:
        RuntimeError: the engine failed or died (core/engine/client.py, after `--engine-failure-timeout`).
    """
    if custom is not None:
        return custom.generate(engine, dataset, sampling, rollout_id=rollout_id, indices=indices, first=first)
    if tools is not None:
        return generate_episodes(
            config, engine, dataset, sampling, tools, rollout_id=rollout_id, indices=indices, first=first
        )
    plan = plan_samples(config, dataset, rollout_id=rollout_id, indices=indices, first=first)
    requests = [GenerationRequest(prompt_ids=s.prompt.prompt_ids, seed=s.seed) for s in plan]
    context = config.agent.rollout_max_context_len
    if context is None:
        results = engine.generate(requests, sampling)
    else:  # each answer at most --rollout-max-context-len less its prompt (train/startup.py checked room)
        room = [min(sampling.max_new_tokens, context - len(r.prompt_ids)) for r in requests]
        results = generate_within(engine, requests, sampling, room)
    decode = dataset.tokenizer.decode
    return [
        Sample(
            index=s.index,
            prompt_index=s.prompt.index,
            group_index=s.group,
            sample_index=s.k,
            seed=s.seed,
            prompt_ids=list(s.prompt.prompt_ids),
            response_ids=list(res.response_ids),
            rollout_log_probs=res.log_probs.float().cpu(),
            loss_mask=torch.ones(len(res.response_ids), dtype=torch.float32),
            finish_reason=res.finish_reason,
            prompt_text=s.prompt.text,
            response_text=decode(res.response_ids, skip_special_tokens=True),
            label=s.prompt.label,
            kept_token_ids=res.kept_token_ids,
            weight_version=res.weight_version,
        )
        for s, res in zip(plan, results)
    ]


class LivePath:
    """The part every live path shares: built from the run's inputs, nothing to check before the first
    rollout, and rewards scored by the run's reward (`perf/reward_time`). Subclasses say how the
    rollout's prompts are generated across ranks (`rollout`)."""

    generates = True

    def __init__(self, inputs: RolloutInputs) -> None:
        self.inputs = inputs
        self.config = inputs.config

    def check_ready(self, rollout_ids: list[int]) -> None:
        """Nothing to read before a live rollout."""

    def rewards(self, rollout_id: int, samples: list[Sample]) -> list[Sample]:
        """Score `samples` in place (`perf/reward_time`) and return them."""
        with self.inputs.timer("reward"):
            score(self.config, samples, self.inputs.custom_reward)
        return samples

"""Rewards and GRPO advantages of a rollout's samples, the same for every rollout path.

`score` fills each sample's reward with `--rm-type`'s built-in reward or the `--custom-rm-path`
function (core/rewards.py: sync or async, `--group-rm` for whole groups, `--reward-key` for dict
rewards); `assign_advantages` fills each sample's advantage from the rewards of its group with the
`--advantage-estimator` (core/algorithms.py; recomputed on replay and inject too, as Miles does).
"""

from __future__ import annotations

from typing import Any

import torch

from grpolab.core import algorithms, rewards
from grpolab.core.batch import Sample
from grpolab.core.config import Config
from grpolab.core.turns.episode import agent_reward


def load_reward(config: Config) -> Any | None:
    """The run's `--custom-rm-path` function (None for `--rm-type`); an unknown `--rm-type` fails here,
    before any work.

    Raises:
        ValueError: the function does not import or is not callable, or `--rm-type` is not registered.
    """
    reward = config.reward
    if reward.custom_rm_path:
        return rewards.load_custom_reward(reward.custom_rm_path, reward.call_timeout)
    rewards.get_reward_fn(reward.rm_type)
    return None


def score(config: Config, samples: list[Sample], custom_reward: Any | None) -> None:
    """Fill `reward` of `samples` in place (`--rm-type` or the `--custom-rm-path` function `custom_reward`;
    the samples of an agent workflow keep the reward it returned, core/turns/episode.py `agent_reward`).

    Raises:
        RuntimeError: the reward function raised, returned a non-finite or non-number value, or ran
            past `--reward-timeout` (core/rewards.py names the function and the sample).
    """
    agents = [agent_reward(s.metadata) for s in samples]
    if all(r is not None for r in agents):  # --custom-agent-function-path: the workflow scored its episodes
        for s, r in zip(samples, agents):
            s.reward = float(r)  # type: ignore[arg-type]
        return
    records = [
        {
            "prompt": s.prompt_text,
            "response": s.response_text,
            "label": s.label,
            "index": s.index,
            "group_index": s.group_index,
            "metadata": s.metadata,
        }
        for s in samples
    ]
    values = rewards.score_samples(
        records,
        rm_type=config.reward.rm_type,
        custom_fn=custom_reward,
        group_rm=config.reward.group_rm,
        group_size=config.rollout.n_samples_per_prompt,
        reward_key=config.reward.reward_key,
    )
    for s, r in zip(samples, values):
        s.reward = float(r)


def assign_advantages(config: Config, samples: list[Sample]) -> None:
    """Fill `advantage` of `samples` in place: the `--advantage-estimator` over the float64 [B] rewards
    and the [B] group ids (GRPO: group-normalized, `--disable-grpo-std-normalization` drops the std)."""
    algo = config.algorithm
    rewards_B = torch.tensor([s.reward for s in samples], dtype=torch.float64)
    group_ids_B = torch.tensor([s.group_index for s in samples])
    estimator = algorithms.get_advantage_estimator(algo.advantage_estimator)
    advantages_B = estimator(rewards_B, group_ids_B, std_normalize=not algo.disable_grpo_std_normalization)
    for s, a in zip(samples, advantages_B.tolist()):
        s.advantage = float(a)

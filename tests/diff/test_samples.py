"""diff/samples.py on hand-made samples: which field differs first, the tolerance, the text window."""

from __future__ import annotations

import dataclasses

import torch

from grpolab.core.batch import Sample
from grpolab.diff.samples import ids_as_text, sample_divergence


def _sample(
    response: list[int], logps: list[float], *, prompt: list[int] | None = None, reward: float = 0.0
) -> Sample:
    n = len(response)
    return Sample(
        index=0,
        prompt_index=41,
        group_index=0,
        sample_index=0,
        seed=1,
        prompt_ids=prompt or [5, 6],
        response_ids=response,
        rollout_log_probs=torch.tensor(logps),
        loss_mask=torch.ones(n),
        finish_reason="stop",
        reward=reward,
    )


def test_logprob_beyond_tol_names_the_token() -> None:
    a = _sample(list(range(12)), [-0.5] * 12)
    b = _sample(list(range(12)), [-0.5] * 10 + [-0.25, -0.5])
    d = sample_divergence(3, [a], [b], tol=0.0, decode=ids_as_text)
    assert d is not None and (d.rollout_id, d.prompt_index, d.token_index, d.field) == (3, 41, 10, "logprobs")
    assert (d.token_a, d.token_b, d.logprob_a, d.logprob_b) == (10, 10, -0.5, -0.25)
    assert d.text_a == "[2, 3, 4, 5, 6, 7, 8, 9]«[10]»[11]"  # 8 tokens before, 4 after (here 1)
    assert sample_divergence(3, [a], [b], tol=0.25, decode=ids_as_text) is None


def test_tokens_prompt_reward_and_count() -> None:
    a = _sample([1, 2, 3], [-1.0] * 3)
    shorter = _sample([1, 2], [-1.0] * 2)
    d = sample_divergence(0, [a], [shorter], tol=0.0, decode=ids_as_text)
    assert d is not None and (d.token_index, d.token_a, d.token_b, d.field) == (2, 3, None, "tokens")
    assert d.text_b == "[1, 2]«(end)»[]"
    other_prompt = dataclasses.replace(a, prompt_ids=[7])
    d = sample_divergence(0, [a], [other_prompt], tol=0.0, decode=ids_as_text)
    assert d is not None and (d.field, d.token_index, d.text_b) == ("prompt", None, "[7]")
    d = sample_divergence(0, [a], [dataclasses.replace(a, reward=1.0)], tol=0.0, decode=ids_as_text)
    assert d is not None and (d.field, d.text_a, d.text_b) == ("reward", "reward 0.0", "reward 1.0")
    second = dataclasses.replace(a, index=1, sample_index=1)
    d = sample_divergence(0, [a, second], [a], tol=0.0, decode=ids_as_text)
    assert d is not None and (d.field, d.text_a, d.text_b) == ("count", "2 samples", "1 samples")
    assert (d.prompt_index, d.sample_index) == (41, 1)  # the first sample run B lacks

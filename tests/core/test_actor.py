"""Trainer-side log-probs and training on the tiny fixture model."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from engine_samples import engine_samples

from grpolab.core.actor import Actor
from grpolab.core.batch import Sample
from grpolab.core.config import AlgorithmConfig, OptimizerConfig
from grpolab.core.engine.base import SamplingParams


def make_actor(
    model_dir: Path,
    *,
    mbs: int = 4,
    gbs: int = 8,
    padding_side: str = "right",
    temperature: float = 1.0,
    train_forward: str = "auto",
    **algo,
) -> Actor:
    torch.manual_seed(0)
    return Actor(
        str(model_dir),
        dtype=torch.float32,
        device="cpu",
        optimizer=OptimizerConfig(micro_batch_size=mbs, global_batch_size=gbs, lr=1e-3),
        algorithm=AlgorithmConfig(**algo),
        temperature=temperature,
        padding_side=padding_side,
        train_forward=train_forward,
    )


def generate(model_dir: Path, n: int = 8, *, temperature: float = 1.0, top_k: int = 0) -> list[Sample]:
    """n samples of two questions, alternating (seeds 100, 101, ...)."""
    questions = [
        "Tom has 3 apples and buys 5 more. How many apples does Tom have now?",
        "A shop had 9 pens. It sold 4 of them. How many pens are left?",
    ]
    params = SamplingParams(temperature=temperature, top_k=top_k, max_new_tokens=16)
    return engine_samples(
        model_dir, questions, [i % 2 for i in range(n)], [100 + i for i in range(n)], params
    )


@pytest.fixture(scope="module")
def samples(tiny_model_dir: Path) -> list[Sample]:
    return generate(tiny_model_dir)


def test_left_and_right_padding_give_the_same_log_probs(tiny_model_dir: Path, samples: list[Sample]) -> None:
    right = make_actor(tiny_model_dir, padding_side="right").compute_log_probs(samples).log_probs
    left = make_actor(tiny_model_dir, padding_side="left").compute_log_probs(samples).log_probs
    assert len({len(s.response_ids) + len(s.prompt_ids) for s in samples}) > 1  # padding actually happens
    for a, b in zip(right, left):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-5)


def test_trainer_matches_engine_log_probs(tiny_model_dir: Path) -> None:
    for temperature in (1.0, 0.7):
        batch = generate(tiny_model_dir, 4, temperature=temperature)
        trainer = make_actor(tiny_model_dir, temperature=temperature).compute_log_probs(batch).log_probs
        for s, lp in zip(batch, trainer):
            torch.testing.assert_close(lp, s.rollout_log_probs, rtol=0, atol=1e-4)


def test_kept_token_sets_are_scored_over_the_same_support(tiny_model_dir: Path) -> None:
    batch = generate(tiny_model_dir, 4, top_k=3)
    actor = make_actor(tiny_model_dir)
    with_mask = actor.compute_log_probs(batch).log_probs
    for s, lp in zip(batch, with_mask):
        torch.testing.assert_close(lp, s.rollout_log_probs, rtol=0, atol=1e-4)
    for s in batch:
        s.kept_token_ids = None  # full-vocabulary scoring: log-probs drop by log of the kept mass
    without = actor.compute_log_probs(batch).log_probs
    assert all(bool((w <= m + 1e-6).all()) for w, m in zip(without, with_mask))
    assert sum(float((m - w).sum()) for w, m in zip(without, with_mask)) > 1e-3


@pytest.mark.parametrize("train_forward", ["padded", "shared-prefix"])
def test_first_step_is_on_policy_and_micro_batch_size_does_not_matter(
    tiny_model_dir: Path, samples: list[Sample], train_forward: str
) -> None:
    results = {}
    for mbs in (1, 3, 8):
        actor = make_actor(
            tiny_model_dir, mbs=mbs, gbs=8, calculate_per_token_loss=mbs == 3, train_forward=train_forward
        )
        old = actor.compute_log_probs(samples).log_probs
        metrics = actor.train(samples, old, None, step_offset=0)
        assert metrics[0]["train/ppo_kl"] == 0.0 and metrics[0]["train/pg_clipfrac"] == 0.0
        results[mbs] = (metrics[0], [p.detach().clone() for p in actor.model.parameters()])
    # sample-mean runs with micro-batch 1 and 8 optimise the same objective
    assert results[1][0]["train/grad_norm"] == pytest.approx(results[8][0]["train/grad_norm"], rel=1e-5)
    assert results[1][0]["train/pg_loss"] == pytest.approx(results[8][0]["train/pg_loss"], rel=1e-5, abs=1e-7)
    if train_forward == "shared-prefix":
        # micro-batch 1 has nothing to pack and 8 packs, so the gradients differ by rounding (within
        # 1e-5, tests/core/test_shared_prefix.py); AdamW's first step, lr * g / (|g| + eps), turns that
        # into up to ~1.5e-5 on components whose gradient is near eps: the weights are compared padded
        return
    for a, b in zip(results[1][1], results[8][1]):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-5)  # Adam steps are ~lr=1e-3


def test_training_moves_the_policy_and_not_the_reference(tiny_model_dir: Path, samples: list[Sample]) -> None:
    actor = make_actor(tiny_model_dir, gbs=4)
    old = actor.compute_log_probs(samples).log_probs
    before_ref = actor.compute_log_probs(samples, reference=True).log_probs
    steps = actor.train(samples, old, None, step_offset=10)
    assert [m["train/step"] for m in steps] == [10.0, 11.0]
    assert steps[1]["train/ppo_kl"] != 0.0  # the second window sees the first window's update
    after = actor.compute_log_probs(samples).log_probs
    after_ref = actor.compute_log_probs(samples, reference=True).log_probs
    assert any(not torch.equal(a, b) for a, b in zip(after, old))
    assert all(torch.equal(a, b) for a, b in zip(after_ref, before_ref))

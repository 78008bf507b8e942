"""Which log-prob forwards a step runs (core/train_phase.py): the reference forward only when read."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from runs import metrics, train_short

from grpolab.core.actor import Actor
from grpolab.core.config import AlgorithmConfig, CIConfig, Config, OptimizerConfig
from grpolab.core.train_phase import reference_needed


def _values(run_dir: Path) -> list[tuple[str, dict[str, float]]]:
    """(kind, metrics without perf/* and without the reference's keys) of every rollout and step record."""
    out = []
    for kind in ("rollout", "step"):
        for m in metrics(run_dir, kind):
            out.append(
                (kind, {k: v for k, v in m.items() if "ref_log_probs" not in k and k != "train/kl_loss"})
            )
    return out


def test_reference_needed_only_with_a_reader() -> None:
    assert not reference_needed(Config())
    assert reference_needed(Config(algorithm=AlgorithmConfig(use_kl_loss=True)))  # also with coef 0
    assert reference_needed(Config(ci=CIConfig(ci_test=True)))  # the rollout-0 log-prob check
    assert not reference_needed(Config(ci=CIConfig(ci_test=True, ci_disable_logprobs_checker=True)))


def test_actor_without_reference_builds_none_and_refuses(tiny_model_dir: Path) -> None:
    actor = Actor(
        str(tiny_model_dir),
        dtype=torch.float32,
        device="cpu",
        optimizer=OptimizerConfig(global_batch_size=4),
        algorithm=AlgorithmConfig(),
        temperature=1.0,
        with_reference=False,
    )
    assert actor.ref_model is None
    actor.offload()
    actor.onload()  # moving a run without a reference works
    with pytest.raises(RuntimeError, match="without a reference model"):
        actor.compute_log_probs([], reference=True)


def test_skipping_the_reference_changes_no_other_metric(tmp_path: Path) -> None:
    """The default run skips the reference; `--use-kl-loss --kl-loss-coef 0` computes it and adds
    nothing to the gradient, so every other rollout and step metric must be the same float."""
    skipped = train_short(tmp_path / "skipped")
    kept = train_short(tmp_path / "kept", "--use-kl-loss", "--kl-loss-coef", "0")
    for m in metrics(skipped, "rollout"):
        assert "rollout/ref_log_probs" not in m
    for m in metrics(skipped, "perf"):
        assert "perf/ref_log_probs_time" not in m
    rollout0 = metrics(kept, "rollout")[0]
    assert rollout0["rollout/log_probs"] == rollout0["rollout/ref_log_probs"]  # policy == reference at 0
    assert all("perf/ref_log_probs_time" in m for m in metrics(kept, "perf"))
    assert metrics(kept, "step")[0]["train/kl_loss"] == 0.0
    assert _values(skipped) == _values(kept)
    assert len(_values(skipped)) == 4  # 2 rollouts, one step each

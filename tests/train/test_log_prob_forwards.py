"""Which log-prob forwards a step runs (train/train_phase.py): the reference forward only when read,
the old log-probs from the training forward when they are the same numbers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from runs import events, metrics, train_short

from grpolab.core.actor import Actor, LogProbs
from grpolab.core.batch import Sample
from grpolab.core.config import AlgorithmConfig, CIConfig, Config, OptimizerConfig, ProfilingConfig
from grpolab.train import train_phase
from grpolab.train.train_phase import reference_needed, same_log_probs, separate_forward_reason


def _values(run_dir: Path) -> list[tuple[str, dict[str, float]]]:
    """(kind, metrics without perf/* and without the reference's keys) of every rollout and step record."""
    out = []
    for kind in ("rollout", "step"):
        for m in metrics(run_dir, kind):
            out.append(
                (kind, {k: v for k, v in m.items() if "ref_log_probs" not in k and k != "train/kl_loss"})
            )
    return out


def _actor(
    model_dir: Path,
    optimizer: OptimizerConfig,
    algorithm: AlgorithmConfig | None = None,
    *,
    temperature: float = 1.0,
) -> Actor:
    """A float32 CPU actor of the tiny model without a reference copy."""
    return Actor(
        str(model_dir),
        dtype=torch.float32,
        device="cpu",
        optimizer=optimizer,
        algorithm=algorithm or AlgorithmConfig(),
        temperature=temperature,
        with_reference=False,
    )


def test_reference_needed_only_with_a_reader() -> None:
    assert not reference_needed(Config())
    assert reference_needed(Config(algorithm=AlgorithmConfig(use_kl_loss=True)))  # also with coef 0
    assert reference_needed(Config(ci=CIConfig(ci_test=True)))  # the rollout-0 log-prob check
    assert not reference_needed(Config(ci=CIConfig(ci_test=True, ci_disable_logprobs_checker=True)))


def test_actor_without_reference_builds_none_and_refuses(tiny_model_dir: Path) -> None:
    actor = _actor(tiny_model_dir, OptimizerConfig(global_batch_size=4))
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


def _samples(n: int, vocab: int) -> list[Sample]:
    """`n` samples of varied prompt and response lengths (random tokens; values need not be plausible)."""
    gen = torch.Generator().manual_seed(7)
    out = []
    for i in range(n):
        prompt = torch.randint(0, vocab, (5 + i % 3,), generator=gen).tolist()
        response = torch.randint(0, vocab, (4 + (2 * i) % 5,), generator=gen).tolist()
        out.append(
            Sample(
                index=i,
                prompt_index=i // 2,
                group_index=i // 2,
                sample_index=i % 2,
                seed=i,
                prompt_ids=prompt,
                response_ids=response,
                rollout_log_probs=torch.full((len(response),), -2.0),
                loss_mask=torch.ones(len(response)),
                finish_reason="length",
                advantage=1.0 if i % 3 else -1.0,
            )
        )
    return out


@pytest.mark.parametrize("mbs", [1, 3, 6])
def test_training_forward_log_probs_equal_the_separate_forward(tiny_model_dir: Path, mbs: int) -> None:
    """One optimizer window: the training forward's detached log-probs and entropies are torch.equal to
    compute_log_probs', and training on them gives the same step metrics and weights."""
    runs = {}
    for source in ("separate", "training_forward"):
        torch.manual_seed(0)
        actor = _actor(
            tiny_model_dir,
            OptimizerConfig(micro_batch_size=mbs, global_batch_size=6, lr=1e-3),
            AlgorithmConfig(use_tis=True, entropy_coef=0.01),
            temperature=0.7,
        )
        samples = _samples(6, actor.vocab_size)
        separate = actor.compute_log_probs(samples, with_entropy=True) if source == "separate" else None
        forward = LogProbs(log_probs=[], entropy=[])
        old = None if separate is None else separate.log_probs
        steps = actor.train(samples, old, None, step_offset=0, forward=forward)
        runs[source] = (separate, forward, steps, [p.detach().clone() for p in actor.model.parameters()])
    separate, forward_a, steps_a, weights_a = runs["separate"]
    _, forward_b, steps_b, weights_b = runs["training_forward"]
    assert (
        separate is not None and same_log_probs(separate, forward_a) and same_log_probs(forward_a, forward_b)
    )
    assert steps_a == steps_b and steps_a[0]["train/ppo_kl"] == 0.0
    assert all(torch.equal(a, b) for a, b in zip(weights_a, weights_b))
    assert all(float(e.sum()) > 0 for e in forward_b.entropy or [])  # real values, not zeros


def test_training_forward_refuses_several_windows(tiny_model_dir: Path) -> None:
    actor = _actor(tiny_model_dir, OptimizerConfig(global_batch_size=2))
    samples = _samples(4, actor.vocab_size)
    with pytest.raises(ValueError, match="one optimizer window"):
        actor.train(samples, None, None, step_offset=0, forward=LogProbs(log_probs=[], entropy=[]))


def test_separate_forward_reasons(tiny_model_dir: Path) -> None:
    model = torch.nn.Sequential(torch.nn.Linear(2, 2))
    assert separate_forward_reason(Config(), model) is None
    several = Config(optimizer=OptimizerConfig(global_batch_size=16))  # 8 × 8 samples: 4 steps
    assert "4 optimizer steps" in str(separate_forward_reason(several, model))
    assert "--ci-test" in str(separate_forward_reason(Config(ci=CIConfig(ci_test=True)), model))
    # actions for another rank count too: every rank must take the same path (the check is a collective)
    faults = Config(
        ci=CIConfig(ci_ft_test_actions='[{"at_rollout": 1, "action": "crash_before_allreduce", "rank": 1}]')
    )
    assert "--ci-ft-test-actions" in str(separate_forward_reason(faults, model))
    profiled = Config(profiling=ProfilingConfig(use_pytorch_profiler=True, profile_target="train_log_probs"))
    assert "train_log_probs" in str(separate_forward_reason(profiled, model))
    dropped = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Dropout(0.1))
    assert "drops out" in str(separate_forward_reason(Config(), dropped))


def test_default_run_metrics_equal_the_separate_forward_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The default run verifies at rollout 0, then takes the old log-probs from the training forward;
    every rollout and step metric equals a run forced to the separate forward, bitwise."""
    fused = train_short(tmp_path / "fused", "--num-rollout", "3")
    assert [e["source"] for e in events(fused, "old_log_probs")] == ["training_forward"]
    # rollout 0's separate forward and training forward, each one micro-batch of 2 prompts x 2 answers, packed
    packing = [(e["rollout_id"], e["packed"], e["forwards"]) for e in events(fused, "train_forward")]
    assert packing == [(0, 2, 2)]
    assert ["perf/log_probs_time" in m for m in metrics(fused, "perf")] == [True, False, False]
    monkeypatch.setattr(train_phase, "separate_forward_reason", lambda *_, **__: "forced by the test")
    separate = train_short(tmp_path / "separate", "--num-rollout", "3")
    assert events(separate, "old_log_probs") == []
    assert all("perf/log_probs_time" in m for m in metrics(separate, "perf"))
    assert _values(fused) == _values(separate) and len(_values(fused)) == 6
    lines = [json.loads(line)["kind"] for line in (fused / "metrics.jsonl").read_text().splitlines()]
    assert [k for k in lines if k != "perf"] == ["rollout", "step"] * 3  # rollout line before its step

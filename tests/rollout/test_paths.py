"""Rollout paths (rollout/): which path a config chooses, what each hands the loop, and the registry's rules.

The end-to-end runs of each path (bitwise replay, inject, 2-rank fleet) are in tests/replay and
tests/fleet; here each path runs on its own, without a loop, against a small engine that answers
at once, so what the protocol promises is checked path by path.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from grpolab.core.config import Config, DebugConfig, DynamicSamplingConfig, RolloutConfig
from grpolab.core.data import PromptDataset
from grpolab.core.dist import DistContext
from grpolab.core.engine.base import GenerationResult, SamplingParams
from grpolab.core.metrics import PhaseTimer
from grpolab.core.modeling import load_tokenizer
from grpolab.replay.inject import InjectMismatchError
from grpolab.replay.replayer import RolloutRecorder, RunIdentity
from grpolab.rollout import (
    ROLLOUT_PATHS,
    RolloutInputs,
    assign_advantages,
    build_rollout_path,
    check_recordings,
    chosen_path,
)
from grpolab.rollout.base import rank_share
from grpolab.rundir.writer import RunDirectory

FINGERPRINTS = {"model_fingerprint": "m", "tokenizer_fingerprint": "t", "chat_template_hash": "c"}
IDENTITY = RunIdentity(fingerprints=FINGERPRINTS, train_config={"n_samples_per_prompt": 2})


class CountingEngine:
    """Answers each request with three tokens derived from its seed; counts the calls."""

    def __init__(self) -> None:
        self.calls = 0

    def generate(self, requests: list, sampling: SamplingParams) -> list[GenerationResult]:
        self.calls += 1
        return [
            GenerationResult(
                response_ids=[5 + r.seed % 7, 6, 7],
                log_probs=torch.full((3,), -0.5),
                finish_reason="length",
                weight_version=3,
            )
            for r in requests
        ]


def _config(tmp_path: Path, **debug: object) -> Config:
    rollout = RolloutConfig(rollout_batch_size=2, n_samples_per_prompt=2, rollout_max_response_len=3)
    return Config(rollout=rollout, debug=DebugConfig(**debug))  # type: ignore[arg-type]


def _inputs(tmp_path: Path, config: Config, tiny_model_dir: Path, engine: object | None) -> RolloutInputs:
    tokenizer = load_tokenizer(tiny_model_dir)
    dataset = PromptDataset(
        config.data.prompt_data, tokenizer, input_key="question", label_key="answer", apply_chat_template=True
    )
    return RolloutInputs(
        config=config,
        engine=engine,  # type: ignore[arg-type]
        dataset=dataset,
        sampling=SamplingParams(max_new_tokens=3),
        identity=IDENTITY,
        run_dir=RunDirectory.create(tmp_path / "run", config={}, argv=[], seed=0),
        timer=PhaseTimer(),
        dist=DistContext(),
        custom_reward=None,
    )


def test_the_registry_asks_replay_inject_dynamic_central_engine_in_that_order(tmp_path: Path) -> None:
    assert [name for name, _ in ROLLOUT_PATHS.items()] == ["replay", "inject", "dynamic", "central", "engine"]
    template = str(tmp_path / "r_{rollout_id}.grz")
    assert chosen_path(_config(tmp_path), 1) == "engine"
    assert chosen_path(_config(tmp_path, load_debug_rollout_data=template), 1) == "replay"
    inject = _config(tmp_path, ci_inject_rollout_data_path=template)
    assert chosen_path(inject, 1) == "inject"
    assert chosen_path(inject, 1, live_only=True) == "engine"
    fleet = Config(rollout=RolloutConfig(rollout_num_engines=1))
    assert chosen_path(fleet, 1) == "engine"  # one rank: the HTTP engine is this rank's engine
    assert chosen_path(fleet, 2) == "central"  # several: rank 0 generates for every rank
    dynamic = Config(dynamic_sampling=DynamicSamplingConfig(dynamic_sampling_filter_path="m.f"))
    assert chosen_path(dynamic, 1) == "dynamic"
    with pytest.raises(
        ValueError, match="unknown rollout path 'custom'; valid: central, dynamic, engine, inject, replay"
    ):
        ROLLOUT_PATHS.get("custom")


def test_the_engine_path_generates_scores_and_leaves_advantages_to_the_loop(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    engine = CountingEngine()
    path = build_rollout_path(_inputs(tmp_path, _config(tmp_path), tiny_model_dir, engine))
    assert (path.name, path.generates) == ("engine", True)
    path.check_ready([0, 1])
    samples = path.rollout(0)
    assert engine.calls == 1
    assert [(s.index, s.group_index, s.sample_index) for s in samples] == [
        (0, 0, 0),
        (1, 0, 1),
        (2, 1, 0),
        (3, 1, 1),
    ]
    assert all(s.weight_version == 3 and len(s.loss_mask) == 3 for s in samples)
    scored = path.rewards(0, samples)
    assert scored is samples and all(isinstance(s.reward, float) for s in scored)
    for s, r in zip(scored, [1.0, 0.0, 0.0, 0.0]):
        s.reward = r
    assign_advantages(_config(tmp_path), scored)
    assert [round(s.advantage, 6) for s in scored] == [0.707107, -0.707107, 0.0, 0.0]


def test_replay_hands_back_the_recording_and_inject_trains_on_it(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    template = str(tmp_path / "rec" / "r_{rollout_id}.grz")
    live = build_rollout_path(_inputs(tmp_path / "a", _config(tmp_path), tiny_model_dir, CountingEngine()))
    recorded = live.rewards(0, live.rollout(0))
    recorder = RolloutRecorder(template, IDENTITY, run_seed=1234, sampler={}, run_id="r1", run_dir="a")
    recorder.save(recorded, rollout_id=0, weight_version=3)

    replay_cfg = _config(tmp_path, load_debug_rollout_data=template)
    replay = build_rollout_path(_inputs(tmp_path / "b", replay_cfg, tiny_model_dir, None))
    assert (replay.name, replay.generates) == ("replay", False)
    with pytest.raises(FileNotFoundError, match="r_1.grz"):
        check_recordings(replay_cfg, replay, None, start=0, evals=False)  # rollout 1 was never recorded
    replay.check_ready([0])
    again = replay.rollout(0)
    assert [s.response_ids for s in again] == [s.response_ids for s in recorded]
    assert replay.rewards(0, again) is again  # the recorded rewards stay

    engine = CountingEngine()
    inject_cfg = _config(tmp_path, ci_inject_rollout_data_path=template)
    inject = build_rollout_path(_inputs(tmp_path / "c", inject_cfg, tiny_model_dir, engine))
    assert (inject.name, inject.generates) == ("inject", True)
    fresh = inject.rollout(0)
    assert engine.calls == 1  # generated by the live path it wraps
    trained = inject.rewards(0, fresh)
    assert trained is not fresh and [s.response_ids for s in trained] == [s.response_ids for s in recorded]
    other = live.rewards(1, live.rollout(1))
    for s in other:  # a recording the engine does not reproduce fails the run
        s.response_ids = [9, 9, 9]
    recorder.save(other, rollout_id=1, weight_version=3)
    with pytest.raises(InjectMismatchError, match="min-match-ratio"):
        inject.rewards(1, inject.rollout(1))


def test_a_rank_keeps_its_contiguous_share() -> None:
    items = list(range(8))
    assert rank_share(items, DistContext(rank=0, world_size=2)) == [0, 1, 2, 3]  # type: ignore[arg-type]
    assert rank_share(items, DistContext(rank=1, world_size=2)) == [4, 5, 6, 7]  # type: ignore[arg-type]

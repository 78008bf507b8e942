"""A run that fails at rollout 3 and continues in its own run directory with --load: TensorBoard holds one
value per step, equal to what metrics.jsonl's reader keeps (the rollouts the second start re-ran are
purged), and the second start continues the first start's wandb run instead of opening another."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import rollout_loggers
from runs import SHORT

from grpolab.cli import main
from grpolab.rundir.reader import read_metrics

SHAPE = [*SHORT, "--num-rollout", "4", "--global-batch-size", "2", "--entropy-coef", "0.01"]
SHAPE += ["--use-tensorboard", "--use-wandb", "--wandb-mode", "offline", "--wandb-project", "grpolab-tests"]
"""4 rollouts × 2 optimizer steps (train/step 0..7), a checkpoint every 2 rollouts, both sinks."""


@pytest.fixture(scope="module")
def continued(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """The run directory after the second start, and the first start's wandb id."""
    tmp = tmp_path_factory.mktemp("continued")
    run_dir, ckpt = tmp / "run", tmp / "ckpt"
    argv = ["train", *SHAPE, "--run-dir", str(run_dir), "--save", str(ckpt), "--save-interval", "2"]
    argv += ["--custom-rollout-log-function-path", "rollout_loggers.boom_at_3"]
    rollout_loggers.BOOM_AT_3["armed"] = True
    assert main(argv) == 1
    first_id = json.loads((run_dir / "run.json").read_text())["wandb"]["id"]
    rollout_loggers.BOOM_AT_3["armed"] = False
    try:
        assert main([*argv, "--load", str(ckpt)]) == 0  # re-runs rollouts 2 and 3
    finally:
        rollout_loggers.BOOM_AT_3["armed"] = True
    return run_dir, first_id


def test_tensorboard_has_one_value_per_step_as_the_reader(continued: tuple[Path, str]) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run_dir, _ = continued
    acc = EventAccumulator(str(run_dir / "tensorboard"), size_guidance={"scalars": 0})
    acc.Reload()
    read = {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}
    expected: dict[str, dict[int, float]] = {}
    for r in read_metrics(run_dir):
        if r.kind in ("step", "rollout", "perf", "eval"):
            x = r.step if r.kind == "step" else r.rollout_id
            for key, value in r.metrics.items():
                expected.setdefault(key, {})[x] = value
    assert [s for s, _ in read["train/loss"]] == list(range(8))  # once each, rollout 1's steps 2..3 kept
    assert [s for s, _ in read["rollout/raw_reward"]] == [0, 1, 2, 3]
    for tag, by_x in expected.items():
        steps = [s for s, _ in read[tag]]
        assert steps == sorted(by_x), tag
        assert dict(read[tag]) == pytest.approx(by_x, rel=1e-6, abs=1e-30), tag


def test_wandb_run_is_continued(continued: tuple[Path, str]) -> None:
    run_dir, first_id = continued
    info = json.loads((run_dir / "run.json").read_text())["wandb"]
    assert info["id"] == first_id

"""UI fixtures: one RUNS_ROOT made once per session with the real trainer, plus edited copies.

Layout of the root (`ui_root`):
    a/          real run, seed 1234, rollouts recorded (4 rollouts × 2 prompts × 4 answers)
    b/          real run, seed 7 (diverges from a at step 0)
    a-step3/    a copy of a whose metrics.jsonl was edited from step 3 on (rewards and train/*
                values changed), so a and a-step3 are equal until step 3 and differ from step 3
    a-late/     a copy of a whose metrics.jsonl steps and rollout ids were shifted by +100, so it
                shares no step number with the others
    no-runjson/ a copy of a without run.json ("incomplete")
    logs/miles_plain.log, logs/miles_dead_engine.log   the Miles-format fixtures (mtime set an hour back)
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import pytest

from grpolab.cli import build_parser, config_from_args
from grpolab.core.loop import train

LOGS = Path(__file__).resolve().parents[2] / "fixtures" / "logs"
TINY_ARGS = ["--rollout-batch-size", "2", "--n-samples-per-prompt", "4", "--num-rollout", "4"]
TINY_ARGS += ["--rollout-max-response-len", "8", "--no-progress"]


def _train(run_dir: Path, *extra: str) -> Path:
    argv = ["train", *TINY_ARGS, "--run-dir", str(run_dir), *extra]
    return train(config_from_args(build_parser().parse_args(argv)), ["grpolab", *argv])


def _edit_metrics(run_dir: Path, edit) -> None:
    path = run_dir / "metrics.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    path.write_text("".join(json.dumps(edit(r)) + "\n" for r in rows))


def _diverge_from_step3(rec: dict) -> dict:
    index = rec["step"] if rec["kind"] == "step" else rec["rollout_id"]
    if index >= 3 and rec["kind"] == "rollout":
        rec["metrics"]["rollout/raw_reward"] += 0.25
    if index >= 3 and rec["kind"] == "step":
        rec["metrics"]["train/loss"] += 1e-3
    return rec


def _shift(rec: dict) -> dict:
    rec["rollout_id"] += 100
    if rec["step"] is not None:
        rec["step"] += 100
    return rec


@pytest.fixture(scope="session")
def ui_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("ui-runs")
    a = _train(
        root / "a", "--save-debug-rollout-data", str(root / "a" / "rollouts" / "rollout_{rollout_id}.grz")
    )
    _train(root / "b", "--seed", "7")
    for name, edit in (("a-step3", _diverge_from_step3), ("a-late", _shift)):
        shutil.copytree(a, root / name)
        _edit_metrics(root / name, edit)
    shutil.copytree(a, root / "no-runjson")
    (root / "no-runjson" / "run.json").unlink()
    (root / "logs").mkdir()
    hour_ago = time.time() - 3600
    for log in ("miles_plain.log", "miles_dead_engine.log"):
        shutil.copy(LOGS / log, root / "logs" / log)
        os.utime(root / "logs" / log, (hour_ago, hour_ago))
    return root

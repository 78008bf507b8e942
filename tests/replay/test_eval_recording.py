"""`--save-debug-rollout-data` with `--eval-interval` records every eval as `eval_<id>` (issue 15 item 18)."""

from __future__ import annotations

import json
from pathlib import Path

from runs import events, metrics, run

from grpolab.replay.cli import main as replay_main
from grpolab.replay.recording import load_rollout

ARITHMETIC_TEST = Path(__file__).resolve().parents[2] / "fixtures" / "data" / "arithmetic_test.jsonl"


def test_eval_rollouts_are_recorded_and_inspectable(tmp_path: Path, capsys) -> None:
    rec = tmp_path / "rec"
    out = run(
        tmp_path,
        "ev",
        "--num-rollout",
        "1",
        "--debug-rollout-only",
        "--save-debug-rollout-data",
        str(rec / "r_{rollout_id}.grz"),
        "--eval-interval",
        "1",
        "--eval-prompt-data",
        "arith",
        str(ARITHMETIC_TEST),
        "--eval-max-prompts",
        "2",
        "--n-samples-per-eval-prompt",
        "2",
    )
    # an eval before rollout 0 and one after the last rollout, as the README says
    names = ["r_0.grz", "r_eval_0.grz", "r_eval_1.grz"]
    assert sorted(p.name for p in rec.iterdir()) == names
    run_id = json.loads((out / "run.json").read_text())["run_id"]
    assert [m["rollout/step"] for m in metrics(out, "rollout")] == [0.0]
    eval_rewards = [m["eval/arith"] for m in metrics(out, "eval")]
    for n, expected in enumerate(eval_rewards):
        recording = load_rollout(rec / f"r_eval_{n}.grz")
        assert recording.rollout_id == f"eval_{n}" and recording.run_id == run_id
        assert len(recording.samples) == 4  # 2 prompts x 2 answers
        assert [s.group_index for s in recording.samples] == [0, 0, 1, 1]
        assert [s.sample_index for s in recording.samples] == [0, 1, 0, 1]
        assert all(s.metadata == {"eval_set": "arith"} for s in recording.samples)
        assert sum(s.reward for s in recording.samples) / 4 == expected  # what eval/arith logged
    recorded = events(out, "eval_recorded")
    assert [(e["rollout_id"], e["id"]) for e in recorded] == [(0, "eval_0"), (1, "eval_1")]
    assert replay_main(["inspect", str(rec / "r_eval_1.grz")]) == 0
    shown = capsys.readouterr().out
    assert "rollout id: eval_1" in shown and "samples: 4 in 2 groups" in shown
    assert f"recorded by: run {run_id} (run dir {out})" in shown

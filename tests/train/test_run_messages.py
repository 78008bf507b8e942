"""What `grpolab train` says on the way (issue 15 item 23): what it loads, one progress row per
rollout on a stdout that is not a terminal, and an end-of-run summary with the UI command."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from runs import SHORT, events, metrics, train_short

from grpolab.core.metrics import RunSummary

REPO = Path(__file__).resolve().parents[2]


def test_summary_lines_count_rollouts_time_and_reward() -> None:
    now = [100.0]
    summary = RunSummary(clock=lambda: now[0])
    summary.add(4, {"rollout/raw_reward": 0.140625})
    summary.add(5, {"rollout/raw_reward": 0.25})
    summary.add(6, {"rollout/raw_reward": 0.484375})
    now[0] = 100.0 + 334.4
    assert summary.lines("runs/x", 8) == [
        "done: 3 rollouts (4..6 of 8) in 5 min 34 s; reward 0.141 -> 0.484",
        "run directory: runs/x",
        "open it in the UI: grpolab ui runs/x",
    ]
    one = RunSummary(clock=lambda: 7.6)
    one.add(0, {"rollout/raw_reward": 1.0})
    assert one.lines("r", 1)[0] == "done: 1 rollout (0 of 1) in 0 s; reward 1.000 -> 1.000"
    hours = RunSummary(clock=lambda: 0.0)
    hours.started = -2 * 3600 - 5 * 60 - 1
    assert hours.lines("r", 1)[0] == "done: 0 rollouts in 2 h 05 min"


def test_a_piped_run_says_what_it_loads_each_rollout_and_where_it_is(tmp_path: Path) -> None:
    """stdout is a pipe (not a terminal): the import line and the loading lines come first, then one
    `[k/N]` row per rollout, then the summary; console.log has the same lines (not the import line,
    printed before the run directory exists); every rank's last heartbeat is phase finished (what
    `grpolab diagnose hang` reads as a rank that left normally)."""
    run_dir = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "-m", "grpolab", "train", *SHORT, "--run-dir", str(run_dir)],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    model = REPO / "fixtures" / "tiny-qwen3"
    data = REPO / "fixtures" / "data" / "arithmetic_train.jsonl"
    rows = sum(1 for line in data.read_text().splitlines() if line.strip())
    expected_start = [
        f"loading model {model}: fingerprint and tokenizer",
        f"prompt data: {data} ({rows} rows)",
        "building the rollout engine: torch, float32 on cpu",
        "the engine decodes with grpolab's own forward (--rollout-decode-path auto)",
        "building the trainer: float32 on cpu",
        "the trainer's forward: shared-prefix (a prompt runs once for its samples in micro-batches where that "
        "pays) (--train-forward auto)",
    ]
    assert lines[0] == "importing torch and transformers ..."  # before the slow imports; not in console.log
    assert lines[1:7] == expected_start, lines[:8]
    progress = [line for line in lines if line.startswith("[")]
    assert [p.split(" ", 1)[0] for p in progress] == ["[1/2]", "[2/2]"]
    rewards = [json.loads(r)["metrics"]["rollout/raw_reward"] for r in _records(run_dir, "rollout")]
    assert lines[-3].startswith("done: 2 rollouts (0..1 of 2) in ")
    assert lines[-3].endswith(f"; reward {rewards[0]:.3f} -> {rewards[1]:.3f}")
    assert lines[-2:] == [f"run directory: {run_dir}", f"open it in the UI: grpolab ui {run_dir}"]
    console = (run_dir / "console.log").read_text().splitlines()
    assert console[:6] == expected_start and console[-3:] == lines[-3:]
    rank0 = json.loads((run_dir / "ranks" / "0.json").read_text())
    assert rank0["heartbeat"]["phase"] == "finished"


def test_a_run_that_cannot_learn_says_so_at_the_start_and_the_end(tmp_path: Path) -> None:
    """GRPO groups of one sample: every advantage 0, every grad norm 0. A `warning` event and console
    line at the start (naming the flag) and again before the summary; a run with groups of four whose
    steps have gradients says neither."""
    run_dir = train_short(tmp_path / "ones", "--n-samples-per-prompt", "1")
    codes = [e["code"] for e in events(run_dir, "warning")]
    assert codes == ["advantages_always_zero", "grad_norm_always_zero"]
    console = (run_dir / "console.log").read_text().splitlines()
    start = next(i for i, line in enumerate(console) if "advantage of 0" in line)
    assert console[start].startswith("warning: --n-samples-per-prompt 1: the grpo advantage estimator")
    assert start < next(i for i, line in enumerate(console) if line.startswith("[1/2]"))
    assert console[-4] == (
        "warning: train/grad_norm was 0 at every optimizer step (2 steps): the weights never moved. A zero "
        "gradient means every advantage was 0 (groups of one sample, or every group's rewards equal: see "
        "rollout/zero_std/*) and no KL or entropy term pulled"
    )
    assert console[-3].startswith("done: 2 rollouts")
    learns = train_short(
        tmp_path / "fours", "--n-samples-per-prompt", "4", "--rollout-max-response-len", "24"
    )
    assert any(m["train/grad_norm"] > 0 for m in metrics(learns, "step"))
    assert events(learns, "warning") == []


def test_the_untrained_warning_needs_every_step_at_zero() -> None:
    summary = RunSummary(clock=lambda: 0.0)
    assert summary.untrained_warning() is None  # no step ran (a rollout-only run)
    summary.add(0, {}, [{"train/grad_norm": 0.0}])
    assert summary.untrained_warning() is not None
    summary.add(1, {}, [{"train/grad_norm": 0.0}, {"train/grad_norm": 1e-9}])
    assert summary.untrained_warning() is None


def _records(run_dir: Path, kind: str) -> list[str]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [line for line in lines if json.loads(line)["kind"] == kind]


def test_the_ui_hint_quotes_a_path_with_spaces() -> None:
    lines = RunSummary(clock=lambda: 0.0).lines("runs/my run's dir", 1)
    assert lines[-2:] == [
        "run directory: runs/my run's dir",
        """open it in the UI: grpolab ui 'runs/my run'"'"'s dir'""",
    ]

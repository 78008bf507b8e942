"""--use-wandb (offline), --use-tensorboard and --custom-rollout-log-function-path on one short run of the
tiny model: what wandb's transaction log and TensorBoard's event file hold equals metrics.jsonl, the
wandb run and the run directory name each other, the API key is stored nowhere, and the custom logger
is called once per rollout with Miles' arguments while the default logging stays (it returns False)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import rollout_loggers
import wandb_records
from runs import events, records, train_short

API_KEY = "0123456789abcdef" * 2 + "feedface"
"""A WANDB_API_KEY value to look for in the run's files (offline mode never uses it)."""
EVAL_SET = Path(__file__).resolve().parents[2] / "fixtures" / "data" / "arithmetic_test.jsonl"
SHAPE = ["--num-rollout", "2", "--global-batch-size", "2", "--entropy-coef", "0.01"]
SHAPE += ["--eval-prompt-data", "arith", str(EVAL_SET), "--eval-interval", "2", "--eval-max-prompts", "2"]
"""2 rollouts × 2 optimizer steps: train/step 0..3 (the entropy bonus makes train/loss non-zero);
evaluations before rollout 0 and after the last (eval records at rollout ids 0 and 2)."""


@pytest.fixture(scope="module")
def monitored(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One run with every sink and the `keep` logger; WANDB_API_KEY set, TENSORBOARD_DIR unset."""
    rollout_loggers.CALLS.clear()
    with pytest.MonkeyPatch.context() as env:
        env.setenv("WANDB_API_KEY", API_KEY)
        env.delenv("TENSORBOARD_DIR", raising=False)
        run_dir = train_short(
            tmp_path_factory.mktemp("monitored") / "run",
            *SHAPE,
            *("--use-wandb", "--wandb-mode", "offline", "--wandb-project", "grpolab-tests"),
            *("--use-tensorboard", "--custom-rollout-log-function-path", "rollout_loggers.keep"),
        )
    return run_dir


def _wandb_log(run_dir: Path) -> Path:
    info = json.loads((run_dir / "run.json").read_text())["wandb"]
    return Path(info["dir"]) / f"run-{info['id']}.wandb"


def test_wandb_history_equals_metrics_jsonl(monitored: Path) -> None:
    rows = wandb_records.history(wandb_records.read_records(_wandb_log(monitored)))
    steps = {r["step"]: r["metrics"] for r in records(monitored, "step")}
    assert sorted(steps) == [0, 1, 2, 3]
    train_rows = {row["train/step"]: row for row in rows if "train/loss" in row}
    assert sorted(train_rows) == [0, 1, 2, 3]
    assert steps[3]["train/loss"] != 0.0  # the entropy bonus: a value that could differ
    assert train_rows[3]["train/loss"] == steps[3]["train/loss"]
    for step, metrics in steps.items():
        assert {k: train_rows[step][k] for k in metrics} == metrics
    rollout_rows = {row["rollout/step"]: row for row in rows if "rollout/raw_reward" in row}
    for record in records(monitored, "rollout"):
        metrics = record["metrics"]
        assert {k: rollout_rows[record["rollout_id"]][k] for k in metrics} == metrics
    eval_rows = {row["eval/step"]: row for row in rows if "eval/arith" in row}
    assert sorted(eval_rows) == [0, 2]
    for record in records(monitored, "eval"):
        metrics = record["metrics"]
        assert {k: eval_rows[record["rollout_id"]][k] for k in metrics} == metrics
    perf_rows = [row for row in rows if "perf/step_time" in row]
    assert [(row["rollout/step"], row["perf/step_time"]) for row in perf_rows] == [
        (r["rollout_id"], r["metrics"]["perf/step_time"]) for r in records(monitored, "perf")
    ]


def test_wandb_axes_config_and_links(monitored: Path) -> None:
    log_file = _wandb_log(monitored)
    recs = wandb_records.read_records(log_file)
    axes = {m.glob_name: m.step_metric for m in wandb_records.of_type(recs, "metric") if m.glob_name}
    assert axes == {
        "train/*": "train/step",
        "rollout/*": "rollout/step",
        "perf/*": "rollout/step",
        "eval/*": "eval/step",
    }
    (run,) = wandb_records.of_type(recs, "run")
    meta = json.loads((monitored / "run.json").read_text())
    assert run.run_id == meta["wandb"]["id"] == meta["starts"][-1]["wandb"]["id"]
    assert (run.project, meta["wandb"]["group"], meta["wandb"]["mode"]) == ("grpolab-tests", None, "offline")
    config = {item.key: json.loads(item.value_json) for item in run.config.update}
    assert config["run_dir"] == str(monitored.resolve())
    assert config["rollout"]["num_rollout"] == meta["config"]["rollout"]["num_rollout"] == 2
    assert run.display_name == monitored.name
    assert [e.exit_code for e in wandb_records.of_type(recs, "exit")] == [0]


def test_api_key_is_in_no_file_of_the_run_directory(monitored: Path) -> None:
    files = [p for p in monitored.rglob("*") if p.is_file() and not p.is_symlink()]
    assert any(p.suffix == ".wandb" for p in files)  # wandb's own files are among those searched
    assert [p for p in files if API_KEY.encode() in p.read_bytes()] == []


def test_tensorboard_scalars_equal_metrics_jsonl(monitored: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events_dir = monitored / "tensorboard"
    acc = EventAccumulator(str(events_dir), size_guidance={"scalars": 0})
    acc.Reload()
    read = {tag: {e.step: e.value for e in acc.Scalars(tag)} for tag in acc.Tags()["scalars"]}
    expected: dict[str, dict[int, float]] = {}
    kinds = ("step", "rollout", "perf", "eval")
    for r in [r for kind in kinds for r in records(monitored, kind)]:
        x = r["step"] if r["kind"] == "step" else r["rollout_id"]
        for key, value in r["metrics"].items():
            expected.setdefault(key, {})[x] = value
    assert set(read) == set(expected) and "eval/arith" in read
    for tag, by_step in expected.items():  # TensorBoard stores float32
        assert read[tag] == pytest.approx(by_step, rel=1e-6, abs=1e-30), tag
    console = (monitored / "console.log").read_text()
    assert f"Saving tensorboard log to {events_dir}" in console


def test_custom_logger_gets_miles_arguments_and_false_keeps_the_line(monitored: Path) -> None:
    rollouts = records(monitored, "rollout")
    assert [c["rollout_id"] for c in rollout_loggers.CALLS] == [0, 1]
    perf = records(monitored, "perf")
    for call, record, p in zip(rollout_loggers.CALLS, rollouts, perf):
        assert call["rollout_batch_size"] == 2
        assert len(call["rewards"]) == 4  # the whole rollout: 2 prompts × 2 answers
        assert call["extra"] == {"metrics": record["metrics"], "run_dir": str(monitored)}
        assert call["rollout_time"] == p["metrics"]["perf/rollout_time"]
    console = (monitored / "console.log").read_text().splitlines()
    assert [line.split(":")[0] for line in console if line.startswith("rollout ")] == [
        "rollout 0",
        "rollout 1",
    ]
    assert events(monitored, "status")[-1]["status"] == "finished"

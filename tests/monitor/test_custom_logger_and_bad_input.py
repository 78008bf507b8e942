"""--custom-rollout-log-function-path returning True (async) replaces the default rollout logging but not
metrics.jsonl; a raising logger fails the run at that rollout (exit 1, the wandb run finished failed);
bad input is exit 2 before any run directory: a logger path that does not import, --use-wandb without
wandb."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import rollout_loggers
import wandb_records
from runs import SHORT, events, records

from grpolab.cli import main

ONE = ["--num-rollout", "1"]


def _train(run_dir: Path, *extra: str) -> int:
    return main(["train", *SHORT, *ONE, "--run-dir", str(run_dir), *extra])


def test_true_replaces_the_rollout_line_and_sink_scalars_not_the_record(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    rollout_loggers.CALLS.clear()
    run_dir = tmp_path / "run"
    monkeypatch.setenv("TENSORBOARD_DIR", str(tmp_path / "tb"))  # Miles' variable, no --tensorboard-dir
    flags = ["--custom-rollout-log-function-path", "rollout_loggers.replace", "--use-tensorboard"]
    assert _train(run_dir, *flags) == 0
    assert [c["rollout_id"] for c in rollout_loggers.CALLS] == [0]  # the coroutine ran
    (record,) = records(run_dir, "rollout")
    assert record["metrics"] == rollout_loggers.CALLS[0]["extra"]["metrics"]
    console = (run_dir / "console.log").read_text()
    assert "\nrollout 0: " not in console and "\nstep 0: " in console and "[1/1] reward" in console
    assert f"Saving tensorboard log to {tmp_path / 'tb'}" in console
    acc = EventAccumulator(str(tmp_path / "tb"), size_guidance={"scalars": 0})
    acc.Reload()
    tags = acc.Tags()["scalars"]
    assert "train/loss" in tags and "perf/step_time" in tags
    assert [t for t in tags if t.startswith("rollout/")] == []


def test_the_shipped_example_logger_prints_what_the_rollout_holds(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """`grpolab.examples.rollout_logger.log_rollout` (the docs' example) runs, keeps the default
    line, and its numbers agree with the rollout's metrics.jsonl record."""
    run_dir = tmp_path / "run"
    flags = ["--custom-rollout-log-function-path", "grpolab.examples.rollout_logger.log_rollout"]
    assert _train(run_dir, *flags) == 0
    out = capsys.readouterr().out
    (line,) = [x for x in out.splitlines() if x.startswith("custom logger: rollout 0: ")]
    (record,) = records(run_dir, "rollout")
    reward = record["metrics"]["rollout/raw_reward"]
    assert f"mean reward {reward:.3f}," in line
    assert "\nrollout 0: {" in (run_dir / "console.log").read_text()  # False kept the default line
    n = next(int(a) for a, b in zip(SHORT[1:], SHORT) if b == "--rollout-max-response-len")
    assert f"(--rollout-max-response-len {n})" in line


def test_raising_logger_fails_the_run_at_that_rollout(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    run_dir = tmp_path / "run"
    flags = ["--custom-rollout-log-function-path", "rollout_loggers.boom"]
    assert _train(run_dir, *flags, "--use-wandb", "--wandb-mode", "offline") == 1
    err = capsys.readouterr().err
    assert "--custom-rollout-log-function-path rollout_loggers.boom raised at rollout 0: KeyError" in err
    status = events(run_dir, "status")[-1]
    assert status["status"] == "failed" and "rollout_loggers.boom raised at rollout 0" in status["error"]
    assert records(run_dir, "rollout")[0]["rollout_id"] == 0  # metrics.jsonl has the record
    info = json.loads((run_dir / "run.json").read_text())["wandb"]
    recs = wandb_records.read_records(Path(info["dir"]) / f"run-{info['id']}.wandb")
    assert [e.exit_code for e in wandb_records.of_type(recs, "exit")] == [1]


def test_logger_that_does_not_import_is_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    run_dir = tmp_path / "run"
    with pytest.raises(SystemExit) as exit_:
        _train(run_dir, "--custom-rollout-log-function-path", "no_such_pkg_m1.logging.my_log")
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "--custom-rollout-log-function-path 'no_such_pkg_m1.logging.my_log': cannot import module" in err
    assert "ModuleNotFoundError: No module named 'no_such_pkg_m1'" in err
    assert not run_dir.exists()


def test_use_wandb_without_wandb_is_exit_2_naming_the_extra(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    argv = ["train", *SHORT, *ONE, "--run-dir", str(run_dir), "--use-wandb"]
    code = f"import sys; sys.modules['wandb'] = None; from grpolab.cli import main; sys.exit(main({argv!r}))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=os.environ.copy())
    assert done.returncode == 2, done.stderr
    assert "--use-wandb needs the wandb package" in done.stderr
    assert "pip install 'grpolab[monitoring]'" in done.stderr
    assert "Traceback" not in done.stderr and not run_dir.exists()


def test_tensorboard_dir_that_is_a_file_is_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    (tmp_path / "tb").write_text("not a folder")
    with pytest.raises(SystemExit) as exit_:
        _train(tmp_path / "run", "--use-tensorboard", "--tensorboard-dir", str(tmp_path / "tb"))
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert (
        f"--tensorboard-dir {tmp_path / 'tb'}: is a file; expected a directory for TensorBoard files" in err
    )
    assert not (tmp_path / "run").exists()


def test_logger_with_the_wrong_signature_is_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    run_dir = tmp_path / "run"
    with pytest.raises(SystemExit) as exit_:
        _train(run_dir, "--custom-rollout-log-function-path", "rollout_loggers.two_args")
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "--custom-rollout-log-function-path 'rollout_loggers.two_args'" in err
    assert "cannot be called as fn(rollout_id, args, samples, extra, rollout_time)" in err
    assert not run_dir.exists()  # refused at start, not at rollout 0


@pytest.mark.parametrize(
    "argv", [["--wandb-key", "sEcReT42"], ["--wandb-key=sEcReT42"], ["--wandb-host", "sEcReT42"]]
)
def test_miles_wandb_key_flag_is_exit_2_without_echoing_it(
    tmp_path: Path, capsys: pytest.CaptureFixture, argv: list[str]
) -> None:
    with pytest.raises(SystemExit) as exit_:
        _train(tmp_path / "run", "--use-wandb", *argv)
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "sEcReT42" not in err
    flag = argv[0].split("=")[0]
    env = "WANDB_API_KEY" if flag == "--wandb-key" else "WANDB_BASE_URL"
    assert f"{flag} is not a grpolab flag" in err and env in err


def test_wandb_mode_disabled_stores_no_id(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    assert _train(run_dir, "--use-wandb", "--wandb-mode", "disabled") == 0
    info = json.loads((run_dir / "run.json").read_text())["wandb"]
    assert (info["mode"], info["id"], info["dir"], info["url"]) == ("disabled", None, None, None)

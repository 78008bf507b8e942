"""End-to-end runs of `grpolab train` on the tiny fixture model (CPU, a few seconds each)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from runs import SMALL, records, run

from grpolab.cli import main
from grpolab.core import checkpoint


@pytest.fixture(scope="module")
def two_rollouts(tmp_path_factory) -> Path:
    return run(tmp_path_factory.mktemp("e2e"), "two", "--num-rollout", "2")


def test_step0_is_exactly_on_policy(two_rollouts: Path) -> None:
    step0 = records(two_rollouts, "step")[0]["metrics"]
    assert step0["train/ppo_kl"] == 0.0
    assert step0["train/pg_clipfrac"] == 0.0
    rollout0 = records(two_rollouts, "rollout")[0]["metrics"]
    assert "rollout/ref_log_probs" not in rollout0  # nothing reads the reference (train/train_phase.py)
    # the engine's incremental KV-cache log-probs and the trainer's full forward agree closely in fp32
    assert 0.0 <= step0["train/train_rollout_logprob_abs_diff"] < 1e-4


def test_rewards_are_informative_at_the_start(two_rollouts: Path) -> None:
    reward0 = records(two_rollouts, "rollout")[0]["metrics"]["rollout/raw_reward"]
    assert 0.0 < reward0 < 1.0


def test_run_directory_contract(two_rollouts: Path) -> None:
    meta = json.loads((two_rollouts / "run.json").read_text())
    assert meta["config"]["rollout"]["num_rollout"] == 2 and meta["seed"] == 1234
    assert meta["environment"]["torch"] and "deterministic" in meta["environment"]
    events = [json.loads(line) for line in (two_rollouts / "events.jsonl").read_text().splitlines()]
    assert events[0]["event"] == "run_start" and events[-1] == {
        **events[-1],
        "event": "status",
        "status": "finished",
    }
    assert [e["weight_version"] for e in events if e["event"] == "weight_update"] == [1, 2, 3]
    rank0 = json.loads((two_rollouts / "ranks" / "0.json").read_text())
    assert (
        rank0["rank"] == 0 and rank0["pid"] > 0 and rank0["heartbeat"]["phase"] == "finished"
    )  # left its loop normally
    console = (two_rollouts / "console.log").read_text()
    for line in ("rollout 1: {", "step 1: {", "perf 1: {", "[2/2] reward"):
        assert line in console
    perf = records(two_rollouts, "perf")[1]["metrics"]
    for key in (
        "perf/step_time",
        "perf/rollout_time",
        "perf/train_time",
        "perf/update_weights_time",
        "perf/sleep_time",
        "perf/wake_up_time",
    ):
        assert perf[key] > 0, key
    assert [r["rollout_id"] for r in records(two_rollouts, "step")] == [0, 1]


def test_resume_continues_with_the_same_data_and_weights(tmp_path: Path) -> None:
    full = run(
        tmp_path, "full", "--num-rollout", "3", "--save", str(tmp_path / "ckpt"), "--save-interval", "2"
    )
    assert checkpoint.find_latest(tmp_path / "ckpt").name == "iter_0000003"
    # a second run resumes from the rollout-2 checkpoint of the first
    (tmp_path / "ckpt" / checkpoint.LATEST_FILE).write_text("2\n")
    resumed = run(tmp_path, "resumed", "--num-rollout", "3", "--load", str(tmp_path / "ckpt"))
    assert [r["rollout_id"] for r in records(resumed, "rollout")] == [2]
    assert records(resumed, "rollout")[0]["metrics"] == records(full, "rollout")[2]["metrics"]
    assert records(resumed, "step")[0]["metrics"] == records(full, "step")[2]["metrics"]


def test_empty_load_dir_starts_fresh_and_says_so(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    out = run(tmp_path, "fresh", "--num-rollout", "1", "--load", str(tmp_path / "empty"))
    assert "no checkpoint there yet, starting fresh" in (out / "console.log").read_text()
    assert [r["rollout_id"] for r in records(out, "rollout")] == [0]


def test_real_gsm8k_prompts_run(tmp_path: Path, gsm8k_train: Path) -> None:
    argv = [
        "train",
        "--prompt-data",
        str(gsm8k_train),
        "--input-key",
        "question",
        "--label-key",
        "answer",
        "--num-rollout",
        "1",
    ]
    argv += ["--no-progress", "--run-dir", str(tmp_path / "gsm8k")]
    assert main(argv) == 0
    rollout0 = records(tmp_path / "gsm8k", "rollout")[0]["metrics"]
    assert 0.0 <= rollout0["rollout/raw_reward"] <= 1.0
    assert rollout0["rollout/total_lengths"] > 50  # real GSM8K questions are long


# ---------------------------------------------------------------- bad input
def fails(tmp_path: Path, capsys, *argv: str, run_dir_made: bool = False) -> str:
    """Run `grpolab train` with bad input; it must exit 2 (through argparse when checked before the run).
    Flags and input files are checked before the run directory is made; a checkpoint only after
    (`run_dir_made=True`), and then the directory says why the run failed."""
    try:
        code = main(["train", *SMALL, "--num-rollout", "1", "--run-dir", str(tmp_path / "bad"), *argv])
    except SystemExit as e:
        code = e.code
    assert code == 2
    assert (tmp_path / "bad").exists() == run_dir_made
    return capsys.readouterr().err


def test_unknown_rm_type(tmp_path: Path, capsys) -> None:
    err = fails(tmp_path, capsys, "--rm-type", "nope")
    assert "--rm-type" in err and "math" in err


def test_missing_prompt_file_and_key(tmp_path: Path, capsys) -> None:
    assert "--prompt-data" in fails(tmp_path, capsys, "--prompt-data", str(tmp_path / "none.jsonl"))
    data = tmp_path / "p.jsonl"
    data.write_text('{"q": "1+1?", "answer": "#### 2"}\n')
    err = fails(
        tmp_path,
        capsys,
        "--prompt-data",
        str(data),
        "--input-key",
        "question",
        "--run-dir",
        str(tmp_path / "bad2"),
    )
    assert "--input-key 'question'" in err and "line 1 has no such field" in err


def test_indivisible_global_batch(capsys) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["train", *SMALL, "--global-batch-size", "5"])
    assert exit_info.value.code == 2
    assert "--global-batch-size 5 must divide" in capsys.readouterr().err


def test_custom_rm_that_does_not_import(tmp_path: Path, capsys) -> None:
    err = fails(tmp_path, capsys, "--custom-rm-path", "no_such_pkg.rewards.fn")
    assert "no_such_pkg.rewards.fn" in err and "no_such_pkg" in err
    assert not list((tmp_path / "bad").glob("metrics.jsonl"))  # failed before any rollout


def test_reward_function_that_raises_names_the_sample(tmp_path: Path, capsys, monkeypatch) -> None:
    (tmp_path / "badrm.py").write_text("def fn(sample):\n    raise ZeroDivisionError('boom')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    argv = ["--num-rollout", "1", "--run-dir", str(tmp_path / "bad"), "--custom-rm-path", "badrm.fn"]
    sys.modules.pop("badrm", None)
    try:
        code = main(["train", *SMALL, *argv])
    finally:  # another test's badrm.py must not find this one imported (it has no `reward`)
        sys.modules.pop("badrm", None)
    err = capsys.readouterr().err
    assert code == 1  # the run failed in the user's code: not a bad flag
    assert "sample 0" in err and "boom" in err or "ZeroDivisionError" in err
    events = [json.loads(line) for line in (tmp_path / "bad" / "events.jsonl").read_text().splitlines()]
    assert events[-1]["event"] == "status" and events[-1]["status"] == "failed"


def test_checkpoint_from_another_model_is_refused(tmp_path: Path, tiny_model_dir: Path, capsys) -> None:
    import shutil

    from transformers import AutoConfig, AutoModelForCausalLM

    run(tmp_path, "src", "--num-rollout", "1", "--save", str(tmp_path / "ckpt"))
    other = tmp_path / "other-model"
    shutil.copytree(tiny_model_dir, other)
    config = AutoConfig.from_pretrained(other)
    config.num_hidden_layers = 2
    config.layer_types = config.layer_types[:2]
    AutoModelForCausalLM.from_config(config).save_pretrained(other)
    err = fails(
        tmp_path, capsys, "--hf-checkpoint", str(other), "--load", str(tmp_path / "ckpt"), run_dir_made=True
    )
    assert "--load" in err and "iter_0000001" in err and "another model" in err


def test_a_failed_run_gives_back_the_callers_sigterm_handler(tmp_path: Path) -> None:
    """The run turns SIGTERM into an interrupt while it runs, swallows it while writing its end, and
    then restores what the caller had: a process started afterwards must still die on SIGTERM."""
    import signal
    import subprocess

    from runs import train_short

    def mine(signum: int, frame: object) -> None:
        raise AssertionError("not expected")

    before = signal.signal(signal.SIGTERM, mine)
    try:
        fault = '[{"at_rollout": 0, "action": "raise_in_train"}]'
        with pytest.raises(RuntimeError):
            train_short(tmp_path / "failed", "--ci-ft-test-actions", fault)
        assert signal.getsignal(signal.SIGTERM) is mine
        assert (
            signal.getsignal(signal.SIGINT) is signal.default_int_handler
        )  # held while it ended, given back
        events = [json.loads(x) for x in (tmp_path / "failed" / "events.jsonl").read_text().splitlines()]
        assert events[-1]["event"] == "status" and events[-1]["status"] == "failed"
        assert "error" in json.loads((tmp_path / "failed" / "ranks" / "0.json").read_text())
        child = subprocess.Popen(["sleep", "30"])
        child.terminate()
        assert child.wait(timeout=10) == -signal.SIGTERM
    finally:
        signal.signal(signal.SIGTERM, before)

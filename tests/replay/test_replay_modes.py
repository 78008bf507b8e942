"""Cut the loop in half: capture, train-only replay and inject, end to end on the tiny model."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest
from runs import SMALL, events, metrics, run

from grpolab.cli import main
from grpolab.replay.recording import load_rollout


def weight_hashes(ckpt: Path) -> dict[str, str]:
    return {
        p.parent.name: hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(ckpt.glob("iter_*/model.safetensors"))
    }


@pytest.fixture(scope="module")
def captured(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("capture")
    run(
        tmp,
        "cap",
        "--num-rollout",
        "3",
        "--debug-rollout-only",
        "--save-debug-rollout-data",
        str(tmp / "rec" / "r_{rollout_id}.grz"),
    )
    return tmp


def test_rollout_only_builds_no_trainer(captured: Path) -> None:
    assert sorted(p.name for p in (captured / "rec").iterdir()) == ["r_0.grz", "r_1.grz", "r_2.grz"]
    assert metrics(captured / "cap", "step") == []  # no optimizer, no backward
    assert "rollout/log_probs" not in metrics(captured / "cap", "rollout")[0]
    assert not any(e["event"] == "weight_update" for e in events(captured / "cap"))


def test_two_train_only_replays_are_bitwise_identical(captured: Path) -> None:
    template = str(captured / "rec" / "r_{rollout_id}.grz")
    a = run(
        captured,
        "replay-a",
        "--num-rollout",
        "3",
        "--load-debug-rollout-data",
        template,
        "--save",
        str(captured / "ck-a"),
        "--save-interval",
        "1",
    )
    b = run(
        captured,
        "replay-b",
        "--num-rollout",
        "3",
        "--load-debug-rollout-data",
        template,
        "--save",
        str(captured / "ck-b"),
        "--save-interval",
        "1",
    )
    assert len(metrics(a, "step")) == 3
    assert metrics(a, "step") == metrics(b, "step")
    assert weight_hashes(captured / "ck-a") == weight_hashes(captured / "ck-b")
    assert len(weight_hashes(captured / "ck-a")) == 3
    assert not any(e["event"] == "weight_update" for e in events(a))  # no engine was built


def test_recorded_run_replays_to_the_same_training(tmp_path: Path) -> None:
    template = str(tmp_path / "rec" / "r_{rollout_id}.grz")
    live = run(
        tmp_path,
        "live",
        "--num-rollout",
        "3",
        "--save-debug-rollout-data",
        template,
        "--save",
        str(tmp_path / "ck-live"),
        "--save-interval",
        "1",
    )
    replay = run(
        tmp_path,
        "replay",
        "--num-rollout",
        "3",
        "--load-debug-rollout-data",
        template,
        "--save",
        str(tmp_path / "ck-replay"),
        "--save-interval",
        "1",
    )
    assert metrics(live, "step") == metrics(replay, "step")  # every train/* value, bitwise
    assert weight_hashes(tmp_path / "ck-live") == weight_hashes(tmp_path / "ck-replay")
    assert [m["rollout/raw_reward"] for m in metrics(live, "rollout")] == [
        m["rollout/raw_reward"] for m in metrics(replay, "rollout")
    ]


def test_inject_matches_with_right_weights_and_fails_without_sync(tmp_path: Path, capsys) -> None:
    template = str(tmp_path / "rec" / "r_{rollout_id}.grz")
    fast = ["--num-rollout", "2", "--lr", "5e-3"]  # a large step so one skipped sync visibly changes sampling
    run(tmp_path, "live", *fast, "--save-debug-rollout-data", template)
    ok = run(tmp_path, "inject", *fast, "--ci-inject-rollout-data-path", template)
    checks = [e for e in events(ok) if e["event"] == "inject_check"]
    assert [c["mean_ratio"] for c in checks] == [1.0, 1.0]
    code = main(
        [
            "train",
            *SMALL,
            *fast,
            "--ci-inject-rollout-data-path",
            template,
            "--debug-skip-weight-update",
            "--run-dir",
            str(tmp_path / "skip"),
        ]
    )
    err = capsys.readouterr().err
    assert code == 1  # the run failed its inject check (not bad input)
    assert (
        "rollout 1: mean response-token match ratio" in err
        and "threshold 0.9" in err
        and "first diff at token" in err
    )
    failed = [e for e in events(tmp_path / "skip") if e["event"] == "inject_check"]
    assert failed[0]["mean_ratio"] == 1.0 and failed[1]["mean_ratio"] <= 0.9


def test_subsample_and_exit_after_rollout(captured: Path) -> None:
    template = str(captured / "rec" / "r_{rollout_id}.grz")
    out = run(
        captured,
        "sub",
        "--num-rollout",
        "3",
        "--load-debug-rollout-data",
        template,
        "--load-debug-rollout-data-subsample",
        "0.5",
        "--global-batch-size",
        "8",
        "--debug-exit-after-rollout",
        "1",
    )
    assert [m["rollout/step"] for m in metrics(out, "rollout")] == [0.0, 1.0]
    assert events(out)[-1]["status"] == "finished"


def test_event_mirror_and_disable_optimizer(tmp_path: Path) -> None:
    out = run(
        tmp_path,
        "noopt",
        "--num-rollout",
        "1",
        "--debug-disable-optimizer",
        "--save-debug-event-data",
        str(tmp_path / "ev"),
    )
    assert (tmp_path / "ev" / "events.jsonl").read_text() == (out / "events.jsonl").read_text()
    step = metrics(out, "step")[0]
    assert step["train/lr-pg_0"] == 0.0 and step["train/grad_norm"] > 0  # backward ran, no optimizer step


# ---------------------------------------------------------------- bad input
@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--save-debug-rollout-data", "/tmp/r.grz"], "must contain {rollout_id}"),
        (["--save-debug-rollout-data", "/tmp/r_{rollout_id}_{step}.grz"], "has field {step}"),
        (["--save-debug-rollout-data", "/tmp/r_{rollout_id.grz"], "stray brace"),
        (["--debug-rollout-only", "--debug-train-only"], "exclude each other"),
        (
            ["--debug-rollout-only", "--load-debug-rollout-data", "/tmp/r_{rollout_id}.grz"],
            "exclude each other",
        ),
        (["--debug-train-only"], "needs --load-debug-rollout-data"),
    ],
)
def test_bad_flags(argv: list[str], needle: str, capsys) -> None:
    with pytest.raises(SystemExit):
        main(["train", *argv])
    assert needle in capsys.readouterr().err


@pytest.mark.parametrize("flag", ["--load-debug-rollout-data", "--ci-inject-rollout-data-path"])
def test_missing_recordings_are_listed_before_the_first_rollout(captured: Path, flag: str, capsys) -> None:
    rec, name = captured / "rec", flag.strip("-")
    argv = ["train", *SMALL, "--num-rollout", "5", flag, str(rec / "r_{rollout_id}.grz")]
    assert main([*argv, "--run-dir", str(captured / name)]) == 2
    err = capsys.readouterr().err
    assert (
        f"{flag}: 2 of the 5 rollouts this run reads have no recording (checked before the first rollout)"
        in err
    )
    assert f"rollout 3: expected {rec / 'r_3.grz'}\n  rollout 4: expected {rec / 'r_4.grz'}" in err
    assert not (captured / name / "metrics.jsonl").exists()  # no rollout ran before the refusal
    assert events(captured / name)[-1]["status"] == "failed"


def test_recording_again_is_refused_and_a_mixed_set_is_not_replayed(
    captured: Path, tmp_path: Path, capsys
) -> None:
    rec = tmp_path / "rec"
    shutil.copytree(captured / "rec", rec)
    template = str(rec / "r_{rollout_id}.grz")
    before = {p.name: p.read_bytes() for p in rec.iterdir()}
    first = json.loads((captured / "cap" / "run.json").read_text())
    again = ["train", *SMALL, "--debug-rollout-only", "--save-debug-rollout-data", template, "--seed", "2"]
    assert main([*again, "--num-rollout", "3", "--run-dir", str(tmp_path / "again")]) == 2
    err = capsys.readouterr().err
    assert "--save-debug-rollout-data: 3 of the 3 recordings this run will write already exist" in err
    who = f"recorded by run {first['run_id']} (run dir {captured / 'cap'}, seed {first['seed']})"
    assert f"{rec / 'r_0.grz'}: {who}" in err and "--overwrite-debug-rollout-data" in err
    assert {p.name: p.read_bytes() for p in rec.iterdir()} == before  # nothing replaced
    over = tmp_path / "over"
    assert main([*again, "--num-rollout", "1", "--overwrite-debug-rollout-data", "--run-dir", str(over)]) == 0
    second = json.loads((over / "run.json").read_text())
    assert load_rollout(rec / "r_0.grz").run_id == second["run_id"] != first["run_id"]
    assert [e["path"] for e in events(over, "recording_replaced")] == [str(rec / "r_0.grz")]
    replay = ["train", *SMALL, "--num-rollout", "3", "--load-debug-rollout-data", template]
    assert main([*replay, "--run-dir", str(tmp_path / "mixed")]) == 2
    err = capsys.readouterr().err
    assert "--load-debug-rollout-data: these recordings come from 2 different runs" in err
    assert f"{rec / 'r_0.grz'}: run {second['run_id']} (run dir {over}, seed 2)" in err
    assert f"{rec / 'r_1.grz'}, {rec / 'r_2.grz'}: run {first['run_id']}" in err


def test_inject_explains_a_recording_without_weight_updates(captured: Path) -> None:
    """`captured` was recorded with --debug-rollout-only: its policy never moves, this run's does."""
    out = run(
        captured,
        "inject-frozen",
        "--num-rollout",
        "2",
        "--ci-inject-rollout-data-path",
        str(captured / "rec" / "r_{rollout_id}.grz"),
    )
    checks = events(out, "inject_check")
    assert checks[0]["mean_ratio"] == 1.0 and checks[0]["note"] == ""
    assert (checks[0]["recorded_weight_version"], checks[0]["engine_weight_version"]) == (0, 1)
    assert (checks[1]["recorded_weight_version"], checks[1]["engine_weight_version"]) == (0, 2)
    assert checks[1]["mean_ratio"] < 1.0  # the live policy took one optimizer step, the recording's none
    assert "only rollout 0 is expected to match exactly" in checks[1]["note"]
    assert f"inject rollout 1: mean response-token match ratio {checks[1]['mean_ratio']:.4f}" in (
        log := (out / "console.log").read_text()
    )
    assert f"note: {checks[1]['note']}" in log and log.count("note: ") == 1


def test_recording_from_another_tokenizer_is_refused(
    captured: Path, tiny_model_dir: Path, tmp_path: Path, capsys
) -> None:
    import shutil

    other = tmp_path / "model"
    shutil.copytree(tiny_model_dir, other)
    tok = json.loads((other / "tokenizer.json").read_text())
    vocab = tok["model"]["vocab"]
    a, b = sorted(vocab)[100:102]
    vocab[a], vocab[b] = vocab[b], vocab[a]  # same sizes, different tokenizer
    (other / "tokenizer.json").write_text(json.dumps(tok))
    template = str(captured / "rec" / "r_{rollout_id}.grz")
    argv = [
        "train",
        *SMALL,
        "--num-rollout",
        "1",
        "--hf-checkpoint",
        str(other),
        "--load-debug-rollout-data",
        template,
    ]
    assert main([*argv, "--run-dir", str(tmp_path / "refused")]) == 2
    err = capsys.readouterr().err
    assert "tokenizer_fingerprint: recording has" in err and "--allow-recording-mismatch" in err
    assert main([*argv, "--allow-recording-mismatch", "--run-dir", str(tmp_path / "allowed")]) == 0


@pytest.mark.parametrize("flag", ["--load-debug-rollout-data", "--ci-inject-rollout-data-path"])
def test_a_swapped_or_corrupt_recording_is_exit_2_before_the_first_rollout(
    captured: Path, tmp_path: Path, flag: str, capsys
) -> None:
    """The tester's `cp rec/r_2.grz recswap/r_0.grz` (issue 15 fix F6), then a damaged r_1."""
    swap = tmp_path / "swap"
    swap.mkdir()
    shutil.copy(captured / "rec" / "r_2.grz", swap / "r_0.grz")
    shutil.copy(captured / "rec" / "r_1.grz", swap / "r_1.grz")
    argv = ["train", *SMALL, "--num-rollout", "2", flag, str(swap / "r_{rollout_id}.grz")]
    assert main([*argv, "--run-dir", str(tmp_path / "a")]) == 2
    assert f"{swap / 'r_0.grz'}: read as rollout 0, but its header says rollout 2" in capsys.readouterr().err
    assert not (tmp_path / "a" / "metrics.jsonl").exists()
    shutil.copy(captured / "rec" / "r_0.grz", swap / "r_0.grz")
    data = bytearray((swap / "r_1.grz").read_bytes())
    data[len(data) // 2] ^= 0xFF
    (swap / "r_1.grz").write_bytes(bytes(data))
    assert main([*argv, "--run-dir", str(tmp_path / "b")]) == 2
    err = capsys.readouterr().err
    assert f"{flag}: rollout 1: {swap / 'r_1.grz'}: corrupt recording" in err
    assert not (tmp_path / "b" / "metrics.jsonl").exists()

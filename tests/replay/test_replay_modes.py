"""Cut the loop in half: capture, train-only replay and inject, end to end on the tiny model."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from runs import SMALL, events, metrics, run

from grpolab.cli import main


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


def test_missing_recording_names_the_expected_path(captured: Path, capsys) -> None:
    template = str(captured / "rec" / "r_{rollout_id}.grz")
    code = main(
        [
            "train",
            *SMALL,
            "--num-rollout",
            "5",
            "--load-debug-rollout-data",
            template,
            "--run-dir",
            str(captured / "missing"),
        ]
    )
    assert code == 2
    assert f"no recording for rollout 3: expected {captured / 'rec' / 'r_3.grz'}" in capsys.readouterr().err


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

"""`grpolab replay logprobs`: the trainer-vs-engine gap of recorded rollouts, recomputed on a real run."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from runs import records, run

from grpolab.replay import logprob_gap
from grpolab.replay.cli import main
from grpolab.replay.logprobs import (
    GAP_KEY,
    LogprobsError,
    WeightsSource,
    gap_result,
    read_result,
    recording_of,
    result_path,
    trainer_log_probs,
)
from grpolab.replay.recording import load_rollout
from grpolab.rundir.reader import read_run_meta

REL = 1e-6
"""Recomputed vs logged gap, relative: the same float32 log-probs on the same weights, reduced in float64
here and in float32 per micro-batch by the trainer (measured: at most 9e-8 on this run, where the gap
itself is ~5e-7 nats and the initial weights' gap on rollout 1 is ~1e-2)."""


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """2 rollouts × 16 answers recorded, 2 optimizer steps per rollout, a checkpoint after each rollout."""
    tmp = tmp_path_factory.mktemp("logprobs")
    rollouts = str(tmp / "rec" / "rollouts" / "rollout_{rollout_id}.grz")
    extra = ["--num-rollout", "2", "--global-batch-size", "8", "--save-debug-rollout-data", rollouts]
    return run(tmp, "rec", *extra, "--save", str(tmp / "ckpt"), "--save-interval", "1")


def _logged(run_dir: Path, rollout_id: int) -> list[tuple[int, float]]:
    return [
        (r["step"], r["metrics"][GAP_KEY]) for r in records(run_dir, "step") if r["rollout_id"] == rollout_id
    ]


def test_recomputed_gap_equals_the_logged_one(recorded: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["replay", "logprobs", str(recorded), "--rollout", "0"]) == 0
    out = capsys.readouterr()
    assert "[2/3] loading the initial weights of --hf-checkpoint" in out.err
    assert f"wrote {result_path(recorded, 0)}" in out.out
    result = read_result(result_path(recorded, 0))
    logged = _logged(recorded, 0)
    assert [s for s, _ in result.steps] == [s for s, _ in logged] == [0, 1]
    for (_, ours), (_, theirs) in zip(result.steps, logged):
        assert ours == pytest.approx(theirs, rel=REL) and ours > 0
    assert (
        f"step 1: recomputed {GAP_KEY} {result.steps[1][1]:.6g}; the run logged {logged[1][1]:.6g}" in out.out
    )
    assert result.weights.weights is None and result.reduction == "sample_mean"
    assert result.mean_abs_gap == pytest.approx(np.mean([g for _, g in logged]), rel=REL)
    first = result.samples[0]
    mask = first.loss_tokens
    assert len(result.samples) == 16 and len(first.trainer_log_probs) == len(first.engine_log_probs)
    assert first.mean_abs_gap == pytest.approx(
        float(np.abs(first.trainer_log_probs.astype(np.float64) - first.engine_log_probs).sum() / mask)
    )


def test_later_rollout_uses_the_checkpoint_saved_before_it(recorded: Path) -> None:
    assert main(["replay", "logprobs", str(recorded), "--rollout", "1"]) == 0
    result = read_result(result_path(recorded, 1))
    assert result.weights.weights is not None and result.weights.weights.endswith("iter_0000001")
    logged = _logged(recorded, 1)
    assert [s for s, _ in result.steps] == [s for s, _ in logged] == [2, 3]
    for (_, ours), (_, theirs) in zip(result.steps, logged):
        assert ours == pytest.approx(theirs, rel=REL)
    # the weights matter: the initial weights score rollout 1 thousands of times further from the engine
    config = read_run_meta(recorded).config
    assert config is not None
    samples = load_rollout(result.recording).samples
    initial = WeightsSource(config.model.hf_checkpoint, None, "initial weights")
    trainer = trainer_log_probs(config, samples, initial)
    engine = [s.rollout_log_probs.numpy() for s in samples]
    wrong = gap_result(config, 1, 1, result.recording, initial, samples, engine, trainer)
    assert all(w > 1000 * theirs for (_, w), (_, theirs) in zip(wrong.steps, logged))


def test_existing_result_needs_force(recorded: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = result_path(recorded, 0)
    if not path.exists():
        assert main(["replay", "logprobs", str(recorded), "--rollout", "0"]) == 0
    before = read_result(path).created
    capsys.readouterr()
    assert main(["replay", "logprobs", str(recorded), "--rollout", "0"]) == 2
    assert f"{path} already exists; pass --force" in capsys.readouterr().err
    assert read_result(path).created == before
    assert main(["replay", "logprobs", str(recorded), "--rollout", "0", "--force"]) == 0
    assert read_result(path).created > before


def test_weights_not_on_disk(recorded: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ckpt = recorded.parent / "ckpt" / "iter_0000001"
    shutil.move(ckpt, tmp_path / "away")
    try:
        assert main(["replay", "logprobs", str(recorded), "--rollout", "1", "--force"]) == 2
    finally:
        shutil.move(tmp_path / "away", ckpt)
    err = capsys.readouterr().err
    assert "cannot recompute rollout 1: no checkpoint of the weights before rollout 1 is on disk" in err
    assert "Traceback" not in err


def test_unrecorded_rollout_and_missing_run(
    recorded: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["replay", "logprobs", str(recorded), "--rollout", "5"]) == 2
    err = capsys.readouterr().err
    assert "the recording of rollout 5" in err and "(the run recorded rollouts [0, 1])" in err
    assert main(["replay", "logprobs", str(tmp_path), "--rollout", "0"]) == 2
    assert f"{tmp_path / 'run.json'}: no such file" in capsys.readouterr().err


def test_damaged_result_file_is_named(tmp_path: Path) -> None:
    path = result_path(tmp_path, 3)
    path.parent.mkdir()
    path.write_text("{not json")
    with pytest.raises(LogprobsError, match=f"{path}: not valid JSON"):
        read_result(path)
    path.write_text(json.dumps({"format": "grpolab.replay.logprobs", "version": 1, "rollout_id": 3}))
    with pytest.raises(LogprobsError, match="missing or mis-typed field"):
        read_result(path)


def test_gap_reductions() -> None:
    sums, counts = np.array([1.0, 3.0, 0.0]), np.array([2.0, 2.0, 0.0])
    assert logprob_gap.reduce_gap(sums, counts, "sample_mean") == pytest.approx((0.5 + 1.5 + 0.0) / 3)
    assert logprob_gap.reduce_gap(sums, counts, "token_mean") == pytest.approx(4.0 / 4.0)
    # 2 ranks, 8 samples, global batch 4: rank 0 trains 0..3, rank 1 trains 4..7, two samples each per step
    assert logprob_gap.step_windows(8, 4, 2) == [[0, 1, 4, 5], [2, 3, 6, 7]]
    assert logprob_gap.step_windows(16, 8, 1) == [list(range(8)), list(range(8, 16))]
    assert logprob_gap.step_windows(10, 4, 1) == []


def _copy(recorded: Path, dest: Path, *, template: str | None = None, recorded_events: bool = True) -> Path:
    """`cp -r` of the run without its results; `template` replaces run.json's --save-debug-rollout-data,
    and the `rollout_recorded` events are dropped unless `recorded_events`."""
    shutil.copytree(recorded, dest, ignore=shutil.ignore_patterns("logprobs"))
    if template is not None:
        meta = json.loads((dest / "run.json").read_text())
        meta["config"]["debug"]["save_debug_rollout_data"] = template
        (dest / "run.json").write_text(json.dumps(meta))
    if not recorded_events:
        rows = [json.loads(line) for line in (dest / "events.jsonl").read_text().splitlines()]
        kept = [r for r in rows if r["event"] != "rollout_recorded"]
        (dest / "events.jsonl").write_text("".join(json.dumps(r) + "\n" for r in kept))
    return dest


def test_recording_copied_with_its_run_is_scored(
    recorded: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # recorded with --save-debug-rollout-data 'runs/recA/r_{rollout_id}.grz' --run-dir runs/recA, then
    # `cp -r runs/recA /tmp/copyA; cd /tmp`: the events name runs/recA/r_0.grz, the file is copyA/r_0.grz
    copy = _copy(recorded, tmp_path / "copyA", template="runs/recA/r_{rollout_id}.grz")
    shutil.move(copy / "rollouts" / "rollout_0.grz", copy / "r_0.grz")
    events = (copy / "events.jsonl").read_text()
    (copy / "events.jsonl").write_text(
        events.replace(str(recorded / "rollouts" / "rollout_0.grz"), "runs/recA/r_0.grz")
    )
    monkeypatch.chdir(tmp_path)
    assert main(["replay", "logprobs", str(copy), "--rollout", "0"]) == 0, capsys.readouterr().err
    result = read_result(result_path(copy, 0))
    assert result.recording == str(copy / "r_0.grz")
    assert result.mean_abs_gap == pytest.approx(np.mean([g for _, g in _logged(recorded, 0)]), rel=REL)


def test_cli_and_ui_find_recordings_by_the_template_when_events_lack_them(
    recorded: Path, tmp_path: Path
) -> None:
    from grpolab.ui.runstore import RunStore

    copy = _copy(recorded, tmp_path / "copyB", recorded_events=False)
    shutil.rmtree(copy / "rollouts")  # only run.json's absolute template names the originals
    config = read_run_meta(copy).config
    assert config is not None
    expected = {i: recorded / "rollouts" / f"rollout_{i}.grz" for i in (0, 1)}
    assert {i: recording_of(config, [], i, copy) for i in (0, 1)} == expected
    store = RunStore([tmp_path])
    (run_id,) = [r.run_id for r in store.list_runs() if r.path == copy]
    assert store.list_rollouts(run_id) == expected


def test_mislabelled_recording_is_refused(
    recorded: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # found through the copy's rollouts/ folder: no event, a template whose files are gone
    copy = _copy(
        recorded, tmp_path / "mislabelled", template="/gone/rollout_{rollout_id}.grz", recorded_events=False
    )
    wrong = copy / "rollouts" / "rollout_1.grz"
    shutil.copy(copy / "rollouts" / "rollout_0.grz", wrong)  # rollout 0's recording under rollout 1's name
    assert main(["replay", "logprobs", str(copy), "--rollout", "1"]) == 2
    err = capsys.readouterr().err
    assert f"{wrong}: its header says rollout 0, not --rollout 1" in err and "Traceback" not in err
    assert "[2/3]" not in err and not result_path(copy, 1).exists()


def test_unwritable_result_path_is_refused_before_computing(
    recorded: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    copy = _copy(recorded, tmp_path / "blocked")
    (copy / "logprobs").write_text("not a folder")
    assert main(["replay", "logprobs", str(copy), "--rollout", "0"]) == 2
    err = capsys.readouterr().err
    assert f"{copy / 'logprobs'} is not a directory; expected the folder of the result files" in err
    assert "[1/3]" not in err
    (copy / "logprobs").unlink()
    result_path(copy, 0).mkdir(parents=True)
    for extra in ([], ["--force"]):
        assert main(["replay", "logprobs", str(copy), "--rollout", "0", *extra]) == 2
        err = capsys.readouterr().err
        assert (
            f"{result_path(copy, 0)} is a directory; expected the result file" in err and "[1/3]" not in err
        )

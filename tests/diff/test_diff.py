"""`grpolab diff` on real runs of the tiny model: identical replays, another seed, another config,
Miles logs, and the inputs it must refuse or cannot judge (issue 13).

The runs are made once per module: one recorded rollout-only run per seed (runs.SHORT: 2 rollouts of
2 prompts × 2 answers; no trainer, the cheapest run that records) and three train-only replays of the seed-7 recording with per-step hashes (two alike, one
with another --lr). The CLI runs in this process through `grpolab.cli.main`.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from runs import train_short

from grpolab.checkers.step_hash import read_step_hashes, step_hash_files
from grpolab.cli import main
from grpolab.diff import SetupDifference, diff_runs
from grpolab.replay.recording import load_rollout

LOGS = Path(__file__).resolve().parents[2] / "fixtures" / "logs"


def _recorded(root: Path, seed: int) -> Path:
    run = root / f"rec_s{seed}"
    return train_short(
        run, "--seed", str(seed), "--save-debug-rollout-data", f"{run}/rollouts/{{rollout_id}}.grz"
    )


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("diff")
    out = {"rec7": _recorded(root, 7), "rec8": _recorded(root, 8)}
    replay = ["--load-debug-rollout-data", f"{out['rec7']}/rollouts/{{rollout_id}}.grz"]
    replay += ["--save-model-hash-every-step"]
    out["replay1"] = train_short(root / "replay1", *replay)
    out["replay2"] = train_short(root / "replay2", *replay)
    out["replay_lr"] = train_short(root / "replay_lr", *replay, "--lr", "1e-5")
    return out


def _cli(capsys: pytest.CaptureFixture[str], *argv: object) -> tuple[int, str, str]:
    code = main(["diff", *map(str, argv)])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def _copy(src: Path, dst: Path, *, drop: str) -> Path:
    """A copy of a run without its recordings ("recordings") or its step hashes ("hashes")."""
    shutil.copytree(src, dst)
    if drop == "hashes":
        shutil.rmtree(dst / "checks")
        return dst
    shutil.rmtree(dst / "rollouts")
    events = [json.loads(line) for line in (dst / "events.jsonl").read_text().splitlines()]
    kept = [e for e in events if e["event"] != "rollout_recorded"]
    (dst / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in kept))
    meta = json.loads((dst / "run.json").read_text())
    meta["config"]["debug"]["save_debug_rollout_data"] = None
    (dst / "run.json").write_text(json.dumps(meta))
    return dst


def test_identical_replays_exit_0(runs: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _cli(capsys, runs["replay1"], runs["replay2"])
    assert code == 0, out
    assert "verdict: identical (bitwise; 2 common steps)" in out
    report = diff_runs(runs["replay1"], runs["replay2"])
    assert report.metrics == [] and report.layer is None and report.notes == []
    # the only set-up difference of two replays is where they were written
    assert [(d.section, d.key) for d in report.setup] == [("flags", "run.run_dir")]


def test_other_seed_differs_at_rollout_0_sample_0(
    runs: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = _cli(capsys, runs["rec7"], runs["rec8"])
    assert code == 1
    report = diff_runs(runs["rec7"], runs["rec8"])
    assert report.first_step == 0
    assert SetupDifference("flags", "run.seed", 7, 8) in report.setup
    s = report.sample
    assert s is not None and (s.rollout_id, s.sample_index) == (0, 0)
    a = load_rollout(runs["rec7"] / "rollouts" / "0.grz").samples[0]
    b = load_rollout(runs["rec8"] / "rollouts" / "0.grz").samples[0]
    assert s.prompt_index == a.prompt_index
    i = s.token_index
    assert i is not None and a.response_ids[:i] == b.response_ids[:i]
    assert (s.token_a, s.token_b) == (a.response_ids[i], b.response_ids[i]) and s.token_a != s.token_b
    assert s.logprob_a == float(a.rollout_log_probs[i])
    assert f"token {i}" in out and f"id {s.token_a} vs {s.token_b}" in out
    assert "«" in s.text_a and "«" in s.text_b  # decoded around the token (the tiny tokenizer ships)


def test_changed_config_names_flag_step_and_layer(runs: dict[str, Path]) -> None:
    report = diff_runs(runs["replay1"], runs["replay_lr"])
    assert report.verdict == "differs" and report.exit_code == 1
    assert SetupDifference("flags", "optimizer.lr", 2e-4, 1e-5) in report.setup
    assert report.first_step == 0 and report.metrics[0].key == "train/lr-pg_0"
    layer = report.layer
    assert layer is not None
    a = read_step_hashes(step_hash_files(runs["replay1"])[layer.step])
    b = read_step_hashes(step_hash_files(runs["replay_lr"])[layer.step])
    assert (layer.hash_a, layer.hash_b) == (a[layer.name], b[layer.name]) and a[layer.name] != b[layer.name]
    earlier = [read_step_hashes(f) for s, f in step_hash_files(runs["replay1"]).items() if s < layer.step]
    assert all(h == read_step_hashes(step_hash_files(runs["replay_lr"])[i]) for i, h in enumerate(earlier))


def test_json_has_the_same_content(runs: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _cli(capsys, runs["rec7"], runs["rec8"], "--json")
    assert code == 1
    body = json.loads(out)
    assert body == json.loads(json.dumps(diff_runs(runs["rec7"], runs["rec8"]).to_dict()))
    assert body["verdict"] == "differs" and body["sample"]["rollout_id"] == 0


def test_recording_on_one_side_only_is_not_identical(
    runs: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bare = _copy(runs["rec7"], tmp_path / "bare", drop="recordings")
    code, out, _ = _cli(capsys, bare, runs["rec7"])
    assert code == 2
    assert "verdict: cannot judge" in out
    assert "recordings on one side only: run B recorded rollouts [0, 1], the other none" in out


def test_hashes_on_one_side_only_is_not_identical(runs: dict[str, Path], tmp_path: Path) -> None:
    bare = _copy(runs["replay1"], tmp_path / "bare", drop="hashes")
    report = diff_runs(runs["replay1"], bare)
    assert report.verdict == "cannot_judge" and report.exit_code == 2
    assert report.notes == ["per-step model hashes on one side only: run A has them, the other none"]


def test_no_common_steps_cannot_judge(
    runs: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    shifted = shutil.copytree(runs["replay1"], tmp_path / "shifted")
    rows = [json.loads(line) for line in (shifted / "metrics.jsonl").read_text().splitlines()]
    for row in rows:
        for field in ("rollout_id", "step"):
            if row.get(field) is not None:
                row[field] += 10
    (shifted / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    shutil.rmtree(shifted / "checks")
    code, out, _ = _cli(capsys, runs["replay1"], shifted)
    assert code == 2
    assert "no common steps: run A logged steps 0..1, run B 10..11" in out
    assert "metrics: no common step to compare" in out and "(bitwise; 0 common steps)" in out


def test_bad_input_exits_2_naming_it(
    runs: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    code, out, err = _cli(capsys, runs["replay1"], empty)
    assert (code, out) == (2, "") and f"grpolab diff: error: {empty}: not a run directory" in err
    text = tmp_path / "notes.txt"
    text.write_text("hello\n")
    code, _, err = _cli(capsys, text, runs["replay1"])
    assert code == 2 and f"{text}: not a run directory, and no metric line" in err
    readme = Path(__file__).resolve().parents[2] / "README.md"  # a progress-line example, no metric line
    code, _, err = _cli(capsys, readme, runs["replay1"])
    assert code == 2 and f"{readme}: not a run directory, and no metric line" in err
    code, _, err = _cli(capsys, runs["replay1"], tmp_path / "missing")
    assert code == 2 and "missing: no such file or directory" in err
    code, _, err = _cli(capsys, runs["replay1"], runs["replay2"], "--tol", "-1")
    assert code == 2 and "--tol must be a finite number >= 0, got -1.0" in err


def test_miles_logs_with_baseline_band(capsys: pytest.CaptureFixture[str]) -> None:
    bad, seeds = LOGS / "gate_candidate_bad_gap.log", [LOGS / "gate_seed2.log", LOGS / "gate_seed3.log"]
    report = diff_runs(LOGS / "gate_seed1.log", bad, baselines=seeds)
    assert report.verdict == "differs" and SetupDifference("flags", "seed", "1", "1234") in report.setup
    [m] = report.metrics  # the seeds' spread covers every other metric at every step
    assert (m.key, m.step, m.a, m.b, m.band) == (
        "train/train_rollout_logprob_abs_diff",
        0,
        0.0148,
        0.05,
        (0.0148, 0.0157),
    )
    code, out, _ = _cli(capsys, LOGS / "gate_seed1.log", LOGS / "gate_seed1.log")
    assert code == 0 and "verdict: identical" in out


def _with_nan(src: Path, dst: Path, key: str, step: int) -> Path:
    """A copy of a run whose metrics.jsonl logs `key` as NaN at train step `step`."""
    shutil.copytree(src, dst)
    rows = [json.loads(line) for line in (dst / "metrics.jsonl").read_text().splitlines()]
    for row in rows:
        if row["kind"] == "step" and row["step"] == step:
            row["metrics"][key] = float("nan")
    (dst / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return dst


def test_a_number_against_nan_differs_and_nan_equals_nan(runs: dict[str, Path], tmp_path: Path) -> None:
    nan1 = _with_nan(runs["replay1"], tmp_path / "nan1", "train/grad_norm", 1)
    nan2 = _with_nan(runs["replay2"], tmp_path / "nan2", "train/grad_norm", 1)
    report = diff_runs(runs["replay1"], nan1)
    assert report.verdict == "differs" and report.first_step == 1
    assert [m.key for m in report.metrics] == ["train/grad_norm"] and report.metrics[0].b != report.metrics[
        0
    ].b
    assert diff_runs(nan1, nan2).verdict == "identical"


def test_miles_log_with_nan_grad_norm_differs(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _cli(capsys, LOGS / "grpolab_console.log", LOGS / "grpolab_grad_nan.log")
    assert code == 1 and "step 1 train/grad_norm: 0.507 -> nan" in out
    code, out, _ = _cli(capsys, LOGS / "grpolab_grad_nan.log", LOGS / "grpolab_grad_nan.log")
    assert code == 0 and "verdict: identical" in out


def test_recordings_are_found_from_the_run_dir_not_the_cwd(
    runs: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run recorded with relative paths (runs/rec/rollouts/N.grz) and a copy whose recordings are
    another run's: the same verdict from the launch directory and from elsewhere, the foreign
    recordings named in the notes, never compared as the copy's own."""
    root = tmp_path / "launch"
    rec = shutil.copytree(runs["rec7"], root / "runs" / "rec")
    events = [json.loads(line) for line in (rec / "events.jsonl").read_text().splitlines()]
    for e in events:
        if e["event"] == "rollout_recorded":
            e["path"] = f"runs/rec/rollouts/{Path(e['path']).name}"
    (rec / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    copy = shutil.copytree(rec, tmp_path / "copy")
    for f in (copy / "rollouts").iterdir():
        shutil.copyfile(runs["rec8"] / "rollouts" / f.name, f)
    verdicts = []
    for cwd in (root, tmp_path):
        monkeypatch.chdir(cwd)
        report = diff_runs(rec, copy)
        verdicts.append((report.verdict, report.sample))
        assert any(
            n.startswith(f"run B: recording {copy / 'rollouts'}/0.grz is of run ") for n in report.notes
        )
    assert verdicts[0] == verdicts[1] and verdicts[0][0] == "cannot_judge"


def test_run_status_is_said_but_does_not_decide(runs: dict[str, Path], tmp_path: Path) -> None:
    failed = shutil.copytree(runs["replay1"], tmp_path / "failed")
    lines = (failed / "events.jsonl").read_text().splitlines()
    end = {"event": "status", "time": 1.0, "rank": 0, "status": "failed", "error": "RuntimeError: boom"}
    (failed / "events.jsonl").write_text("\n".join([*lines[:-1], json.dumps(end)]) + "\n")
    report = diff_runs(runs["replay1"], failed)
    assert report.verdict == "identical" and report.runs == [
        "run B: failed, 2/2 rollouts: it failed: RuntimeError: boom"
    ]
    assert "status: run B: failed, 2/2 rollouts: it failed: RuntimeError: boom" in report.render()
    assert diff_runs(failed, failed).runs == [
        "run A: failed, 2/2 rollouts: it failed: RuntimeError: boom",
        "run B: failed, 2/2 rollouts: it failed: RuntimeError: boom",
    ]
    assert diff_runs(runs["replay1"], runs["replay2"]).runs == []


def test_run_dir_against_a_log_lists_only_shared_setup_keys(
    runs: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = _cli(capsys, runs["replay1"], LOGS / "grpolab_console.log", "--tol", "0.5")
    assert code == 1 and "(absent)" not in out
    assert "(tolerance 0.5; hashes compare exactly; 2 common steps)" in out
    one_sided = sum(
        1 for d in diff_runs(runs["replay1"], LOGS / "grpolab_console.log").setup if d.only == "A"
    )
    assert one_sided > 50 and f"{one_sided} keys only in run A: not listed, see --json" in out


def test_one_common_step_is_singular() -> None:
    from grpolab.diff import RunDiff

    assert "(bitwise; 1 common step)" in RunDiff("a", "b", "identical", common_steps=1).render()


def test_a_path_named_relative_and_absolute_is_one_path(runs: dict[str, Path], tmp_path: Path) -> None:
    """It listed `model.hf_checkpoint: fixtures/tiny-qwen3 vs /repo/fixtures/tiny-qwen3` as a set-up
    difference: run.json records the folder each run started in (`cwd`), and paths compare resolved."""
    import os

    meta = json.loads((runs["replay1"] / "run.json").read_text())
    assert meta["cwd"] == os.getcwd()  # the trainer records where it started
    model = Path(meta["config"]["model"]["hf_checkpoint"])
    edited = {}
    for side, cwd, given in (("a", str(model.parent), model.name), ("b", "/elsewhere", str(model))):
        copy = shutil.copytree(runs["replay1"], tmp_path / side)
        doc = json.loads((copy / "run.json").read_text())
        doc["cwd"], doc["config"]["model"]["hf_checkpoint"] = cwd, given
        doc["config"]["run"]["run_dir"] = os.path.relpath("/same", cwd) if side == "a" else "/same"
        (copy / "run.json").write_text(json.dumps(doc))
        edited[side] = copy
    report = diff_runs(edited["a"], edited["b"])
    keys = {d.key for d in report.setup}
    assert "model.hf_checkpoint" not in keys and "run.run_dir" not in keys, report.setup
    doc = json.loads((edited["a"] / "run.json").read_text())
    doc["config"]["model"]["hf_checkpoint"] = "another-model"  # a real difference is still one
    (edited["a"] / "run.json").write_text(json.dumps(doc))
    (diff,) = [d for d in diff_runs(edited["a"], edited["b"]).setup if d.key == "model.hf_checkpoint"]
    assert (diff.a, diff.b) == (str(model.parent / "another-model"), str(model))


def test_a_changed_numerics_switch_is_named_in_the_setup(runs: dict[str, Path], tmp_path: Path) -> None:
    """The environment manifest: an env var that changes numbers (MKL's reproducibility mode) and a torch
    switch (oneDNN) recorded in run.json, and `grpolab diff` names both when they change."""
    other = shutil.copytree(runs["replay1"], tmp_path / "other_env")
    meta = json.loads((other / "run.json").read_text())
    env = meta["environment"]
    assert "MKL_CBWR" in env["deterministic"] and env["numerics"]["cpu_capability"]
    env["deterministic"]["MKL_CBWR"] = "COMPATIBLE"
    env["numerics"]["mkldnn_enabled"] = not env["numerics"]["mkldnn_enabled"]
    (other / "run.json").write_text(json.dumps(meta))
    keys = {(d.section, d.key) for d in diff_runs(runs["replay1"], other).setup}
    assert {("env", "deterministic.MKL_CBWR"), ("env", "numerics.mkldnn_enabled")} <= keys

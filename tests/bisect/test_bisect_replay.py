"""`grpolab bisect` with real train-only replays of a recording, over scratch copies of this project (slow:
each replay is a `python -m grpolab train` of the tiny model, 5-20 s; CI: `pytest -m slow tests/bisect`)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from scratch import TRAIN_FLAGS, git, make_scratch_repo

from grpolab.cli import main
from grpolab.rundir.reader import read_run_meta

pytestmark = pytest.mark.slow


def bisect(capsys, repo: Path, commits: list[str], recording: str, out: Path) -> tuple[int, str, str, dict]:
    """`grpolab bisect` over commits[0]..commits[-1]; (exit code, stdout, stderr, report.json)."""
    argv = ["bisect", "--good", commits[0], "--bad", commits[-1], "--repo", str(repo)]
    code = main([*argv, "--recording", recording, "--output-dir", str(out), "--", *TRAIN_FLAGS])
    stdout, stderr = capsys.readouterr()
    newest = max(out.glob("*/report.json"), key=lambda p: p.stat().st_mtime_ns)
    return code, stdout, stderr, json.loads(newest.read_text())


def test_bisect_names_the_loss_change_in_at_most_5_replays_then_reruns_nothing(
    scratch_repo, recording, tmp_path, capsys
):
    repo, commits = scratch_repo
    code, stdout, stderr, report = bisect(capsys, repo, commits, recording, tmp_path / "out")
    short5 = git(repo, "rev-parse", "--short", commits[4])
    assert code == 0, stderr
    assert f"{short5} is the first bad commit\ncommit {commits[4]}\n" in stdout
    assert "commit 5: double the loss denominator" in stdout and "core/algorithms.py | 1 +" in stdout
    assert "first divergent step: 0 (train/loss differs at step 0)" in stdout
    assert report["first_bad"]["commit"] == commits[4]
    assert report["replays"] <= 5  # 3 bisection steps plus the good and bad ends
    assert report["diff"]["first_step"] == 0
    assert "train/loss" in [m["key"] for m in report["diff"]["metrics"] if m["step"] == 0]
    for t in report["tested"]:  # each replay ran the tested commit's code, in bisect/<time>/<hash>
        assert read_run_meta(t["run"]).environment["git_commit"] == t["commit"]
        assert Path(t["run"]).name == t["commit"][:12]
        assert t["verdict"] == ("bad" if commits.index(t["commit"]) >= 4 else "good")

    code2, stdout2, _, report2 = bisect(capsys, repo, commits, recording, tmp_path / "out")
    assert code2 == 0 and f"{short5} is the first bad commit" in stdout2
    assert report2["replays"] == 0 and all(t["cached"] for t in report2["tested"])


def test_a_commit_that_does_not_import_is_skipped(recording, tmp_path, capsys):
    repo = tmp_path / "repo"
    repo.mkdir()
    commits = make_scratch_repo(repo, broken=6)
    # good = commit 4: git splits 5..8 at commit 6 (the best split), which does not import
    code, stdout, stderr, report = bisect(capsys, repo, commits[3:], recording, tmp_path / "out")
    assert code == 0, stderr
    assert report["first_bad"]["commit"] == commits[4]
    broken = report["tested"][2]
    assert broken["commit"] == commits[5]
    assert broken["verdict"] == "skip" and broken["status"] == "crashed"
    assert "SyntaxError" in broken["tail"]

"""`grpolab bisect` without replays: bad input (exit 2), the dirty-tree note, git's order, the cache key,
and which grpolab a replay imports."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from scratch import git

import grpolab
from grpolab.cli import main
from grpolab.diff.bisect_git import next_commit
from grpolab.diff.bisect_run import ReplaySpec, cache_key, run_pythonpath


@pytest.fixture
def tiny_repo(tmp_path: Path) -> tuple[Path, list[str]]:
    """A 4-commit repository of one text file (not grpolab: nothing here imports it)."""
    repo = tmp_path / "tiny"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    commits = []
    for n in range(1, 5):
        (repo / "f.txt").write_text(f"{n}\n")
        git(repo, "add", "f.txt")
        git(repo, "commit", "-q", "-m", f"c{n}")
        commits.append(git(repo, "rev-parse", "HEAD"))
    return repo, commits


@pytest.fixture
def fake_recording(tmp_path: Path) -> str:
    """A template whose rollout 0 file exists (its bytes are only hashed: no replay reads it here)."""
    (tmp_path / "rec").mkdir()
    (tmp_path / "rec" / "r_0.grz").write_bytes(b"not read")
    return str(tmp_path / "rec" / "r_{rollout_id}.grz")


def bisect(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["bisect", *argv])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize(
    ("which", "expected"),
    [
        ("missing_rev", "--bad nope: no such commit in"),
        ("same", "--good and --bad are the same commit"),
        ("reversed", "is not an ancestor of --bad"),
        ("no_match", "matches nothing"),
        ("no_field", "must contain {rollout_id}"),
        ("cmd_field", "must contain {run_dir}"),
        ("not_repo", "not a git repository"),
    ],
)
def test_bad_input_exits_2(which, expected, tiny_repo, fake_recording, tmp_path, capsys):
    repo, c = tiny_repo
    good, bad, rec, repo_arg = c[0], c[-1], fake_recording, str(repo)
    extra: list[str] = []
    if which == "missing_rev":
        bad = "nope"
    elif which == "same":
        bad = good
    elif which == "reversed":
        good, bad = bad, good
    elif which == "no_match":
        rec = str(tmp_path / "elsewhere" / "r_{rollout_id}.grz")
    elif which == "no_field":
        rec = str(tmp_path / "rec" / "r_0.grz")
    elif which == "cmd_field":
        extra = ["--cmd", "echo hi"]
    else:
        repo_arg = str(tmp_path / "rec")
    argv = ["--good", good, "--bad", bad, "--repo", repo_arg, "--recording", rec, *extra]
    code, out, err = bisect(capsys, *argv, "--output-dir", str(tmp_path / "out"))
    assert code == 2, err
    assert err.startswith("grpolab bisect: error: ") and expected in err, err
    assert not (tmp_path / "out").exists()  # bad input is refused before anything is written


def test_dirty_tree_runs_committed_code_and_says_so(tiny_repo, tmp_path, capsys, monkeypatch):
    repo, c = tiny_repo
    (repo / "f.txt").write_text("uncommitted\n")
    monkeypatch.chdir(tmp_path)
    cmd = "sleep 5; cat f.txt > {run_dir}"
    code, out, err = bisect(
        capsys, "--good", c[0], "--bad", c[-1], "--repo", str(repo), "--cmd", cmd, "--timeout", "0.5"
    )
    assert code == 1  # the good end timed out: nothing to compare with
    assert "has uncommitted changes: bisect runs committed code only" in err
    assert "did not run (timed out)" in err
    (report_file,) = (tmp_path / "bisect").glob("*/report.json")
    report = json.loads(report_file.read_text())
    assert report["exit_code"] == 1 and report["first_bad"] is None
    assert any("uncommitted changes" in n for n in report["notes"])
    assert [t["status"] for t in report["tested"]] == ["timeout"]
    assert report["tested"][0]["commit"] == c[0] and report["tested"][0]["verdict"] == "skip"
    assert (repo / "f.txt").read_text() == "uncommitted\n"  # the user's work tree is untouched
    assert git(repo, "worktree", "list").count("\n") == 0  # the temporary worktree is gone


def test_next_commit_follows_git_and_ends_on_skips(tiny_repo):
    repo, c = tiny_repo
    first, done = next_commit(repo, c[3], [c[0]], set())
    assert done == [] and first in c[1:3]
    assert next_commit(repo, c[1], [c[0]], set()) == (None, [c[1]])  # bad is right after good
    nxt, done = next_commit(repo, c[3], [c[0]], {c[1], c[2]})  # only skipped commits left
    assert nxt is None and set(done) == {c[1], c[2], c[3]} and done[-1] == c[3]


def test_cache_key_covers_commit_recording_flags_not_timeout():
    spec = ReplaySpec("/r_{rollout_id}.grz", "ab" * 32, 2, ("--lr", "1e-5"), None, 60.0, True)
    key = cache_key("1" * 40, spec)
    assert len(key) == 64 and key == cache_key("1" * 40, replace(spec))
    assert cache_key("1" * 40, replace(spec, timeout_s=5.0)) == key
    others = [
        cache_key("2" * 40, spec),
        cache_key("1" * 40, replace(spec, recording_digest="cd" * 32)),
        cache_key("1" * 40, replace(spec, num_rollout=1)),
        cache_key("1" * 40, replace(spec, train_flags=("--lr", "2e-5"))),
        cache_key("1" * 40, replace(spec, cmd="x {run_dir}")),
    ]
    assert len(set(others)) == len(others) and key not in others


def test_replay_imports_the_worktrees_grpolab(scratch_repo, tmp_path):
    """The editable install of this checkout must not win over the worktree linked on PYTHONPATH."""
    repo, commits = scratch_repo
    worktree = tmp_path / "wt"
    git(repo, "worktree", "add", "--detach", str(worktree), commits[0])
    try:
        spec = ReplaySpec(None, "", 1, (), None, 60.0, True)
        env = dict(os.environ, PYTHONPATH=run_pythonpath(spec, worktree, tmp_path / "scratch"))
        probe = "import grpolab, grpolab.diff.bisect; print(grpolab.__file__); print(grpolab.diff.bisect.__file__)"
        python = [sys.executable, *(["-P"] if sys.version_info >= (3, 11) else [])]
        done = subprocess.run([*python, "-c", probe], env=env, capture_output=True, text=True, check=True)
        pkg, mod = (Path(line).resolve() for line in done.stdout.split())
        assert pkg == worktree.resolve() / "__init__.py"
        assert mod == worktree.resolve() / "diff" / "bisect.py"
    finally:
        git(repo, "worktree", "remove", "--force", str(worktree))


def test_another_repository_is_on_pythonpath_with_the_installed_grpolab(tiny_repo, tmp_path):
    """A repository that is not grpolab (a custom reward module): the worktree is importable and
    grpolab stays the installed one."""
    repo, c = tiny_repo
    (repo / "my_reward.py").write_text("VALUE = 7\n")
    git(repo, "add", "my_reward.py")
    git(repo, "commit", "-q", "-m", "reward")
    worktree = tmp_path / "wt"
    git(repo, "worktree", "add", "--detach", str(worktree), "HEAD")
    try:
        spec = ReplaySpec(None, "", 1, (), None, 60.0, False)
        env = dict(os.environ, PYTHONPATH=run_pythonpath(spec, worktree, tmp_path / "scratch"))
        probe = "import grpolab, my_reward; print(grpolab.__file__); print(my_reward.__file__)"
        done = subprocess.run(
            [sys.executable, "-c", probe], env=env, capture_output=True, text=True, check=True
        )
        pkg, mod = (Path(line).resolve() for line in done.stdout.split())
        assert pkg == Path(grpolab.__file__).resolve()
        assert mod == worktree.resolve() / "my_reward.py"
    finally:
        git(repo, "worktree", "remove", "--force", str(worktree))

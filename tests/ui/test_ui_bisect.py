"""The Bisect page: past `grpolab bisect` reports listed from report.json, a bisect started as a job."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from grpolab.diff.report import MetricDivergence, RunDiff
from grpolab.ui import bisect_reports, jobs
from grpolab.ui.bisect_reports import BisectRequest

APP = Path(__file__).resolve().parents[2] / "ui" / "app.py"
FIRST_BAD = {
    "commit": "5e0c2b1d9a8f7e6d5c4b3a29180716253e4f5a6b",
    "short": "5e0c2b1",
    "subject": "loss: divide by the token count",
    "author_date": "2026-11-30T10:05:00+00:00",
    "show": "commit 5e0c2b1d9a8f\n\n    loss: divide by the token count\n\n core/loss.py | 2 +-",
}


def _tested(commit: str, short: str, verdict: str, seconds: float, run: str, **more: object) -> dict:
    """One tested commit as diff/bisect.py's Tested.to_dict writes it."""
    row = {"commit": commit, "short": short, "subject": f"commit {short}", "verdict": verdict, "reason": ""}
    row |= {"run": run, "status": "ran", "seconds": seconds, "run_path": run, "output": run + ".out"}
    return row | {"exit_code": 0, "tail": "", "cached": False} | more


TESTED = [
    _tested("a1" * 20, "a1a1a1a", "good", 6.1, "/tmp/bisect/a1", reason="reference"),
    _tested("b2" * 20, "b2b2b2b", "bad", 6.4, "/tmp/bisect/b2", first_step=0, metrics=["train/loss"]),
    _tested(
        FIRST_BAD["commit"], "5e0c2b1", "bad", 5.9, "/tmp/bisect/5e", first_step=0, metrics=["train/loss"]
    ),
    _tested(
        "c3" * 20, "c3c3c3c", "skip", 0.8, "/tmp/bisect/c3", status="crashed", exit_code=1, reason="exit 1"
    ),
]
DIFF = RunDiff(
    "/tmp/bisect/a1",
    "/tmp/bisect/5e",
    "differs",
    metrics=[MetricDivergence("train/loss", 0, 0.125, 0.25)],
    first_step=0,
    common_steps=2,
).to_dict()


def _page(monkeypatch: pytest.MonkeyPatch, root: Path, folder: Path) -> AppTest:
    monkeypatch.setenv("GRPOLAB_UI_ROOTS", str(root))
    at = AppTest.from_file(str(APP), default_timeout=120).run()
    at.switch_page("app_pages/bisect.py").run()
    at.text_input(key="bisect_dir").input(str(folder)).run()
    return at


def _texts(at: AppTest, kind: str) -> list[str]:
    return [str(e.value) for e in getattr(at, kind)]


@pytest.fixture
def bisect_dir(tmp_path: Path) -> Path:
    folder = tmp_path / "bisect"
    (folder / "20261201T101500Z").mkdir(parents=True)
    report = {"good": "a1" * 20, "bad": "b2" * 20, "exit_code": 0, "replays": 3, "tested": TESTED}
    report |= {"first_bad": FIRST_BAD, "diff": DIFF, "notes": ["/repo has uncommitted changes"]}
    (folder / "20261201T101500Z" / "report.json").write_text(json.dumps(report))
    (folder / "20261130T090000Z").mkdir()
    (folder / "20261130T090000Z" / "report.json").write_text("{not json")
    (folder / "20261201T120000Z").mkdir()  # a bisect still running: no report.json yet
    return folder


def test_list_reports_newest_first(bisect_dir: Path) -> None:
    found = bisect_reports.list_reports(bisect_dir)
    assert [f.folder.name for f in found] == ["20261201T101500Z", "20261130T090000Z"]
    assert found[0].first_bad == FIRST_BAD and found[0].tested == TESTED and found[0].error is None
    assert found[1].error is not None and found[1].error.startswith(str(bisect_dir / "20261130T090000Z"))
    assert "is not JSON" in found[1].error and found[1].first_bad is None
    assert bisect_reports.list_reports(bisect_dir / "missing") == []


def test_bisect_args() -> None:
    req = BisectRequest(
        good="v1",
        bad="HEAD",
        output_dir=Path("/tmp/b"),
        recording="/r/rollout_{rollout_id}.grz",
        num_rollout=2,
        metrics=("train/loss",),
        train_flags="--lr 1e-5 --micro-batch-size '2'",
    )
    assert bisect_reports.bisect_args(req) == [
        "bisect", "--good", "v1", "--bad", "HEAD", "--recording", "/r/rollout_{rollout_id}.grz",
        "--num-rollout", "2", "--metric", "train/loss", "--tol", "0", "--output-dir", "/tmp/b",
        "--", "--lr", "1e-5", "--micro-batch-size", "2",
    ]  # fmt: skip
    with pytest.raises(ValueError, match="--recording"):
        bisect_reports.bisect_args(BisectRequest("v1", "HEAD", Path("/tmp/b")))
    with pytest.raises(ValueError, match="--good is required"):
        bisect_reports.bisect_args(BisectRequest(" ", "HEAD", Path("/tmp/b"), recording="r"))
    with pytest.raises(ValueError, match="unclosed|quotation"):
        bisect_reports.bisect_args(
            BisectRequest("v1", "HEAD", Path("/tmp/b"), recording="r", train_flags="'x")
        )


def test_bisect_page_lists_past_reports(
    bisect_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    at = _page(monkeypatch, tmp_path, bisect_dir)
    assert not at.exception
    assert _texts(at, "subheader") == ["20261201T101500Z", "20261130T090000Z"]
    assert "`5e0c2b1` is the first bad commit" in _texts(at, "error")
    assert any(
        "loss: divide by the token count" in m and "2026-11-30T10:05" in m for m in _texts(at, "markdown")
    )
    assert any("core/loss.py | 2 +-" in c for c in _texts(at, "code"))
    tested = at.dataframe[0].value
    assert tested["short"].tolist() == ["a1a1a1a", "b2b2b2b", "5e0c2b1", "c3c3c3c"]
    assert tested["verdict"].tolist() == ["good", "bad", "bad", "skip"]
    assert tested["seconds"].tolist() == [6.1, 6.4, 5.9, 0.8]
    assert tested["run"].tolist() == ["/tmp/bisect/a1", "/tmp/bisect/b2", "/tmp/bisect/5e", "/tmp/bisect/c3"]
    assert tested["metrics"].tolist() == ["", "train/loss", "train/loss", ""]
    assert "4 commits tested, 3 replayed (the others from the cache)" in _texts(at, "caption")
    assert any(
        m.startswith("**grpolab diff** (good vs first bad): differs; first divergent step 0")
        for m in _texts(at, "markdown")
    )
    divergence = at.dataframe[1].value
    assert divergence[["key", "step", "a", "b"]].values.tolist() == [["train/loss", 0, 0.125, 0.25]]
    assert "/repo has uncommitted changes" in _texts(at, "warning")
    assert any("Unreadable bisect report" in w and "is not JSON" in w for w in _texts(at, "warning"))


def test_bisect_page_starts_the_command(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = tmp_path / "bisect"
    at = _page(monkeypatch, tmp_path, folder)
    assert any("No bisect reports under" in i for i in _texts(at, "info"))
    at.button(key="bisect_start").click().run()
    assert "--good is required" in _texts(at, "error")
    at.text_input(key="bisect_good").input("no-such-rev-xyz")
    at.button(key="bisect_start").click().run()
    assert "--recording (or --cmd) is required" in _texts(at, "error")
    assert jobs.get(("bisect", str(folder))) is None
    at.text_input(key="bisect_recording").input(str(tmp_path / "rollout_{rollout_id}.grz"))
    at.text_input(key="bisect_flags").input("--lr 1e-5")
    at.button(key="bisect_start").click().run()  # starts it, polls until it ends: a bad --good is exit 2
    assert not at.exception
    job = jobs.get(("bisect", str(folder)))
    assert job is not None and job.command == (
        f"grpolab bisect --good no-such-rev-xyz --bad HEAD --recording {tmp_path}/rollout_{{rollout_id}}.grz "
        f"--tol 0 --output-dir {folder} -- --lr 1e-5"
    )
    assert job.returncode == 2
    shown = f"`grpolab bisect --good no-such-rev-xyz --bad HEAD --recording '{tmp_path}/rollout_{{rollout_id}}.grz' "
    assert any(e.startswith(shown) and "refused its input (exit 2)" in e for e in _texts(at, "error"))
    assert "grpolab bisect: error: --good no-such-rev-xyz: no such commit in" in _texts(at, "code")[-1]
    assert not folder.exists()  # bad input: nothing written


LOG_CMD = "printf \"step 0: {'train/loss': %s, 'train/grad_norm': 1.0}\\n\" \"$(cat loss.txt)\" > {run_dir}"
"""Writes a one-step Miles log line whose train/loss is the commit's loss.txt (as tests/bisect do)."""


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True).stdout


def _log_repo(repo: Path) -> list[str]:
    """A 4-commit repository whose commit 3 halves loss.txt; its commits' short hashes, oldest first."""
    repo.mkdir()
    _git(repo, "init", "-q", "-b", "main")
    for n in range(1, 5):
        (repo / "loss.txt").write_text("0.5\n" if n < 3 else "0.25\n")
        (repo / "n.txt").write_text(f"{n}\n")
        _git(repo, "add", "loss.txt", "n.txt")
        _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", f"commit {n}")
    return _git(repo, "log", "--reverse", "--format=%h").split()


def test_bisect_page_runs_a_cmd_bisect_and_lists_its_report(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A real `grpolab bisect --cmd` (a shell command writing a Miles log: seconds, no model) started from
    the form: its progress lines, git bisect's answer, and its report.json listed."""
    commits = _log_repo(tmp_path / "repo")
    folder = tmp_path / "bisect"
    at = _page(monkeypatch, tmp_path, folder)
    at.text_input(key="bisect_good").input(commits[0])
    at.text_input(key="bisect_bad").input(commits[-1])
    at.text_input(key="bisect_repo").input(str(tmp_path / "repo"))
    at.text_input(key="bisect_cmd").input(LOG_CMD)
    at.button(key="bisect_start").click().run()  # polls until the command ends
    assert not at.exception
    job = jobs.get(("bisect", str(folder)))
    assert job is not None and job.returncode == 0, job.stderr_tail()
    assert any("named the first bad commit" in s for s in _texts(at, "success"))
    output = _texts(at, "code")[0]
    progress = [line.split()[1:3] for line in output.splitlines() if line.startswith("bisect: ")]
    assert progress[:2] == [[commits[0], "good"], [commits[-1], "bad"]]  # the ends first
    assert [commits[2], "bad"] in progress and f"{commits[2]} is the first bad commit" in output
    assert f"`{commits[2]}` is the first bad commit" in _texts(at, "error")
    (report,) = bisect_reports.list_reports(folder)
    tested = at.dataframe[0].value
    assert tested["short"].tolist() == [t["short"] for t in report.tested] == [c for c, _ in progress]
    assert set(tested["verdict"]) <= {"good", "bad"} and len(tested) <= 4

"""Scratch git repositories made from this project's tree, for `grpolab bisect`'s tests and
benchmarks/bench_bisect.py.

A scratch repository holds the project's committed tree (HEAD's, tests/ left out: files being edited
in this checkout may not fit together yet) as commit 1, then 7 more
commits; commit 5 doubles the loss denominator in core/algorithms.py (`aggregate_loss`), so every
replay from commit 5 on logs another train/loss at step 0. `broken=K` makes commit K's code fail to
import (a syntax error in core/algorithms.py, fixed again by commit K+1).
"""

from __future__ import annotations

import io
import subprocess
import tarfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SHAPE = ["--rollout-batch-size", "2", "--n-samples-per-prompt", "2", "--rollout-max-response-len", "8"]
TRAIN_FLAGS = [*SHAPE, "--entropy-coef", "0.01", "--no-progress"]
"""The replay's shape (tests/runs.py SHORT without --num-rollout: 2 prompts × 2 answers, 8 tokens) and an
entropy bonus, so train/loss is not 0 (the recording's rewards are all 0: no policy-gradient loss)."""
LOSS_LINE = "    _check_same_shape(values_BT=values_BT, mask_BT=mask_BT)\n    if not denominator > 0:\n"
BAD_LOSS = "    _check_same_shape(values_BT=values_BT, mask_BT=mask_BT)\n    denominator = 2 * denominator\n    if not denominator > 0:\n"


def git(repo: Path, *args: str) -> str:
    """`git -C repo ARGS` with a fixed identity; stdout."""
    env_args = ["-c", "user.name=Bisect Test", "-c", "user.email=bisect@test", "-c", "commit.gpgsign=false"]
    done = subprocess.run(
        ["git", "-C", str(repo), *env_args, *args], capture_output=True, text=True, check=True
    )
    return done.stdout.strip()


def make_scratch_repo(root: Path, *, broken: int | None = None) -> list[str]:
    """Build the 8-commit scratch repository at `root`; returns the commit hashes, oldest first."""
    tar = subprocess.run(
        ["git", "-C", str(REPO), "archive", "--format=tar", "HEAD"], capture_output=True, check=True
    )
    with tarfile.open(fileobj=io.BytesIO(tar.stdout)) as archive:
        archive.extractall(root, members=[m for m in archive.getmembers() if not m.name.startswith("tests/")])
    git(root, "init", "-q", "-b", "main")
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", "commit 1: the project's tree")
    algorithms = root / "core" / "algorithms.py"
    assert LOSS_LINE in algorithms.read_text(), "aggregate_loss changed: update tests/bisect/conftest.py"
    commits = [git(root, "rev-parse", "HEAD")]
    for n in range(2, 9):
        text = algorithms.read_text().replace("raise SyntaxError_on_purpose(\n", "")
        if n == 5:
            text = text.replace(LOSS_LINE, BAD_LOSS)
        if n == broken:
            text += "raise SyntaxError_on_purpose(\n"
        algorithms.write_text(text)
        notes = root / "BISECT_NOTES.txt"
        notes.write_text(notes.read_text() + f"{n}\n" if notes.exists() else f"{n}\n")
        git(root, "add", "-A")
        git(root, "commit", "-q", "-m", f"commit {n}" + (": double the loss denominator" if n == 5 else ""))
        commits.append(git(root, "rev-parse", "HEAD"))
    return commits

"""`grpolab bisect` wall time over 8 commits ÷ one replay's wall time (issue 13; goal ≤ 6×).

Builds the 8-commit scratch repository of the tests (tests/bisect/scratch.py: this project's committed
tree, commit 5 doubles the loss denominator), records a real 2-rollout run of the tiny model, then:
1. one replay: the exact process bisect starts per commit (`bisect_run.run_commit` on a worktree of
   commit 1), `--reps` times, median (worktree set-up excluded: it is part of bisect's overhead);
2. `grpolab bisect --good commit1 --bad commit8` from an empty cache, in this process, wall time;
   it must name commit 5. The ideal is 5 replays (3 bisection steps plus the two ends); the rest is
   git, worktrees and the comparisons.
Run: `python benchmarks/bench_bisect.py [--reps 3] [--threads 1]`.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "bisect"))

from scratch import TRAIN_FLAGS, git, make_scratch_repo  # noqa: E402

from grpolab.diff.bisect_run import ReplaySpec, digest_files, recording_files, run_commit  # noqa: E402


def record(tmp: Path) -> str:
    """A 2-rollout recording of a real run with the tests' shape; returns its template."""
    template = str(tmp / "rec" / "r_{rollout_id}.grz")
    argv = ["train", "--num-rollout", "2", *TRAIN_FLAGS, "--save-debug-rollout-data", template]
    cmd = [sys.executable, "-m", "grpolab", *argv, "--run-dir", str(tmp / "rec" / "run")]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    return template


def one_replay(repo: Path, commit: str, template: str, tmp: Path, rep: int) -> float:
    """Seconds of one replay process at `commit` (what bisect runs per commit)."""
    files = recording_files(template, None)
    spec = ReplaySpec(template, digest_files(files), len(files), tuple(TRAIN_FLAGS), None, 3600.0, True)
    scratch = tmp / f"replay{rep}"
    scratch.mkdir()
    git(repo, "worktree", "add", "--detach", str(scratch / "wt"), commit)
    try:
        (scratch / "runs").mkdir()
        outcome = run_commit(commit, spec, scratch / "wt", scratch, scratch / "runs" / "run")
    finally:
        git(repo, "worktree", "remove", "--force", str(scratch / "wt"))
    assert outcome.status == "ran", outcome.tail
    return outcome.seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=3, help="single replays timed (median)")
    parser.add_argument("--threads", type=int, default=1, help="OMP_NUM_THREADS of every run")
    args = parser.parse_args()
    os.environ["OMP_NUM_THREADS"] = str(args.threads)
    tmp = Path(tempfile.mkdtemp(prefix="bench-bisect-"))
    (tmp / "repo").mkdir()
    commits = make_scratch_repo(tmp / "repo")
    template = record(tmp)
    replays = [one_replay(tmp / "repo", commits[0], template, tmp, i) for i in range(args.reps)]
    replay = statistics.median(replays)

    from grpolab.cli import main as grpolab

    argv = ["bisect", "--good", commits[0], "--bad", commits[-1], "--repo", str(tmp / "repo")]
    argv += ["--recording", template, "--output-dir", str(tmp / "bisect"), "--", *TRAIN_FLAGS]
    t0 = time.perf_counter()
    code = grpolab(argv)
    wall = time.perf_counter() - t0
    report = json.loads(next((tmp / "bisect").glob("*/report.json")).read_text())
    assert code == 0 and report["first_bad"]["commit"] == commits[4], report["notes"]
    in_runs = sum(t["seconds"] for t in report["tested"])

    print(f"load average: {os.getloadavg()[0]:.1f}; OMP_NUM_THREADS={args.threads}")
    print(f"one replay: median {replay:.1f} s of {[round(r, 1) for r in replays]}")
    print(
        f"bisect over 8 commits: {wall:.1f} s, {report['replays']} replays ({in_runs:.1f} s in them, "
        f"{wall - in_runs:.1f} s git/worktrees/diffs) -> {wall / replay:.2f}x one replay (goal <= 6x)"
    )
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()

"""Per-step hash overhead: the default run's step time with `--save-model-hash-every-step` against
the same run without it (issue 13, goal ≤ 5 % of step time).

What it measures: `grpolab train` with the default flags (tiny fixture model, arithmetic prompts, 8
prompts × 8 answers, 32 tokens) and `--num-rollout R`, run A (no hashes) and B (hashes after every
optimizer step into RUN_DIR/checks/) alternately, `--reps` times each, in this process. A run's step
time is the median `perf/step_time` of its rollouts after the first (rollout 0 pays the warm-up); a
side's is the median over its runs; B / A is the whole-run ratio. The hashing itself happens inside
the step (the actor calls it after `optimizer.step()`), so the script also times the writes directly
(`checkers.step_hash.save_step_hashes`: SHA-256 of every parameter plus the atomic JSON write) as a
share of the step time of the same rollouts: on a shared machine load moves step times by more than
the 5 % goal, and that direct share is the figure to trust.

Run:  python benchmarks/bench_step_hash.py [--reps 2] [--rollouts 4] [--threads 1]
About 2-5 minutes on a 2-core CPU.
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import machine  # noqa: E402

from grpolab.checkers import step_hash  # noqa: E402
from grpolab.cli import build_parser, config_from_args  # noqa: E402
from grpolab.rundir.reader import read_metrics  # noqa: E402
from grpolab.train.loop import GRPORun  # noqa: E402


class TimedSave:
    """Wraps `step_hash.save_step_hashes`, adding up its seconds for steps of rollouts after the first."""

    def __init__(self, steps_per_rollout: int) -> None:
        self.save, self.steps_per_rollout = step_hash.save_step_hashes, steps_per_rollout
        self.seconds, self.calls = 0.0, 0

    def __call__(self, run_dir: Any, step: int, *args: Any, **kwargs: Any) -> Path:
        start = time.perf_counter()
        try:
            return self.save(run_dir, step, *args, **kwargs)
        finally:
            self.calls += 1
            if step >= self.steps_per_rollout:
                self.seconds += time.perf_counter() - start


def one_run(run_dir: Path, rollouts: int, threads: int, hashed: bool) -> tuple[float, float, float, int]:
    """(median perf/step_time after rollout 0, run wall seconds, share of those rollouts' step time
    spent writing hashes, hash files written) of one run, stdout quiet."""
    argv = ["train", "--num-rollout", str(rollouts), "--no-progress", "--run-dir", str(run_dir)]
    argv += ["--num-threads", str(threads), *(["--save-model-hash-every-step"] if hashed else [])]
    config = config_from_args(build_parser().parse_args(argv))
    timed = TimedSave(config.steps_per_rollout)
    step_hash.save_step_hashes = timed  # type: ignore[assignment]
    try:
        start = time.perf_counter()
        run = GRPORun.create(config, ["grpolab", *argv])
        for handler in logging.getLogger("grpolab").handlers:
            if getattr(handler, "_grpolab_stdout", False):
                handler.setLevel(logging.WARNING)
        run.run()
        wall = time.perf_counter() - start
    finally:
        step_hash.save_step_hashes = timed.save  # type: ignore[assignment]
    steps = [r.metrics["perf/step_time"] for r in read_metrics(run_dir, "perf")][1:]
    return statistics.median(steps), wall, timed.seconds / sum(steps), len(step_hash.step_hash_files(run_dir))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reps", type=int, default=2, help="runs per side, alternating A B A B ...")
    ap.add_argument("--rollouts", type=int, default=4, help="--num-rollout of each run (>= 2)")
    ap.add_argument("--threads", type=int, default=1, help="--num-threads of both sides")
    opts = ap.parse_args()
    if opts.rollouts < 2:
        ap.error("--rollouts must be >= 2: rollout 0 is left out of the step time")
    load0 = os.getloadavg()[0]
    sides: dict[bool, list[tuple[float, float, float, int]]] = {False: [], True: []}
    with tempfile.TemporaryDirectory(prefix="bench-step-hash-") as tmp:
        for rep in range(opts.reps):
            for hashed in (False, True):
                run_dir = Path(tmp) / f"{'B' if hashed else 'A'}{rep}"
                sides[hashed].append(one_run(run_dir, opts.rollouts, opts.threads, hashed))
    plain = statistics.median(r[0] for r in sides[False])
    hashed_step = statistics.median(r[0] for r in sides[True])
    inside = statistics.median(r[2] for r in sides[True])
    print(
        f"step time with --save-model-hash-every-step / without: {hashed_step / plain:.3f}x by median; "
        f"hash writes inside the steps: {100 * inside:.2f} % of step time (goal <= 5 %)"
    )
    print()
    load1 = os.getloadavg()[0]
    print(f"context: {machine()}, threads {opts.threads}, load avg at start {load0:.2f}, end {load1:.2f}")
    for hashed, label in ((False, "A without"), (True, "B with   ")):
        runs = sides[hashed]
        steps = " ".join(f"{r[0]:.3f}" for r in runs)
        walls = " ".join(f"{r[1]:.1f}" for r in runs)
        files = " ".join(str(r[3]) for r in runs)
        print(
            f"  {label}: median step {statistics.median(r[0] for r in runs):.3f} s (runs: {steps}); "
            f"run wall s: {walls}; hash files: {files}"
        )


if __name__ == "__main__":
    main()

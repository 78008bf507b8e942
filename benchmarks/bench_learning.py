"""Learning check: does the default GRPO task improve the reward over 30 rollouts?

What it measures: `grpolab train --num-rollout 30` with every other flag at its default (tiny
fixture model, arithmetic prompts, 8 prompts × 8 samples, lr 2e-4, seed 1234), run directory in a
temporary folder. Prints the mean `rollout/raw_reward` of the first 5 rollouts (the baseline: the
warm-started model before GRPO has done much) against the last 5, and their difference, plus
the whole reward curve. Rewards are measured on each rollout's own fresh prompts, so the curve
is noisy; the 5-rollout means smooth it a little.

Goal: last-5 mean clearly above first-5 mean (difference > 0).

Run:  python benchmarks/bench_learning.py [--rollouts 30] [--seed 1234] [--threads N]
About 1.5-3 minutes on a 2-core CPU.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import machine  # noqa: E402

from grpolab.cli import build_parser, config_from_args  # noqa: E402
from grpolab.rundir.reader import read_metrics  # noqa: E402
from grpolab.train.loop import GRPORun  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rollouts", type=int, default=30)
    ap.add_argument("--seed", type=int, default=None, help="--seed for the run (default: grpolab's)")
    ap.add_argument("--threads", type=int, default=None, help="--num-threads (default: torch's)")
    ap.add_argument("--window", type=int, default=5, help="rollouts averaged at each end")
    opts = ap.parse_args()
    load0 = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="bench-learning-") as tmp:
        run_dir = Path(tmp) / "run"
        argv = ["train", "--num-rollout", str(opts.rollouts), "--no-progress", "--run-dir", str(run_dir)]
        if opts.seed is not None:
            argv += ["--seed", str(opts.seed)]
        if opts.threads is not None:
            argv += ["--num-threads", str(opts.threads)]
        config = config_from_args(build_parser().parse_args(argv))
        t0 = time.perf_counter()
        run = GRPORun.create(config, ["grpolab", *argv])
        for h in logging.getLogger("grpolab").handlers:
            if getattr(h, "_grpolab_stdout", False):
                h.setLevel(logging.WARNING)
        run.run()
        wall = time.perf_counter() - t0
        rewards = [r.metrics["rollout/raw_reward"] for r in read_metrics(run_dir, "rollout")]
        steps = [r.metrics["perf/step_time"] for r in read_metrics(run_dir, "perf")]
    w = opts.window
    first, last = sum(rewards[:w]) / w, sum(rewards[-w:]) / w
    print(
        f"mean rollout/raw_reward: first {w} {first:.4f}  last {w} {last:.4f}  difference {last - first:+.4f}"
    )
    print()
    threads = opts.threads or "torch default"
    print(f"context: {machine()}, threads {threads}, load avg at start {load0:.2f}, seed {config.run.seed}")
    print(f"  {len(rewards)} rollouts in {wall:.1f} s (median step {sorted(steps)[len(steps) // 2]:.2f} s)")
    print("  reward curve: " + " ".join(f"{r:.2f}" for r in rewards))


if __name__ == "__main__":
    main()

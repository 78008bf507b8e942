"""Monitoring overhead: the default run's step time with `--use-wandb --wandb-mode offline
--use-tensorboard` against the same run without them.

What it measures: `grpolab train` with the default flags (tiny fixture model, arithmetic prompts, 8
prompts × 8 answers, 32 tokens) and `--num-rollout R`, run A (no monitoring) and B (wandb offline +
TensorBoard, both writing into the run directory) alternately, `--reps` times each, in this process.
A run's step time is the median `perf/step_time` of its rollouts after the first (rollout 0 pays the
warm-up); a side's is the median over its runs. The ratio B / A is the overhead (goal ≤ 1.03: 3 %,
issue 14). wandb's core process runs beside the trainer and competes for the same cores, so its cost
shows in the step time; wandb.init / finish (about 1 s each start) happen outside the steps and are
printed apart, as the start-up cost. On a shared 2-core machine the load moves step times by more
than 3 %, so the script also prints the ratio of the fastest runs and what the sinks cost inside the
steps directly: the seconds spent in the loop's `Monitor.record` calls (wandb.log, add_scalar) of the
rollouts after the first, as a share of those rollouts' step time.

Run:  python benchmarks/bench_monitoring.py [--reps 3] [--rollouts 6] [--threads 1]
About 2-4 minutes on a 2-core CPU.
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import machine  # noqa: E402

from grpolab.cli import build_parser, config_from_args  # noqa: E402
from grpolab.rundir.reader import read_metrics  # noqa: E402
from grpolab.train.loop import GRPORun  # noqa: E402

MONITORING = ["--use-wandb", "--wandb-mode", "offline", "--use-tensorboard"]


class Timed:
    """Wraps a Monitor's `record`, adding up its seconds for records of rollouts after the first."""

    def __init__(self, record: Callable[..., bool]) -> None:
        self.record, self.seconds = record, 0.0

    def __call__(self, kind: str, rollout_id: int, *args: Any, **kwargs: Any) -> bool:
        start = time.perf_counter()
        try:
            return self.record(kind, rollout_id, *args, **kwargs)
        finally:
            if rollout_id > 0:
                self.seconds += time.perf_counter() - start


def one_run(run_dir: Path, rollouts: int, threads: int, monitored: bool) -> tuple[float, float, float]:
    """(median perf/step_time after rollout 0, seconds of the whole run, share of the step time after
    rollout 0 spent in Monitor.record) of one run, stdout quiet."""
    argv = ["train", "--num-rollout", str(rollouts), "--no-progress", "--run-dir", str(run_dir)]
    argv += ["--num-threads", str(threads), *(MONITORING if monitored else [])]
    config = config_from_args(build_parser().parse_args(argv))
    start = time.perf_counter()
    run = GRPORun.create(config, ["grpolab", *argv])
    timed = run.monitor.record = Timed(run.monitor.record)  # type: ignore[method-assign]
    for handler in logging.getLogger("grpolab").handlers:
        if getattr(handler, "_grpolab_stdout", False):
            handler.setLevel(logging.WARNING)
    run.run()
    wall = time.perf_counter() - start
    steps = [r.metrics["perf/step_time"] for r in read_metrics(run_dir, "perf")][1:]
    return statistics.median(steps), wall, timed.seconds / sum(steps)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reps", type=int, default=3, help="runs per side, alternating A B A B ...")
    ap.add_argument("--rollouts", type=int, default=6, help="--num-rollout of each run (>= 2)")
    ap.add_argument("--threads", type=int, default=1, help="--num-threads of both sides")
    opts = ap.parse_args()
    if opts.rollouts < 2:
        ap.error("--rollouts must be >= 2: rollout 0 is left out of the step time")
    os.environ.pop("TENSORBOARD_DIR", None)  # TensorBoard files go into each run directory
    load0 = os.getloadavg()[0]
    sides: dict[bool, list[tuple[float, float, float]]] = {False: [], True: []}
    with tempfile.TemporaryDirectory(prefix="bench-monitoring-") as tmp:
        for rep in range(opts.reps):
            for monitored in (False, True):
                run_dir = Path(tmp) / f"{'B' if monitored else 'A'}{rep}"
                sides[monitored].append(one_run(run_dir, opts.rollouts, opts.threads, monitored))
    plain = statistics.median(r[0] for r in sides[False])
    watched = statistics.median(r[0] for r in sides[True])
    fastest = min(r[0] for r in sides[True]) / min(r[0] for r in sides[False])
    inside = statistics.median(r[2] for r in sides[True])
    print(
        f"step time with --use-wandb --wandb-mode offline --use-tensorboard / without: "
        f"{watched / plain:.3f}x by median, {fastest:.3f}x by fastest (goal <= 1.03); "
        f"sinks inside the steps: {100 * inside:.2f} % of step time"
    )
    print()
    load1 = os.getloadavg()[0]
    print(f"context: {machine()}, threads {opts.threads}, load avg at start {load0:.2f}, end {load1:.2f}")
    for monitored, label in ((False, "A without"), (True, "B with   ")):
        runs = sides[monitored]
        steps = " ".join(f"{r[0]:.3f}" for r in runs)
        walls = " ".join(f"{r[1]:.1f}" for r in runs)
        median = statistics.median(r[0] for r in runs)
        print(f"  {label}: median step {median:.3f} s (runs: {steps}); run wall s: {walls}")
    extra = statistics.median(r[1] for r in sides[True]) - statistics.median(r[1] for r in sides[False])
    print(f"  start-up and end cost of monitoring (median run wall time B - A): {extra:+.1f} s")


if __name__ == "__main__":
    main()

"""Overhead of `--use-pytorch-profiler` outside its window on the default run's step time.

What it measures, on the default `grpolab train` config (tiny fixture model, 8 prompts × 8 samples):

  1. Micro: the cost of one timed phase, `PhaseTimer` with its `grpolab/<phase>` record_function
     range (always on, profiler or not) against the same timer without the range, over many
     empty phases; times the phases of one step (counted from a run's perf record) over that run's
     median step time. This is the whole cost a run without a running profiler pays.
  2. Macro, in this process, repetitions alternating A B C / C B A:
       A. no profiler;
       B. `--use-pytorch-profiler --profile-step-start 0 --profile-step-end 1`: rollout 0 traced,
          rollouts 1.. outside the window;
       C. `--profile-target train_actor --profile-step-start 1000 --profile-step-end 1001`: the
          micro-batch hooks run on every forward, no micro-batch is ever traced.
     Step time = median `perf/step_time` of rollouts 1.. (read with `rundir.reader`); the ratios
     B/A and C/A are the overhead outside the window. On a shared 2-core machine the run-to-run
     spread of A alone is printed too: a ratio inside it is noise, and the micro figure is the one
     that resolves 1 %.

Goal: ≤ 1 % of step time outside the window (issue 14's benchmark).

Run:  python benchmarks/bench_profiler.py [--rollouts 4] [--reps 2] [--threads 1]
About 1-2 minutes on a 2-core CPU.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import machine, median  # noqa: E402

from grpolab.cli import build_parser, config_from_args  # noqa: E402
from grpolab.core.metrics import PhaseTimer  # noqa: E402
from grpolab.rundir.reader import read_metrics  # noqa: E402
from grpolab.train.loop import train  # noqa: E402

GOAL = 0.01
CONFIGS = {
    "A no profiler": [],
    "B window at rollout 0": [
        "--use-pytorch-profiler",
        "--profile-step-start",
        "0",
        "--profile-step-end",
        "1",
    ],
    "C train_actor hooks, no window": [
        "--use-pytorch-profiler",
        "--profile-target",
        "train_actor",
        "--profile-step-start",
        "1000",
        "--profile-step-end",
        "1001",
    ],
}


class BareTimer(PhaseTimer):
    """PhaseTimer without the record_function range: the baseline of the micro measure."""

    @contextmanager
    def __call__(self, name: str):
        start = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - start


def phase_cost(n: int = 20000) -> tuple[float, float]:
    """Seconds per empty phase: (PhaseTimer with its range, BareTimer); medians of 5 alternating rounds."""
    with_range, bare = [], []
    for _ in range(5):
        for timer, out in ((PhaseTimer(), with_range), (BareTimer(), bare)):
            t0 = time.perf_counter()
            for _ in range(n):
                with timer("rollout"):
                    pass
            out.append((time.perf_counter() - t0) / n)
    return median(with_range), median(bare)


def one_run(tmp: Path, name: str, flags: list[str], rollouts: int, threads: int) -> tuple[list[float], int]:
    """A default run with `flags`; (perf/step_time of rollouts 1.., phases in rollout 1's perf record)."""
    argv = ["train", "--num-rollout", str(rollouts), "--no-progress", "--num-threads", str(threads)]
    argv += ["--run-dir", str(tmp / name), *flags]
    run_dir = train(config_from_args(build_parser().parse_args(argv)), ["grpolab", *argv])
    perf = [r for r in read_metrics(run_dir, "perf") if r.rollout_id is not None and r.rollout_id >= 1]
    phases = sum(
        1 for k in perf[0].metrics if k.endswith("_time") and k not in ("perf/train_time", "perf/step_time")
    )
    return [r.metrics["perf/step_time"] for r in perf], phases


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rollouts", type=int, default=4)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1)
    opts = ap.parse_args()
    logging.getLogger("grpolab").setLevel(logging.WARNING)
    load0 = os.getloadavg()[0]
    steps: dict[str, list[float]] = {k: [] for k in CONFIGS}
    per_rep_a: list[float] = []
    phases = 0
    with tempfile.TemporaryDirectory() as tmp:
        for rep in range(opts.reps):
            order = list(CONFIGS) if rep % 2 == 0 else list(reversed(CONFIGS))
            for name in order:
                times, phases = one_run(
                    Path(tmp), f"{rep}-{name[0]}", CONFIGS[name], opts.rollouts, opts.threads
                )
                steps[name] += times
                if name.startswith("A"):
                    per_rep_a.append(median(times))
    with_range, bare = phase_cost()
    base = median(steps["A no profiler"])
    micro = phases * (with_range - bare) / base
    print(
        f"micro: a timed phase costs {with_range * 1e6:.2f} µs with its range, {bare * 1e6:.2f} µs without;"
    )
    print(
        f"       {phases} phases per step -> {micro:.2e} of the {base:.3f} s step ({'meets' if micro <= GOAL else 'misses'} ≤ 1 %)"
    )
    for name, times in steps.items():
        print(
            f"{name:32s} median step {median(times):.3f} s  ratio {median(times) / base:.3f}  (n={len(times)})"
        )
    spread = (max(per_rep_a) - min(per_rep_a)) / base if len(per_rep_a) > 1 else float("nan")
    print(f"A's own spread between repetitions: {spread:.1%} of its median (ratios inside it are noise)")
    print(f"context: {machine()}; threads {opts.threads}; load {load0:.2f} -> {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()

"""Dynamic sampling on the default run: generated/kept token ratio, and the ledger's share of step time
(issue 25's benchmark, goal <= 2 %).

What it measures: `grpolab train` with the default flags (tiny fixture model, arithmetic prompts, 8
prompts × 8 answers, 32 tokens) plus `--dynamic-sampling-filter-path
grpolab.rollout.filters.check_reward_nonzero_std --over-sampling-batch-size 16`, `--num-rollout R`, run
in this process `--reps` times, alternated with the same run without the filter (the baseline). From
the run's own records:

- the share of generated groups the filter dropped as zero-std (the default run's reward is 0/1 per
  answer: a group whose 8 answers all fail, or all pass, is zero-std), from the `ledger` events;
- generated / kept response tokens over the rollouts after the first, from `rollout/ledger/
  generated_tokens` and `rollout/ledger/kept_tokens`;
- the ledger's own work, timed directly around `RolloutLedger.add`, `RolloutLedger.metrics` and
  `DynamicSamplingPath._write_ledger` (the counting, the `rollout N:` keys and the `ledger` event
  written to events.jsonl), as a share of the same rollouts' `perf/step_time`: that share is the
  figure for the goal (the whole-run ratio also holds the over-sampled generation itself);
- the filtered run's median step time over the baseline's, as context (it generates more).

Run:  python benchmarks/bench_dynamic_sampling.py [--reps 2] [--rollouts 4] [--threads 1]
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
from grpolab.rollout.dynamic_path import DynamicSamplingPath  # noqa: E402
from grpolab.rollout.ledger import RolloutLedger  # noqa: E402
from grpolab.rundir.reader import read_events, read_metrics  # noqa: E402
from grpolab.train.loop import GRPORun  # noqa: E402

FILTER = ["--dynamic-sampling-filter-path", "grpolab.rollout.filters.check_reward_nonzero_std"]
LEDGER_CALLS = [(RolloutLedger, "add"), (RolloutLedger, "metrics"), (DynamicSamplingPath, "_write_ledger")]


class LedgerClock:
    """Wraps the ledger's methods (`LEDGER_CALLS`) on their classes, adding up their seconds per rollout
    (`RolloutLedger.rollout_id` or the path's `ledger.rollout_id`)."""

    def __init__(self) -> None:
        self.seconds: dict[int, float] = {}
        self._saved: list[tuple[type, str, Callable[..., Any]]] = []

    def __enter__(self) -> LedgerClock:
        for owner, name in LEDGER_CALLS:
            original = getattr(owner, name)
            self._saved.append((owner, name, original))
            setattr(owner, name, self._timed(original))
        return self

    def __exit__(self, *exc: object) -> None:
        for owner, name, original in self._saved:
            setattr(owner, name, original)

    def _timed(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(obj: Any, *args: Any, **kwargs: Any) -> Any:
            ledger = obj if isinstance(obj, RolloutLedger) else args[0]
            start = time.perf_counter()
            try:
                return fn(obj, *args, **kwargs)
            finally:
                rollout = ledger.rollout_id
                self.seconds[rollout] = self.seconds.get(rollout, 0.0) + time.perf_counter() - start

        return wrapper


def one_run(run_dir: Path, rollouts: int, threads: int, filtered: bool) -> dict[str, float]:
    """One run's figures (module docstring), rollout 0 left out (it pays the warm-up); stdout quiet."""
    argv = ["train", "--num-rollout", str(rollouts), "--no-progress", "--run-dir", str(run_dir)]
    argv += ["--num-threads", str(threads)]
    if filtered:
        argv += [*FILTER, "--over-sampling-batch-size", "16"]
    config = config_from_args(build_parser().parse_args(argv))
    with LedgerClock() as clock:
        run = GRPORun.create(config, ["grpolab", *argv])
        for handler in logging.getLogger("grpolab").handlers:
            if getattr(handler, "_grpolab_stdout", False):
                handler.setLevel(logging.WARNING)
        run.run()
    steps = {r.rollout_id: r.metrics["perf/step_time"] for r in read_metrics(run_dir, "perf")}
    later = [k for k in steps if k >= 1]
    out = {"step": statistics.median(steps[k] for k in later)}
    if not filtered:
        return out
    rows = {r.rollout_id: r.metrics for r in read_metrics(run_dir, "rollout")}
    ledgers = [e for e in read_events(run_dir) if e.get("event") == "ledger"]
    generated = sum(e["generated"]["groups"] for e in ledgers)
    dropped = sum(t["groups"] for e in ledgers for r, t in e["filtered"].items() if r.startswith("zero_std"))
    out["zero_std_share"] = dropped / generated
    out["generated_per_kept"] = sum(rows[k]["rollout/ledger/generated_tokens"] for k in later) / sum(
        rows[k]["rollout/ledger/kept_tokens"] for k in later
    )
    out["ledger_share"] = sum(clock.seconds.get(k, 0.0) for k in later) / sum(steps[k] for k in later)
    out["ledger_ms_per_rollout"] = 1000 * statistics.median(clock.seconds.get(k, 0.0) for k in later)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reps", type=int, default=2, help="runs per side, alternating baseline, filtered, ...")
    ap.add_argument("--rollouts", type=int, default=4, help="--num-rollout of each run (>= 2)")
    ap.add_argument("--threads", type=int, default=1, help="--num-threads of both sides")
    opts = ap.parse_args()
    if opts.rollouts < 2:
        ap.error("--rollouts must be >= 2: rollout 0 is left out of the figures")
    if opts.reps < 1:
        ap.error("--reps must be >= 1")
    load0 = os.getloadavg()[0]
    sides: dict[bool, list[dict[str, float]]] = {False: [], True: []}
    with tempfile.TemporaryDirectory(prefix="bench-dynamic-sampling-") as tmp:
        for rep in range(opts.reps):
            for filtered in (False, True):
                run_dir = Path(tmp) / f"{'filtered' if filtered else 'plain'}{rep}"
                sides[filtered].append(one_run(run_dir, opts.rollouts, opts.threads, filtered))

    def med(key: str) -> float:
        return statistics.median(r[key] for r in sides[True])

    plain = statistics.median(r["step"] for r in sides[False])
    print(
        f"ledger work: {100 * med('ledger_share'):.3f} % of step time (goal <= 2 %; "
        f"{med('ledger_ms_per_rollout'):.2f} ms per rollout); generated / kept tokens {med('generated_per_kept'):.2f}x "
        f"with {100 * med('zero_std_share'):.0f} % of generated groups zero-std; step time filtered / "
        f"baseline (no filter) {med('step') / plain:.3f}x by median"
    )
    print()
    load1 = os.getloadavg()[0]
    print(f"context: {machine()}, threads {opts.threads}, load avg at start {load0:.2f}, end {load1:.2f}")
    for filtered, label in ((False, "baseline"), (True, "filtered")):
        steps = " ".join(f"{r['step']:.3f}" for r in sides[filtered])
        print(
            f"  {label}: median step {statistics.median(r['step'] for r in sides[filtered]):.3f} s (runs: {steps})"
        )


if __name__ == "__main__":
    main()

"""`grpolab diagnose hang` verdict time on 4 really hung ranks (goal <= 5 s), against the manual loop.

Starts the fixture `straggler` scenario with 4 gloo ranks on CPU (fixtures/hangs: ranks 0, 2, 3 wait
in all_reduce, rank 1 sleeps) and, alternating A/B, measures wall time from the command's start to
its exit:
- A, grpolab: `grpolab diagnose hang RUN_DIR` as a subprocess with the default flags (two py-spy
  samples of all ranks in parallel, `--interval` 2 s apart, classification, dumps written). This
  includes Python start-up and the 2 s confirmation wait: the time a user waits for the verdict.
- A1, one sample: the same with `--interval 0 --stall-seconds 1` (one parallel py-spy sweep,
  the hang confirmed by the stale heartbeats), the part comparable to one manual sweep.
- B, baseline: the AReaL debugging guide's manual loop ("Dump all training worker processes at
  once", step 2 of its hang section), run by bash:
  `for pid in $(ps aux | grep 'python.*RUN_DIR' | grep -v grep | awk '{print $2}'); do
  echo "== PID $pid =="; py-spy dump --pid $pid; done`, sequential dumps, no confirmation, no
  classification.
Prints the ratios A/B and A1/B first, then absolute medians and the load average as context.
Run: `python benchmarks/bench_hang_verdict.py [--reps 5] [--ranks 4] [--native]`.
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import machine, median

from grpolab.diagnose.hang.pyspy import find_py_spy
from grpolab.fixtures.hangs import launch_hang_world, stop_hang_world, wait_until_hung


def timed(cmd: list[str], *, expect: int | None = None) -> tuple[float, str]:
    """(wall seconds, stdout) of one command; raises when the exit code is not `expect`."""
    start = time.perf_counter()
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    seconds = time.perf_counter() - start
    if expect is not None and out.returncode != expect:
        raise RuntimeError(
            f"{shlex.join(cmd)} exited {out.returncode}, expected {expect}:\n{out.stderr[-2000:]}"
        )
    return seconds, out.stdout


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=5, help="repetitions of each side, alternated (default 5)")
    ap.add_argument("--ranks", type=int, default=4, help="hung ranks (default 4)")
    ap.add_argument("--native", action="store_true", help="py-spy --native on both sides")
    args = ap.parse_args()
    py_spy = find_py_spy()
    native = ["--native"] if args.native else []
    grpolab = [sys.executable, "-m", "grpolab", "diagnose", "hang"]
    with tempfile.TemporaryDirectory(prefix="bench-hang-") as tmp:
        run = Path(tmp) / "run"
        procs = launch_hang_world("straggler", args.ranks, run, hang_seconds=900)
        try:
            started = time.perf_counter()
            wait_until_hung(run, args.ranks, timeout_s=300, procs=procs)
            print(f"{args.ranks} ranks hung (straggler scenario) after {time.perf_counter() - started:.1f} s")
            loop = (
                f"for pid in $(ps aux | grep 'python.*{run}' | grep -v grep | awk '{{print $2}}'); do "
                f'echo "========== PID $pid =========="; {shlex.quote(py_spy)} dump --pid $pid {" ".join(native)}; done'
            )
            full, single, manual = [], [], []
            verdict = ""
            for _ in range(args.reps):
                seconds, out = timed([*grpolab, str(run), *native], expect=1)
                full.append(seconds)
                verdict = next((ln for ln in out.splitlines() if ln.startswith("verdict:")), out[:200])
                seconds, _ = timed(
                    [*grpolab, str(run), "--interval", "0", "--stall-seconds", "1", *native], expect=1
                )
                single.append(seconds)
                seconds, out = timed(["bash", "-c", loop], expect=0)
                manual.append(seconds)
                assert out.count("========== PID") == args.ranks, out[:2000]
            startup = []
            for _ in range(args.reps):  # how much of A is Python start-up and the grpolab CLI import
                startup.append(timed([*grpolab, "--help"], expect=0)[0])
        finally:
            stop_hang_world(procs, run)
            shutil.rmtree(run / "diagnose", ignore_errors=True)
    a, a1, b, startup = median(full), median(single), median(manual), median(startup)
    print(verdict.strip())
    print(
        f"ratio grpolab (default, 2 samples 2 s apart) / manual loop: {a / b:.2f}x; "
        f"grpolab one sample / manual loop: {a1 / b:.2f}x"
    )
    print(
        f"verdict time {a:.2f} s (goal <= 5 s) {'PASS' if a <= 5 else 'FAIL'}; one sample {a1:.2f} s; "
        f"manual loop {b:.2f} s ({args.ranks} sequential py-spy dumps, no verdict); "
        f"`grpolab diagnose hang --help` (start-up alone) {startup:.2f} s"
    )
    print(
        f"medians of {args.reps} alternated repetitions; {machine()}; load average "
        + " ".join(f"{x:.2f}" for x in os.getloadavg())
        + ("; --native" if args.native else "")
    )
    return 0 if a <= 5 else 1


if __name__ == "__main__":
    sys.exit(main())

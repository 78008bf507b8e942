"""CLI start-up: wall time of `grpolab --help`, `gate --help`, a `train` flag error and `diagnose log --help`.

Each command runs as its own process (the `grpolab` console script next to this interpreter, else
`python -m grpolab`), against `python -c pass` measured in the same run; the repetitions alternate
baseline and commands, and the figures are medians. Goal (issue 12): each command <= 1.5 s wall on the
2-core machine, which needs it to import neither torch nor transformers (tests/test_cli_startup.py
checks that; this script measures the time). Context after the table: one `import torch,
transformers.modeling_utils`, what any of these commands cost before the imports became lazy; and
issue 12's "default run, time to the first rollout line" (reported, no goal): wall seconds from
starting `grpolab train --run-dir <tmp> --num-rollout 1` (default flags otherwise) to the first
stdout line starting with `rollout 0:`, read line by line as it is written (PYTHONUNBUFFERED=1, as a
terminal would show it), median of `--train-reps` runs after one warm-up run; each run is left to
finish and must exit 0. That line comes after the first rollout's training step, so the figure is
imports + model and data loading + one GRPO step.

The commands run from cached bytecode, as an installed package does (this project's environment sets
PYTHONDONTWRITEBYTECODE, which would add grpolab's compile time to every start).

    python benchmarks/bench_cli_startup.py [--reps 7] [--train-reps 3]
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import machine, median  # noqa: E402

GOAL_S = 1.5
"""Issue 12's goal for each command, wall seconds on the 2-core machine."""

COMMANDS: list[tuple[str, list[str], int]] = [
    ("grpolab --help", ["--help"], 0),
    ("grpolab gate --help", ["gate", "--help"], 0),
    ("grpolab train --num-rollout x", ["train", "--num-rollout", "x"], 2),
    ("grpolab train --hf-checkpoint /nonexistent", ["train", "--hf-checkpoint", "/nonexistent"], 2),
    ("grpolab diagnose log --help", ["diagnose", "log", "--help"], 0),
]
"""(label, arguments, expected exit code) of each measured command."""

FIRST_ROLLOUT = "rollout 0:"
"""Start of the default run's first rollout line on stdout (the run's console format)."""

TRAIN_TIMEOUT_S = 300.0
"""A train run still going after this many seconds is killed and reported (the default run takes ~10 s)."""


def grpolab_command() -> list[str]:
    """The `grpolab` console script installed beside this interpreter, else `python -m grpolab`."""
    script = Path(sys.executable).parent / "grpolab"
    return [str(script)] if script.is_file() else [sys.executable, "-m", "grpolab"]


def timed(cmd: list[str], env: dict[str, str], expected_code: int) -> float:
    """Wall seconds of one run of `cmd`. Raises RuntimeError when it exits with another code."""
    started = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False, env=env)
    seconds = time.perf_counter() - started
    if proc.returncode != expected_code:
        raise RuntimeError(
            f"{' '.join(cmd)} exited {proc.returncode}, expected {expected_code}: {proc.stderr}"
        )
    return seconds


def first_rollout_seconds(cmd: list[str], env: dict[str, str], stderr_path: Path) -> float:
    """Wall seconds from starting `cmd` to reading its first stdout line starting with FIRST_ROLLOUT.

    The process is left to finish. Raises RuntimeError when it exits non-zero, never prints that
    line, or is killed after TRAIN_TIMEOUT_S; the message ends with its stderr's tail.
    """
    seen: float | None = None
    with open(stderr_path, "w", encoding="utf-8") as err:
        started = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, text=True, env=env)
        killer = threading.Timer(TRAIN_TIMEOUT_S, proc.kill)
        killer.start()
        try:
            assert proc.stdout is not None
            for line in proc.stdout:
                if seen is None and line.startswith(FIRST_ROLLOUT):
                    seen = time.perf_counter() - started
            code = proc.wait()
        finally:
            killer.cancel()
    if code != 0 or seen is None:
        if code == -signal.SIGKILL:
            why = f"was killed after {TRAIN_TIMEOUT_S:.0f} s"
        else:
            why = f"exited {code}" if code != 0 else f"printed no line starting {FIRST_ROLLOUT!r}"
        tail = stderr_path.read_text(encoding="utf-8", errors="replace")[-2000:]
        raise RuntimeError(f"{' '.join(cmd)} {why}; its stderr ends: {tail}")
    return seen


def time_to_first_rollout(grpolab: list[str], env: dict[str, str], tmp: Path, reps: int) -> list[float]:
    """`reps` timed default runs (`--num-rollout 1`, run directories under `tmp`) after one warm-up."""
    env = {**env, "PYTHONUNBUFFERED": "1"}  # line by line through the pipe, as on a terminal
    seconds = []
    for i in range(reps + 1):
        cmd = [*grpolab, "train", "--run-dir", str(tmp / f"run{i}"), "--num-rollout", "1"]
        seconds.append(first_rollout_seconds(cmd, env, tmp / f"run{i}.stderr"))
    return seconds[1:]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=7, help="alternated repetitions (median)")
    parser.add_argument(
        "--train-reps", type=int, default=3, help="timed default runs for the time to the first rollout line"
    )
    args = parser.parse_args()
    if args.train_reps < 1:
        parser.error(f"--train-reps must be >= 1, got {args.train_reps}")

    grpolab = grpolab_command()
    baseline = [sys.executable, "-c", "pass"]
    with tempfile.TemporaryDirectory() as tmp:
        env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
        env["PYTHONPYCACHEPREFIX"] = str(Path(tmp) / "pycache")
        load_before = os.getloadavg()[0]
        for _, argv, code in COMMANDS:  # warm-up: writes the bytecode, fills the page cache
            timed(grpolab + argv, env, code)
        base_s: list[float] = []
        cmd_s: dict[str, list[float]] = {label: [] for label, _, _ in COMMANDS}
        for _ in range(args.reps):
            base_s.append(timed(baseline, env, 0))
            for label, argv, code in COMMANDS:
                cmd_s[label].append(timed(grpolab + argv, env, code))
        first_s = time_to_first_rollout(grpolab, env, Path(tmp), args.train_reps)
    # the installed bytecode of torch and transformers (the cache prefix above would compile them afresh)
    heavy_s = timed([sys.executable, "-c", "import torch, transformers.modeling_utils"], dict(os.environ), 0)

    print(f"{machine()}; load average {load_before:.2f} before, {os.getloadavg()[0]:.2f} after")
    print(f"command: {' '.join(grpolab)}; medians of {args.reps} alternated runs")
    base = median(base_s)
    print(f"baseline python -c pass: {base:.3f} s")
    for label, seconds in cmd_s.items():
        wall = median(seconds)
        verdict = "met" if wall <= GOAL_S else "NOT met"
        print(
            f"{label}: {wall:.3f} s wall (goal <= {GOAL_S} s: {verdict}); ratio to python -c pass: "
            f"{wall / base:.1f}x; min {min(seconds):.3f} s, max {max(seconds):.3f} s"
        )
    print(f"context: python -c 'import torch, transformers.modeling_utils' once: {heavy_s:.3f} s")
    print(
        f"context: default run (grpolab train --num-rollout 1), start to its first {FIRST_ROLLOUT!r} line: "
        f"{median(first_s):.3f} s wall (median of {len(first_s)} runs after a warm-up; "
        f"min {min(first_s):.3f} s, max {max(first_s):.3f} s)"
    )


if __name__ == "__main__":
    main()

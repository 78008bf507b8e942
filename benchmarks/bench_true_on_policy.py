"""What `--true-on-policy-mode` costs: the GRPO step with it against the same run without it (issue 24).

Both sides run the same `grpolab train` (the default run, or SmolLM2-135M on GSM8K with `--smollm2`) in
fresh processes, alternated `--reps` times; a side's figure is the median `perf/step_time` of its
rollouts after the first (start-up excluded). Also printed: where the extra time goes
(`perf/rollout_time`: the engine's re-scoring prefill; `perf/log_probs_time` (0 where the training
forward's log-probs are used) + `perf/actor_train_time`:
the trainer scoring each sample alone) and the gaps, 0.0 with the mode.
Run: `python benchmarks/bench_true_on_policy.py [--reps 3] [--num-rollout 4] [--smollm2]`.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from _common import GSM8K_TRAIN, machine, median, smollm2_missing

PARTS = ("perf/step_time", "perf/rollout_time", "perf/log_probs_time", "perf/actor_train_time")
GAP = "train/train_rollout_logprob_abs_diff"


def run_once(flags: list[str], run_dir: Path) -> tuple[dict[str, float], list[float]]:
    """Median of each PARTS metric over the rollouts after the first, and the gap of every step."""
    argv = [sys.executable, "-m", "grpolab", "train", "--run-dir", str(run_dir), "--no-progress", *flags]
    proc = subprocess.run(argv, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"grpolab train failed:\n{proc.stderr[-2000:]}")
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    perf = [r["metrics"] for r in rows if r["kind"] == "perf"][1:]
    gaps = [r["metrics"][GAP] for r in rows if r["kind"] == "step"]
    return {k: median([p.get(k, 0.0) for p in perf]) for k in PARTS}, gaps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--num-rollout", type=int, default=4)
    parser.add_argument("--smollm2", action="store_true", help="SmolLM2-135M on GSM8K, 2 x 2 x 32 tokens")
    args = parser.parse_args()
    print(machine())
    flags = ["--num-rollout", str(args.num_rollout)]
    if args.smollm2:
        missing = smollm2_missing()
        if missing:
            raise SystemExit(missing)
        from grpolab.fixtures import smollm2_gguf

        flags += ["--hf-checkpoint", str(smollm2_gguf()), "--prompt-data", str(GSM8K_TRAIN),
                  "--input-key", "question", "--label-key", "answer", "--apply-chat-template",
                  "--rollout-batch-size", "2", "--n-samples-per-prompt", "2", "--rollout-max-response-len", "32",
                  "--micro-batch-size", "2", "--global-batch-size", "4"]  # fmt: skip
    sides: dict[str, list[dict[str, float]]] = {"without": [], "with": []}
    gaps: dict[str, list[float]] = {"without": [], "with": []}
    with tempfile.TemporaryDirectory() as tmp:
        for rep in range(args.reps):
            for side in ("without", "with"):
                extra = ["--true-on-policy-mode"] if side == "with" else []
                figures, side_gaps = run_once(flags + extra, Path(tmp) / f"{side}{rep}")
                sides[side].append(figures)
                gaps[side] += side_gaps
                print(
                    f"rep {rep} {side:7s} "
                    + "  ".join(f"{k.split('/')[1]} {v:.3f} s" for k, v in figures.items())
                )
    model = "SmolLM2-135M" if args.smollm2 else "tiny-qwen3 default run"
    print(f"{model}, {args.reps} alternated reps, {args.num_rollout} rollouts each (the first not counted)")
    for k in PARTS:
        with_, without = median([f[k] for f in sides["with"]]), median([f[k] for f in sides["without"]])
        ratio = f"{with_ / without:.2f}x" if without > 0 else "n/a"
        print(f"{k}: with / without the mode {ratio} ({with_:.3f} s vs {without:.3f} s)")
    print(f"gap with the mode: max {max(gaps['with']):.3g} over {len(gaps['with'])} steps; without: "
          f"{min(gaps['without']):.3g}-{max(gaps['without']):.3g}")  # fmt: skip


if __name__ == "__main__":
    main()

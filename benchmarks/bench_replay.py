"""Replay benchmarks (replay issue): recorder overhead, recording size, I/O speed, replay step time.

Measures, in one process on the tiny fixture model with the default rollout shape (8 prompts × 8
answers, 32 tokens):
1. recorder overhead: `perf/save_rollout_data_time` as a share of `perf/step_time` in a normal run
   with `--save-debug-rollout-data` (goal ≤ 3 %);
2. recording size vs `torch.save` of the same samples as per-sample dicts of tensors (goal ≤ 0.35×);
3. write and read MB/s of the raw array bytes through `save_rollout` / `load_rollout`;
4. train-only replay step time vs the train phase (`perf/train_time`) of the normal run it replays
   (goal ≤ 1.05×).
Run: `python benchmarks/bench_replay.py [--rollouts 6]`. Ratios are against baselines measured here.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch

from grpolab.cli import build_parser, config_from_args
from grpolab.replay.recording import load_rollout, rollout_arrays, save_rollout
from grpolab.rundir.reader import read_metrics
from grpolab.train.loop import train


def perf_records(run_dir: Path) -> list[dict[str, float]]:
    return [r.metrics for r in read_metrics(run_dir, "perf")]


def run(argv: list[str]) -> Path:
    full = ["train", "--no-progress", *argv]
    return train(config_from_args(build_parser().parse_args(full)), ["grpolab", *full])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rollouts", type=int, default=6)
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench-replay-"))
    template = str(tmp / "rec" / "r_{rollout_id}.grz")
    live = run(
        [
            "--num-rollout",
            str(args.rollouts),
            "--save-debug-rollout-data",
            template,
            "--run-dir",
            str(tmp / "live"),
        ]
    )
    replay = run(
        [
            "--num-rollout",
            str(args.rollouts),
            "--load-debug-rollout-data",
            template,
            "--run-dir",
            str(tmp / "replay"),
        ]
    )
    live_perf, replay_perf = perf_records(live)[1:], perf_records(replay)[1:]  # rollout 0 is warm-up

    overhead = [p["perf/save_rollout_data_time"] / p["perf/step_time"] for p in live_perf]
    train_phase = statistics.median(p["perf/train_time"] for p in live_perf)
    replay_step = statistics.median(p["perf/step_time"] for p in replay_perf)

    rec = load_rollout(template.format(rollout_id=1))
    samples = rec.samples
    as_dicts = [
        {
            "tokens": torch.tensor(s.prompt_ids + s.response_ids),
            "response_length": s.response_length,
            "loss_mask": s.loss_mask,
            "rollout_log_probs": s.rollout_log_probs,
            "reward": s.reward,
            "group_index": s.group_index,
            "index": s.index,
            "status": s.finish_reason,
        }
        for s in samples
    ]
    torch.save({"rollout_id": 1, "samples": as_dicts}, tmp / "same.pt")
    grz_size = Path(template.format(rollout_id=1)).stat().st_size
    pt_size = (tmp / "same.pt").stat().st_size
    raw_bytes = sum(a.nbytes for a in rollout_arrays(samples)[0].values())
    writes, reads = [], []
    for i in range(20):
        path = tmp / f"io_{i}.grz"
        t0 = time.perf_counter()
        save_rollout(
            path,
            samples,
            rollout_id=1,
            weight_version=0,
            run_seed=0,
            sampler={},
            fingerprints={},
            train_config={},
        )
        t1 = time.perf_counter()
        load_rollout(path)
        t2 = time.perf_counter()
        writes.append(t1 - t0)
        reads.append(t2 - t1)

    print(f"samples per rollout: {len(samples)}, raw array bytes: {raw_bytes}")
    print(
        f"recorder overhead: median {100 * statistics.median(overhead):.2f} % of step time (goal <= 3 %); max {100 * max(overhead):.2f} %"
    )
    print(
        f"recording size: {grz_size} B vs torch.save {pt_size} B -> {grz_size / pt_size:.3f}x (goal <= 0.35x)"
    )
    print(
        f"write: {raw_bytes / statistics.median(writes) / 1e6:.1f} MB/s ({1000 * statistics.median(writes):.1f} ms, incl. fsync)"
    )
    print(
        f"read:  {raw_bytes / statistics.median(reads) / 1e6:.1f} MB/s ({1000 * statistics.median(reads):.1f} ms, incl. rebuilding samples)"
    )
    print(
        f"train-only replay step {replay_step:.3f} s vs train phase of a normal step {train_phase:.3f} s "
        f"-> {replay_step / train_phase:.3f}x (goal <= 1.05x)"
    )


if __name__ == "__main__":
    main()

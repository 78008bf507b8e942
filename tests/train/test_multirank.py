"""Multi-rank runs through torchrun on CPU (gloo / det_gloo), 2 ranks, tiny model.

The key invariance (checkers issue): with the deterministic backend, world size 1 with 2
micro-batches and world size 2 with 1 micro-batch each reach bitwise-identical weights after 2
optimizer steps on the same recorded rollouts.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from runs import SMALL, metrics
from safetensors.torch import load_file


def grpolab(*argv: str, timeout: float = 300) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run(
        [sys.executable, "-m", "grpolab", *argv], capture_output=True, text=True, timeout=timeout, env=env
    )


@pytest.fixture(scope="module")
def recorded(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("multirank")
    out = grpolab(
        "train",
        *SMALL,
        "--num-rollout",
        "2",
        "--debug-rollout-only",
        "--save-debug-rollout-data",
        str(tmp / "rec" / "r_{rollout_id}.grz"),
        "--run-dir",
        str(tmp / "cap"),
    )
    assert out.returncode == 0, out.stderr[-2000:]
    return tmp


def test_two_ranks_train_with_gloo(recorded: Path) -> None:
    out = grpolab(
        "train", "--nproc-per-node", "2", *SMALL, "--num-rollout", "2", "--run-dir", str(recorded / "gloo2")
    )
    assert out.returncode == 0, out.stderr[-3000:]
    run = recorded / "gloo2"
    meta = json.loads((run / "run.json").read_text())
    assert (meta["world_size"], meta["backend"]) == (2, "gloo")
    assert sorted(p.name for p in (run / "ranks").iterdir()) == ["0.json", "1.json"]
    pids = {json.loads((run / "ranks" / f"{r}.json").read_text())["pid"] for r in (0, 1)}
    assert len(pids) == 2
    steps = metrics(run, "step")
    assert [s["train/step"] for s in steps] == [0.0, 1.0]  # logged once, by rank 0
    assert steps[0]["train/ppo_kl"] == 0.0 and steps[0]["train/pg_clipfrac"] == 0.0
    rollout0 = metrics(run, "rollout")[0]
    assert rollout0["rollout/response_lengths"] > 0 and 0 <= rollout0["rollout/raw_reward"] <= 1
    assert "rollout 0: {" in out.stdout and out.stdout.count("rollout 0: {") == 1  # printed once


def test_det_backend_world_sizes_agree_bitwise(recorded: Path) -> None:
    common = [
        *SMALL,
        "--num-rollout",
        "2",
        "--load-debug-rollout-data",
        str(recorded / "rec" / "r_{rollout_id}.grz"),
    ]
    common += ["--debug-deterministic-collective", "--ci-save-model-hash", "--micro-batch-size", "8"]
    one = grpolab(
        "train", *common, "--run-dir", str(recorded / "det1")
    )  # 16 samples: 2 micro-batches on 1 rank
    assert one.returncode == 0, one.stderr[-3000:]
    two = grpolab(
        "train", "--nproc-per-node", "2", *common, "--run-dir", str(recorded / "det2")
    )  # 1 each on 2 ranks
    assert two.returncode == 0, two.stderr[-3000:]
    h1 = json.loads((recorded / "det1" / "checks" / "model_hash_final.json").read_text())
    h2 = json.loads((recorded / "det2" / "checks" / "model_hash_final.json").read_text())
    assert h1 == h2 and len(h1) == 5
    assert json.loads((recorded / "det2" / "run.json").read_text())["backend"] == "det_gloo"
    for a, b in zip(metrics(recorded / "det1", "step"), metrics(recorded / "det2", "step")):
        assert {k: v for k, v in a.items() if k != "train/grad_norm"} == {
            k: v for k, v in b.items() if k != "train/grad_norm"
        }
        assert a["train/grad_norm"] == pytest.approx(
            b["train/grad_norm"], rel=1e-6
        )  # sharded vs full norm bracketing
    base = json.loads((recorded / "det1" / "run.json").read_text())["environment"]["deterministic"]
    assert base["use_deterministic_algorithms"] is True and base["torch_num_threads"] == 1


def test_two_rank_checkpoint_resumes_bitwise_with_per_rank_hashes(recorded: Path) -> None:
    ck = recorded / "ck2"
    common = ["--nproc-per-node", "2", *SMALL, "--num-rollout", "3", "--debug-deterministic-collective"]
    full = grpolab(
        "train",
        *common,
        "--save",
        str(ck),
        "--save-interval",
        "2",
        "--ci-save-model-hash",
        "--run-dir",
        str(recorded / "full2"),
    )
    assert full.returncode == 0, full.stderr[-3000:]
    assert sorted(p.name for p in (ck / "iter_0000002").glob("model_hash_rank*.json")) == [
        "model_hash_rank0.json",
        "model_hash_rank1.json",
    ]
    # the 2-rank checkpoint exports for serving as a 1-rank one does (rank 0 wrote the gathered weights)
    hf = recorded / "hf2"
    export = grpolab("convert", "--to-hf", str(ck / "iter_0000002"), "--output-dir", str(hf))
    assert export.returncode == 0 and "bitwise on 12 positions" in export.stdout, export.stderr[-3000:]
    facts = json.loads((hf / "grpolab_export.json").read_text())
    assert (facts["next_rollout_id"], facts["tied"]) == (2, ["lm_head.weight"])
    trained = load_file(str(ck / "iter_0000002" / "model.safetensors"))
    exported = load_file(str(hf / "model.safetensors"))
    assert exported and set(exported) <= set(trained)
    assert all(torch.equal(exported[k], trained[k]) for k in exported)
    assert set(facts["tensor_sha256"]) == set(trained)
    (ck / "latest_checkpointed_iteration.txt").write_text("2\n")
    resumed = grpolab(
        "train",
        *common,
        "--load",
        str(ck),
        "--save",
        str(ck),
        "--ci-check-model-hash",
        "--run-dir",
        str(recorded / "resumed2"),
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert [m["rollout/step"] for m in metrics(recorded / "resumed2", "rollout")] == [2.0]
    assert metrics(recorded / "resumed2", "rollout")[0] == metrics(recorded / "full2", "rollout")[2]
    assert metrics(recorded / "resumed2", "step")[0] == metrics(recorded / "full2", "step")[2]


def test_dynamic_sampling_on_two_ranks_is_the_one_rank_run(recorded: Path) -> None:
    """Rank 0 fills each rollout (its rounds, the filter's verdicts, the ledger) and sends it to rank 1: the
    rollouts, the ledger and (det backend) the training equal the one-rank run's."""
    common = [*SMALL, "--num-rollout", "2", "--dynamic-sampling-filter-path",
              "grpolab.rollout.filters.check_reward_nonzero_std", "--over-sampling-batch-size", "6",
              "--debug-deterministic-collective", "--micro-batch-size", "8", "--ci-save-model-hash"]  # fmt: skip
    one = grpolab("train", *common, "--run-dir", str(recorded / "dyn1"))
    assert one.returncode == 0, one.stderr[-3000:]
    two = grpolab("train", "--nproc-per-node", "2", *common, "--run-dir", str(recorded / "dyn2"))
    assert two.returncode == 0, two.stderr[-3000:]
    rollouts = metrics(recorded / "dyn2", "rollout")
    assert rollouts == metrics(recorded / "dyn1", "rollout")
    assert all(r["rollout/ledger/kept_groups"] == 4 for r in rollouts)
    assert sum(r["rollout/ledger/generated_groups"] for r in rollouts) >= 12  # a round is 6 groups

    def ledgers(run: str) -> list[dict]:
        rows = [json.loads(line) for line in (recorded / run / "events.jsonl").read_text().splitlines()]
        return [
            {k: v for k, v in e.items() if k not in ("time", "t")} for e in rows if e["event"] == "ledger"
        ]

    assert ledgers("dyn2") == ledgers("dyn1") and len(ledgers("dyn1")) == 2
    for a, b in zip(metrics(recorded / "dyn1", "step"), metrics(recorded / "dyn2", "step"), strict=True):
        assert {k: v for k, v in a.items() if k != "train/grad_norm"} == {
            k: v for k, v in b.items() if k != "train/grad_norm"
        }
    h1 = json.loads((recorded / "dyn1" / "checks" / "model_hash_final.json").read_text())
    assert h1 == json.loads((recorded / "dyn2" / "checks" / "model_hash_final.json").read_text())


def test_crash_before_allreduce_on_one_rank_ends_the_world(recorded: Path) -> None:
    actions = '[{"at_rollout": 1, "action": "crash_before_allreduce", "rank": 1}]'
    out = grpolab(
        "train",
        "--nproc-per-node",
        "2",
        *SMALL,
        "--num-rollout",
        "3",
        "--ci-ft-test-actions",
        actions,
        "--run-dir",
        str(recorded / "crash"),
    )
    assert out.returncode == 1
    assert "injecting crash_before_allreduce on rank 1 at rollout 1" in out.stderr
    # torchrun's ChildFailedError traceback and failure table (~40 lines) were the last thing on screen
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith("grpolab train: error: rank 1 failed (exit code 1)") and "console.log" in last, (
        last
    )
    assert "ChildFailedError" not in out.stderr and "Root Cause" not in out.stderr
    # rank 0, whose allreduce lost its peer, says so instead of quoting gloo's pair.cc (when torchrun
    # stops it before its collective notices, it says nothing: which comes first is a race)
    rank0 = [line for line in out.stderr.splitlines() if line.startswith("grpolab train: error: rank 0")]
    assert all("rank 0 stopped: another rank's process ended" in line for line in rank0), rank0
    assert "pair.cc" not in out.stderr
    rank1 = json.loads((recorded / "crash" / "ranks" / "1.json").read_text())
    assert (
        rank1["heartbeat"]["phase"] == "fault:crash_before_allreduce"
        and rank1["heartbeat"]["rollout_id"] == 1
    )
    assert (
        len(metrics(recorded / "crash", "step")) == 1
    )  # rollout 0 trained, rollout 1 never reached the reduction
    last = [json.loads(line) for line in (recorded / "crash" / "events.jsonl").read_text().splitlines()][-1]
    assert (
        last["event"] == "status" and last["status"] in ("failed", "interrupted") and last["rollout_id"] == 1
    )


def test_sigterm_to_the_wrapper_stops_every_rank(tmp_path: Path) -> None:
    """`kill -TERM` on `grpolab train --nproc-per-node 2` (what a watchdog's --stop-pid sends) must
    reach torchrun and both ranks, not only the wrapper process; the command ends with 143 (128 +
    SIGTERM) and one line on stderr: no line per rank, no torchrun traceback or banner."""
    run = tmp_path / "long"
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}  # torchrun's banner case
    argv = ["train", "--nproc-per-node", "2", *SMALL, "--num-rollout", "500", "--run-dir", str(run)]
    stderr = (tmp_path / "stderr.txt").open("w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "grpolab", *argv],
        env=env,
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=stderr,
    )
    rank_pids: list[int] = []
    try:
        deadline = time.monotonic() + 240
        while len(rank_pids) < 2:
            assert proc.poll() is None, "the run ended before it started training"
            assert time.monotonic() < deadline, "the ranks never wrote their heartbeats"
            files = [run / "ranks" / f"{r}.json" for r in (0, 1)]
            if all(f.exists() for f in files):
                rank_pids = [json.loads(f.read_text())["pid"] for f in files]
            time.sleep(0.5)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=120) == 143
        stderr.close()
        assert (tmp_path / "stderr.txt").read_text().splitlines() == [
            "grpolab train: interrupted; the run directory's last event says so"
        ]
        deadline = time.monotonic() + 60
        while any(Path(f"/proc/{pid}").exists() for pid in rank_pids) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert not any(Path(f"/proc/{pid}").exists() for pid in rank_pids), "a rank survived SIGTERM"
        status = [json.loads(line) for line in (run / "events.jsonl").read_text().splitlines()][-1]
        assert status["event"] == "status" and status["status"] == "interrupted", status
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()

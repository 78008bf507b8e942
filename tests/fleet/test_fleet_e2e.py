"""End to end through the real sglang-router on CPU: `grpolab train --rollout-num-engines` against the
in-process engine, a kill -9'd engine, and teardown (no process of the fleet outlives the run)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from runs import engines_after_first_metrics

from grpolab.diagnose.common.procfs import proc_children, proc_state
from grpolab.replay.recording import load_rollout
from grpolab.rundir.reader import read_events

SMALL = ["--num-rollout", "2", "--rollout-batch-size", "4", "--n-samples-per-prompt", "4", "--no-progress"]


def _train(run_dir: Path, *flags: str, timeout: float = 600) -> subprocess.CompletedProcess:
    argv = [sys.executable, "-m", "grpolab", "train", "--run-dir", str(run_dir), *SMALL, *flags]
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout)


def _metrics(run_dir: Path) -> list[tuple]:
    """metrics.jsonl without wall time and perf/* (timings differ between any two runs)."""
    rows = []
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        r = json.loads(line)
        if r["kind"] != "perf":
            rows.append((r["kind"], r["rollout_id"], r.get("step"), r["metrics"]))
    return rows


def _alive(pid: int) -> bool:
    """`pid` exists and is not a zombie."""
    return proc_state(pid) not in (None, "Z")


def _recorded(template: str, n: int) -> list[list[tuple]]:
    """Per rollout, each sample's (seed, response ids, log-prob float32 bytes, finish reason)."""
    return [
        [
            (s.seed, s.response_ids, s.rollout_log_probs.numpy().tobytes(), s.finish_reason)
            for s in load_rollout(template.format(rollout_id=i)).samples
        ]
        for i in range(n)
    ]


@pytest.mark.slow
def test_one_engine_through_the_router_matches_the_in_process_run_bitwise(tmp_path: Path) -> None:
    """Same tokens and log-probs (the server orders a batch's rows by the rids the client numbers),
    so every metric but wall time is equal; the fleet's recording replays to the same training."""
    rec_in, rec_served = (
        str(tmp_path / "rec_in" / "r_{rollout_id}.grz"),
        str(tmp_path / "rec" / "r_{rollout_id}.grz"),
    )
    inproc = _train(tmp_path / "inproc", "--ci-test", "--save-debug-rollout-data", rec_in)
    assert inproc.returncode == 0, inproc.stderr[-3000:]
    served = _train(
        tmp_path / "served",
        "--ci-test",
        "--rollout-num-engines",
        "1",
        "--save-debug-rollout-data",
        rec_served,
    )
    assert served.returncode == 0, served.stderr[-3000:]
    assert _metrics(tmp_path / "served") == _metrics(tmp_path / "inproc")  # every value, bitwise
    recorded = _recorded(rec_served, 2)
    assert recorded == _recorded(rec_in, 2) and len(recorded[0]) == 16
    run = tmp_path / "served"
    assert "listening on http://127.0.0.1:" in (run / "engines" / "0.log").read_text()
    assert "Router ready" in (run / "router.log").read_text()
    assert "/update_weights_from_disk" not in served.stderr  # no failed sync was reported

    replay = _train(tmp_path / "replay", "--load-debug-rollout-data", rec_served)
    assert replay.returncode == 0, replay.stderr[-3000:]
    steps = [r for r in _metrics(tmp_path / "served") if r[0] == "step"]
    assert steps and [r for r in _metrics(tmp_path / "replay") if r[0] == "step"] == steps


@pytest.mark.slow
def test_rollout_only_with_evals_through_the_router_matches_the_in_process_run(tmp_path: Path) -> None:
    """--debug-rollout-only with an eval before rollout 0 and after each rollout: no trainer is built, and
    the fleet's rollouts and evals (scores and recordings, bit for bit) are the in-process run's."""
    test_set = Path(__file__).resolve().parents[2] / "fixtures" / "data" / "arithmetic_test.jsonl"
    flags = ["--debug-rollout-only", "--eval-interval", "1", "--eval-prompt-data", "arith", str(test_set)]
    flags += ["--eval-max-prompts", "3", "--n-samples-per-eval-prompt", "2"]
    templates = {}
    for name, extra in (("inproc", []), ("served", ["--rollout-num-engines", "1"])):
        templates[name] = str(tmp_path / f"rec_{name}" / "r_{rollout_id}.grz")
        done = _train(tmp_path / name, *flags, *extra, "--save-debug-rollout-data", templates[name])
        assert done.returncode == 0, done.stderr[-3000:]
    served, inproc = _metrics(tmp_path / "served"), _metrics(tmp_path / "inproc")
    assert served == inproc
    assert [r[0] for r in served].count("eval") == 3 and not any(r[0] == "step" for r in served)
    for rid in (0, 1, "eval_0", "eval_1", "eval_2"):
        a, b = (load_rollout(t.format(rollout_id=rid)).samples for t in templates.values())
        assert [(s.response_ids, s.rollout_log_probs.numpy().tobytes(), s.reward) for s in a] == [
            (s.response_ids, s.rollout_log_probs.numpy().tobytes(), s.reward) for s in b
        ], rid
    assert "Router ready" in (tmp_path / "served" / "router.log").read_text()


@pytest.mark.slow
def test_a_killed_engine_fails_the_run_at_once_and_leaves_no_process(tmp_path: Path) -> None:
    run = tmp_path / "killed"
    argv = [sys.executable, "-m", "grpolab", "train", "--run-dir", str(run), *SMALL, "--num-rollout", "6"]
    argv += ["--rollout-num-engines", "1"]  # the default --engine-failure-timeout, 60 s
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        fleet, engines = engines_after_first_metrics(proc, run)
        assert len(engines) == 1 and len(fleet) == 2, fleet  # one engine and the router
        os.kill(engines[0], signal.SIGKILL)
        killed = time.monotonic()
        _, err = proc.communicate(timeout=120)
        seconds = time.monotonic() - killed
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 1, err[-3000:]
    # a launched engine that exited cannot come back: the run fails at once, not after the 60 s
    # (the seconds are the trainer's stop and the router's graceful shutdown, ~3-6 s on 2 busy cores)
    assert seconds < 30, seconds
    assert "engine 0 (http://127.0.0.1:" in err and "killed by SIGKILL" in err, err[-3000:]
    # what went, not "failed for 0.0 s" (the log doctor's engine_gone verdict reads this prefix)
    assert "rollout engine 'sglang fleet (1 engine behind http://127.0.0.1:" in err, err[-3000:]
    assert "' is gone: engine 0 (http://127.0.0.1:" in err and "failed for" not in err, err[-3000:]
    assert "[engines/0.log]" in err  # the engine's last log lines are quoted
    status = [e for e in read_events(run) if e.get("event") == "status" or e.get("type") == "status"]
    assert status and status[-1].get("status") == "failed", status
    assert not any(_alive(p) for p in fleet), [p for p in fleet if _alive(p)]  # the router went too


@pytest.mark.slow
def test_sigterm_ends_the_run_and_its_fleet(tmp_path: Path) -> None:
    run = tmp_path / "term"
    argv = [sys.executable, "-m", "grpolab", "train", "--run-dir", str(run), *SMALL, "--num-rollout", "20"]
    argv += ["--rollout-num-engines", "2"]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 300
        while "Router ready" not in _read(run / "router.log") or len(proc_children(proc.pid)) < 3:
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[1][-3000:]
            time.sleep(0.2)
        while not _read(run / "metrics.jsonl"):  # both engines registered and serving
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[1][-3000:]
            time.sleep(0.2)
        fleet = proc_children(proc.pid)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 143, err[-3000:]  # 128 + SIGTERM
    assert len(fleet) == 3 and not any(_alive(p) for p in fleet), fleet


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


@pytest.mark.slow
def test_a_router_on_a_taken_port_is_exit_2(tmp_path: Path) -> None:
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        result = _train(tmp_path / "taken", "--rollout-num-engines", "1", "--sglang-router-port", str(port))
    assert result.returncode == 2, result.stderr[-3000:]
    assert f"--sglang-router-port {port}: 127.0.0.1:{port} is in use" in result.stderr


@pytest.mark.slow
def test_a_second_router_on_the_machine_starts(tmp_path: Path, tiny_model_dir: Path) -> None:
    """sglang-router's Prometheus exporter binds 0.0.0.0:29000 unless told otherwise: with that port taken
    (another run's router) the router panicked "Address already in use" (seen in a benchmark run)."""
    import socket

    from grpolab.core.engine.fleet import Fleet
    from grpolab.core.engine.http_calls import call_json

    with socket.socket() as held:
        held.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 0)
        try:
            held.bind(("0.0.0.0", 29000))
            held.listen(1)
        except OSError:
            pass  # already taken by something else: the same situation
        fleet = Fleet.launch(checkpoint=str(tiny_model_dir), num_engines=1, run_dir=tmp_path)
        try:
            answer = call_json("GET", fleet.router_url + "/workers", None, timeout=10)
            assert [w["url"] for w in answer["workers"]] == [fleet.engines[0].url]
        finally:
            fleet.close()

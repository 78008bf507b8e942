"""`grpolab diagnose hang` at its edges: one sample, processes that end mid-diagnosis, reused pids, two
jobs under one --match, recorded errors of a failed run, backend advice, bad flags, a closed pipe.

Same stand-ins as test_hang_cli.py (hang_fakes.py): real sleeping processes, a fake py-spy.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hang_fakes import ALL_REDUCE, STALE_S, FakeWorld, cli, kill_after_first_dump, run_json

from grpolab.diagnose.common.procfs import proc_start_time, started_after
from grpolab.diagnose.hang import run_hang_command
from grpolab.diagnose.hang.match import ranks_from_match
from grpolab.diagnose.hang.targets import InspectError

PEER_ERROR = (
    "RuntimeError: [/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed by peer "
    "[127.0.0.1]:19102. This is typically caused by a remote worker crashing."
)
ROOT_ERROR = (
    "InjectedFault: injected fault: raise_in_train on rank 1 at rollout 0\n"
    '  File "/work/main/checkers/faults.py", line 255, in _fire\n'
    '    raise InjectedFault(f"injected fault: {what}")'
)


def text_run(world: FakeWorld, capsys: pytest.CaptureFixture, *argv: str) -> tuple[int, str, str]:
    code = run_hang_command(cli(world, *argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


# ----------------------------------------------------------------------------- one sample (--interval 0)
def test_one_sample_of_fresh_heartbeats_is_not_confirmed(world: FakeWorld, capsys) -> None:
    pid = world.spawn()
    world.shows(pid, ALL_REDUCE)
    run = world.run_dir([pid])
    code, out, err = text_run(world, capsys, str(run), "--interval", "0")
    assert code == 2, out
    assert "grpolab diagnose hang: not confirmed yet: only one sample was taken" in err
    assert "--interval > 0" in err and "older than --stall-seconds 120" in err
    assert "Not hung" not in out + err and "progress observed" not in out + err
    stale = world.run_dir([pid], name="stale", age_s=STALE_S)
    code, report = run_json(world, capsys, str(stale), "--interval", "0", "--stall-seconds", "1")
    assert code == 1 and report["progress"]["outcome"] == "hung" and report["progress"]["samples"] == 1
    assert report["progress"]["reason"].startswith("only one sample was taken, and the newest heartbeat")
    assert "a healthy phase longer than --stall-seconds 1" in report["progress"]["note"]
    assert "take two samples or raise --stall-seconds" in report["progress"]["note"]


def test_one_sample_while_the_run_writes_says_so(world: FakeWorld, capsys) -> None:
    pid = world.spawn()
    world.shows(pid, ALL_REDUCE)
    run = world.run_dir([pid])
    (world.spy_dir / f"{pid}.touch").write_text(str(run / "ranks" / "0.json"))  # a heartbeat mid-dump
    code, out, _ = text_run(world, capsys, str(run), "--interval", "0", "--stall-seconds", "1")
    assert code == 0
    assert "progress observed: the run wrote ranks/0.json while its ranks were sampled" in out
    assert "between the two samples" not in out


# ------------------------------------------------------------------------- processes that end meanwhile
@pytest.mark.parametrize("mode", ["text", "json"])
def test_pid_that_exits_during_sampling_is_not_hung(world: FakeWorld, capsys, mode: str) -> None:
    pid = world.spawn()
    world.shows(pid, ALL_REDUCE)
    killer = kill_after_first_dump(world, pid)
    try:
        if mode == "json":
            code, report = run_json(world, capsys, "--pid", str(pid), "--interval", "1")
        else:
            code, out, _ = text_run(world, capsys, "--pid", str(pid), "--interval", "1")
    finally:
        killer.join()
    assert code == 0
    if mode == "json":
        assert report["hung"] is False and report["exit_code"] == 0
        assert report["progress"]["outcome"] == "ended" and report["progress"]["progressed"] is True
        assert report["verdict"]["kind"] == "not_hung"
        assert report["verdict"]["title"] == f"Not hung: the processes ended during the diagnosis (pid {pid})"
    else:
        assert f"every process ended during the diagnosis (pid {pid}): nothing is left to hang" in out
        assert "hang confirmed" not in out and "ended rather than hung" not in out
        assert f"rank 0 (pid {pid}): exited (pid gone)" in out


# ------------------------------------------------------------------------------------------ reused pids
def test_proc_start_time_of_a_new_process() -> None:
    before = time.time()
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        started = proc_start_time(proc.pid)
        assert started is not None and before - 2.0 <= started <= time.time() + 2.0
        assert started_after(proc.pid, before - 60) and not started_after(proc.pid, time.time())
        assert proc_start_time(os.getpid()) <= started
    finally:
        proc.kill()
        proc.wait(timeout=30)


def test_reused_pid_reads_as_exited_not_as_a_py_spy_failure(world: FakeWorld, capsys) -> None:
    """The rank's heartbeat is 10 min old but its pid now belongs to a process started seconds ago."""
    stranger = world.spawn()
    world.fails(stranger, "Error: Failed to find python version from target process")  # not Python
    run = world.tmp / "reused"
    world.rank_file(run, 0, stranger, at=time.time() - 600)
    code, _, err = text_run(world, capsys, str(run))
    assert code == 2
    assert f"pid {stranger} now belongs to another process started after the rank's last heartbeat" in err
    assert "py-spy could not dump" not in err
    assert not (world.spy_dir / f"{stranger}.count").exists()  # never attached to

    world.final_status(run, "failed", "RuntimeError: boom")
    code, report = run_json(world, capsys, str(run))
    assert code == 0 and report["progress"]["outcome"] == "ended"


def test_reused_pid_next_to_a_live_rank_is_rank_exited(world: FakeWorld, capsys) -> None:
    live, stranger = world.spawn(), world.spawn()
    world.shows(live, ALL_REDUCE)
    run = world.tmp / "mixed"
    world.rank_file(run, 0, live, at=time.time())
    world.rank_file(run, 1, stranger, at=time.time() - 600)
    code, report = run_json(world, capsys, str(run), "--interval", "0.1")
    assert code == 1 and report["verdict"]["kind"] == "rank_exited"
    assert "now belongs to another process" in report["missing_ranks"]["1"]
    assert report["ranks"][1]["alive"] is False
    assert not (world.spy_dir / f"{stranger}.count").exists()


# ------------------------------------------------------------------------------------ two jobs, one match
def test_match_refuses_the_ranks_of_two_jobs(world: FakeWorld) -> None:
    marker = f"grpolab-two-jobs-{os.getpid()}-{time.time_ns()}"
    jobs = {}
    for port in ("29611", "29622"):
        env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port}
        jobs[port] = [world.spawn(marker, env={**env, "RANK": str(r)}) for r in (0, 1)]
    with pytest.raises(InspectError) as caught:
        ranks_from_match(marker)
    message = str(caught.value)
    assert "matches the ranks of 2 jobs" in message and "--pid" in message
    for port, pids in jobs.items():
        assert f"127.0.0.1:{port}): pid {pids[0]} (RANK 0), pid {pids[1]} (RANK 1)" in message


def test_match_of_one_job_still_works(world: FakeWorld) -> None:
    marker = f"grpolab-one-job-{os.getpid()}-{time.time_ns()}"
    env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29633", "TORCHELASTIC_RUN_ID": "abc"}
    pids = [world.spawn(marker, env={**env, "RANK": str(r)}) for r in (1, 0)]
    targets, _ = ranks_from_match(marker)
    assert [(t.rank, t.pid) for t in targets] == [(0, pids[1]), (1, pids[0])]


# ----------------------------------------------------------------------- errors recorded by a failed run
def failed_run(world: FakeWorld) -> Path:
    """Rank 1 raised first; rank 0 then lost its connection to it; the status carries rank 0's error."""
    run = world.tmp / "failed"
    now = time.time()
    world.rank_file(run, 0, world.gone_pid(), at=now - 3.0, error=PEER_ERROR)
    world.rank_file(run, 1, world.gone_pid(), at=now - 4.0, error=ROOT_ERROR)
    world.final_status(run, "failed", PEER_ERROR)
    return run


def test_failed_run_shows_every_rank_error_root_cause_first(world: FakeWorld, capsys) -> None:
    run = failed_run(world)
    code, out, _ = text_run(world, capsys, str(run))
    assert code == 0, out
    assert "\nthe run ended (final status 'failed'); no rank process is alive\n" in out
    assert (
        "verdict: Not hung: the run ended (final status 'failed'); rank 1 failed first: InjectedFault: "
        "injected fault: raise_in_train on rank 1 at rollout 0\n"
    ) in out
    root = out.index("exception recorded by rank 1 (root cause):\n    InjectedFault: injected fault")
    side = out.index(
        "exception recorded by rank 0 (a consequence: lost the connection to a peer after rank 1 failed):"
    )
    assert root < side
    assert "in _fire" in out[root:side]  # the whole recorded traceback tail
    assert "1. Fix the error on rank 1 first: InjectedFault" in out
    assert "The error of rank 0 follows from it: the connection to rank 1 closed" in out
    assert "progress observed" not in out and "exited, exited" not in out and "re-check later" not in out
    code, report = run_json(world, capsys, str(run))
    assert [e["rank"] for e in report["rank_errors"]] == [1, 0]
    assert [e["peer_connection_error"] for e in report["rank_errors"]] == [False, True]


def test_a_rank_gone_without_final_status_is_never_progress(world: FakeWorld, capsys) -> None:
    """A copied run dir: fresh file mtimes, rank 0 (local) gone, rank 1 on another host, no status."""
    run = world.tmp / "copied"
    world.rank_file(run, 0, world.gone_pid(), at=time.time() - 5)
    world.rank_file(run, 1, world.spawn(), at=time.time(), host="node-elsewhere-9")
    (run / "metrics.jsonl").write_text(json.dumps({"kind": "step", "metrics": {}}) + "\n")  # fresh mtime
    code, report = run_json(world, capsys, str(run), "--interval", "0.1")
    assert code == 1, report
    assert report["verdict"]["kind"] == "rank_exited"
    assert report["progress"]["outcome"] == "hung" and report["progress"]["ranks_exited"] == [0]
    assert "node-elsewhere-9" in report["missing_ranks"]["1"]
    assert any(n.startswith("rank 1 not inspected: on host node-elsewhere-9") for n in report["notes"])


def test_activity_age_comes_from_record_times_not_file_mtimes(world: FakeWorld, capsys) -> None:
    pid = world.spawn()
    world.shows(pid, [("score", "/work/job.py", 20), ("main", "/work/job.py", 51)], sample=1)
    world.shows(pid, [("score", "/work/job.py", 21), ("main", "/work/job.py", 51)], sample=2)
    run = world.run_dir([pid], age_s=STALE_S)
    old = {"kind": "step", "time": time.time() - 900, "metrics": {}}
    (run / "metrics.jsonl").write_text(json.dumps(old) + "\n")  # mtime now, last record 15 min ago
    code, report = run_json(world, capsys, str(run), "--interval", "0.2", "--stall-seconds", "1")
    assert code == 1 and report["run"]["metrics_age_s"] >= 899


# ------------------------------------------------------------------------------------- backend advice
def _still_running(world: FakeWorld, short_run: Path, tmp_path: Path, **run_json_edits: object) -> Path:
    """A copy of a real `grpolab train` run directory that looks like a 2-rank run stuck in an all_reduce:
    run.json edited (device: config.model.device; other keys top level), its final status dropped, and
    ranks 0 and 1 rewritten to live sleepers (fresh heartbeats) whose py-spy shows the all_reduce."""
    run = Path(shutil.copytree(short_run, tmp_path / "real-run"))
    meta = json.loads((run / "run.json").read_text())
    for key, value in {"world_size": 2, **run_json_edits}.items():
        if key == "device":
            meta["config"]["model"]["device"] = value
        else:
            meta[key] = value
    (run / "run.json").write_text(json.dumps(meta, indent=2))
    events = (run / "events.jsonl").read_text().splitlines(keepends=True)
    assert json.loads(events[-1])["event"] == "status"  # the real run finished
    (run / "events.jsonl").write_text("".join(events[:-1]))
    rank0 = json.loads((run / "ranks" / "0.json").read_text())
    for rank in (0, 1):
        pid = world.spawn()
        world.shows(pid, ALL_REDUCE)
        record = {**rank0, "rank": rank, "pid": pid, "heartbeat": {**rank0["heartbeat"], "time": time.time()}}
        (run / "ranks" / f"{rank}.json").write_text(json.dumps(record))
    return run


@pytest.mark.parametrize(
    ("edits", "nccl"),
    [({"device": "cuda", "backend": "nccl"}, True), ({"device": "cuda"}, True), ({}, False)],
    ids=["cuda-nccl", "cuda-no-backend", "cpu-as-written"],
)
def test_next_steps_follow_a_real_runs_device_and_backend(
    world: FakeWorld, capsys, short_run: Path, tmp_path: Path, edits: dict, nccl: bool
) -> None:
    run = _still_running(world, short_run, tmp_path, **edits)
    code, report = run_json(world, capsys, str(run), "--interval", "0.1")
    steps = " ".join(report["verdict"]["next_steps"])
    assert code == 1 and report["verdict"]["hung"], report
    assert report["run"]["device"] == edits.get("device", "cpu")
    assert report["run"]["backend"] == edits.get("backend")  # a one-process CPU run records none
    assert "TORCH_DISTRIBUTED_DEBUG=DETAIL" in steps and "timeout=timedelta(seconds=300)" in steps
    assert ("NCCL_DEBUG=INFO" in steps) is nccl
    assert ("10 min for NCCL)" in steps) is nccl and ("30 min for gloo)" in steps) is not nccl
    assert ("GLOO_SOCKET_IFNAME" in steps) is not nccl


@pytest.mark.parametrize(("backend", "nccl"), [("det_nccl", True), ("det_gloo", False), ("gloo", False)])
def test_the_recorded_backend_decides_the_advice(
    world: FakeWorld, capsys, short_run: Path, tmp_path: Path, backend: str, nccl: bool
) -> None:
    # run.json's backend (deterministic collectives: det_nccl / det_gloo) outranks the device
    run = _still_running(world, short_run, tmp_path, device="cuda" if not nccl else "cpu", backend=backend)
    code, report = run_json(world, capsys, str(run), "--interval", "0.1")
    steps = " ".join(report["verdict"]["next_steps"])
    assert code == 1 and ("NCCL_DEBUG=INFO" in steps) is nccl and ("GLOO_SOCKET_IFNAME" in steps) is not nccl


# ------------------------------------------------------------------------------------------ bad flags
@pytest.mark.parametrize(
    ("flag", "value"),
    [
        ("--interval", "inf"),
        ("--interval", "1e300"),
        ("--interval", "nan"),
        ("--timeout", "inf"),
        ("--timeout", "1e300"),
        ("--stall-seconds", "inf"),
    ],
)
def test_non_finite_or_huge_seconds_are_exit_2_naming_the_flag(
    world: FakeWorld, capsys, flag: str, value: str
) -> None:
    pid = world.spawn()
    world.shows(pid, ALL_REDUCE)
    code, report = run_json(world, capsys, "--pid", str(pid), flag, value)
    assert code == 2 and report["error"].startswith(f"{flag}: expected a finite number of seconds")
    assert not (world.spy_dir / f"{pid}.count").exists()  # rejected before any sampling


# ------------------------------------------------------------------------------------------ a closed pipe
def test_closed_stdout_ends_quietly(world: FakeWorld) -> None:
    pid = world.spawn()
    world.shows(pid, ALL_REDUCE)
    proc = subprocess.Popen(
        [sys.executable, "-m", "grpolab", "diagnose", "hang", "--pid", str(pid), "--interval", "0.5"]
        + ["--py-spy", str(world.py_spy)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    proc.stdout.close()  # like `| head -1` after its line: the report is written into a closed pipe
    try:
        _, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert b"Traceback" not in err and b"BrokenPipeError" not in err, err.decode()
    assert proc.returncode == 1

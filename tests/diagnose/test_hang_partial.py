"""`grpolab diagnose hang` when it cannot see every rank: a rank on another host, a rank that exits
while it samples, a rank found only as an orphaned forked worker (`--match`), and the floor of
`--stall-seconds`.

Same stand-ins as test_hang_cli.py (hang_fakes.py): real processes (real fork, real reparenting),
a fake py-spy. The real-fixture versions are in test_hang_real.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hang_fakes import ALL_REDUCE, FakeWorld, cli, kill_after_first_dump, run_json

from grpolab.diagnose.common.procfs import is_alive, proc_cmdline, proc_env_rank, proc_parent
from grpolab.diagnose.hang import run_hang_command
from grpolab.diagnose.hang.match import ranks_from_match


# --------------------------------------------------------------------------------- a rank elsewhere
def test_rank_on_another_host_is_not_counted_and_the_headline_says_so(world: FakeWorld, capsys) -> None:
    pids = [world.spawn(), world.spawn()]
    for pid in pids:
        world.shows(pid, ALL_REDUCE)
    run = world.run_dir(pids)
    record = json.loads((run / "ranks" / "1.json").read_text())  # the run's rank 1 is on another host
    (run / "ranks" / "2.json").write_text(json.dumps({**record, "rank": 2}))
    (run / "ranks" / "1.json").write_text(json.dumps({**record, "host": "otherhost", "pid": 999998}))
    code = run_hang_command(cli(world, str(run), "--interval", "0.1"))
    out = capsys.readouterr().out
    assert code == 1, out
    assert (
        "hang confirmed: 2 of 3 ranks inspected; rank 1 on host otherhost was not; the stacks of ranks 0, 2 "
        "are identical in two samples 0.1 s apart"
    ) in out
    assert "every rank" not in out
    verdict = out[out.index("verdict: ") :].splitlines()[0]
    assert verdict.startswith("verdict: Same collective (pattern C): ranks 0, 2 wait in all_reduce")
    assert verdict.endswith("(rank 1 not inspected: run this on otherhost too)")
    assert "\n  1. Run the same `grpolab diagnose hang` on otherhost too: rank 1 runs there" in out
    assert "The code agrees on ranks 0, 2 (the ranks whose stacks were read)" in out
    assert "py-spy gave nothing" not in out
    assert "rank 1 on host otherhost was not inspected (py-spy reaches only" in out
    code, report = run_json(world, capsys, str(run), "--interval", "0.1")
    assert report["progress"]["ranks_not_inspected"] == [1] and report["progress"]["ranks_compared"] == [0, 2]
    assert [r["alive"] for r in report["ranks"]] == [True, None, True]


# ------------------------------------------------------------------------ a rank that exits meanwhile
def test_one_of_two_pids_exiting_during_sampling_is_in_the_headline(world: FakeWorld, capsys) -> None:
    pids = [world.spawn(), world.spawn()]
    for pid in pids:
        world.shows(pid, ALL_REDUCE)
    killer = kill_after_first_dump(world, pids[0])
    try:
        code = run_hang_command(cli(world, "--pid", *map(str, pids), "--interval", "1"))
    finally:
        killer.join()
    out = capsys.readouterr().out
    assert code == 1, out
    assert (
        "hang confirmed: rank 0 exited during sampling; the stack of rank 1 is identical in two samples "
        "1 s apart\n"
    ) in out
    assert "every rank" not in out
    assert "verdict: Rank 0 exited; rank 1 waits in all_reduce for it" in out


# ------------------------------------------------------------------------- an orphaned forked worker
FORK_AND_EXIT = (
    "import os, sys, time\n"
    "if os.fork() == 0:\n"
    "    time.sleep(300)\n"  # the child: a worker that outlives its rank
    "    sys.exit(0)\n"
    "os._exit(1)\n"  # the rank: exits at once
)


def orphan_of_exited_rank(world: FakeWorld, marker: str, env: dict[str, str], *, new_session: bool) -> tuple:
    """Start a "rank" that forks a worker and exits; (the rank's pid, the orphaned worker's pid)."""
    rank = subprocess.Popen(
        [sys.executable, "-c", FORK_AND_EXIT, marker],
        env={**os.environ, **env},
        start_new_session=new_session,
    )
    rank.wait(timeout=60)  # reaped: the worker is reparented to init or a subreaper
    deadline = time.time() + 60
    while True:
        found = [
            int(e.name)
            for e in Path("/proc").iterdir()
            if e.name.isdigit()
            and marker in (proc_cmdline(int(e.name)) or "")
            and proc_env_rank(int(e.name)) == int(env["RANK"])
        ]
        if found and proc_parent(found[0]) != rank.pid:
            break
        assert time.time() < deadline, "the forked worker did not show up"
        time.sleep(0.02)
    (worker,) = found
    return rank.pid, worker


def kill(pid: int) -> None:
    try:
        os.kill(pid, 9)
    except ProcessLookupError:
        pass


def test_orphan_forked_by_an_exited_session_leader_is_that_rank_exited(world: FakeWorld, capsys) -> None:
    """torchrun starts every worker in its own session: an orphan whose group leader is gone was forked by
    that leader, the rank, which exited."""
    marker = f"grpolab-orphan-leader-{os.getpid()}-{time.time_ns()}"
    env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29644"}
    rank0 = world.spawn(marker, env={**env, "RANK": "0"})  # FakeWorld.spawn: a new session, like torchrun
    rank1, worker = orphan_of_exited_rank(world, marker, {**env, "RANK": "1"}, new_session=True)
    try:
        assert not is_alive(rank1)
        targets, notes = ranks_from_match(marker)
        assert [(t.rank, t.pid) for t in targets] == [(0, rank0), (1, rank1)]
        assert targets[1].caveat is None
        assert any(
            f"pid {worker} matches with RANK 1 but was forked by pid {rank1}, its session and process group "
            "leader, which exited" in n
            for n in notes
        )
        world.shows(rank0, ALL_REDUCE)
        code, report = run_json(world, capsys, "--match", marker, "--interval", "0.1")
        assert code == 1 and report["verdict"]["kind"] == "rank_exited"
        assert report["verdict"]["title"] == "Rank 1 exited; rank 0 waits in all_reduce for it"
        assert report["progress"]["reason"].startswith(
            "rank 1 had exited before sampling; the stack of rank 0 is identical"
        )
        assert not (world.spy_dir / f"{worker}.count").exists()  # the worker was never taken for rank 1
    finally:
        kill(worker)


def test_orphan_without_a_group_leader_to_blame_gets_a_caveat(world: FakeWorld) -> None:
    marker = f"grpolab-orphan-caveat-{os.getpid()}-{time.time_ns()}"
    env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29655"}
    rank0 = world.spawn(marker, env={**env, "RANK": "0"})
    _, worker = orphan_of_exited_rank(world, marker, {**env, "RANK": "1"}, new_session=False)
    try:
        targets, _ = ranks_from_match(marker)
        assert [(t.rank, t.pid) for t in targets] == [(0, rank0), (1, worker)]
        caveat = targets[1].caveat or ""
        assert caveat.startswith(f"only an orphaned process matches RANK 1 (pid {worker}, parent pid ")
        assert f"while the job's other ranks have parent pid {os.getpid()}" in caveat
        assert "it may be a forked worker" in caveat
    finally:
        kill(worker)


def test_orphan_next_to_a_live_process_of_its_rank_is_skipped(world: FakeWorld) -> None:
    marker = f"grpolab-orphan-skipped-{os.getpid()}-{time.time_ns()}"
    env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29666"}
    rank0 = world.spawn(marker, env={**env, "RANK": "0"})
    _, worker = orphan_of_exited_rank(world, marker, {**env, "RANK": "1"}, new_session=False)
    try:
        rank1 = world.spawn(marker, env={**env, "RANK": "1"})  # rank 1 restarted; its old worker lingers
        targets, notes = ranks_from_match(marker)
        assert [(t.rank, t.pid) for t in targets] == [(0, rank0), (1, rank1)]
        assert all(t.caveat is None for t in targets)
        assert any(f"pid {worker} matches with RANK 1 but is an orphan" in n for n in notes)
    finally:
        kill(worker)


# ---------------------------------------------------------------------------------- --stall-seconds
@pytest.mark.parametrize("value", ["0", "0.001", "0.99"])
def test_stall_seconds_below_one_second_is_refused(world: FakeWorld, capsys, value: str) -> None:
    pid = world.spawn()
    world.shows(pid, ALL_REDUCE)
    run = world.run_dir([pid])
    code, report = run_json(world, capsys, str(run), "--interval", "0", "--stall-seconds", value)
    assert code == 2 and report["error"] == (
        f"--stall-seconds: expected a finite number of seconds >= 1, got {float(value)}"
    )
    assert not (world.spy_dir / f"{pid}.count").exists()


def test_stall_seconds_help_says_the_floor_and_the_false_alarm() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "grpolab", "diagnose", "hang", "--help"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "COLUMNS": "400"},
    )
    assert out.returncode == 0, out.stderr
    text = " ".join(out.stdout.split())
    assert "--stall-seconds STALL_SECONDS heartbeats/metrics older than this (seconds, at least 1)" in text
    assert "Heartbeats are written at phase changes only: a value below the run's longest phase" in text

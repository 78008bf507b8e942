"""`grpolab diagnose hang` on REAL hangs: gloo ranks on CPU blocked for real, py-spy for real.

The hangs come from fixtures/hangs (independent rank processes, each scenario one AReaL pattern);
one test hangs a real `grpolab train --nproc-per-node 2` run with the fault action
`sleep_forever_at_end`. Every test kills its processes in a `finally` (fixture teardown).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from runs import SMALL

from grpolab.diagnose.hang import add_hang_arguments, run_hang_command
from grpolab.fixtures.hangs import launch_hang_world, stop_hang_world, wait_until_hung

FAST = ("--interval", "0.5")
"""Two samples half a second apart: enough for a process blocked in gloo (its stack cannot move)."""


@contextmanager
def hung_world(tmp: Path, scenario: str, world_size: int) -> Iterator[tuple[Path, dict[int, dict]]]:
    """Start a fixture scenario, wait until every rank blocked (or exited), stop it afterwards."""
    run = tmp / scenario
    procs = launch_hang_world(scenario, world_size, run, hang_seconds=300)
    try:
        markers = wait_until_hung(run, world_size, timeout_s=240, procs=procs)
        yield run, markers
    finally:
        stop_hang_world(procs, run)


def diagnose(capsys: pytest.CaptureFixture, *argv: str) -> tuple[int, dict]:
    """`grpolab diagnose hang *argv --json` in this process; (exit code, the printed JSON)."""
    parser = argparse.ArgumentParser()
    add_hang_arguments(parser)
    code = run_hang_command(parser.parse_args([*argv, "--json"]))
    return code, json.loads(capsys.readouterr().out)


def diagnose_text(capsys: pytest.CaptureFixture, *argv: str) -> tuple[int, str]:
    parser = argparse.ArgumentParser()
    add_hang_arguments(parser)
    code = run_hang_command(parser.parse_args(list(argv)))
    return code, capsys.readouterr().out


def rows(report: dict) -> dict[int, dict]:
    return {row["rank"]: row for row in report["verdict"]["rows"]}


def dump_dir(run: Path) -> Path:
    (only,) = (run / "diagnose").iterdir()
    return only


def test_cleanup_deadlock_reports_the_exception_first(tmp_path: Path, capsys) -> None:
    with hung_world(tmp_path, "cleanup", 2) as (run, _):
        code, text = diagnose_text(capsys, str(run), *FAST)
    assert code == 1, text
    head, _, rest = text.partition("evidence:")
    assert "verdict: Cleanup deadlock (pattern A): rank 1 failed (RuntimeError)" in head
    # the failing rank's own exception comes first: before the evidence, the table and the advice
    assert "exception recorded by rank 1:\n    RuntimeError: reward tensor has shape (7,)" in head
    assert "in compute_loss" in head  # the traceback tail the rank recorded
    assert rest.index("rank 1 raised RuntimeError") < rest.index("rank 0 waits in all_reduce")
    assert "barrier (torch/distributed/distributed_c10d.py" in rest and "Trainer.__exit__" in rest
    saved = json.loads((dump_dir(run) / "verdict.json").read_text())
    assert saved["verdict"]["kind"] == "cleanup_deadlock" and saved["verdict"]["pattern"] == "A"
    by_rank = rows(saved)
    assert by_rank[1]["state"] == "teardown" and by_rank[1]["collective"] == "barrier"
    assert by_rank[0]["state"] == "collective" and by_rank[0]["collective"] == "all_reduce"
    assert by_rank[0]["call_site"].startswith("train_step (")
    assert saved["progress"]["progressed"] is False and saved["progress"]["ranks_moved"] == []


def test_mismatched_collectives_name_the_rank_missing_the_all_reduce(tmp_path: Path, capsys) -> None:
    with hung_world(tmp_path, "mismatch", 3) as (run, _):
        code, report = diagnose(capsys, str(run), *FAST)
        # the same hang with rank 1 (the one in barrier) on another host: never counted as agreeing
        record = json.loads((run / "ranks" / "1.json").read_text())
        (run / "ranks" / "1.json").write_text(json.dumps({**record, "host": "otherhost", "pid": 999998}))
        other_code, other = diagnose_text(capsys, str(run), *FAST, "--out", str(tmp_path / "other"))
    assert other_code == 1, other
    assert (
        "hang confirmed: 2 of 3 ranks inspected; rank 1 on host otherhost was not; the stacks of ranks 0, 2"
        in other
    )
    assert "every rank" not in other and "py-spy gave nothing" not in other
    title = other[other.index("verdict: ") :].splitlines()[0]
    assert title.startswith(
        "verdict: Same collective (pattern C): ranks 0, 2 wait in all_reduce ← train_step"
    )
    assert title.endswith("(rank 1 not inspected: run this on otherhost too)")
    assert "next steps:\n  1. Run the same `grpolab diagnose hang` on otherhost too" in other
    assert code == 1
    verdict = report["verdict"]
    assert verdict["kind"] == "mismatched_collectives" and verdict["pattern"] == "B"
    assert verdict["title"].startswith(
        "Mismatched collectives (pattern B): rank 1 waits in barrier, ranks 0, 2"
    )
    assert any(
        e.startswith("rank 1 is missing the collective the others wait in") for e in verdict["evidence"]
    )
    by_rank = rows(report)
    assert [by_rank[r]["collective"] for r in (0, 1, 2)] == ["all_reduce", "barrier", "all_reduce"]
    assert by_rank[1]["call_site"].startswith("save_checkpoint (")
    assert sorted(p.name for p in dump_dir(run).iterdir()) == [
        "rank0.json",
        "rank0.txt",
        "rank1.json",
        "rank1.txt",
        "rank2.json",
        "rank2.txt",
        "verdict.json",
    ]


@pytest.fixture(scope="module")
def straggler(tmp_path_factory) -> Iterator[tuple[Path, dict[int, dict]]]:
    """One straggler world (3 ranks, rank 1 sleeps) shared by the RUN_DIR, --pid, --match and CLI tests."""
    with hung_world(tmp_path_factory.mktemp("hang"), "straggler", 3) as world:
        yield world


def test_straggler_same_collective_names_the_sleeping_rank(straggler, capsys) -> None:
    run, markers = straggler
    code, report = diagnose(capsys, str(run), *FAST)
    assert code == 1
    verdict = report["verdict"]
    assert verdict["kind"] == "same_collective" and verdict["pattern"] == "C"
    assert "ranks 0, 2 wait in all_reduce" in verdict["title"]
    assert "rank 1 has not arrived (straggler)" in verdict["title"]
    by_rank = rows(report)
    assert by_rank[1]["state"] == "idle" and by_rank[1]["where"].startswith("generate_rollouts (")
    assert [r["pid"] for r in report["ranks"]] == [markers[r]["pid"] for r in range(3)]
    assert report["progress"]["ranks_compared"] == [0, 1, 2]
    text = (dump_dir(run) / "rank1.txt").read_text()
    assert f"Process {markers[1]['pid']}:" in text and "generate_rollouts (" in text


def test_pid_and_match_find_the_same_ranks(straggler, capsys) -> None:
    run, markers = straggler
    pids = [str(markers[r]["pid"]) for r in (2, 0, 1)]  # --pid numbers ranks in the order given
    code, report = diagnose(capsys, "--pid", *pids, *FAST)
    assert code == 1 and report["verdict"]["kind"] == "same_collective"
    assert [r["pid"] for r in report["ranks"]] == [int(p) for p in pids]
    assert "rank 2 has not arrived (straggler)" in report["verdict"]["title"]
    assert report["run_dir"] is None and report["dumps"] is None
    code, report = diagnose(capsys, "--match", re.escape(str(run)), *FAST)
    assert code == 1 and report["verdict"]["kind"] == "same_collective"
    assert [(r["rank"], r["pid"]) for r in report["ranks"]] == [(r, markers[r]["pid"]) for r in range(3)]
    assert "rank 1 has not arrived (straggler)" in report["verdict"]["title"]


def test_native_frames_in_the_last_sample(straggler, capsys, tmp_path: Path) -> None:
    run, markers = straggler
    out = tmp_path / "native"
    code, report = diagnose(capsys, "--pid", str(markers[0]["pid"]), "--native", *FAST, "--out", str(out))
    assert code == 1 and report["verdict"]["kind"] == "same_collective"
    assert "c10d::" in rows(report)[0]["native_wait"]  # gloo's wait, seen through py-spy --native
    first, last = json.loads((out / "rank0.json").read_text())["samples"]
    native = [f for t in last["stack"]["threads"] for f in t["frames"] if f["native"]]
    assert native and not any(f["native"] for t in first["stack"]["threads"] for f in t["frames"])


def test_cli_json_shape(straggler) -> None:
    run, _ = straggler
    out = subprocess.run(
        [sys.executable, "-m", "grpolab", "diagnose", "hang", str(run), "--json", "--interval", "0.5"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 1, out.stderr
    report = json.loads(out.stdout)  # one JSON object, nothing else on stdout
    assert set(report) >= {
        "verdict",
        "hung",
        "exit_code",
        "run_dir",
        "run",
        "dumps",
        "progress",
        "ranks",
        "missing_ranks",
        "notes",
        "py_spy",
        "command",
        "elapsed_s",
    }
    assert report["hung"] is True and report["exit_code"] == 1 and report["missing_ranks"] == {}
    assert set(report["verdict"]) >= {"kind", "pattern", "title", "evidence", "rows", "next_steps"}
    steps = " ".join(report["verdict"]["next_steps"])
    assert "TORCH_DISTRIBUTED_DEBUG=DETAIL" in steps and "timeout=timedelta(seconds=300)" in steps
    assert "NCCL_DEBUG" not in steps  # a gloo world: nothing says NCCL (no run.json, no NCCL frames)
    assert set(report["progress"]) >= {
        "progressed",
        "reason",
        "interval_s",
        "stall_seconds",
        "newest_activity_age_s",
    }
    assert report["py_spy"]["version"].startswith("py-spy ")
    assert Path(report["dumps"], "verdict.json").exists()
    assert {r["rank"]: r["dumped"] for r in report["ranks"]} == {0: True, 1: True, 2: True}


def test_rank_exited_before_all_reduce(tmp_path: Path, capsys) -> None:
    with hung_world(tmp_path, "exit", 2) as (run, markers):
        code, report = diagnose(capsys, str(run), *FAST)
        match_code, matched = diagnose(capsys, "--match", re.escape(str(run)), *FAST)
    assert match_code == 1, matched
    assert code == 1
    verdict = report["verdict"]
    assert verdict["kind"] == "rank_exited"
    assert verdict["title"] == "Rank 1 exited; rank 0 waits in all_reduce for it"
    assert rows(report)[1]["state"] == "exited"
    assert report["missing_ranks"] == {"1": "exited (pid gone)"}
    assert {r["rank"]: r["alive"] for r in report["ranks"]} == {0: True, 1: False}
    assert "# not dumped: exited (pid gone)" in (dump_dir(run) / "rank1.txt").read_text()
    # --match finds rank 1's forked socket keeper (same command line, RANK=1, reparented): in doubt
    keeper = int((run / "hang_fixture" / "keepers").read_text().split()[0])
    assert [(r["rank"], r["pid"]) for r in matched["ranks"]] == [(0, markers[0]["pid"]), (1, keeper)]
    assert matched["ranks"][1]["caveat"].startswith(f"only an orphaned process matches RANK 1 (pid {keeper}")
    verdict = matched["verdict"]
    assert verdict["title"].endswith("(rank 1's process is in doubt: see the evidence)"), verdict["title"]
    assert any(e.startswith(f"rank 1 (pid {keeper}): only an orphaned process") for e in verdict["evidence"])
    assert verdict["next_steps"][0].startswith("Check whether rank 1 still runs")


def test_extra_collective_reached_after_the_peer_left(tmp_path: Path, capsys) -> None:
    """Rank 1 ends its loop and exits 0; rank 0 then waits in a barrier inside save_checkpoint. The
    verdict names the extra collective on rank 0 and does not offer "same collective" (it said
    "Rank 1 exited; rank 0 waits in barrier for it", also fits: same collective)."""
    run = tmp_path / "extra"
    procs = launch_hang_world("extra", 2, run, culprit=0, hang_seconds=300)
    try:
        markers = wait_until_hung(run, 2, timeout_s=240, procs=procs)
        assert markers[1]["state"] == "exiting" and markers[0]["what"] == "barrier in save_checkpoint"
        code, report = diagnose(capsys, str(run), *FAST)
    finally:
        stop_hang_world(procs, run)
    assert code == 1, report
    verdict = report["verdict"]
    assert verdict["kind"] == "extra_collective" and verdict["pattern"] is None
    title = verdict["title"]
    assert title.startswith(
        "Extra collective on rank 0, reached after the peer left: barrier ← save_checkpoint ("
    )
    assert "hang_world.py:" in title
    assert verdict["title"].endswith("rank 1 finished and exited, so no rank will join it")
    assert not any("same collective" in line for line in [verdict["title"], *verdict["evidence"]])
    assert rows(report)[1]["state"] == "exited" and rows(report)[0]["collective"] == "barrier"
    assert verdict["next_steps"][0].startswith("Make the collective at save_checkpoint (")


def test_python_stall_confirmed_by_stale_heartbeats(tmp_path: Path, capsys) -> None:
    """Rank 1 spins in Python (its frames move), rank 0 polls: hung only because nothing was written."""
    with hung_world(tmp_path, "python_stall", 2) as (run, _):
        time.sleep(1.0)  # every heartbeat is now older than --stall-seconds 1
        code, report = diagnose(capsys, str(run), *FAST, "--stall-seconds", "1")
    assert code == 1
    verdict = report["verdict"]
    assert verdict["kind"] == "python_stall", verdict
    assert "rank 1 thread MainThread is busy in score_rollouts (" in verdict["title"]
    assert rows(report)[0]["where"].startswith("wait_for_scores (")
    assert report["progress"]["progressed"] is False
    assert report["progress"]["newest_activity_age_s"] >= 1


# ------------------------------------------------------------------------------ a real grpolab run
def _rank_file(run: Path, rank: int) -> dict:
    try:
        return json.loads((run / "ranks" / f"{rank}.json").read_text())
    except (OSError, ValueError):
        return {}


def _descendants(pid: int) -> list[int]:
    """Every process below `pid` (children, grandchildren, …), from /proc/*/stat parent pids."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            parent = int(stat[stat.rfind(")") + 2 :].split()[1])
            children.setdefault(parent, []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def _kill_tree(proc: subprocess.Popen) -> None:
    """SIGKILL `proc`'s process group and every descendant (torchrun starts each rank in its own session)."""
    for pid in [proc.pid, *_descendants(proc.pid)]:
        for kill in (os.killpg, os.kill):
            try:
                kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
    proc.wait(timeout=60)


def test_real_train_run_hung_by_sleep_forever_at_end(tmp_path: Path, capsys) -> None:
    run = tmp_path / "run"
    actions = '[{"at_rollout": 0, "action": "sleep_forever_at_end", "rank": 1}]'
    argv = ["train", "--nproc-per-node", "2", *SMALL, "--num-rollout", "2", "--run-dir", str(run)]
    proc = subprocess.Popen(
        [sys.executable, "-m", "grpolab", *argv, "--ci-ft-test-actions", actions],
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,  # its own process group: grpolab, torchrun and both ranks
    )
    try:
        deadline = time.monotonic() + 400
        while True:
            r0, r1 = _rank_file(run, 0), _rank_file(run, 1)
            if (r1.get("heartbeat") or {}).get("phase") == "fault:sleep_forever_at_end" and (
                r0.get("heartbeat") or {}
            ).get("rollout_id") == 1:
                break
            assert proc.poll() is None, proc.stdout.read().decode(errors="replace")[-3000:]
            assert time.monotonic() < deadline, "the run did not reach the injected hang in time"
            time.sleep(0.5)
        time.sleep(3.0)  # rank 0 runs rollout 1 to its first all_gather_object, then waits there
        code, report = diagnose(capsys, str(run), "--interval", "1")
        assert code == 1
        verdict = report["verdict"]
        assert verdict["kind"] == "same_collective", verdict
        assert re.search(r"rank 0 waits? in all_gather_object", verdict["title"]), verdict["title"]
        assert "rank 1 has not arrived (straggler)" in verdict["title"]
        by_rank = rows(report)
        # grpolab's core/dist.py wrappers are skipped, so the call site is the loop line
        assert by_rank[0]["call_site"].startswith("GRPORun._gather ("), by_rank[0]
        assert by_rank[1]["where"].startswith("sleep_forever_injected (")
        assert report["ranks"][1]["heartbeat"]["phase"] == "fault:sleep_forever_at_end"

        pids = [str(r0["pid"]), str(r1["pid"])]
        code, by_pid = diagnose(capsys, "--pid", *pids, "--interval", "0.5")
        assert code == 1 and by_pid["verdict"]["title"] == verdict["title"]
        code, matched = diagnose(capsys, "--match", re.escape(str(run)), "--interval", "0.5")
        assert code == 1 and [r["pid"] for r in matched["ranks"]] == [int(p) for p in pids]
        assert sum("no RANK in its environment" in n for n in matched["notes"]) == 2  # grpolab + torchrun
    finally:
        _kill_tree(proc)


def test_failed_run_shows_the_root_cause_rank_first(tmp_path: Path, capsys) -> None:
    """Rank 1 raises in train; rank 0 then fails in its all_reduce ("Connection closed by peer") and its
    error becomes the final status. Each rank records its exception in its rank file; the report of
    the ended run puts rank 1's error first."""
    run = tmp_path / "failed"
    actions = '[{"at_rollout": 0, "action": "raise_in_train", "rank": 1}]'
    argv = ["train", "--nproc-per-node", "2", "--num-rollout", "2", "--rollout-batch-size", "2"]
    argv += ["--n-samples-per-prompt", "2", "--rollout-max-response-len", "8", "--no-progress"]
    out = subprocess.run(
        [sys.executable, "-m", "grpolab", *argv, "--run-dir", str(run), "--ci-ft-test-actions", actions],
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert out.returncode != 0, out.stdout[-2000:]
    record = _rank_file(run, 1)
    assert record["heartbeat"]["phase"] == "error"
    assert record["error"].startswith("InjectedFault: injected fault: raise_in_train on rank 1 at rollout 0")
    assert "in _fire\n" in record["error"]  # the innermost traceback lines come with it
    code, text = diagnose_text(capsys, str(run))
    assert code == 0, text
    # rank 0 ends 'failed' when gloo reports the closed connection first, 'interrupted' when torchrun's
    # SIGTERM (sent once rank 1 exited) arrives first, as it can on a loaded machine: a race, either is right
    status = json.loads((run / "events.jsonl").read_text().splitlines()[-1])["status"]
    assert status in ("failed", "interrupted")
    assert f"\nthe run ended (final status '{status}'); no rank process is alive\n" in text
    assert f"verdict: Not hung: the run ended (final status '{status}'); rank 1 failed" in text
    if status == "failed":  # rank 0 recorded its own error (the closed connection): rank 1's comes first
        assert text.index("exception recorded by rank 1 (root cause):\n    InjectedFault:") < text.index(
            "exception recorded by rank 0"
        )
        assert "Fix the error on rank 1 first: InjectedFault" in text
    else:
        assert "exception recorded by rank 1:\n    InjectedFault:" in text
    assert "progress observed" not in text and "exited, exited" not in text


def test_match_over_two_jobs_is_refused_with_each_jobs_pids(tmp_path: Path, capsys) -> None:
    """Two hung 2-rank worlds whose command lines both match: merged they would look like one 4-rank
    world; each job's pids are listed instead, and a tighter pattern inspects one job."""
    with (
        hung_world(tmp_path, "straggler", 2) as (run_a, markers_a),
        hung_world(tmp_path, "mismatch", 2) as (run_b, markers_b),
    ):
        code, report = diagnose(capsys, "--match", re.escape(str(tmp_path)), *FAST)
        assert code == 2 and report["hung"] is None
        error = report["error"]
        assert "matches the ranks of 2 jobs" in error and "--pid" in error
        for markers in (markers_a, markers_b):
            assert f"pid {markers[0]['pid']} (RANK 0), pid {markers[1]['pid']} (RANK 1)" in error
        code, report = diagnose(capsys, "--match", re.escape(str(run_b)), *FAST)
    assert code == 1 and report["verdict"]["kind"] == "mismatched_collectives"
    assert [r["pid"] for r in report["ranks"]] == [markers_b[0]["pid"], markers_b[1]["pid"]]

"""`grpolab diagnose hang` orchestration without real hangs: discovery, the progress rule, exit codes.

Rank processes are real (`python -c` sleepers, so liveness and /proc are real); py-spy is a small
shell script (`--py-spy PATH`) that prints canned `py-spy dump --json` output per pid, so each test
controls what the "ranks" show in each sample (hang_fakes.py). The real-hang tests are in test_hang_real.py;
the cases found by a fresh-user pass (ended processes, reused pids, two jobs, …) in test_hang_edges.py.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from hang_fakes import ALL_REDUCE, STALE_S, FakeWorld, cli, run_json

from grpolab.diagnose.hang import add_hang_arguments, pyspy, run_hang_command
from grpolab.diagnose.hang.match import ranks_from_match
from grpolab.diagnose.hang.progress import decide_progress
from grpolab.diagnose.hang.targets import (
    InspectError,
    is_alive,
    proc_parent,
    proc_state,
    read_rank_files,
)


# ----------------------------------------------------------------------------- the progress rule
def test_progress_rule_changed_file_means_progress() -> None:
    check = decide_progress(
        files_changed=["ranks/0.json"],
        ranks_compared=[0, 1],
        ranks_moved=[],
        newest_activity_age_s=500.0,
        stall_seconds=120,
        interval_s=2,
    )
    assert check.progressed and "ranks/0.json" in check.reason


def test_progress_rule_identical_stacks_mean_hang_with_note_when_fresh() -> None:
    fresh = decide_progress(
        files_changed=[], ranks_compared=[0, 1], ranks_moved=[], newest_activity_age_s=5.0,
        stall_seconds=120, interval_s=2,
    )  # fmt: skip
    assert not fresh.progressed and "identical" in fresh.reason and fresh.note is not None
    stale = decide_progress(
        files_changed=[], ranks_compared=[0, 1], ranks_moved=[], newest_activity_age_s=300.0,
        stall_seconds=120, interval_s=2,
    )  # fmt: skip
    assert not stale.progressed and stale.note is None
    no_run_dir = decide_progress(
        files_changed=[], ranks_compared=[0], ranks_moved=[], newest_activity_age_s=None,
        stall_seconds=120, interval_s=2,
    )  # fmt: skip
    assert not no_run_dir.progressed


def test_progress_rule_moving_stacks_need_stale_heartbeats_to_be_a_hang() -> None:
    kwargs = dict(
        files_changed=[], ranks_compared=[0, 1], ranks_moved=[1], stall_seconds=120.0, interval_s=2.0
    )
    assert decide_progress(newest_activity_age_s=30.0, **kwargs).progressed
    assert decide_progress(newest_activity_age_s=None, **kwargs).progressed
    stale = decide_progress(newest_activity_age_s=121.0, **kwargs)
    assert not stale.progressed and "rank(s) 1" in stale.reason and "121.0 s" in stale.reason


def test_progress_rule_single_sample_confirms_only_stale_heartbeats() -> None:
    """One sample cannot show movement: fresh heartbeats leave the hang not confirmed, never "progress"."""
    kwargs = dict(
        files_changed=[], ranks_compared=[], ranks_moved=[], stall_seconds=10.0, interval_s=0.0, samples=1
    )
    fresh = decide_progress(newest_activity_age_s=3.0, **kwargs)
    assert fresh.outcome == "not_confirmed" and not fresh.progressed
    assert "only one sample was taken" in fresh.reason and "--interval > 0" in fresh.note
    assert "older than --stall-seconds 10" in fresh.note
    stale = decide_progress(newest_activity_age_s=10.0, **kwargs)
    assert stale.outcome == "hung" and "only one sample was taken" in stale.reason
    wrote = decide_progress(**{**kwargs, "files_changed": ["ranks/0.json"]}, newest_activity_age_s=3.0)
    assert wrote.outcome == "progressed" and wrote.reason.endswith("while its ranks were sampled")
    no_age = decide_progress(**{**kwargs, "samples": 2, "interval_s": 2.0}, newest_activity_age_s=None)
    assert no_age.outcome == "not_confirmed" and "no rank could be sampled twice" in no_age.reason


def test_progress_rule_a_local_rank_gone_without_final_status_is_never_progress() -> None:
    check = decide_progress(
        files_changed=["metrics.jsonl"], ranks_compared=[], ranks_moved=[], newest_activity_age_s=0.5,
        stall_seconds=120, interval_s=2, ranks_exited=[0],
    )  # fmt: skip
    assert check.outcome == "hung" and check.reason.startswith(
        "rank 0 exited and the run wrote no final status"
    )


# ------------------------------------------------------------------------------------- discovery
def test_rank_files_half_written_and_bad_fields_are_reported_not_fatal(world: FakeWorld) -> None:
    pid = world.spawn()
    run = world.run_dir([pid])
    (run / "ranks" / "1.json").write_text('{"rank": 1, "pid": 12')  # cut mid-write
    (run / "ranks" / "2.json").write_text(json.dumps({"rank": 2, "pid": "abc"}))
    targets, problems = read_rank_files(run)
    assert [(t.rank, t.pid) for t in targets] == [(0, pid)]
    assert any("1.json" in p and "not valid JSON" in p for p in problems)
    assert any("2.json" in p and "'pid' must be a positive integer" in p for p in problems)


@pytest.mark.parametrize("layout", ["missing", "file", "empty", "no_ranks", "only_junk"])
def test_bad_run_dir_is_exit_2_naming_it(world: FakeWorld, capsys, layout: str) -> None:
    run = world.tmp / "bad"
    if layout == "file":
        run.write_text("x")
    elif layout != "missing":
        run.mkdir()
    if layout == "no_ranks":
        (run / "run.json").write_text("{}")
    if layout == "only_junk":
        (run / "ranks").mkdir()
        (run / "ranks" / "0.json").write_text("{not json")
    code = run_hang_command(cli(world, str(run)))
    err = capsys.readouterr().err
    assert code == 2
    assert f"RUN_DIR {run}" in err
    expected = {
        "missing": "no such directory",
        "file": "not a directory",
        "empty": "is empty",
        "no_ranks": "no ranks/*.json",
        "only_junk": "not valid JSON",
    }[layout]
    assert expected in err


def test_zombie_counts_as_exited(world: FakeWorld) -> None:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    world.procs.append(proc)
    deadline = time.time() + 60
    while proc_state(proc.pid) not in ("Z", None) and time.time() < deadline:
        time.sleep(0.05)
    assert proc_state(proc.pid) == "Z"  # exited, not yet reaped by us
    assert not is_alive(proc.pid)
    assert is_alive(os.getpid())


def test_match_ranks_by_env_rank_and_skips_launchers(world: FakeWorld) -> None:
    marker = f"grpolab-hang-test-{os.getpid()}-{time.time_ns()}"
    launcher = world.spawn(marker)
    r1 = world.spawn(marker, env={"RANK": "1"})
    r0 = world.spawn(marker, env={"RANK": "0"})
    world.spawn("something-else", env={"RANK": "0"})
    # rank 2 forks a worker (a data loader would): same command line, same RANK, child of the rank
    forking = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import os, time\nif os.fork() == 0:\n    time.sleep(300)\ntime.sleep(300)",
            marker,
        ],
        env={**os.environ, "RANK": "2"},
        start_new_session=True,
    )
    world.procs.append(forking)
    deadline = time.time() + 60
    while not any(
        proc_parent(int(e.name)) == forking.pid for e in Path("/proc").iterdir() if e.name.isdigit()
    ):
        assert time.time() < deadline, "the forking rank did not fork"
        time.sleep(0.05)
    try:
        targets, notes = ranks_from_match(marker)
    finally:
        os.killpg(forking.pid, 9)  # the forked worker too
    assert [(t.rank, t.pid) for t in targets] == [(0, r0), (1, r1), (2, forking.pid)]
    assert any(str(launcher) in n and "no RANK" in n for n in notes)
    assert any(f"forked child of matching pid {forking.pid}" in n for n in notes)
    with pytest.raises(InspectError, match="--match"):
        ranks_from_match("(unclosed")
    with pytest.raises(InspectError, match="no running process"):
        ranks_from_match(marker + "-nobody-has-this")


# ------------------------------------------------------------------------------------ exit codes
def test_hung_world_is_exit_1_with_dumps_in_the_run_dir(world: FakeWorld, capsys) -> None:
    pids = [world.spawn(), world.spawn()]
    for pid in pids:
        world.shows(pid, ALL_REDUCE)
    run = world.run_dir(pids)
    code = run_hang_command(cli(world, str(run), "--interval", "0.2"))
    out = capsys.readouterr().out
    assert code == 1, out
    assert "hang confirmed: every rank's stack is identical" in out
    assert "all_reduce" in out and "next steps:" in out
    (dump_dir,) = (run / "diagnose").iterdir()
    assert sorted(p.name for p in dump_dir.iterdir()) == [
        "rank0.json",
        "rank0.txt",
        "rank1.json",
        "rank1.txt",
        "verdict.json",
    ]
    text = (dump_dir / "rank1.txt").read_text()
    assert f"Process {pids[1]}:" in text and "all_reduce (" in text and text.count("# sample") == 2
    saved = json.loads((dump_dir / "verdict.json").read_text())
    assert saved["hung"] is True and saved["exit_code"] == 1
    assert saved["verdict"]["kind"] == "same_collective"
    assert saved["py_spy"]["version"] == "py-spy 0.0.0-fake"
    assert saved["progress"]["ranks_compared"] == [0, 1] and saved["progress"]["ranks_moved"] == []
    parsed = json.loads((dump_dir / "rank0.json").read_text())
    assert parsed["pid"] == pids[0] and len(parsed["samples"]) == 2


def test_moving_stacks_with_fresh_heartbeats_are_exit_0(world: FakeWorld, capsys) -> None:
    pids = [world.spawn(), world.spawn()]
    for pid in pids:
        world.shows(pid, ALL_REDUCE)
    world.shows(pids[1], [("forward", "/work/model.py", 10), *ALL_REDUCE[2:]], sample=1)
    world.shows(pids[1], [("forward", "/work/model.py", 11), *ALL_REDUCE[2:]], sample=2)
    run = world.run_dir(pids, age_s=1)
    code, report = run_json(world, capsys, str(run), "--interval", "0.2")
    assert code == 0
    assert report["hung"] is False and report["verdict"]["kind"] == "not_hung"
    assert report["progress"]["ranks_moved"] == [1]


def test_moving_stacks_with_stale_heartbeats_are_a_hang(world: FakeWorld, capsys) -> None:
    pids = [world.spawn(), world.spawn()]
    world.shows(pids[0], [("wait_for_scores", "/work/job.py", 12), ("main", "/work/job.py", 50)])
    world.shows(pids[1], [("score", "/work/job.py", 20), ("main", "/work/job.py", 51)], sample=1)
    world.shows(pids[1], [("score", "/work/job.py", 21), ("main", "/work/job.py", 51)], sample=2)
    run = world.run_dir(pids, age_s=STALE_S)
    code, report = run_json(world, capsys, str(run), "--interval", "0.2", "--stall-seconds", "1")
    assert code == 1
    assert report["verdict"]["kind"] == "python_stall"
    assert "code runs without reaching the next phase" in report["progress"]["reason"]
    assert report["progress"]["note"].startswith("decided by the heartbeat age: heartbeats are written")
    assert report["progress"]["ranks_moved"] == [1]
    for count in world.spy_dir.glob("*.count"):
        count.unlink()  # the fake py-spy replays samples 1 and 2
    code, report = run_json(world, capsys, str(run), "--interval", "0.2", "--stall-seconds", "60")
    assert code == 0 and report["verdict"]["kind"] == "not_hung"


def test_heartbeat_written_between_samples_is_progress(world: FakeWorld, capsys) -> None:
    pid = world.spawn()
    world.shows(pid, ALL_REDUCE)
    run = world.run_dir([pid])
    rank_file = run / "ranks" / "0.json"

    def heartbeat_after_first_sample() -> None:
        deadline = time.time() + 60
        while not (world.spy_dir / f"{pid}.count").exists() and time.time() < deadline:
            time.sleep(0.01)  # the fake py-spy writes PID.count when it answers the first dump
        record = json.loads(rank_file.read_text())
        record["heartbeat"]["time"] = time.time()
        rank_file.write_text(json.dumps(record))

    writer = threading.Thread(target=heartbeat_after_first_sample)
    writer.start()
    try:
        code, report = run_json(world, capsys, str(run), "--interval", "2")
    finally:
        writer.join()
    assert code == 0
    assert report["progress"]["files_changed"] == ["ranks/0.json"]
    assert report["verdict"]["kind"] == "not_hung"


def test_one_rank_not_dumped_still_classified_and_named(world: FakeWorld, capsys) -> None:
    pids = [world.spawn(), world.spawn(), world.spawn()]
    for pid in pids[:2]:
        world.shows(pid, ALL_REDUCE)
    world.fails(pids[2], "Error: Failed to find python version from target process")
    code, report = run_json(world, capsys, "--pid", *map(str, pids), "--interval", "0.2")
    assert code == 1
    assert report["missing_ranks"] == {
        "2": "py-spy exited with 1: Error: Failed to find python version from target process"
    }
    assert [r["dumped"] for r in report["ranks"]] == [True, True, False]
    assert any("rank 2 not inspected" in n for n in report["notes"])
    assert report["dumps"] is None  # no RUN_DIR and no --out: nothing written


def test_out_dir_without_run_dir(world: FakeWorld, capsys) -> None:
    pid = world.spawn()
    world.shows(pid, ALL_REDUCE)
    out = world.tmp / "dumps"
    code = run_hang_command(cli(world, "--pid", str(pid), "--interval", "0.1", "--out", str(out)))
    assert code == 1
    assert "dumps: " + str(out) in capsys.readouterr().out
    assert (out / "verdict.json").exists() and (out / "rank0.txt").exists()


def test_permission_denied_is_exit_2_with_the_reason(world: FakeWorld, capsys) -> None:
    pids = [world.spawn(), world.spawn()]
    for pid in pids:
        world.fails(pid, "Error: Permission Denied (os error 1)\nTry running again with elevated permissions")
    code = run_hang_command(cli(world, "--pid", *map(str, pids)))
    err = capsys.readouterr().err
    assert code == 2
    assert "could not inspect: permission denied" in err and "ptrace" in err and f"pid {pids[1]}" in err


def test_py_spy_missing_is_exit_2(world: FakeWorld, capsys, monkeypatch) -> None:
    pid = world.spawn()
    code = run_hang_command(cli(world, "--pid", str(pid), py_spy=str(world.tmp / "nope")))
    assert code == 2 and "--py-spy" in capsys.readouterr().err
    monkeypatch.setenv("PATH", str(world.tmp / "empty-bin"))
    monkeypatch.setattr(pyspy, "PY_SPY_FALLBACK_DIRS", ())
    parser = argparse.ArgumentParser()
    add_hang_arguments(parser)
    code = run_hang_command(parser.parse_args(["--pid", str(pid)]))
    assert code == 2 and "py-spy not found on PATH" in capsys.readouterr().err


def test_no_such_pid_and_flag_mistakes_are_exit_2(world: FakeWorld, capsys) -> None:
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait(timeout=60)
    code, report = run_json(world, capsys, "--pid", str(dead.pid))
    assert code == 2 and report["error"] == f"--pid {dead.pid}: no such process (it exited or never existed)"
    pid = world.spawn()
    run = world.run_dir([pid])
    for argv, expected in [
        ((str(run), "--pid", str(pid)), "give exactly one of RUN_DIR, --pid"),
        ((), "give exactly one of RUN_DIR, --pid"),
        (("--pid", str(pid), "--interval", "0"), "--interval 0 needs RUN_DIR"),
        ((str(run), "--timeout", "0"), "--timeout"),
        ((str(run), "--stall-seconds", "-1"), "--stall-seconds"),
    ]:
        code, report = run_json(world, capsys, *argv)
        assert code == 2 and expected in report["error"], (argv, report)


def test_ended_run_is_exit_0_and_killed_run_is_exit_2(world: FakeWorld, capsys) -> None:
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait(timeout=60)
    run = world.run_dir([gone.pid], name="ended")
    (run / "events.jsonl").write_text(
        json.dumps({"event": "status", "time": time.time(), "status": "finished"}) + "\n"
    )
    code = run_hang_command(cli(world, str(run)))
    out = capsys.readouterr().out
    assert code == 0, out
    assert "\nthe run ended (final status 'finished'); no rank process is alive\n" in out
    assert "verdict: Not hung: the run ended (final status 'finished')\n" in out
    assert f"rank 0 (pid {gone.pid}): exited (pid gone)" in out
    assert "progress observed" not in out and "exited, exited" not in out and "next steps" not in out
    killed = world.run_dir([gone.pid], name="killed")
    code = run_hang_command(cli(world, str(killed)))
    assert code == 2 and "no rank process is alive" in capsys.readouterr().err


def test_remote_rank_is_named_not_dumped(world: FakeWorld, capsys) -> None:
    local, remote = world.spawn(), world.spawn()
    world.shows(local, ALL_REDUCE)
    world.shows(remote, [("should_not_be_dumped", "/x.py", 1)])
    run = world.run_dir([local])
    other = world.run_dir([remote], name="other", host="node-elsewhere-7")
    record = json.loads((other / "ranks" / "0.json").read_text())
    (run / "ranks" / "1.json").write_text(json.dumps({**record, "rank": 1}))
    code, report = run_json(world, capsys, str(run), "--interval", "0.1")
    assert code == 1
    assert "node-elsewhere-7" in report["missing_ranks"]["1"]
    assert report["ranks"][1]["dump_seconds"] == [] and report["ranks"][1]["alive"] is None
    assert report["ranks"][1]["inspected"] is False and report["ranks"][0]["inspected"] is True
    assert not (world.spy_dir / f"{remote}.count").exists()  # py-spy never ran on it
    assert any(n.startswith("rank 1 not inspected: on host node-elsewhere-7") for n in report["notes"])


def test_duplicate_rank_files_keep_the_newest_heartbeat(world: FakeWorld) -> None:
    old, new = world.spawn(), world.spawn()
    run = world.run_dir([old], age_s=100)
    fresh = world.run_dir([new], name="fresh", age_s=1)
    (run / "ranks" / "0-restarted.json").write_text((fresh / "ranks" / "0.json").read_text())
    targets, problems = read_rank_files(run)
    assert [(t.rank, t.pid) for t in targets] == [(0, new)]
    assert len(problems) == 1 and "whose heartbeat is newer; skipped" in problems[0]


def test_py_spy_timeout_names_the_rank(world: FakeWorld, capsys) -> None:
    pids = [world.spawn(), world.spawn()]
    for pid in pids:
        world.shows(pid, ALL_REDUCE)
    (world.spy_dir / f"{pids[1]}.sleep").write_text("5")
    code, report = run_json(world, capsys, "--pid", *map(str, pids), "--interval", "0.1", "--timeout", "0.5")
    assert code == 1
    assert "--timeout 0.5 s" in report["missing_ranks"]["1"]


def test_cli_wiring_through_grpolab_main(world: FakeWorld, capsys) -> None:
    from grpolab.cli import main

    pid = world.spawn()
    world.shows(pid, ALL_REDUCE)
    code = main(
        ["diagnose", "hang", "--pid", str(pid), "--interval", "0.1", "--json", "--py-spy", str(world.py_spy)]
    )
    report = json.loads(capsys.readouterr().out)
    assert code == 1 and report["ranks"][0]["pid"] == pid and report["verdict"]["rows"]


def test_repeated_pid_flags_add_up(world: FakeWorld, capsys) -> None:
    # `--pid A --pid B` used to keep only the last flag (argparse's default action) and inspect B alone
    pids = [world.spawn() for _ in range(3)]
    for pid in pids:
        world.shows(pid, ALL_REDUCE)
    a, b, c = map(str, pids)
    assert cli(world, "--pid", a, b, "--pid", c).pid == pids
    code, report = run_json(world, capsys, "--pid", a, "--pid", b, c, "--interval", "0.1")
    assert code == 1 and [(r["rank"], r["pid"]) for r in report["ranks"]] == list(enumerate(pids))
    assert all(r["dumped"] for r in report["ranks"]) and report["command"]["options"]["pid"] == pids
    code, report = run_json(world, capsys, "--pid", a, "--pid", a)
    assert code == 2 and report["error"] == f"--pid: each pid must be given once, got {a} {a}"

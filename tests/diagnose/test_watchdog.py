"""`grpolab watchdog`: the manual's rule on synthetic error times (replay), and the live loop on real files.

Replay tests use synthetic error times: a dead engine (10 errors/s that never stop) and the manual's
healthy pattern (two bursts 45 s apart, then quiet). Live tests use tiny intervals (0.2 s checks over
a 0.4 s window) on a file a background thread writes into, with a real child process to stop.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from grpolab.diagnose.common.dead_engine import (
    WatchdogRule,
    error_times,
    parse_time,
    replay_table,
)
from grpolab.diagnose.watchdog import add_watchdog_arguments, format_replay, run_watchdog_command
from grpolab.diagnose.watchdog.follow import LogFollower

ERROR = "[2026-10-17 21:03:30.637 rollout_executor] http_utils.py:241 - Error: Server error '503 Service Unavailable' for url 'http://172.17.0.3:20035/generate'"
LIVE = ["--interval", "0.2", "--window", "0.4", "--limit", "5", "--checks", "3"]
T0 = 1761117389.0  # 2025-10-22 07:16:29 UTC


def watchdog(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """`grpolab watchdog *argv` through the module's own parser; (exit code, stdout, stderr)."""
    parser = argparse.ArgumentParser(prog="grpolab watchdog")
    add_watchdog_arguments(parser)
    code = run_watchdog_command(parser.parse_args(list(argv)))
    out, err = capsys.readouterr()
    return code, out, err


def dead_engine(seconds: float = 3600, per_second: int = 10) -> list[float]:
    """A dead engine: `per_second` errors every second, forever (the manual's wd-dead container)."""
    return [T0 + i / per_second for i in range(int(seconds * per_second))]


def healthy_bursts(
    burst_s: float = 35, gap_s: float = 45, per_second: int = 37, pairs: int = 3, period_s: float = 720
) -> list[float]:
    """The manual's healthy pattern: two bursts `gap_s` apart, a pair every `period_s` seconds.

    The period is a multiple of the 30 s check interval, so every pair meets the check grid at the
    same phase (as in the manual's run, where one pair of bursts 45 s apart did the striking).
    """
    times = []
    for pair in range(pairs):
        start = T0 + pair * period_s
        for burst in range(2):
            first = start + burst * (burst_s + gap_s)
            times += [first + i / per_second for i in range(int(burst_s * per_second))]
    return times


# ---------------------------------------------------------------------- the rule, replayed
def test_dead_engine_stops_after_about_checks_times_interval() -> None:
    rule = WatchdogRule()
    for row in replay_table(dead_engine(), rule):
        assert row.offsets == 30 and row.stopped == 30, row
        assert row.most_in_a_row == row.checks
        lo, hi = row.stop_after
        # the first strike needs > 100 errors in 60 s, i.e. 10 s of errors; then checks - 1 more checks
        assert (row.checks - 1) * 30 + 10 <= lo <= hi < (row.checks - 1) * 30 + 40
        assert abs((lo + hi) / 2 - row.checks * 30) <= 30


def test_healthy_bursts_are_stopped_by_six_checks_but_not_by_ten() -> None:
    times = healthy_bursts()
    assert (
        max(sum(1 for t in times if s - 60 < t <= s) for s in times[::50]) > 100
    )  # busy: a count alone flags it
    rows = {row.checks: row for row in replay_table(times, WatchdogRule(), (6, 8, 10))}
    assert 0 < rows[6].stopped < 30  # stopped at some check offsets: 6 is too few
    assert rows[8].stopped == 0 and rows[10].stopped == 0
    assert rows[10].stop_after is None
    assert {row.most_in_a_row for row in rows.values()} == {6}


def test_parse_times() -> None:
    assert parse_time("2025-10-22T07:16:29Z") == T0
    assert parse_time("2025-10-22 09:16:29+02:00 something") == T0
    assert parse_time(ERROR) == pytest.approx(1792271010.637)
    assert parse_time("(FSDPTrainRayActor pid=2551) [2025-10-22 07:16:29,500 actor] x") == T0 + 0.5
    assert parse_time("no time here") is None
    found = error_times(
        [
            "1761117389.25\n",
            "[2025-10-22 07:16:30]\n",
            "2025-10-22 07:16:31.5 rollout: 503 Service Unavailable\n",
            "2025-10-22 07:16:32 rollout: all good\n",  # not an error line
            "503 Service Unavailable without a time\n",
            "\n",
        ],
        re.compile("503 Service Unavailable"),
    )
    assert found.times == [T0 + 0.25, T0 + 1, T0 + 2.5]
    assert found.unstamped == 1


def test_replay_command_prints_the_table(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    stored = tmp_path / "dead.txt"
    stored.write_text("".join(f"{t}\n" for t in dead_engine(600)))
    code, out, _ = watchdog(capsys, "--replay", str(stored))
    assert code == 0
    lines = out.splitlines()
    assert lines[0].startswith(f"{stored}: 6,000 errors from 2025-10-22 07:16:29")
    assert "checks every 30 s over the last 60 s, limit 100" in lines[0]
    assert [line.split()[:4] for line in lines[2:]] == [
        ["6", "30", "of", "30"],
        ["8", "30", "of", "30"],
        ["10", "30", "of", "30"],
    ]
    assert lines[4].endswith("280 to 309 s")
    # a Miles-style log: the matching lines' own times are used; --checks gives one row
    log = tmp_path / "miles.log"
    stamps = healthy_bursts(pairs=1)
    log.write_text(
        "".join(
            f"[{time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime(t))}.{int(t * 1000) % 1000:03d} rollout_executor] "
            "http_utils.py:241 - Error: Server error '503 Service Unavailable'\n[x] rollout 0: {}\n"
            for t in stamps
        )
    )
    code, out, _ = watchdog(capsys, "--replay", str(log), "--checks", "10")
    assert code == 0
    assert f"{len(stamps):,} errors" in out
    assert out.splitlines()[2].split() == ["10", "0", "of", "30", "6", "-"]


def test_replay_without_times_or_file_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    plain = tmp_path / "console.log"
    plain.write_text("Error: 503 Service Unavailable\n" * 3)
    code, _, err = watchdog(capsys, "--replay", str(plain))
    assert code == 2 and "no error times found (no time on 3 matching lines)" in err
    code, _, err = watchdog(capsys, "--replay", str(tmp_path / "missing.txt"))
    assert code == 2 and "cannot read it" in err


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--checks", "0", "x.log"], "--checks must be a whole number >= 1, got 0"),
        (["--limit", "-1", "x.log"], "--limit must be a whole number >= 0"),
        (["--interval", "0", "x.log"], "--interval must be a finite number > 0"),
        (["--window", "inf", "x.log"], "--window must be a finite number > 0"),
        (["--pattern", "(", "x.log"], "is not a regular expression"),
        (["--stop-pid", "0", "x.log"], "--stop-pid must be a process id > 0"),
        (["--grace-seconds", "-1", "x.log"], "--grace-seconds must be a finite number of seconds >= 0"),
        (["--wait-seconds", "nan", "x.log"], "--wait-seconds must be a finite number of seconds >= 0"),
        ([], "give the LOG_OR_RUN_DIR"),
    ],
)
def test_bad_numbers_exit_2(argv: list[str], needle: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = watchdog(capsys, *argv)
    assert code == 2 and needle in err


def test_bad_checks_through_the_grpolab_cli(capsys: pytest.CaptureFixture[str]) -> None:
    from grpolab.cli import main

    assert main(["watchdog", "--checks", "0", "x.log"]) == 2
    assert "grpolab watchdog: error: --checks must be a whole number >= 1" in capsys.readouterr().err
    with pytest.raises(SystemExit) as info:
        main(["watchdog", "--limit", "1.5", "x.log"])  # not a whole number: argparse says so
    assert info.value.code == 2


def test_unreadable_log_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = watchdog(capsys, str(tmp_path / "missing.log"), "--wait-seconds", "0")
    assert code == 2 and "cannot read" in err and "No such file or directory" in err
    (tmp_path / "not_a_run").mkdir()
    code, _, err = watchdog(capsys, str(tmp_path / "not_a_run"), "--wait-seconds", "0")
    assert code == 2 and "without console.log" in err
    if os.geteuid() != 0:  # root reads any file
        locked = tmp_path / "locked.log"
        locked.write_text("x\n")
        locked.chmod(0)
        code, _, err = watchdog(capsys, str(locked))
        assert code == 2 and "Permission denied" in err


# ---------------------------------------------------------------------- following a file
def test_follower_skips_old_lines_and_follows_truncation_and_rotation(tmp_path: Path) -> None:
    path = tmp_path / "a.log"
    path.write_bytes(b"old 1\nold 2\n")
    follower = LogFollower(path)
    assert follower.poll() == []
    with open(path, "ab") as f:
        f.write(b"new 1\nhalf")
    assert follower.poll() == [b"new 1"]
    with open(path, "ab") as f:
        f.write(b" line\n")
    assert follower.poll() == [b"half line"]
    path.write_bytes(b"after truncation\n")  # copytruncate: the same file, shorter
    assert follower.poll() == [b"after truncation"]
    with open(path, "ab") as f:
        f.write(b"last of the old file\n")
    path.rename(tmp_path / "a.log.1")
    assert follower.poll() == [b"last of the old file"]
    assert follower.problem is not None and "FileNotFoundError" in follower.problem  # rotation in progress
    path.write_bytes(b"first of the new file\n")
    assert follower.poll() == [b"first of the new file"]
    assert follower.problem is None
    follower.close()


# ---------------------------------------------------------------------- live
@pytest.fixture
def child() -> Iterator[subprocess.Popen]:
    """A process for the watchdog to stop (killed at the end if it survived)."""
    proc = subprocess.Popen(["sleep", "60"])
    yield proc
    if proc.poll() is None:
        proc.kill()
    proc.wait()


class ErrorWriter(threading.Thread):
    """Appends error lines (one per `every` seconds) to `path` until stopped or `limit_s` passed."""

    def __init__(self, path: Path, every: float = 0.005, limit_s: float = 10.0) -> None:
        super().__init__(daemon=True)
        self.path, self.every, self.limit_s = path, every, limit_s
        self.done = threading.Event()

    def run(self) -> None:
        end = time.monotonic() + self.limit_s
        with open(self.path, "a") as f:
            while not self.done.is_set() and time.monotonic() < end:
                f.write(ERROR + "\n")
                f.flush()
                time.sleep(self.every)

    def __enter__(self) -> ErrorWriter:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.done.set()
        self.join()


def test_live_stop_terminates_the_stop_pid(
    tmp_path: Path, child: subprocess.Popen, capsys: pytest.CaptureFixture[str]
) -> None:
    log = tmp_path / "train.log"
    log.write_text("startup lines\n")
    with ErrorWriter(log):
        code, out, _ = watchdog(capsys, str(log), *LIVE, "--stop-pid", str(child.pid))
    assert code == 1
    assert child.wait(timeout=10) == -signal.SIGTERM
    assert "strike 3 of 3" in out
    assert "more than 5 errors from the rollout engine in each of 3 checks, last " in out
    assert re.search(r"last \d+ in 0\.4 s, stopping the run\n", out)
    assert f"sent SIGTERM to process {child.pid}" in out


def test_live_quiet_log_ends_with_the_stop_pid(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = tmp_path / "train.log"
    log.write_text("")
    proc = subprocess.Popen(["sleep", "0.8"])
    try:
        code, out, _ = watchdog(capsys, str(log), *LIVE, "--stop-pid", str(proc.pid))
    finally:
        proc.wait()
    assert code == 0 and f"the run ended (process {proc.pid} exited)" in out
    assert "strike 1" not in out


def _run_dir(tmp_path: Path) -> Path:
    run = tmp_path / "run"
    (run / "ranks").mkdir(parents=True)
    (run / "console.log").write_text("grpolab train: run directory run\n")
    (run / "events.jsonl").write_text(
        json.dumps({"event": "run_start", "time": 0, "rank": 0, "pid": 1}) + "\n"
    )
    return run


def test_live_run_dir_ends_with_its_final_status(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = _run_dir(tmp_path)

    def finish() -> None:
        time.sleep(0.6)
        with open(run / "events.jsonl", "a") as f:
            f.write(json.dumps({"event": "status", "time": 1, "rank": 0, "status": "finished"}) + "\n")

    finisher = threading.Thread(target=finish, daemon=True)
    finisher.start()
    code, out, _ = watchdog(capsys, str(run), *LIVE)
    finisher.join()
    assert code == 0 and "the run ended (status finished in events.jsonl)" in out


def test_live_run_dir_stops_its_ranks(
    tmp_path: Path, child: subprocess.Popen, capsys: pytest.CaptureFixture[str]
) -> None:
    run = _run_dir(tmp_path)
    rank = {"rank": 0, "pid": child.pid, "host": socket.gethostname(), "role": "actor+rollout"}
    (run / "ranks" / "0.json").write_text(json.dumps(rank))
    with ErrorWriter(run / "console.log"):
        code, out, _ = watchdog(capsys, str(run), *LIVE)
    assert code == 1
    assert child.wait(timeout=10) == -signal.SIGTERM
    assert f"sent SIGTERM to process {child.pid}" in out


def test_one_error_is_worded_as_one(tmp_path: Path) -> None:
    text = format_replay(tmp_path / "t.txt", [T0], WatchdogRule(), [])
    assert text.startswith(f"{tmp_path / 't.txt'}: 1 error from 2025-10-22 07:16:29 over 0 s")


# ---------------------------------------------------------------------- stopping and waiting
def test_a_process_that_ignores_sigterm_is_killed_after_the_grace(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """As `docker stop`: SIGTERM, then SIGKILL once --grace-seconds have passed."""
    code = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('ready', flush=True); time.sleep(60)"
    stubborn = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert (
            stubborn.stdout is not None and stubborn.stdout.readline() == "ready\n"
        )  # SIGTERM is ignored now
        log = tmp_path / "train.log"
        log.write_text("")
        with ErrorWriter(log):
            code_, out, _ = watchdog(
                capsys, str(log), *LIVE, "--stop-pid", str(stubborn.pid), "--grace-seconds", "0.5"
            )
        assert code_ == 1
        assert stubborn.wait(timeout=30) == -signal.SIGKILL
        assert f"sent SIGTERM to process {stubborn.pid}; SIGKILL follows after 0.5 s if still running" in out
        assert f"process {stubborn.pid} still running 0.5 s after SIGTERM: sent SIGKILL" in out
    finally:
        if stubborn.poll() is None:
            stubborn.kill()
        stubborn.wait()


def test_waits_for_a_log_that_does_not_exist_yet(
    tmp_path: Path, child: subprocess.Popen, capsys: pytest.CaptureFixture[str]
) -> None:
    """Started before the run: one "waiting" line, then the log is followed from its first line."""
    log = tmp_path / "later" / "train.log"

    def start_later() -> None:
        time.sleep(0.8)
        log.parent.mkdir()
        with open(log, "w") as f:  # the first lines, written before the watchdog can look again
            f.write((ERROR + "\n") * 20)
        with ErrorWriter(log):
            time.sleep(5)

    writer = threading.Thread(target=start_later, daemon=True)
    writer.start()
    code, out, _ = watchdog(capsys, str(log), *LIVE, "--stop-pid", str(child.pid))
    writer.join()
    assert code == 1 and child.wait(timeout=10) == -signal.SIGTERM
    assert out.count("waiting up to 300 s for it to appear (--wait-seconds)") == 1
    assert re.search(r"strike 1 of 3: \d+ errors", out)


def test_waiting_ends(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = watchdog(capsys, str(tmp_path / "never.log"), "--wait-seconds", "0.6")
    assert code == 2 and "waiting up to 0.6 s" in out
    assert "No such file or directory after waiting 0.6 s (--wait-seconds)" in err
    run = tmp_path / "run"
    run.mkdir()  # a run directory whose console.log never comes
    code, out, err = watchdog(capsys, str(run), "--wait-seconds", "0.6")
    assert code == 2 and f"waiting up to 0.6 s for {run / 'console.log'} to appear" in out
    assert "a directory without console.log after waiting 0.6 s" in err
    # the run's process exits before its log appears: the run ended
    proc = subprocess.Popen(["sleep", "0.5"])
    try:
        code, out, _ = watchdog(capsys, str(tmp_path / "never.log"), "--stop-pid", str(proc.pid))
    finally:
        proc.wait()
    assert code == 0 and f"the run ended (process {proc.pid} exited) before its log appeared" in out

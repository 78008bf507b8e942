"""Stand-ins for `grpolab diagnose hang` tests: sleeping processes as ranks, a fake py-spy, run dirs.

Rank processes are real (`python -c` sleepers, so liveness and /proc are real); py-spy is a small
shell script (`--py-spy PATH`) that prints canned `py-spy dump --json` output per pid, so each test
controls what the "ranks" show in each sample.
"""

from __future__ import annotations

import argparse
import json
import os
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from grpolab.core.config import Config
from grpolab.diagnose.hang import add_hang_arguments, run_hang_command
from grpolab.diagnose.hang.targets import proc_cmdline, proc_env_rank

FAKE_PY_SPY = """#!/bin/sh
# A stand-in for py-spy: `--version`, and `dump --json --pid PID [--native]` answered from $FAKE_PYSPY_DIR:
#   PID.err: print it to stderr, exit 1;  PID.N.json: the N-th dump of PID;  PID.json: any dump;
#   PID.sleep: seconds to wait first;  PID.touch: a path to touch while dumping (a heartbeat write).
if [ "$1" = "--version" ]; then echo "py-spy 0.0.0-fake"; exit 0; fi
pid=$4
d=$FAKE_PYSPY_DIR
if [ -f "$d/$pid.err" ]; then cat "$d/$pid.err" >&2; exit 1; fi
if [ -f "$d/$pid.sleep" ]; then sleep "$(cat "$d/$pid.sleep")"; fi
if [ -f "$d/$pid.touch" ]; then touch "$(cat "$d/$pid.touch")"; fi
n=$(cat "$d/$pid.count" 2>/dev/null || echo 0)
n=$((n + 1))
echo "$n" > "$d/$pid.count"
if [ -f "$d/$pid.$n.json" ]; then cat "$d/$pid.$n.json"; else cat "$d/$pid.json"; fi
"""

STALE_S = 1.5
"""A heartbeat age (seconds) past `--stall-seconds 1`, the smallest allowed, that a sleeper started a
moment ago can still have: rank_liveness reads a heartbeat more than procfs.PID_REUSE_MARGIN_S (2 s)
older than its process as a reused pid."""

ALL_REDUCE = [
    ("all_reduce", "/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py", 3252),
    ("wrapper", "/venv/lib/python3.11/site-packages/torch/distributed/c10d_logger.py", 83),
    ("train_step", "/work/job.py", 40),
    ("<module>", "/work/job.py", 60),
]


def pyspy_json(pid: int, frames: list[tuple[str, str, int]], *, thread_name: str = "MainThread") -> str:
    """`py-spy dump --json` output (py-spy 0.4 field names) for one thread with `frames`, innermost first."""
    return json.dumps(
        [
            {
                "pid": pid,
                "thread_id": 140000000000000 + pid,
                "thread_name": thread_name,
                "os_thread_id": pid,
                "active": False,
                "owns_gil": False,
                "frames": [
                    {
                        "name": name,
                        "filename": filename,
                        "module": None,
                        "short_filename": filename.rsplit("/", 1)[-1],
                        "line": line,
                        "locals": None,
                        "is_entry": i == len(frames) - 1,
                        "is_shim_entry": i == len(frames) - 1,
                    }
                    for i, (name, filename, line) in enumerate(frames)
                ],
                "process_info": None,
            }
        ]
    )


class FakeWorld:
    """Sleeping processes standing in for ranks, a run directory and a fake py-spy."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.spy_dir = tmp / "spy"
        self.spy_dir.mkdir()
        self.py_spy = tmp / "py-spy"
        self.py_spy.write_text(FAKE_PY_SPY)
        self.py_spy.chmod(self.py_spy.stat().st_mode | stat.S_IXUSR)
        self.procs: list[subprocess.Popen] = []

    def spawn(self, *marker: str, env: dict[str, str] | None = None) -> int:
        proc = subprocess.Popen(
            [sys.executable, "-c", "import time; time.sleep(300)", *marker],
            env={**os.environ, **(env or {})},
            start_new_session=True,
        )
        self.procs.append(proc)
        deadline = time.time() + 60  # the parent returns mid-exec: wait for the new cmdline and environ
        while time.time() < deadline and not (
            "time.sleep(300)" in (proc_cmdline(proc.pid) or "")
            and (not env or proc_env_rank(proc.pid) is not None or "RANK" not in env)
        ):
            time.sleep(0.01)
        return proc.pid

    def shows(self, pid: int, frames: list[tuple[str, str, int]], *, sample: int | None = None) -> None:
        name = f"{pid}.json" if sample is None else f"{pid}.{sample}.json"
        (self.spy_dir / name).write_text(pyspy_json(pid, frames))

    def fails(self, pid: int, message: str) -> None:
        (self.spy_dir / f"{pid}.err").write_text(message)

    def run_dir(
        self,
        pids: list[int],
        *,
        name: str = "run",
        age_s: float = 0.0,
        host: str | None = None,
    ) -> Path:
        """A run directory whose rank r is pids[r], heartbeat `age_s` seconds ago, and a run.json in the
        writer's shape (a default CPU config, gloo). A heartbeat more than 2 s older than its process
        reads as a reused pid, so a fresh sleeper's heartbeat is backdated by at most `STALE_S`, with
        --stall-seconds 1."""
        run = self.tmp / name
        (run / "ranks").mkdir(parents=True)
        meta = {"name": name, "config": Config().to_dict(), "world_size": len(pids), "backend": "gloo"}
        (run / "run.json").write_text(json.dumps(meta))
        for rank, pid in enumerate(pids):
            record = {
                "rank": rank,
                "pid": pid,
                "host": host or os.uname().nodename,
                "role": "actor+rollout",
                "heartbeat": {"phase": "train", "rollout_id": 3, "step": None, "time": time.time() - age_s},
            }
            (run / "ranks" / f"{rank}.json").write_text(json.dumps(record))
        return run

    def gone_pid(self) -> int:
        """The pid of a process that exited and was reaped."""
        proc = subprocess.Popen([sys.executable, "-c", "pass"])
        proc.wait(timeout=60)
        return proc.pid

    @staticmethod
    def rank_file(
        run: Path, rank: int, pid: int, *, at: float, error: str | None = None, host: str | None = None
    ) -> None:
        """Write ranks/<rank>.json with a heartbeat at Unix time `at` (and the rank's recorded error)."""
        record = {
            "rank": rank,
            "pid": pid,
            "host": host or os.uname().nodename,
            "role": "actor+rollout",
            "heartbeat": {"phase": "error" if error else "train", "rollout_id": 0, "step": None, "time": at},
            **({"error": error} if error else {}),
        }
        (run / "ranks").mkdir(parents=True, exist_ok=True)
        (run / "ranks" / f"{rank}.json").write_text(json.dumps(record))

    @staticmethod
    def final_status(run: Path, status: str, error: str | None = None) -> None:
        """Append the run's final `status` event to events.jsonl."""
        record = {"event": "status", "time": time.time(), "rank": 0, "status": status}
        with open(run / "events.jsonl", "a", encoding="utf-8") as f:
            f.write(json.dumps({**record, **({"error": error} if error else {})}) + "\n")

    def close(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait(timeout=30)


def cli(world: FakeWorld, *argv: str, py_spy: str | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_hang_arguments(parser)
    return parser.parse_args([*argv, "--py-spy", py_spy or str(world.py_spy)])


def run_json(world: FakeWorld, capsys: pytest.CaptureFixture, *argv: str) -> tuple[int, dict]:
    code = run_hang_command(cli(world, *argv, "--json"))
    return code, json.loads(capsys.readouterr().out)


def kill_after_first_dump(world: FakeWorld, pid: int) -> threading.Thread:
    """Kill (and reap) rank `pid` as soon as the fake py-spy answered its first dump."""
    proc = next(p for p in world.procs if p.pid == pid)

    def kill() -> None:
        deadline = time.time() + 60
        while not (world.spy_dir / f"{pid}.count").exists() and time.time() < deadline:
            time.sleep(0.01)
        proc.kill()
        proc.wait(timeout=30)

    thread = threading.Thread(target=kill)
    thread.start()
    return thread

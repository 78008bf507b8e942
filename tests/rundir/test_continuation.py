"""A run directory continued by a `--load` start: the reader's records, the status rule, and when the
writer may append (same run, nothing alive). Hand-written files; the real runs are in
tests/train/test_checkpoint_resume.py."""

from __future__ import annotations

import json
import logging
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from grpolab.core.config import Config
from grpolab.rundir import reader
from grpolab.rundir.continuation import (
    config_differences,
    continue_run,
    failed_before_first_rollout,
    running_ranks,
)


def write_lines(path: Path, rows: list[dict]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def metric(kind: str, rollout_id: int, value: float, step: int | None = None) -> dict:
    return {"kind": kind, "rollout_id": rollout_id, "step": step, "time": 0.0, "metrics": {"x": value}}


def marker(rollout_id: int) -> dict:
    return {
        "kind": reader.RESUME_KIND,
        "rollout_id": rollout_id,
        "step": rollout_id,
        "time": 0.0,
        "metrics": {},
    }


def test_each_resume_marker_replaces_the_records_from_its_rollout_on(tmp_path: Path) -> None:
    rows = [metric("rollout", r, 1.0) for r in range(4)] + [metric("step", r, 1.0, step=r) for r in range(4)]
    rows += [marker(2), metric("rollout", 2, 2.0), metric("step", 2, 2.0, step=2)]  # second start: crashed
    rows += [marker(1)] + [metric("rollout", r, 3.0) for r in (1, 2, 3)]  # third start, from rollout 1
    rows += [{"kind": "eval", "rollout_id": None, "step": None, "metrics": {"x": 9.0}}]
    write_lines(tmp_path / "metrics.jsonl", rows)
    got = reader.read_metrics_file(tmp_path / "metrics.jsonl")
    assert [(r.kind, r.rollout_id, r.metrics["x"]) for r in got.records] == [
        ("rollout", 0, 1.0),
        ("step", 0, 1.0),
        ("rollout", 1, 3.0),
        ("rollout", 2, 3.0),
        ("rollout", 3, 3.0),
        ("eval", None, 9.0),
    ]
    assert got.replaced == [2, 3, 4, 6, 7, 8, 10, 11] and got.bad_lines == []
    assert [r.rollout_id for r in reader.read_metrics(tmp_path, "rollout")] == [0, 1, 2, 3]


def test_the_status_of_a_continued_run_is_its_last_starts(tmp_path: Path) -> None:
    first = [{"event": "run_start"}, {"event": "status", "status": "failed"}]
    second = [
        {"event": "run_start", "start": 2, "continued": True},
        {"event": "resume", "next_rollout_id": 2},
    ]
    write_lines(tmp_path / "events.jsonl", first + second)
    (tmp_path / "ranks").mkdir()
    beat = {"rank": 0, "pid": 12345, "host": "h", "heartbeat": {"phase": "train", "time": 1000.0}}
    (tmp_path / "ranks" / "0.json").write_text(json.dumps(beat))
    assert reader.run_status(tmp_path, now=1010.0) == "running"  # the failed status is the first start's
    assert reader.run_status(tmp_path, now=1000.0 + reader.HEARTBEAT_TIMEOUT_S + 1) == "crashed"
    write_lines(tmp_path / "events.jsonl", first + second + [{"event": "status", "status": "finished"}])
    assert reader.run_status(tmp_path, now=1010.0) == "finished"


def rank_file(run_dir: Path, rank: int, pid: int, host: str, beat: float) -> None:
    (run_dir / "ranks").mkdir(exist_ok=True)
    record = {"rank": rank, "pid": pid, "host": host, "heartbeat": {"phase": "train", "time": beat}}
    (run_dir / "ranks" / f"{rank}.json").write_text(json.dumps(record))


@pytest.fixture
def live_pid():
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    yield proc.pid
    proc.kill()
    proc.wait()


def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_running_ranks_checks_pids_here_and_heartbeats_elsewhere(tmp_path: Path, live_pid: int) -> None:
    now, here = time.time(), socket.gethostname()
    rank_file(tmp_path, 0, dead_pid(), here, now)  # killed a second ago: gone, whatever its heartbeat says
    assert running_ranks(tmp_path) == []
    rank_file(tmp_path, 1, live_pid, here, now - 3600)
    rank_file(tmp_path, 2, 4242, "other-host", now - 10)
    assert running_ranks(tmp_path, now=now) == [
        f"rank 1 is pid {live_pid}, alive on this host",
        "rank 2 on other-host beat 10 s ago",
    ]
    rank_file(tmp_path, 2, 4242, "other-host", now - reader.HEARTBEAT_TIMEOUT_S - 1)
    rank_file(tmp_path, 1, os.getpid(), here, now)  # this process: the start that continues
    assert running_ranks(tmp_path, now=now) == []
    rank_file(tmp_path, 1, live_pid, here, now)
    write_lines(tmp_path / "events.jsonl", [{"event": "status", "status": "finished"}])
    assert running_ranks(tmp_path, now=now) == []  # ended by itself; its pid lives on in another job


def run_json(path: Path, config: dict, **extra) -> None:
    path.mkdir(exist_ok=True)
    body = {"name": path.name, "config": config, "argv": ["grpolab", "train"], "start_time": 1.0, **extra}
    (path / "run.json").write_text(json.dumps(body))


def test_continue_run_appends_a_start_and_refuses_another_or_a_live_run(
    tmp_path: Path, live_pid: int
) -> None:
    config = Config()
    config.run.run_dir = "runs/a"
    run_json(tmp_path, config.to_dict(), run_id="abc")  # a run.json from before "starts"
    rank_file(tmp_path, 0, dead_pid(), socket.gethostname(), time.time())
    again = Config()
    again.run.run_dir, again.checkpoint.load = str(tmp_path), "ckpt"
    starts = continue_run(tmp_path, again.to_dict(), {"argv": ["grpolab", "train", "--load", "ckpt"]})
    assert [s["argv"][-1] for s in starts] == ["train", "ckpt"]
    saved = json.loads((tmp_path / "run.json").read_text())
    assert saved["starts"] == starts and saved["run_id"] == "abc" and saved["argv"] == ["grpolab", "train"]
    assert list((tmp_path / "ranks").iterdir()) == []  # the crashed start's rank files are gone
    other = Config()
    other.optimizer.lr, other.run.seed = 0.5, 7
    with pytest.raises(FileExistsError) as e:
        continue_run(tmp_path, other.to_dict(), {"argv": []})
    assert "holds another run (--lr 0.0002 there, 0.5 here; --seed 1234 there, 7 here)" in str(e.value)
    rank_file(tmp_path, 0, live_pid, socket.gethostname(), time.time())
    with pytest.raises(FileExistsError) as e:
        continue_run(tmp_path, again.to_dict(), {"argv": []})
    assert f"the run there is still running (rank 0 is pid {live_pid}, alive on this host)" in str(e.value)


def test_config_differences_name_flags_and_fields_only_one_side_has() -> None:
    saved = Config().to_dict()
    del saved["optimizer"]["adam_eps"]  # a run.json written before the field existed: its default
    assert config_differences(saved, Config().to_dict()) == []
    saved["optimizer"]["retired_field"] = 1  # written by a grpolab that had it: compared as written
    now = Config()
    now.checkpoint.load, now.checkpoint.allow_data_change, now.rollout.num_rollout = "x", True, 99
    got = config_differences(saved, now.to_dict())
    default = saved["rollout"]["num_rollout"]
    assert got == [
        "--adam-eps (absent) there, 1e-08 here",
        "optimizer.retired_field 1 there, (absent) here",
        f"--num-rollout {default} there, 99 here",
    ]


def test_a_run_dir_whose_starts_failed_before_the_first_rollout_is_reused(tmp_path: Path, caplog) -> None:
    """Bad input found after the directory was made (a checkpoint of other data, missing recordings)
    must not block the corrected command: any next start reuses it, with another config too."""
    from grpolab.rundir.writer import RunDirectory

    first, second = Config(), Config()
    second.run.seed, second.rollout.num_rollout = 7, 2
    path = tmp_path / "run"
    for attempt in range(2):  # two failed starts, then a good one
        run = RunDirectory.create(
            path, config=first.to_dict(), argv=["grpolab", "train", str(attempt)], seed=1
        )
        run.heartbeat("error", None, error="FileNotFoundError: recordings missing")
        run.finish("failed", error="FileNotFoundError: recordings missing")
    with caplog.at_level(logging.INFO, logger="grpolab"):
        run = RunDirectory.create(path, config=second.to_dict(), argv=["grpolab", "train", "ok"], seed=7)
    meta = reader.read_run_meta(path)
    assert meta.config is not None and meta.config.run.seed == 7 and meta.seed == 7
    assert [s["argv"][-1] for s in meta.raw["starts"]] == ["0", "1", "ok"] and meta.argv[-1] == "ok"
    assert not run.continued and list((path / "ranks").iterdir()) == []  # the failed start's rank file
    kinds = [(e["event"], e.get("status"), e.get("failed_starts_before")) for e in reader.read_events(path)]
    assert kinds == [
        ("run_start", None, None),
        ("status", "failed", None),
        ("run_start", None, 1),
        ("status", "failed", None),
        ("run_start", None, 2),
    ]
    assert "reusing it, its earlier start(s) failed before the first rollout" in caplog.text
    run.heartbeat("rollout", 0)
    assert reader.run_status(path) == "running"  # the new start's, not the earlier failure
    run.finish("finished")
    assert reader.run_status(path) == "finished"


@pytest.mark.parametrize("ended", ["metrics", "interrupted", "finished", "killed"])
def test_a_run_dir_with_anything_but_failures_before_a_rollout_is_not_reused(
    tmp_path: Path, ended: str
) -> None:
    from grpolab.rundir.writer import RunDirectory

    path = tmp_path / "run"
    run = RunDirectory.create(path, config=Config().to_dict(), argv=["grpolab", "train"], seed=1)
    if ended == "metrics":
        run.log_metrics("rollout", 0, {"x": 1.0})
    if ended != "killed":
        run.finish("failed" if ended == "metrics" else ended)
    assert not failed_before_first_rollout(path)
    before = (path / "events.jsonl").read_text()
    with pytest.raises(FileExistsError, match="already holds a run"):
        RunDirectory.create(path, config=Config().to_dict(), argv=["grpolab", "train"], seed=1)
    assert (path / "events.jsonl").read_text() == before

"""RunStore: discovery, status, half-written lines, caching, foreign logs in the same shape."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from grpolab.rundir.foreign_logs import parse_file
from grpolab.ui import discovery
from grpolab.ui.runstore import RunStore

LOGS = Path(__file__).resolve().parents[2] / "fixtures" / "logs"


def _run(folder: Path, *, steps: int = 3, status: str | None = "finished", run_json: bool = True) -> Path:
    folder.mkdir(parents=True)
    (folder / "ranks").mkdir()
    if run_json:
        config = {"model": {"hf_checkpoint": "m"}, "optimizer": {"clip_grad": 1.0}}
        (folder / "run.json").write_text(
            json.dumps({"name": folder.name, "config": config, "seed": 3, "start_time": 1.0})
        )
    with open(folder / "metrics.jsonl", "w") as f:
        for i in range(steps):
            f.write(
                json.dumps(
                    {
                        "kind": "rollout",
                        "rollout_id": i,
                        "step": None,
                        "time": 10.0 + i,
                        "metrics": {"rollout/raw_reward": i / 10},
                    }
                )
                + "\n"
            )
            f.write(
                json.dumps(
                    {
                        "kind": "step",
                        "rollout_id": i,
                        "step": i,
                        "time": 10.5 + i,
                        "metrics": {"train/loss": -i},
                    }
                )
                + "\n"
            )
    events = [{"event": "run_start", "time": 1.0}]
    if status:
        events.append({"event": "status", "status": status, "time": 2.0})
    (folder / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    return folder


def _heartbeat(folder: Path, t: float, *, pid: int | None = None, host: str | None = None) -> None:
    """A rank file: by default this process on this host (alive), beating at `t`."""
    record = {"rank": 0, "pid": pid or os.getpid(), "host": host or socket.gethostname()}
    (folder / "ranks" / "0.json").write_text(
        json.dumps({**record, "heartbeat": {"phase": "rollout", "time": t}})
    )


def _gone_pid() -> int:
    """The pid of a process of this host that has exited (and was reaped)."""
    proc = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    return int(proc.stdout)


def test_status_and_discovery(tmp_path: Path) -> None:
    _run(tmp_path / "done")
    _run(tmp_path / "failed", status="failed")
    _heartbeat(_run(tmp_path / "live", status=None), time.time())  # this process beats now
    _heartbeat(_run(tmp_path / "dead", status=None), time.time() - 3600)
    # killed a moment ago: its pid is gone on this host, so no heartbeat timeout is waited for
    _heartbeat(_run(tmp_path / "killed", status=None), time.time() - 10, pid=_gone_pid())
    # another host's rank: only its heartbeat's age tells
    _heartbeat(_run(tmp_path / "remote", status=None), time.time() - 10, pid=_gone_pid(), host="node-7")
    _run(tmp_path / "nested" / "deeper" / "inc", run_json=False)
    shutil.copy(LOGS / "miles_plain.log", tmp_path / "plain.log")
    (tmp_path / "notes.txt").write_text("not a log")
    store = RunStore([tmp_path])
    runs = {r.run_id: r for r in store.list_runs()}
    assert set(runs) == {
        "done",
        "failed",
        "live",
        "dead",
        "killed",
        "remote",
        "nested/deeper/inc",
        "plain.log",
    }
    status = {k: r.status for k, r in runs.items()}
    assert status == {
        "done": "finished",
        "failed": "failed",
        "live": "running",
        "dead": "crashed",
        "killed": "crashed",
        "remote": "running",
        "nested/deeper/inc": "incomplete",
        "plain.log": "running",  # written just now
    }
    assert (
        runs["done"].steps == 3 and runs["done"].last_reward == pytest.approx(0.2) and runs["done"].seed == 3
    )
    assert runs["plain.log"].source == "miles log" and runs["plain.log"].seed == 1
    old = time.time() - 3600
    os.utime(tmp_path / "plain.log", (old, old))
    assert {r.run_id: r.status for r in store.list_runs()}["plain.log"] == "ended"


def test_several_roots_and_bad_roots(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _run(tmp_path / "one" / "r")
    _run(tmp_path / "two" / "r")
    store = RunStore([tmp_path / "one", tmp_path / "two", tmp_path / "missing"])
    assert [r.run_id for r in store.list_runs()] == ["one/r", "two/r"]
    assert store.problems == [f"RUNS_ROOT {tmp_path / 'missing'} does not exist"]

    real_scandir = os.scandir

    def deny(path):
        if Path(path) == tmp_path / "one":
            raise PermissionError(13, "Permission denied")
        return real_scandir(path)

    monkeypatch.setattr(discovery.os, "scandir", deny)
    store = RunStore([tmp_path / "one"])
    assert store.list_runs() == []
    assert store.problems == [f"cannot read RUNS_ROOT {tmp_path / 'one'}: Permission denied"]


def test_half_written_last_line_is_skipped(tmp_path: Path) -> None:
    run = _run(tmp_path / "r", steps=2, status=None)
    with open(run / "metrics.jsonl", "a") as f:
        f.write('{"kind": "step", "rollout_id": 2, "step": 2, "metrics": {"train/lo')
    store = RunStore([tmp_path])
    frame = store.frame("r")
    assert len(frame) == 4 and frame.index.get_level_values("step").max() == 1
    info = store.list_runs()[0]
    assert info.steps == 2 and "half-written" in info.warnings[0]
    with open(run / "metrics.jsonl", "a") as f:  # the writer finishes the line
        f.write('ss": 0.5}}\n')
    assert store.frame("r").loc[("step", 2), "train/loss"] == 0.5
    assert store.list_runs()[0].warnings == ()


def test_metric_values_that_are_not_numbers_are_named(tmp_path: Path) -> None:
    run = _run(tmp_path / "r", steps=2)
    path = run / "metrics.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    rows[1]["metrics"].update({"train/ppo_kl": None, "train/x": "abc"})  # line 2: the first step
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    store = RunStore([tmp_path])
    (info,) = store.list_runs()
    assert info.warnings == (
        'metrics.jsonl: 2 value(s) not a number (left out): line 2: train/ppo_kl = null; line 2: train/x = "abc"',
    )
    assert store.non_numeric("r") == {2: {"train/ppo_kl": "null", "train/x": '"abc"'}}
    assert store.records("r")[1].metrics == {"train/loss": 0.0}


def test_read_scalars_is_cached_until_the_file_changes(tmp_path: Path) -> None:
    run = _run(tmp_path / "r")
    store = RunStore([tmp_path])
    store.list_runs()
    first = store.read_scalars(["r"], ["train/loss"])
    assert store.read_scalars(["r"], ["train/loss"]) is first
    assert store.frame("r") is store.frame("r")
    assert list(first.index.names) == ["run", "kind", "step"] and list(first.columns) == [
        "train/loss",
        "time",
    ]
    with open(run / "metrics.jsonl", "a") as f:
        f.write(
            json.dumps(
                {"kind": "step", "rollout_id": 3, "step": 3, "time": 20.0, "metrics": {"train/loss": -3}}
            )
            + "\n"
        )
    second = store.read_scalars(["r"], ["train/loss"])
    assert second is not first and second.loc[("r", "step", 3), "train/loss"] == -3


def test_miles_log_gives_the_run_dir_shape(tmp_path: Path) -> None:
    """The log read directly equals a run directory whose metrics.jsonl holds the parsed records."""
    shutil.copy(LOGS / "miles_plain.log", tmp_path / "plain.log")
    records = [r.as_jsonl() for r in parse_file(LOGS / "miles_plain.log").records]
    (tmp_path / "as-run").mkdir()
    (tmp_path / "as-run" / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    store = RunStore([tmp_path])
    both = store.read_scalars(["plain.log", "as-run"])
    log, run = both.xs("plain.log", level="run"), both.xs("as-run", level="run")
    pd.testing.assert_frame_equal(log, run)
    assert sorted(set(log.index.get_level_values("kind"))) == ["perf", "rollout", "step"]
    assert len(log) == 30  # the two perf lines of a rollout are one perf row, step lines deduplicated
    assert log.loc[("perf", 0), "perf/step_time"] == 233.29494333267212  # trainer-side line
    assert log.loc[("perf", 0), "perf/rollout_time"] > 50  # rollout-side line, same row
    assert set(log.dtypes) == {pd.Series([1.0]).dtype}


def test_miles_log_and_real_run_share_index_and_dtypes(ui_root: Path) -> None:
    store = RunStore([ui_root])
    store.list_runs()
    ours, theirs = store.frame("a"), store.frame("logs/miles_plain.log")
    assert ours.index.names == theirs.index.names == ["kind", "step"]
    assert set(ours.index.get_level_values("kind")) == set(theirs.index.get_level_values("kind"))
    assert all(str(d) == "float64" for d in [*ours.dtypes, *theirs.dtypes])
    shared = {"rollout/raw_reward", "train/loss", "train/train_rollout_logprob_abs_diff", "perf/step_time"}
    assert shared <= set(ours.columns) & set(theirs.columns)


def test_config_events_rollouts_gpu_diagnose(ui_root: Path, tmp_path: Path) -> None:
    store = RunStore([ui_root])
    store.list_runs()
    assert store.read_config("b")["seed"] == 7 and store.read_config("b")["run"]["seed"] == 7
    assert store.read_config("logs/miles_plain.log")["flags"]["rollout-batch-size"] == "32"
    assert store.read_events("a")[-1]["event"] == "status"
    assert list(store.list_rollouts("a")) == [0, 1, 2, 3] == list(store.list_rollouts("b"))
    rec = store.read_rollout("a", 2)
    assert rec is not None and rec.rollout_id == 2 and len(rec.samples) == 8
    assert store.read_rollout("a", 2) is rec
    assert store.read_gpu("a").empty and store.read_diagnose("a") == []
    run = _run(tmp_path / "g")
    samples = [
        {"time": 10.2, "gpu": 0, "temperature_c": 85, "throttle_reasons": ["thermal"]},
        {"time": 11.0, "gpu": 0},
    ]
    (run / "gpu.jsonl").write_text("".join(json.dumps(s) + "\n" for s in samples))
    gpu = RunStore([tmp_path]).read_gpu("g")
    assert list(gpu["time"]) == [10.2, 11.0]
    assert RunStore([tmp_path]).list_rollouts("g") == {} and RunStore([tmp_path]).read_rollout("g", 0) is None


def test_unknown_run_raises_key_error(tmp_path: Path) -> None:
    with pytest.raises(KeyError, match="no run 'nope'"):
        RunStore([tmp_path]).frame("nope")


def test_hang_reports_newest_first_without_their_parsed_stacks(hang_run: Path) -> None:
    store = RunStore([hang_run.parent])
    hangs = store.read_hang_reports("hung")
    assert [h.folder for h in hangs] == ["diagnose/20261130T024635Z", "diagnose/20261129T100000Z"]
    assert hangs[0].taken == 1796006795.0  # 2026-11-30 02:46:35 UTC
    assert hangs[0].report["verdict"]["pattern"] == "B" and hangs[1].report["hung"] is False
    assert list(hangs[0].dumps) == [0, 1, 2] and "save_checkpoint" in hangs[0].dumps[1]
    assert store.read_diagnose("hung") == [("diagnose/extra/summary.json", {"tool": "custom", "ok": True})]
    assert store.read_hang_reports("hung")[0].report is hangs[0].report  # cached


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("{garbage", "is not JSON (Expecting property name"),
        ("[1,2]", "holds a JSON list, not a hang report object"),
        ('{"hung": "no", "verdict": {}}', 'holds no hang verdict (no boolean "hung"'),
    ],
)
def test_an_unreadable_verdict_is_no_verdict(hang_run: Path, text: str, why: str) -> None:
    verdict = hang_run / "diagnose" / "20261129T100000Z" / "verdict.json"
    verdict.write_text(text)
    newest, unreadable = RunStore([hang_run.parent]).read_hang_reports("hung")
    assert newest.error is None and newest.report["hung"] is True
    assert unreadable.report == {} and unreadable.error is not None
    assert unreadable.error.startswith(f"{verdict} {why}")
    assert list(unreadable.dumps) == [0, 1, 2]  # the dumps are still there to read


def test_log_findings_are_cached_until_the_log_changes(hang_run: Path, tmp_path: Path) -> None:
    shutil.copy(LOGS / "miles_plain.log", tmp_path / "plain.log")
    store = RunStore([tmp_path])
    store.list_runs()
    scan = store.read_log_findings("hung")
    assert scan is not None and scan.file == "console.log" and scan.lines == 4
    assert [(f.rule, f.severity, f.evidence[0].line) for f in scan.findings] == [("fa3_sm", "error", 3)]
    assert store.read_log_findings("hung") is scan
    log = hang_run / "console.log"
    with open(log, "a") as f:
        f.write("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\n")
    again = store.read_log_findings("hung")
    assert again is not scan and again.lines == 5
    assert [(f.rule, f.evidence[0].line) for f in again.findings] == [("fa3_sm", 3), ("engine_oom_start", 5)]
    assert store.read_log_findings("plain.log") is not None  # a console log is read as itself
    assert store.log_file("plain.log") == tmp_path / "plain.log"
    log.unlink()
    assert store.read_log_findings("hung") is None

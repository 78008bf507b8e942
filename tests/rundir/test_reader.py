"""The run-directory reader on a directory written by a real `grpolab train`, and on edited copies."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from grpolab.rundir import reader
from grpolab.rundir.reader import RunDirError


def _copy(short_run: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(short_run, tmp_path / "run"))


def _lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _edit_run_json(run: Path, **changes: object) -> None:
    raw = json.loads((run / "run.json").read_text())
    for key, value in changes.items():
        if key == "device":
            raw["config"]["model"]["device"] = value
        else:
            raw[key] = value
    (run / "run.json").write_text(json.dumps(raw))


# --- run.json ----------------------------------------------------------------------------------


def test_run_meta_of_a_real_run(short_run: Path) -> None:
    meta = reader.read_run_meta(short_run)
    assert meta.path == short_run and meta.name == short_run.name
    assert meta.seed == 1234 and meta.world_size == 1 and meta.backend is None
    assert meta.argv[:2] == ["grpolab", "train"] and "--num-rollout" in meta.argv
    assert meta.config is not None and meta.config_error is None
    assert meta.config.rollout.rollout_batch_size == 2 and meta.config.rollout.n_samples_per_prompt == 2
    assert meta.device == "cpu" == meta.config.model.device
    assert meta.model is not None and meta.model.endswith("tiny-qwen3")
    assert meta.environment["torch"] and isinstance(meta.start_time, float)
    assert meta.config_dict["model"]["device"] == "cpu"


def test_a_gpu_run_read_on_any_machine_keeps_its_device_and_backend(short_run: Path, tmp_path: Path) -> None:
    run = _copy(short_run, tmp_path)
    _edit_run_json(run, device="cuda", backend="nccl", world_size=2)
    meta = reader.read_run_meta(run)
    # nested config.model.device, never a flat config["device"]; the top-level backend
    assert (meta.device, meta.backend, meta.world_size) == ("cuda", "nccl", 2)
    # on a machine without CUDA the config may not validate here: then it says why, and the
    # device still comes from the nested field as written
    assert (meta.config is None) == (meta.config_error is not None)
    if meta.config is None:
        assert "--device cuda" in (meta.config_error or "")


def test_run_json_that_cannot_be_read_names_the_file(short_run: Path, tmp_path: Path) -> None:
    run = _copy(short_run, tmp_path)
    (run / "run.json").write_text('{"name": "x", "conf')
    with pytest.raises(RunDirError, match=r"run\.json: not valid JSON"):
        reader.read_run_meta(run)
    (run / "run.json").write_text("[1, 2]")
    with pytest.raises(RunDirError, match=r"run\.json: expected a JSON object, got list"):
        reader.read_run_meta(run)
    (run / "run.json").unlink()
    with pytest.raises(RunDirError, match=r"run\.json: no such file"):
        reader.read_run_meta(run)
    assert reader.is_run_dir(run) and not reader.is_run_dir(tmp_path / "missing")


def test_config_that_does_not_parse_is_not_an_error(tmp_path: Path) -> None:
    tmp_path.joinpath("run.json").write_text(json.dumps({"config": {"model": {"nope": 1}}, "seed": 3}))
    meta = reader.read_run_meta(tmp_path)
    assert meta.config is None and "unknown fields ['nope']" in (meta.config_error or "")
    assert meta.seed == 3 and meta.device is None and meta.name == tmp_path.name


# --- metrics.jsonl -----------------------------------------------------------------------------


def test_metrics_of_a_real_run_match_the_file(short_run: Path) -> None:
    rows = _lines(short_run / reader.METRICS_FILE)
    records = reader.read_metrics(short_run)
    assert len(records) == len(rows) and [r.line_no for r in records] == list(range(1, len(rows) + 1))
    for rec, row in zip(records, rows, strict=True):
        assert (rec.kind, rec.rollout_id, rec.step, rec.time) == (
            row["kind"], row["rollout_id"], row["step"], row["time"]
        )  # fmt: skip
        assert rec.metrics == row["metrics"]
    steps = reader.read_metrics(short_run, "step")
    assert [(s.rollout_id, s.step) for s in steps] == [(0, 0), (1, 1)]
    assert (
        steps[0].metrics["train/ppo_kl"] == 0.0 and "train/train_rollout_logprob_abs_diff" in steps[0].metrics
    )
    assert [r.rollout_id for r in reader.read_metrics(short_run, "rollout")] == [0, 1]


def test_metrics_file_skips_a_half_written_last_line_and_reports_bad_lines(tmp_path: Path) -> None:
    good = {"kind": "step", "rollout_id": 0, "step": 0, "time": 1.0, "metrics": {"a": 1, "s": "x"}}
    path = tmp_path / reader.METRICS_FILE
    path.write_text(json.dumps(good) + '\n\n{"kind": "perf", "metr')
    got = reader.read_metrics_file(path)
    assert got.partial_last_line and got.bad_lines == []
    (rec,) = got.records
    assert rec.metrics == {"a": 1.0} and rec.line_no == 1  # a non-numeric value is dropped...
    assert got.non_numeric == {1: {"s": '"x"'}}  # ...and named, with its line
    path.write_text(
        '{"kind": \n[1]\n{"kind": "step", "metrics": 3}\n{"kind": "x", "metrics": {}, "step": "a"}\n'
    )
    got = reader.read_metrics_file(path)
    assert got.records == [] and not got.partial_last_line and got.non_numeric == {}
    assert [n for n, _ in got.bad_lines] == [1, 2, 3, 4]
    assert "'metrics' must be an object" in got.bad_lines[2][1] and "index 'a'" in got.bad_lines[3][1]
    assert reader.read_metrics(tmp_path / "missing") == []


def test_jsonl_tail_reads_only_the_last_whole_lines(tmp_path: Path) -> None:
    path = tmp_path / "big.jsonl"
    path.write_text("".join(json.dumps({"i": i, "pad": "x" * 50}) + "\n" for i in range(1000)) + '{"i": 10')
    tail = reader.read_jsonl_tail(path, max_bytes=250)  # 3 lines of 72 bytes, a cut one, 8 partial
    assert [r["i"] for r in tail] == [997, 998, 999]  # the cut first line and the partial last are skipped
    assert len(reader.read_jsonl_tail(path, max_bytes=1 << 20)) == 1000
    assert reader.read_jsonl_tail(tmp_path / "no") == []


# --- events, ranks, status ---------------------------------------------------------------------


def test_events_ranks_and_status_of_a_real_run(short_run: Path) -> None:
    events = reader.read_events(short_run)
    assert events[0]["event"] == "run_start" and events == _lines(short_run / reader.EVENTS_FILE)
    final = reader.final_status_event(short_run)
    assert final == events[-1] and final is not None and final["status"] == "finished"
    assert reader.status_event_of(events) == final
    assert reader.run_status(short_run) == "finished"
    (rank,), problems = reader.read_ranks(short_run)
    assert problems == [] and rank.rank == 0 and rank.pid > 0 and rank.role == "actor+rollout"
    assert rank.host and rank.error is None and rank.source == str(short_run / "ranks" / "0.json")
    assert rank.heartbeat is not None and rank.heartbeat["rollout_id"] == 2  # the next rollout id
    assert rank.heartbeat["phase"] == "finished"  # the loop's last heartbeat: it left normally
    assert rank.heartbeat_time == rank.heartbeat["time"] and rank.written_at is not None


def test_status_without_a_final_event_follows_the_heartbeat(short_run: Path, tmp_path: Path) -> None:
    run = _copy(short_run, tmp_path)
    events = _lines(run / reader.EVENTS_FILE)
    (run / reader.EVENTS_FILE).write_text("".join(json.dumps(e) + "\n" for e in events[:-1]))
    beat = reader.read_ranks(run)[0][0].heartbeat_time
    assert beat is not None and reader.final_status_event(run) is None
    assert reader.run_status(run, now=beat + 10) == "running"
    assert reader.run_status(run, now=beat + reader.HEARTBEAT_TIMEOUT_S + 1) == "crashed"
    assert reader.run_status(run, now=beat + 10, heartbeat_timeout_s=5) == "crashed"
    # a status line being written is not final yet; a long one (200 kB error) is read whole
    with open(run / reader.EVENTS_FILE, "a") as f:
        f.write('{"event": "status", "status": "fail')
    assert reader.run_status(run, now=beat + 10) == "running"
    failed = {"event": "status", "status": "failed", "error": "x" * 200_000}
    (run / reader.EVENTS_FILE).write_text(json.dumps(events[0]) + "\n" + json.dumps(failed) + "\n\n")
    assert reader.run_status(run, now=beat + 10) == "failed"
    assert reader.status_event_of(reader.read_events(run)) == failed
    shutil.rmtree(run / "ranks")
    (run / reader.EVENTS_FILE).unlink()
    assert reader.run_status(run) == "crashed" and reader.read_ranks(run) == ([], [])


@pytest.mark.parametrize(
    ("event", "beats", "expected"),
    [
        ({"event": "status", "status": "interrupted"}, [], "interrupted"),
        ({"event": "status", "status": "finished"}, [99.0], "finished"),
        ({"event": "status", "status": "weird"}, [99.0], "running"),
        (None, [10.0, 99.0], "running"),
        (None, [10.0], "crashed"),
        (None, [], "crashed"),
    ],
)
def test_decide_status(event: dict | None, beats: list[float], expected: str) -> None:
    assert reader.decide_status(event, beats, now=100.0, heartbeat_timeout_s=30) == expected


def _rank(tmp_path: Path, *, pid: int, host: str, beat: float) -> reader.RankRecord:
    (tmp_path / reader.RANKS_DIR).mkdir(exist_ok=True)
    record = {"rank": 0, "pid": pid, "host": host, "heartbeat": {"phase": "train", "time": beat}}
    (tmp_path / reader.RANKS_DIR / "0.json").write_text(json.dumps(record))
    return reader.read_ranks(tmp_path)[0][0]


def test_a_rank_killed_on_this_host_is_crashed_at_once(tmp_path: Path) -> None:
    """Issue 22 item 5: a gone pid of this host means crashed now, not after HEARTBEAT_TIMEOUT_S."""
    (tmp_path / reader.EVENTS_FILE).write_text(json.dumps({"event": "run_start", "time": 1.0}) + "\n")
    here, now = socket.gethostname(), time.time()
    gone = int(
        subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True).stdout
    )
    assert reader.rank_is_gone(_rank(tmp_path, pid=gone, host=here, beat=now))
    assert reader.run_status(tmp_path, now=now + 1) == "crashed"
    # another host's rank: its pid says nothing here; the heartbeat's age decides
    assert not reader.rank_is_gone(_rank(tmp_path, pid=gone, host="node-7", beat=now))
    assert reader.run_status(tmp_path, now=now + 1) == "running"
    assert reader.run_status(tmp_path, now=now + reader.HEARTBEAT_TIMEOUT_S + 1) == "crashed"
    # this process, alive and beating: running
    _rank(tmp_path, pid=os.getpid(), host=here, beat=now)
    assert reader.run_status(tmp_path, now=now + 1) == "running"
    # a pid whose process started after the rank's last heartbeat was reused: that rank is gone
    assert reader.rank_is_gone(_rank(tmp_path, pid=os.getpid(), host=here, beat=now - 10 * 24 * 3600))


def test_rank_files_that_cannot_be_used_are_named(short_run: Path, tmp_path: Path) -> None:
    run = _copy(short_run, tmp_path)
    ranks = run / reader.RANKS_DIR
    good = json.loads((ranks / "0.json").read_text())
    (ranks / "1.json").write_text("{not json")
    (ranks / "2.json").write_text(json.dumps({**good, "rank": 2, "pid": 0}))
    (ranks / "3.json").write_text(json.dumps({**good, "rank": "three"}))
    (ranks / "4.json").write_text("[]")
    older = {**good, "heartbeat": {**good["heartbeat"], "time": good["heartbeat"]["time"] - 60}}
    (ranks / "0-old.json").write_text(json.dumps(older))
    records, problems = reader.read_ranks(run, retries=0)
    assert [(r.rank, r.source) for r in records] == [(0, str(ranks / "0.json"))]
    assert len(problems) == 5
    text = "\n".join(problems)
    assert "1.json: not valid JSON" in text and "2.json: 'pid' must be a positive integer, got 0" in text
    assert (
        "3.json: 'rank' must be an integer, got 'three'" in text and "4.json: expected a JSON object" in text
    )
    assert f"0-old.json: rank 0 is also in {ranks / '0.json'}, whose heartbeat is newer" in text


def test_importing_the_reader_loads_no_torch_or_pandas() -> None:
    code = (
        "import sys; import grpolab.rundir.reader; "
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'torch', 'pandas', 'transformers', 'numpy'}))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"

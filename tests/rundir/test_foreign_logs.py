"""Miles/slime console-log parser: prefixes, dict reprs, both perf lines, duplicates, live logs."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from grpolab.core.metrics import format_line
from grpolab.rundir.foreign_logs import (
    LiteralError,
    LogParser,
    parse_file,
    parse_line,
    parse_metrics_dict,
    perf_side,
)

LOGS = Path(__file__).resolve().parents[2] / "fixtures" / "logs"
MANUAL_ROLLOUT_0 = (
    "(FSDPTrainRayActor pid=2551) [2026-10-17 15:56:48.271 actor_cell00000_rank00000] log_utils.py:125 - "
    "rollout 0: {'rollout/response_lengths': 739.92578125, 'rollout/raw_reward': 0.62890625}"
)


def test_manual_line_with_ray_and_timestamp_prefix() -> None:
    rec = parse_line(MANUAL_ROLLOUT_0, 7)
    assert rec is not None
    assert (rec.kind, rec.rollout_id, rec.step, rec.line_no) == ("rollout", 0, None, 7)
    assert rec.metrics == {"rollout/response_lengths": 739.92578125, "rollout/raw_reward": 0.62890625}
    assert rec.time == pytest.approx(1792252608.271)  # 2026-10-17 15:56:48.271 read as UTC


@pytest.mark.parametrize(
    "line",
    [
        "step 3: {'train/loss': 0.5}",
        "[2026-10-17 15:58:15.687 actor] log_utils.py:554 - step 3: {'train/loss': 0.5}",
        "(FSDPTrainRayActor pid=1) [2026-10-17 15:58:15] model.py:1 - step 3: {'train/loss': 0.5}",
        "(pid=1, ip=10.0.0.1) step 3: {'train/loss': 0.5}\r",
        "(FSDPTrainRayActor pid=1) step 3: {'train/loss': 0.5} [repeated 3x across cluster]",
    ],
)
def test_prefix_variants(line: str) -> None:
    rec = parse_line(line)
    assert rec is not None and rec.kind == "step" and rec.step == 3 and rec.metrics == {"train/loss": 0.5}


def test_not_metric_lines() -> None:
    for line in [
        "Timer train start",
        "Timer rollout end (elapsed: 57.1s)",
        "[CPU memory] after train: 12.5 GB (rollout_id=3, step=3)",
        "rollout 0 finished in 57 s",
        "restep 3: {'a': 1}",
    ]:
        assert parse_line(line) is None


def test_nan_inf_and_numeric_wrappers() -> None:
    got = parse_metrics_dict(
        "{'a': nan, 'b': -inf, 'c': inf, 'd': np.float64(0.25), 'e': tensor(2.0), 'f': True, "
        "'g': 'text', 'h': [1, 2], 'i': None, 'j': -3}"
    )
    assert math.isnan(got["a"]) and got["b"] == -math.inf and got["c"] == math.inf
    assert (got["d"], got["e"], got["f"], got["j"]) == (0.25, 2.0, 1.0, -3.0)
    assert "g" not in got and "h" not in got and "i" not in got


def test_code_is_never_evaluated() -> None:
    with pytest.raises(LiteralError):
        parse_metrics_dict("{'a': __import__('os').getcwd()}")
    with pytest.raises(LiteralError):
        parse_metrics_dict("{'a': open('x')}")
    assert parse_line("step 0: {'a': exit()}") is None


def test_perf_sides() -> None:
    assert perf_side({"perf/rollout_time": 57.0, "rollout/zero_std/count_0": 3}) == "rollout"
    assert perf_side({"perf/step_time": 233.3, "perf/sleep_time": 2.1}) == "trainer"
    assert perf_side({"perf/actor_train_tflops": 1.0}) == "trainer"
    assert perf_side({"perf/rollout_time": 2.0, "perf/train_time": 1.0, "perf/step_time": 3.0}) == "combined"


def test_fixture_log_both_perf_lines_and_duplicates() -> None:
    parsed = parse_file(LOGS / "miles_plain.log")
    kinds = [(r.kind, r.side) for r in parsed.records]
    assert kinds.count(("rollout", None)) == 10 and kinds.count(("step", None)) == 10
    assert kinds.count(("perf", "rollout")) == 10 and kinds.count(("perf", "trainer")) == 10
    assert parsed.duplicates == 10  # every step line is printed twice
    assert parsed.unparsed == 0
    step0 = next(r for r in parsed.records if r.kind == "step" and r.step == 0)
    assert step0.metrics["train/train_rollout_logprob_abs_diff"] == 0.015336457639932632
    perf0 = [r for r in parsed.records if r.kind == "perf" and r.rollout_id == 0]
    assert {r.side for r in perf0} == {"rollout", "trainer"}
    trainer = next(r for r in perf0 if r.side == "trainer")
    assert trainer.metrics["perf/step_time"] == 233.29494333267212
    rollout_side = next(r for r in perf0 if r.side == "rollout")
    assert (
        rollout_side.metrics["rollout/zero_std/count_1"] == 7
        and rollout_side.metrics["rollout/zero_std/count_0"] == 3
    )
    assert parsed.flags["hf-checkpoint"] == "/root/models/Qwen3-0.6B" and parsed.flags["seed"] == "1"
    assert parsed.flags["colocate"] == "true"


def test_only_identical_repeats_are_dropped() -> None:
    parser = LogParser()
    recs = parser.feed("step 1: {'a': 1.0}\nstep 1: {'a': 1.0}\nstep 1: {'a': 2.0}\nstep 2: {'a': 1.0}\n")
    assert [(r.step, r.metrics["a"]) for r in recs] == [(1, 1.0), (1, 2.0), (2, 1.0)]
    assert parser.duplicates == 1


def test_streaming_keeps_a_half_written_line() -> None:
    parser = LogParser()
    assert parser.feed("rollout 0: {'rollout/raw_reward': 0.5}\nstep 0: {'train/lo") and parser.lines == 1
    recs = parser.feed("ss': 0.25}\n")
    assert [(r.kind, r.metrics) for r in recs] == [("step", {"train/loss": 0.25})]


def test_file_with_half_written_last_line(tmp_path: Path) -> None:
    log = tmp_path / "live.log"
    text = (LOGS / "miles_plain.log").read_text()
    log.write_text(
        text
        + "(FSDPTrainRayActor pid=2551) [2026-10-17 16:30:00.000 x] log_utils.py:554 - step 10: {'train/loss': 0.1"
    )
    parsed = parse_file(log, chunk_bytes=1000)  # small chunks: lines cross chunk borders
    assert len(parsed.records) == 40 and parsed.unparsed == 1
    assert max(r.step for r in parsed.records if r.kind == "step") == 9


def test_log_without_metric_lines() -> None:
    parsed = parse_file(LOGS / "miles_dead_engine.log")
    assert parsed.records == [] and parsed.lines == 6 and parsed.first_time is None


def test_our_console_lines_round_trip() -> None:
    """grpolab's own console.log lines (core.metrics.format_line) parse back to the same numbers."""
    rollout = {"rollout/raw_reward": 0.125, "rollout/zero_std/count_0": 1.0, "rollout/step": 3.0}
    step = {"train/loss": -1.5e-09, "train/grad_norm": float("nan"), "train/step": 3.0}
    perf = {"perf/rollout_time": 2.5, "perf/train_time": 1.25, "perf/step_time": 4.0}
    text = "\n".join(
        [format_line("rollout", 3, rollout), format_line("step", 3, step), format_line("perf", 3, perf)]
    )
    recs = LogParser().feed(text + "\n[4/8] reward 0.125 len 14.0\n")
    assert [r.kind for r in recs] == ["rollout", "step", "perf"]
    assert recs[0].metrics == rollout and recs[2].metrics == perf and recs[2].side == "combined"
    assert recs[1].metrics["train/loss"] == -1.5e-09 and math.isnan(recs[1].metrics["train/grad_norm"])
    assert recs[1].as_jsonl() == {
        "kind": "step",
        "rollout_id": None,
        "step": 3,
        "time": None,
        "metrics": recs[1].metrics,
    }

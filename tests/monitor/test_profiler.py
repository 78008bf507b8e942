"""--use-pytorch-profiler on the tiny model: the traces are real Chrome-trace JSON holding the grpolab phase
ranges of exactly the asked window; a rank outside the world is exit 2 naming the flag."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
from runs import SHORT, events

from grpolab.cli import main
from grpolab.monitor.profiler import STEP_RANGE, TRACE_SUFFIX


def _ranges(path: Path) -> list[dict]:
    """The trace's grpolab/ complete events ("ph": "X"), read with json from the gzipped file."""
    with gzip.open(path, "rt", encoding="utf-8") as f:
        trace = json.load(f)
    return [
        e for e in trace["traceEvents"] if e.get("ph") == "X" and str(e.get("name")).startswith("grpolab/")
    ]


def _train(run_dir: Path, *extra: str) -> int:
    return main(["train", *SHORT, "--run-dir", str(run_dir), *extra])


def test_train_overall_traces_exactly_rollout_1(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    window = ["--profile-step-start", "1", "--profile-step-end", "2"]
    assert _train(run_dir, "--num-rollout", "3", "--use-pytorch-profiler", *window) == 0
    traces = sorted((run_dir / "profile").glob(f"*{TRACE_SUFFIX}"))
    assert [p.name for p in traces] == [f"rank0.train_overall.rollout1{TRACE_SUFFIX}"]
    ranges = _ranges(traces[0])
    names = [e["name"] for e in ranges]
    assert [n for n in names if n.startswith("grpolab/rollout_step_")] == [STEP_RANGE.format(1)]
    # no reference (nothing reads it); the old log-probs come from the training forward from rollout 1
    for phase in ("rollout", "actor_train", "update_weights"):
        assert names.count(f"grpolab/{phase}") == 1, (phase, names)  # one rollout step's phases
    assert (
        "grpolab/reward" in names
    )  # rewards are timed in two parts (the rollout path scores, the loop assigns advantages)
    step = next(e for e in ranges if e["name"] == STEP_RANGE.format(1))
    for e in ranges:  # every phase lies inside rollout 1's iteration (µs timestamps)
        assert step["ts"] <= e["ts"] and e["ts"] + e["dur"] <= step["ts"] + step["dur"] + 1, e["name"]
    # the trace is an event with its size, for the UI
    (event,) = events(run_dir, "profiler_trace")
    assert event["path"] == str(traces[0]) and event["bytes"] == traces[0].stat().st_size


def test_train_actor_traces_micro_batches_per_window(tmp_path: Path) -> None:
    """2 prompts × 2 answers = 4 samples, --micro-batch-size 1: 4 micro-batches in one optimizer window;
    micro-batches 1..2 traced, so two training forwards and no log-prob forward in the trace."""
    run_dir = tmp_path / "run"
    flags = ["--use-pytorch-profiler", "--profile-target", "train_actor", "--micro-batch-size", "1"]
    flags += [
        "--profile-step-start",
        "1",
        "--profile-step-end",
        "3",
        "--tensorboard-dir",
        str(tmp_path / "tb"),
    ]
    assert _train(run_dir, "--num-rollout", "1", *flags) == 0
    traces = sorted((tmp_path / "tb").glob(f"*{TRACE_SUFFIX}"))
    assert [p.name for p in traces] == [f"rank0.train_actor.rollout0.window0{TRACE_SUFFIX}"]
    with gzip.open(traces[0], "rt", encoding="utf-8") as f:
        ops = [e.get("name") for e in json.load(f)["traceEvents"] if e.get("ph") == "X"]
    # two micro-batches: two forwards (one embedding lookup each), each with its backward
    assert ops.count("aten::embedding") == 2
    assert ops.count("autograd::engine::evaluate_function: EmbeddingBackward0") == 2
    assert not (run_dir / "profile").exists()  # --tensorboard-dir replaces RUN_DIR/profile


def test_train_log_probs_traces_the_policy_forward_only(tmp_path: Path) -> None:
    """Micro-batch 0 of the log-prob forward: one policy forward, no backward, one trace per rollout."""
    run_dir = tmp_path / "run"
    flags = ["--use-pytorch-profiler", "--profile-target", "train_log_probs", "--micro-batch-size", "1"]
    flags += ["--profile-step-start", "0", "--profile-step-end", "1"]
    assert _train(run_dir, *flags) == 0  # 2 rollouts
    traces = sorted((run_dir / "profile").glob(f"*{TRACE_SUFFIX}"))
    assert [p.name for p in traces] == [
        f"rank0.train_log_probs.rollout{k}.window0{TRACE_SUFFIX}" for k in (0, 1)
    ]
    for trace in traces:
        with gzip.open(trace, "rt", encoding="utf-8") as f:
            ops = [e.get("name") for e in json.load(f)["traceEvents"] if e.get("ph") == "X"]
        assert ops.count("aten::embedding") == 1
        assert not [op for op in ops if op and "Backward" in op]
    assert len(events(run_dir, "profiler_trace")) == 2


def test_train_log_probs_window_to_the_last_micro_batch_leaves_the_reference_out(tmp_path: Path) -> None:
    """Micro-batches 2..3 of 4: the window ends after the policy's last log-prob forward, so the
    reference forward that follows is not in it, and each traced micro-batch has its own range."""
    run_dir = tmp_path / "run"
    flags = ["--use-pytorch-profiler", "--profile-target", "train_log_probs", "--micro-batch-size", "1"]
    flags += ["--profile-step-start", "2", "--profile-step-end", "4", "--num-rollout", "1"]
    assert _train(run_dir, *flags) == 0
    (trace,) = sorted((run_dir / "profile").glob(f"*{TRACE_SUFFIX}"))
    names = [e["name"] for e in _ranges(trace)]
    assert sorted(names) == ["grpolab/micro_batch_2", "grpolab/micro_batch_3"]
    with gzip.open(trace, "rt", encoding="utf-8") as f:
        ops = [e.get("name") for e in json.load(f)["traceEvents"] if e.get("ph") == "X"]
    assert ops.count("aten::embedding") == 2  # two policy forwards, no reference forward


@pytest.mark.parametrize(
    ("world", "ranks", "shown"), [([], ["0", "3"], "3"), (["--nproc-per-node", "2"], ["2"], "2")]
)
def test_profile_rank_outside_world_is_exit_2_at_start(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], world: list[str], ranks: list[str], shown: str
) -> None:
    """Checked before launch (torchrun included: --nproc-per-node is the world) and before the run dir."""
    with pytest.raises(SystemExit) as e:
        _train(tmp_path / "run", "--use-pytorch-profiler", "--profile-ranks", *ranks, *world)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert f"--profile-ranks {shown}: no such rank in a world of {1 if not world else 2}" in err
    assert "Traceback" not in err
    assert not (tmp_path / "run").exists()


def test_window_past_num_rollout_warns(tmp_path: Path) -> None:
    assert _train(tmp_path / "run", "--use-pytorch-profiler") == 0  # default window 10..11, 2 rollouts
    console = (tmp_path / "run" / "console.log").read_text()  # the grpolab logger does not propagate
    assert "--profile-step-start 10 is at or past --num-rollout 2" in console
    assert not (tmp_path / "run" / "profile").exists()


def test_windows_partly_past_num_rollout_warn() -> None:
    """A window that only partly fits, and a memory snapshot past the last rollout, are warned about."""
    from grpolab.core.config.monitoring import ProfilingConfig
    from grpolab.monitor.checks import profiling_warnings

    cfg = ProfilingConfig(use_pytorch_profiler=True, profile_step_start=1, profile_step_end=5)
    (line,) = profiling_warnings(cfg, num_rollout=3)
    assert "--profile-step-end 5 is past --num-rollout 3; only rollouts 1..2 will be traced" in line
    assert profiling_warnings(cfg, num_rollout=5) == []
    mem = ProfilingConfig(record_memory_history=True, memory_recorder="memray", memory_snapshot_num_steps=4)
    (line,) = profiling_warnings(mem, num_rollout=2)
    assert "--memory-snapshot-num-steps 4 is past --num-rollout 2" in line
    assert profiling_warnings(mem, num_rollout=4) == []


def test_run_failing_inside_the_window_ends_with_its_status(tmp_path: Path) -> None:
    """The trace written when a run fails inside the window is recorded before the status event, so
    the status is the last event and the reader says failed (not running)."""
    from grpolab.rundir.status import run_status

    run_dir = tmp_path / "run"
    flags = ["--use-pytorch-profiler", "--profile-step-start", "1", "--profile-step-end", "4"]
    flags += ["--custom-rollout-log-function-path", "rollout_loggers.boom_at_2"]
    assert _train(run_dir, "--num-rollout", "4", *flags) == 1
    lines = (run_dir / "events.jsonl").read_text().splitlines()
    names = [json.loads(line)["event"] for line in lines]
    assert names[-1] == "status" and json.loads(lines[-1])["status"] == "failed"
    assert names.count("profiler_trace") == 1 and names.index("profiler_trace") < len(names) - 1
    assert run_status(run_dir) == "failed"

"""--record-memory-history: memray's host snapshot is written once rollout N-1 has trained and memray's own
reader opens it; recorders this machine cannot run and a non-train_overall target are exit 2."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from runs import SHORT, events, records

from grpolab.cli import main


def _train(run_dir: Path, *extra: str) -> int:
    return main(["train", *SHORT, "--run-dir", str(run_dir), *extra])


def test_memray_snapshot_after_rollout_n_minus_1(tmp_path: Path) -> None:
    memray = pytest.importorskip("memray")
    run_dir, snapshots = tmp_path / "run", tmp_path / "snaps"
    flags = ["--record-memory-history", "--memory-recorder", "memray", "--memory-snapshot-num-steps", "2"]
    assert _train(run_dir, "--num-rollout", "3", *flags, "--memory-snapshot-dir", str(snapshots)) == 0
    path = snapshots / "memray-rank0.bin"
    (event,) = events(run_dir, "memory_snapshot")
    assert event["path"] == str(path) and event["bytes"] == path.stat().st_size > 0
    assert (event["recorder"], event["reason"]) == ("memray", "num_steps")
    # written after rollout 1's optimizer step and before its perf line (the end of its step)
    step_1 = next(r for r in records(run_dir, "step") if r["rollout_id"] == 1)
    perf_1 = next(r for r in records(run_dir, "perf") if r["rollout_id"] == 1)
    assert step_1["time"] <= event["time"] <= perf_1["time"]
    meta = memray.FileReader(path).metadata
    assert meta.total_allocations > 0 and meta.peak_memory > 0
    # tracking ended there: memray's end time is the snapshot event's, not the run's end
    last = events(run_dir)[-1]
    assert meta.end_time.timestamp() <= event["time"] + 0.01
    assert meta.end_time.timestamp() < last["time"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal is for machines without CUDA")
def test_torch_recorder_without_cuda_is_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        _train(tmp_path / "run", "--record-memory-history")  # --memory-recorder torch by default
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "records CUDA memory" in err and "use --memory-recorder memray on CPU" in err
    assert "Traceback" not in err
    assert not (tmp_path / "run").exists()  # refused at start, before the run directory


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (
            ["--record-memory-history", "--profile-target", "train_actor"],
            "needs --profile-target train_overall",
        ),
        (["--profile-step-start", "2", "--profile-step-end", "2"], "--profile-step-end (2) must be greater"),
    ],
)
def test_bad_profiling_flags_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], flags: list[str], message: str
) -> None:
    with pytest.raises(SystemExit) as e:
        _train(tmp_path / "run", *flags)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert not (tmp_path / "run").exists()  # refused before the run directory is made


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the torch recorder records CUDA memory")
def test_torch_snapshot_after_rollout_n_minus_1_on_cuda(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    flags = ["--device", "cuda", "--record-memory-history", "--memory-snapshot-num-steps", "1"]
    assert _train(run_dir, *flags) == 0
    path = run_dir / "memory" / "memory_snapshot-rank0-rollout0.pickle"
    (event,) = events(run_dir, "memory_snapshot")
    assert event["path"] == str(path) and event["bytes"] == path.stat().st_size > 0
    assert (event["recorder"], event["reason"]) == ("torch", "num_steps")
    assert path.read_bytes()[:1] == b"\x80"  # a pickle's protocol opcode; grpolab never loads it


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the torch recorder records CUDA memory")
def test_torch_snapshot_on_a_real_cuda_oom(tmp_path: Path) -> None:
    from grpolab.core.config.monitoring import ProfilingConfig
    from grpolab.monitor.memory import MemoryRecorder

    written: list[tuple[Path, int, str]] = []
    recorder = MemoryRecorder(
        ProfilingConfig(record_memory_history=True, memory_snapshot_num_steps=5),
        tmp_path,
        rank=0,
        on_snapshot=lambda *a: written.append(a),
    )
    recorder.start(0)
    kept = torch.ones(1 << 20, device="cuda")
    with pytest.raises(torch.cuda.OutOfMemoryError) as e:
        torch.empty(1 << 50, dtype=torch.uint8, device="cuda")  # 1 PiB
    recorder.on_error(e.value, 2)
    path = tmp_path / "oom-rank0-rollout2.pickle"
    assert written == [(path, path.stat().st_size, "oom")]
    assert kept.sum().item() == 1 << 20


def test_memory_snapshot_dir_that_is_a_file_is_exit_2_at_start(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a_file = tmp_path / "a_file"
    a_file.write_text("x")
    flags = ["--record-memory-history", "--memory-recorder", "memray", "--memory-snapshot-dir", str(a_file)]
    with pytest.raises(SystemExit) as e:
        _train(tmp_path / "run", *flags)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert f"--memory-snapshot-dir {a_file}: is a file; expected a directory for memory snapshots" in err
    assert not (tmp_path / "run").exists()  # refused before the model loads and the run directory


def test_memray_not_installed_is_exit_2_at_start(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "memray", None)  # `import memray` raises ImportError, as uninstalled
    with pytest.raises(SystemExit) as e:
        _train(tmp_path / "run", "--record-memory-history", "--memory-recorder", "memray")
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "--memory-recorder memray needs the memray package" in err and "Traceback" not in err
    assert not (tmp_path / "run").exists()

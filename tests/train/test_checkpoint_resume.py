"""Resuming through `grpolab train`: a crashed run continues in its own run directory, another run's
directory is refused, a complete run says so, and a checkpoint of other data is refused.

One module-scoped pair of runs (a start that crashes after rollout 2 of 4, then the same command with
`--load`) is shared; the tests that add starts to it run last, in file order.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from runs import SHORT, events, metrics

from grpolab.cli import main
from grpolab.core.save_dir import SAVE_LOCK_FILE, live_writer
from grpolab.rundir import reader
from grpolab.rundir.writer import RunDirectory
from grpolab.train.loop import GRPORun


class Crash(BaseException):
    """Stands for SIGKILL: nothing of the run's own error handling writes a status."""


TINY = [*SHORT, "--num-rollout", "4"]
"""4 rollouts of 2 prompts × 2 answers, 8 tokens."""


def command(tmp: Path, *extra: str) -> list[str]:
    """The run's own command: TINY with a checkpoint every 2 rollouts."""
    return ["train", *TINY, "--save", str(tmp / "ckpt"), "--save-interval", "2", *extra]


@pytest.fixture(scope="module")
def resumed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """tmp/run: crashed after rollout 2 (checkpoint iter_0000002 from rollout 1), then continued with --load."""
    tmp = tmp_path_factory.mktemp("resume")
    run_dir = tmp / "run"
    step = GRPORun.step

    def crashing_step(self: GRPORun, rollout_id: int) -> None:
        step(self, rollout_id)
        if rollout_id == 2:
            raise Crash

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(GRPORun, "step", crashing_step)
        mp.setattr(RunDirectory, "finish", lambda self, status, **fields: self.detach_console_log())
        with pytest.raises(Crash):
            main([*command(tmp), "--run-dir", str(run_dir)])
    assert reader.final_status_event(run_dir) is None  # a crash: no status event
    stale = tmp / "ckpt" / ".iter_0000003.k2j_x9zq"  # what a save killed midway left (older name)
    stale.mkdir()
    (stale / "model.safetensors").write_bytes(b"w" * 1_500_000)
    gone = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    lock = {"pid": int(gone.stdout), "host": socket.gethostname(), "run_dir": "runs/killed", "started": 1.0}
    (tmp / "ckpt" / SAVE_LOCK_FILE).write_text(json.dumps(lock))  # what a kill -9 of the trainer leaves
    assert main([*command(tmp), "--run-dir", str(run_dir), "--load", str(tmp / "ckpt")]) == 0
    return run_dir


def test_a_crashed_run_continues_in_its_own_run_dir(resumed: Path) -> None:
    names = [e["event"] for e in events(resumed)]
    assert names.count("run_start") == 2 and names[-1] == "status"
    assert reader.run_status(resumed) == "finished"
    starts = [e for e in events(resumed, "run_start")]
    assert [(s["start"], s["continued"]) for s in starts] == [(1, False), (2, True)]
    (resume,) = events(resumed, "resume")
    assert resume["next_rollout_id"] == 2 and resume["path"].endswith("iter_0000002")
    assert (resume["replaces_from_rollout"], resume["replaces_from_step"]) == (2, 2)
    meta = reader.read_run_meta(resumed)
    first, second = meta.raw["starts"]
    assert "--load" not in first["argv"] and "--load" in second["argv"]
    assert meta.argv == first["argv"] and meta.start_time == first["start_time"] < second["start_time"]


def test_the_reader_keeps_the_records_of_the_start_that_ran_each_rollout_last(resumed: Path) -> None:
    got = reader.read_metrics_file(resumed / reader.METRICS_FILE)
    raw = [json.loads(line) for line in (resumed / reader.METRICS_FILE).read_text().splitlines()]
    marker = next(i for i, r in enumerate(raw, 1) if r["kind"] == reader.RESUME_KIND)
    # the first start logged rollout 2 (rollout, step, perf) after its last checkpoint; the second re-ran it
    assert [raw[n - 1]["rollout_id"] for n in got.replaced] == [2, 2, 2] and max(got.replaced) < marker
    for kind in ("rollout", "step", "perf"):
        assert [r.rollout_id for r in got.records if r.kind == kind] == [0, 1, 2, 3]
    again = next(r for r in got.records if r.kind == "rollout" and r.rollout_id == 2)
    before = next(raw[n - 1] for n in got.replaced if raw[n - 1]["kind"] == "rollout")
    assert again.line_no > marker and again.metrics == before["metrics"]  # resume is exact
    assert [r.step for r in reader.read_metrics(resumed, "step")] == [0, 1, 2, 3]
    assert main(["gate", str(resumed)]) == 0  # the gate judges the continued directory


def test_checkpoint_saves_and_stale_temps_are_logged(resumed: Path) -> None:
    log = (resumed / reader.CONSOLE_LOG).read_text()
    ckpt = resumed.parent / "ckpt"
    assert (
        f"saved checkpoint iter_0000002 to {ckpt} (" in log
        and f"saved checkpoint iter_0000004 to {ckpt}" in log
    )
    assert "--load " + str(ckpt) + ": resumed from iter_0000002, continuing at rollout 2" in log
    assert f"checkpoint: removed .iter_0000003.k2j_x9zq (1.5 MB) from {ckpt}, left by a save" in log
    assert not (ckpt / ".iter_0000003.k2j_x9zq").exists()
    assert f"--save {ckpt}: removed the stale lock of pid " in log and "(run directory runs/killed)" in log
    assert not (ckpt / SAVE_LOCK_FILE).exists()  # the run released its own lock where it ended
    (saved,) = [e for e in events(resumed, "checkpoint") if e["path"].endswith("iter_0000004")]
    assert saved["bytes"] > 100_000 and saved["seconds"] > 0


def test_a_run_dir_of_another_run_is_refused(resumed: Path, capsys) -> None:
    tmp, before = resumed.parent, (resumed / reader.EVENTS_FILE).read_text()
    with pytest.raises(SystemExit) as info:  # the --save of a run without its --load: before the run dir
        main([*command(tmp), "--run-dir", str(resumed)])
    assert info.value.code == 2 and "already holds another run's checkpoints" in capsys.readouterr().err
    with pytest.raises(
        SystemExit
    ) as info:  # a new run in it: refused with the other flag errors, before torch
        main(["train", *TINY, "--save", str(tmp / "ckpt2"), "--run-dir", str(resumed)])
    assert info.value.code == 2 and "already holds a run (run.json exists)" in capsys.readouterr().err
    assert main([*command(tmp), "--run-dir", str(resumed), "--load", str(tmp / "ckpt"), "--lr", "0.001"]) == 2
    err = capsys.readouterr().err
    assert f"--run-dir {resumed} holds another run (--lr 0.0002 there, 0.001 here)" in err
    assert (resumed / reader.EVENTS_FILE).read_text() == before  # nothing appended


def test_a_save_dir_another_live_trainer_writes_is_refused(resumed: Path, capsys) -> None:
    """Two trainers on one --save would replace each other's iter_*: the second exits 2 naming the first."""
    tmp = resumed.parent
    holder = subprocess.Popen(  # a trainer's rank 0 holding the lock, as acquire_save_lock leaves it
        [
            sys.executable,
            "-c",
            "import sys, time; from grpolab.core.save_dir import acquire_save_lock as a; "
            "a(sys.argv[1], 'runs/first'); print('held', flush=True); time.sleep(60)",
            str(tmp / "ckpt"),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline() == "held\n"
        with pytest.raises(SystemExit) as info:
            main([*command(tmp), "--run-dir", str(tmp / "second"), "--load", str(tmp / "ckpt")])
        err = capsys.readouterr().err
        assert info.value.code == 2
        assert (
            f"another trainer is writing checkpoints there, pid {holder.pid} on {socket.gethostname()}" in err
        )
        assert "(run directory runs/first)" in err and not (tmp / "second").exists()
    finally:
        holder.kill()
        holder.wait()
    assert live_writer(tmp / "ckpt") is None  # its pid is gone: the lock it left is stale


def test_run_dir_naming_a_file_is_bad_input(tmp_path: Path, capsys) -> None:
    file = tmp_path / "notes.txt"
    file.write_text("x")
    for run_dir, message in (
        (file, f"--run-dir {file} is a file; expected a directory"),
        (file / "run", f"--run-dir {file / 'run'}: {file} is a file"),
    ):
        with pytest.raises(SystemExit) as e:  # argparse's error: the train usage, exit 2
            main(["train", "--run-dir", str(run_dir)])
        assert e.value.code == 2 and message in capsys.readouterr().err


def test_a_checkpoint_of_other_data_is_refused_naming_what_differs(resumed: Path, capsys) -> None:
    tmp, ckpt = resumed.parent, str(resumed.parent / "ckpt")
    assert main(["train", *TINY, "--run-dir", str(tmp / "seed7"), "--load", ckpt, "--seed", "7"]) == 2
    err = capsys.readouterr().err
    assert "was saved with other data (--seed: 1234 in the checkpoint, 7 now)" in err
    assert "--allow-data-change" in err
    batch = ["--rollout-batch-size", "1", "--load", ckpt, "--allow-data-change"]
    assert main(["train", *TINY, "--run-dir", str(tmp / "allowed"), *batch]) == 0
    log = (tmp / "allowed" / reader.CONSOLE_LOG).read_text()
    assert "--rollout-batch-size: 2 in the checkpoint, 1 now" in log and "resuming anyway" in log


def test_resuming_a_complete_run_says_so(resumed: Path) -> None:
    tmp, lines = resumed.parent, (resumed / reader.METRICS_FILE).read_text()
    assert main([*command(tmp), "--run-dir", str(resumed), "--load", str(tmp / "ckpt")]) == 0
    log = (resumed / reader.CONSOLE_LOG).read_text()
    assert "the checkpoint is at rollout 4 of --num-rollout 4; nothing left to train" in log
    assert (resumed / reader.METRICS_FILE).read_text() == lines  # no rollout, no marker
    last = events(resumed)[-3:]
    assert [e["event"] for e in last] == ["resume", "nothing_to_train", "status"]
    assert "replaces_from_rollout" not in last[0] and last[2]["status"] == "finished"
    assert reader.run_status(resumed) == "finished"
    (rank,), _ = reader.read_ranks(resumed)
    assert rank.heartbeat is not None and rank.heartbeat["phase"] == "finished"


def test_a_schedule_resumes_at_the_next_step_and_another_is_refused(tmp_path: Path, capsys) -> None:
    """A cosine schedule with warm-up over 4 rollouts: 2 + 2 with --load train at the straight run's lrs,
    step for step, and the checkpoint stamps the next lr; resuming with another schedule exits 2 naming
    the stamped and the new lr."""
    schedule = ["--lr-decay-style", "cosine", "--lr-warmup-iters", "1", "--min-lr", "1e-5"]
    straight = tmp_path / "straight"
    assert main(["train", *TINY, *schedule, "--run-dir", str(straight)]) == 0
    first = tmp_path / "first"
    assert main([*command(tmp_path, *schedule), "--run-dir", str(first), "--num-rollout", "2"]) == 0
    state = json.loads((tmp_path / "ckpt" / "iter_0000002" / "trainer_state.json").read_text())
    assert state["lr_schedule"]["style"] == "cosine" and state["lr_schedule"]["decay_iters"] == 2
    lrs = [m["train/lr-pg_0"] for m in metrics(straight, "step")]
    assert lrs[0] == 0.0 and lrs[1] == 2e-4 and lrs[3] < lrs[2] < lrs[1]
    # the first run's --num-rollout 2 made its decay end at step 2: resuming it into a 4-rollout schedule is refused
    code = main(
        [
            *command(tmp_path, *schedule),
            "--run-dir",
            str(tmp_path / "second"),
            "--load",
            str(tmp_path / "ckpt"),
        ]
    )
    assert code == 2
    err = capsys.readouterr().err
    assert "decay_iters 2 -> 4" in err and "would train at lr " in err and "this run's schedule gives " in err
    fixed = ["--lr-decay-iters", "4"]  # the straight run's schedule, named: both halves now match it
    again = tmp_path / "again"
    assert (
        main([*command(again, *schedule, *fixed), "--run-dir", str(again / "a"), "--num-rollout", "2"]) == 0
    )
    assert (
        main(
            [*command(again, *schedule, *fixed), "--run-dir", str(again / "b"), "--load", str(again / "ckpt")]
        )
        == 0
    )
    assert [m["train/lr-pg_0"] for m in metrics(again / "a", "step") + metrics(again / "b", "step")] == lrs

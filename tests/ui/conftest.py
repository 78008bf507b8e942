"""UI fixtures: one RUNS_ROOT made once per session with the real trainer, plus edited copies.

Layout of the root (`ui_root`):
    a/          real run, seed 1234, rollouts recorded (4 rollouts × 2 prompts × 4 answers), per-step model
                hashes (--save-model-hash-every-step)
    b/          real run, seed 7 (diverges from a at step 0), rollouts recorded, per-step model hashes
    a-step3/    a copy of a whose metrics.jsonl was edited from step 3 on (rewards and train/*
                values changed), so a and a-step3 are equal until step 3 and differ from step 3
    a-late/     a copy of a whose metrics.jsonl steps and rollout ids were shifted by +100, so it
                shares no step number with the others
    no-runjson/ a copy of a without run.json ("incomplete")
    logs/miles_plain.log, logs/miles_dead_engine.log   the Miles-format fixtures (mtime set an hour back)
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import pytest

from grpolab.cli import build_parser, config_from_args
from grpolab.train.loop import train

LOGS = Path(__file__).resolve().parents[2] / "fixtures" / "logs"
TINY_ARGS = ["--rollout-batch-size", "2", "--n-samples-per-prompt", "4", "--num-rollout", "4"]
TINY_ARGS += ["--rollout-max-response-len", "8", "--no-progress"]


def _train(run_dir: Path, *extra: str) -> Path:
    argv = ["train", *TINY_ARGS, "--run-dir", str(run_dir), *extra]
    return train(config_from_args(build_parser().parse_args(argv)), ["grpolab", *argv])


def _recorded(run_dir: Path) -> list[str]:
    """Flags that record a run's rollouts in RUN_DIR/rollouts and its per-step model hashes."""
    template = str(run_dir / "rollouts" / "rollout_{rollout_id}.grz")
    return ["--save-debug-rollout-data", template, "--save-model-hash-every-step"]


def _edit_metrics(run_dir: Path, edit) -> None:
    path = run_dir / "metrics.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    path.write_text("".join(json.dumps(edit(r)) + "\n" for r in rows))


def _diverge_from_step3(rec: dict) -> dict:
    index = rec["step"] if rec["kind"] == "step" else rec["rollout_id"]
    if index >= 3 and rec["kind"] == "rollout":
        rec["metrics"]["rollout/raw_reward"] += 0.25
    if index >= 3 and rec["kind"] == "step":
        rec["metrics"]["train/loss"] += 1e-3
    return rec


def _shift(rec: dict) -> dict:
    rec["rollout_id"] += 100
    if rec["step"] is not None:
        rec["step"] += 100
    return rec


@pytest.fixture(scope="session")
def ui_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("ui-runs")
    a = _train(root / "a", *_recorded(root / "a"))
    _train(root / "b", "--seed", "7", *_recorded(root / "b"))
    for name, edit in (("a-step3", _diverge_from_step3), ("a-late", _shift)):
        shutil.copytree(a, root / name)
        _edit_metrics(root / name, edit)
    shutil.copytree(a, root / "no-runjson")
    (root / "no-runjson" / "run.json").unlink()
    (root / "logs").mkdir()
    hour_ago = time.time() - 3600
    for log in ("miles_plain.log", "miles_dead_engine.log"):
        shutil.copy(LOGS / log, root / "logs" / log)
        os.utime(root / "logs" / log, (hour_ago, hour_ago))
    return root


HANG_STAMP = "20261130T024635Z"
"""The newest hang report of `hang_run` (an older, not-hung one is kept at 20261129T100000Z)."""
FA3_LINE = (
    "AssertionError: FlashAttention v3 Backend requires SM>=80 and SM<=90. "
    "Please use `--attention-backend flashinfer`."
)
"""The log doctor's fa3_sm signature (fixtures/logs/miles_dead_engine.log line 3)."""

_WHERE = {
    "all_reduce": "all_reduce (torch/distributed/distributed_c10d.py:3252) ← train_step (hang_world.py:132)",
    "barrier": "barrier (torch/distributed/distributed_c10d.py:5356) ← save_checkpoint (hang_world.py:173)",
}


def _row(rank: int, collective: str) -> dict:
    return {
        "rank": rank, "pid": 14579 + rank, "state": "collective", "where": _WHERE[collective],
        "collective": collective, "call_site": _WHERE[collective].split(" ← ")[1],
        "heartbeat_age_s": 3.858 + rank / 1000, "thread": "MainThread", "unchanged": True,
        "native_wait": None, "exit_code": None,
    }  # fmt: skip


def _verdict(hung: bool) -> dict:
    """A verdict.json as `grpolab diagnose hang` wrote it for a 3-rank 'mismatch' hang fixture
    (trimmed: ranks, run and command left out), or for a run that progressed."""
    title = (
        "Mismatched collectives (pattern B): rank 1 waits in barrier, ranks 0, 2 in all_reduce"
        if hung
        else "Not hung: the ranks progressed between the two samples"
    )
    return {
        "verdict": {
            "kind": "mismatched_collectives" if hung else "not_hung",
            "pattern": "B" if hung else None,
            "hung": hung,
            "title": title,
            "evidence": [
                "ranks 0, 2 wait in all_reduce (torch/distributed/distributed_c10d.py:3252)",
                "rank 1 waits in barrier (torch/distributed/distributed_c10d.py:5356) ← save_checkpoint",
            ],
            "rows": [_row(0, "all_reduce"), _row(1, "barrier"), _row(2, "all_reduce")],
            "next_steps": [
                "Make the code path that reaches save_checkpoint (hang_world.py:173) run on every rank or on none.",
                "Set TORCH_DISTRIBUTED_DEBUG=DETAIL: torch.distributed reports collectives that do not match.",
            ],
        },
        "hung": hung,
        "exit_code": int(hung),
        "progress": {
            "progressed": not hung,
            "reason": "every rank's stack is identical in two samples 2 s apart" if hung else "rank 0 moved",
            "note": "the hang is younger than --stall-seconds 120" if hung else None,
        },
        "missing_ranks": {},
        "notes": ["rank 3's rank file does not parse"] if hung else [],
        "elapsed_s": 2.081,
    }


@pytest.fixture
def hang_run(tmp_path: Path) -> Path:
    """tmp_path/hung: a run directory as `grpolab diagnose hang RUN_DIR` leaves it (two reports, each with
    rank<r>.txt and rank<r>.json), plus one other JSON under diagnose/ and a console.log with FA3_LINE
    on line 3."""
    run = tmp_path / "hung"
    (run / "ranks").mkdir(parents=True)
    (run / "run.json").write_text(json.dumps({"name": run.name, "config": {}, "seed": 1}))
    for stamp, hung in ((HANG_STAMP, True), ("20261129T100000Z", False)):
        folder = run / "diagnose" / stamp
        folder.mkdir(parents=True)
        for rank, frame in enumerate(("all_reduce", "barrier", "all_reduce")):
            stack = f'# rank {rank}, pid {14579 + rank}, host vm\nThread (idle): "MainThread"\n    {_WHERE[frame]}\n'
            (folder / f"rank{rank}.txt").write_text(stack)
            (folder / f"rank{rank}.json").write_text(json.dumps({"rank": rank, "samples": []}))
        (folder / "verdict.json").write_text(json.dumps(_verdict(hung)))
    (run / "diagnose" / "extra").mkdir()
    (run / "diagnose" / "extra" / "summary.json").write_text(json.dumps({"tool": "custom", "ok": True}))
    lines = ["[grpolab] run start", "[grpolab] engine: starting", FA3_LINE, "[grpolab] run end"]
    (run / "console.log").write_text("\n".join(lines) + "\n")
    return run

"""Helpers the end-to-end tests share: a small run shape, running `grpolab train`, reading run files."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from grpolab.cli import build_parser, config_from_args
from grpolab.train.loop import train

SMALL = [
    "--rollout-batch-size",
    "4",
    "--n-samples-per-prompt",
    "4",
    "--rollout-max-response-len",
    "24",
    "--no-progress",
]
"""4 prompts × 4 answers, 24 tokens: a few seconds per rollout on the tiny model."""
SHORT = ["--num-rollout", "2", "--rollout-batch-size", "2", "--n-samples-per-prompt", "2"]
SHORT += ["--rollout-max-response-len", "8", "--no-progress"]
"""2 rollouts × 2 prompts × 2 answers, 8 tokens: the `short_run` session fixture (a few seconds)."""


def run(tmp: Path, name: str, *extra: str) -> Path:
    """`grpolab train SMALL --run-dir tmp/name *extra` in this process; returns the run directory."""
    argv = ["train", *SMALL, "--run-dir", str(tmp / name), *extra]
    return train(config_from_args(build_parser().parse_args(argv)), ["grpolab", *argv])


def train_short(run_dir: Path, *extra: str) -> Path:
    """`grpolab train SHORT --run-dir run_dir *extra` in this process; returns the run directory."""
    argv = ["train", *SHORT, "--run-dir", str(run_dir), *extra]
    return train(config_from_args(build_parser().parse_args(argv)), ["grpolab", *argv])


def records(run_dir: Path, kind: str) -> list[dict]:
    """Whole metrics.jsonl records of one kind (rollout | step | perf | eval)."""
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if r["kind"] == kind]


def metrics(run_dir: Path, kind: str) -> list[dict]:
    """The `metrics` dicts of one kind, in order."""
    return [r["metrics"] for r in records(run_dir, kind)]


def events(run_dir: Path, name: str | None = None) -> list[dict]:
    """events.jsonl records, all or those named `name`."""
    rows = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    return [r for r in rows if name is None or r["event"] == name]


_CLI_PROBE = """
import json, sys
from grpolab.cli import main
try:
    code = main(sys.argv[1:])
except SystemExit as e:
    code = e.code
print(json.dumps({"code": code, "heavy": sorted(m for m in ("torch", "transformers") if m in sys.modules)}))
"""


def cli_in_fresh_process(argv: list[str], cwd: Path) -> tuple[int, list[str], subprocess.CompletedProcess]:
    """`grpolab *argv` in a fresh interpreter (working directory `cwd`): (its exit code, which of torch
    and transformers it imported, the finished process)."""
    proc = subprocess.run(
        [sys.executable, "-c", _CLI_PROBE, *argv], capture_output=True, text=True, timeout=120, cwd=cwd
    )
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout.splitlines()[-1])
    return result["code"], result["heavy"], proc


def engines_after_first_metrics(
    proc: subprocess.Popen, run_dir: Path, timeout_s: float = 300
) -> tuple[list[int], list[int]]:
    """Wait until the `grpolab train` process `proc` wrote its first metrics line in `run_dir`, then return
    (its child processes, the `grpolab serve` engines among them) by pid; fails quoting its stderr if it
    exits first or `timeout_s` passes."""
    import time

    from grpolab.diagnose.common.procfs import proc_children

    metrics_file = run_dir / "metrics.jsonl"
    deadline = time.monotonic() + timeout_s
    while not metrics_file.exists() or not metrics_file.read_text():
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[1][-3000:]
        time.sleep(0.2)
    children = proc_children(proc.pid)
    return children, [p for p in children if b"serve" in (Path("/proc") / str(p) / "cmdline").read_bytes()]

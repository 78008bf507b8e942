"""Multi-turn rollouts on a fleet (`--rollout-num-engines 1`, the real sglang-router): the tool loop
gives the in-process run's rollouts, and a custom generate function posts to the router."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from grpolab.cli import main

REPO = Path(__file__).resolve().parents[2]
BASE = [
    "--hf-checkpoint", str(REPO / "fixtures" / "tiny-qwen3-tools"), "--apply-chat-template",
    "--rollout-batch-size", "4", "--n-samples-per-prompt", "4", "--rollout-max-response-len", "96",
    "--num-rollout", "2", "--no-progress",
]  # fmt: skip
LOOP = ["--generate-execute-tool-function-path", "grpolab.examples.calculator.tools.execute_tool"]
NAIVE = ["--custom-generate-function-path", "grpolab.examples.calculator.naive_generate.generate"]


def _train(run_dir: Path, *flags: str) -> list[dict]:
    argv = [sys.executable, "-m", "grpolab", "train", "--run-dir", str(run_dir), *BASE, *flags,
            "--save-debug-rollout-data", str(run_dir / "{rollout_id}.grz")]  # fmt: skip
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r["metrics"] for r in rows if r["kind"] == "rollout"]


@pytest.mark.slow
def test_tool_loop_and_custom_generate_on_the_fleet(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    local = _train(tmp_path / "local", *LOOP)
    fleet = _train(tmp_path / "fleet", *LOOP, "--rollout-num-engines", "1")
    keys = ["rollout/raw_reward", "rollout/num_turns", "rollout/tool_calls", "rollout/trainable_tokens"]
    assert [[m[k] for k in keys] for m in fleet] == [[m[k] for k in keys] for m in local]
    assert main(["check", "turns", str(tmp_path / "fleet" / "0.grz")]) == 0
    naive = _train(tmp_path / "naive", *NAIVE, "--rollout-num-engines", "1")
    assert naive[0]["rollout/num_turns"] > 1 and "rollout/tool_calls" not in naive[0]
    capsys.readouterr()
    assert main(["check", "turns", str(tmp_path / "naive" / "0.grz"), "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert {e["cause"] for e in report["errors"]} == {"template boundary token"}


AGENT = ["--custom-agent-function-path", "grpolab.examples.calculator.agent.run"]


@pytest.mark.slow
def test_agent_sessions_on_two_launched_engines_give_the_in_process_rollouts(tmp_path: Path) -> None:
    """An agent workflow on a fleet: sample i's session lives on engine i mod 2 (directly, not balanced by
    the router across engines mid-trajectory); the rollouts are the in-process run's, turn for turn."""
    local = _train(tmp_path / "local", *AGENT)
    fleet = _train(tmp_path / "fleet", *AGENT, "--rollout-num-engines", "2")
    keys = ["rollout/raw_reward", "rollout/num_turns", "rollout/tool_calls", "rollout/trainable_tokens"]
    assert [[m[k] for k in keys] for m in fleet] == [[m[k] for k in keys] for m in local]
    assert local[0]["rollout/num_turns"] > 1
    assert main(["check", "turns", str(tmp_path / "fleet" / "1.grz")]) == 0
    refused = subprocess.run(
        [sys.executable, "-m", "grpolab", "train", *BASE, *AGENT, "--sglang-router-ip", "127.0.0.1", "--sglang-router-port", "9",
         "--run-dir", str(tmp_path / "external")],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert (
        refused.returncode == 2
        and "--custom-agent-function-path runs on the in-process engine or a fleet" in (refused.stderr)
    )

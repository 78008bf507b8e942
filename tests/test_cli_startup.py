"""Start-up: help, flag errors and the commands that do not train never import torch or transformers.

Importing them costs 1-7 s on the 2-core CI machine (issue 12's goal: these answer in <= 1.5 s wall;
benchmarks/bench_cli_startup.py measures the time, this test only what is imported). Each case runs in
its own interpreter, since `sys.modules` of the test process already holds torch.
"""

from __future__ import annotations

from importlib.metadata import version
from pathlib import Path

import pytest
from runs import cli_in_fresh_process

REPO = Path(__file__).resolve().parent.parent
FIXTURE_LOG = REPO / "tests" / "diagnose" / "fixtures" / "killed_engine_run" / "console.log"
TINY = str(REPO / "fixtures" / "tiny-qwen3")


CASES: list[tuple[list[str], int]] = [
    (["--help"], 0),
    (["gate", "--help"], 0),
    (["diagnose", "log", "--help"], 0),
    (["hash", "diff", "--help"], 0),
    (["replay", "inspect", "--help"], 0),
    (["diff", "--help"], 0),
    (["bisect", "--help"], 0),
    (["serve", "--help"], 0),
    (["train", "--num-rollout", "x"], 2),  # argparse type error
    (["train", "--rollout-dtype", "float16"], 2),  # the config's checks
    (["train", "--kl-loss-type", "k3", "--advantage-estimator", "grpo", "--num-rollout", "0"], 2),
    (["train", "--kl-loss-type", "foo"], 2),  # an unknown name's error lists the built-in ones
    (["train", "--advantage-estimator", "ppo"], 2),
    (["train", "--hf-checkpoint", "/nonexistent/model"], 2),  # preflight: files, reward, engine kind
    (["train", "--rm-type", "no_such_reward"], 2),
    (["serve", "--hf-checkpoint", TINY, "--dtype", "float16"], 2),  # checked before loading
    (["serve", "--hf-checkpoint", TINY, "--device", "gpu"], 2),
    (["serve", "--hf-checkpoint", "/nonexistent/model"], 2),
    (["gate", str(FIXTURE_LOG)], 0),  # real work: the step-0 checks of a console log
    (["diagnose", "log", str(FIXTURE_LOG)], 1),  # real work: the log doctor finds the dead engine
]


@pytest.mark.parametrize(("argv", "code"), CASES, ids=[" ".join(a[:3]) for a, _ in CASES])
def test_the_command_imports_no_torch_or_transformers(argv: list[str], code: int, tmp_path: Path) -> None:
    got, heavy, proc = cli_in_fresh_process(argv, tmp_path)
    assert got == code, proc.stderr
    assert heavy == [], f"grpolab {' '.join(argv)} imported {heavy}"


def test_a_taken_run_dir_is_refused_before_torch_loads(tmp_path: Path) -> None:
    """It was refused when the run directory was created, after a 6-8 s import of torch and transformers."""
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "run.json").write_text("{}")
    got, heavy, proc = cli_in_fresh_process(["train", "--run-dir", "taken"], tmp_path)
    assert got == 2 and heavy == [], (heavy, proc.stderr)
    assert "--run-dir: taken already holds a run (run.json exists)" in proc.stderr


@pytest.mark.skipif(not version("torch").endswith("+cpu"), reason="a CUDA torch build")
@pytest.mark.parametrize("command", ["train", "serve"])
def test_a_cuda_device_on_a_cpu_torch_build_is_refused_without_importing_it(
    command: str, tmp_path: Path
) -> None:
    """It imported torch to ask (2-7 s); a CPU wheel says so in its version ("2.13.0+cpu")."""
    argv = [command, "--device", "cuda:0"] + (["--hf-checkpoint", TINY] if command == "serve" else [])
    got, heavy, proc = cli_in_fresh_process(argv, tmp_path)
    assert got == 2 and heavy == [], (heavy, proc.stderr)
    assert "--device cuda:0: this torch build or machine has no CUDA device" in proc.stderr

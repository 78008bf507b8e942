"""benchmarks/gpu_check.sh, tested where no GPU is (issue 27): it parses, skips cleanly without CUDA before
installing anything, and every flag it passes exists (grpolab's, its benchmarks', pip's, git's)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "benchmarks" / "gpu_check.sh"
OTHER_TOOLS = {"--no-deps", "--short"}  # pip install --no-deps, git rev-parse --short


def test_the_script_parses() -> None:
    assert subprocess.run(["bash", "-n", str(SCRIPT)], capture_output=True).returncode == 0


def test_without_a_gpu_every_step_is_skipped_before_any_install(tmp_path: Path) -> None:
    env = {**os.environ, "PATH": "/usr/bin:/bin"}  # no nvidia-smi on this machine's PATH either way
    out = tmp_path / "out"
    done = subprocess.run(["bash", str(SCRIPT), str(out)], cwd=REPO, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    summary = (out / "summary.txt").read_text()
    assert "every step skipped" in summary and "install" not in summary


def _help(*argv: str) -> str:
    return subprocess.run([sys.executable, *argv, "--help"], cwd=REPO, capture_output=True, text=True).stdout


def test_every_flag_it_passes_exists() -> None:
    flags = set(re.findall(r"(?<![\w-])--[a-z][a-z0-9-]+", SCRIPT.read_text()))
    known = OTHER_TOOLS | set(re.findall(r"--[a-z][a-z0-9-]+", _help("-m", "grpolab", "train")))
    for tool in ("bench_engine_decode.py", "bench_step_vs_trl.py"):
        known |= set(re.findall(r"--[a-z][a-z0-9-]+", _help(str(REPO / "benchmarks" / tool))))
    known |= set(re.findall(r"--[a-z][a-z0-9-]+", _help("-m", "grpolab", "diff")))
    assert flags - known == set()

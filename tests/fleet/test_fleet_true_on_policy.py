"""`--true-on-policy-mode` on a fleet: launched `grpolab serve` engines re-score by prefill, so the gap
is exactly 0.0 through the real router; an engine started without the mode is refused by name."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from grpolab.core.engine.factory import _check_true_on_policy

REPO = Path(__file__).resolve().parents[2]
TINY = str(REPO / "fixtures" / "tiny-qwen3")
GAP = "train/train_rollout_logprob_abs_diff"


def _serve(*flags: str) -> tuple[subprocess.Popen, str]:
    argv = [sys.executable, "-m", "grpolab", "serve", "--hf-checkpoint", TINY, "--port", "0", *flags]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert proc.stdout is not None
    for line in proc.stdout:
        if "listening on " in line:
            return proc, line.split("listening on ", 1)[1].strip()
    raise AssertionError("grpolab serve did not start")


@pytest.mark.slow
def test_fleet_gap_is_exactly_zero(tmp_path: Path) -> None:
    run = tmp_path / "fleet"
    argv = [sys.executable, "-m", "grpolab", "train", "--run-dir", str(run), "--rollout-num-engines", "1",
            "--true-on-policy-mode", "--ci-test", "--num-rollout", "2", "--rollout-batch-size", "4",
            "--n-samples-per-prompt", "4", "--rollout-max-response-len", "24", "--no-progress"]  # fmt: skip
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["metrics"][GAP] for r in rows if r["kind"] == "step"] == [0.0, 0.0]


@pytest.mark.slow
def test_an_engine_without_the_mode_is_refused() -> None:
    for flags, refused in (((), True), (("--true-on-policy-mode",), False)):
        proc, url = _serve(*flags)
        try:
            if refused:
                with pytest.raises(ValueError, match=f"engine {url} does not report true_on_policy_mode"):
                    _check_true_on_policy(url)
            else:
                _check_true_on_policy(url)
        finally:
            proc.terminate()
            proc.wait(timeout=30)

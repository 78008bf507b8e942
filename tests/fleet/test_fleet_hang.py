"""A hung engine (SIGSTOPped: the kernel still accepts its connections, nothing answers) ends the run within
--engine-failure-timeout, like a dead one, through the real sglang-router."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from runs import engines_after_first_metrics

from grpolab.rundir.reader import read_events

SMALL = ["--rollout-batch-size", "4", "--n-samples-per-prompt", "4", "--no-progress"]
TIMEOUT_S = 5


@pytest.mark.slow
def test_a_sigstopped_engine_fails_the_run_within_the_failure_timeout(tmp_path: Path) -> None:
    """Before: 62.7 s at --engine-failure-timeout 10 (fixed 20 s / 120 s call timeouts, a /generate waiting
    the 600 s request timeout, and the failure timed from when the hung call returned); and a failed held
    rollout's /continue_generation to the hung engine added the failure timeout again."""
    run = tmp_path / "hung"
    argv = [sys.executable, "-m", "grpolab", "train", "--run-dir", str(run), *SMALL, "--num-rollout", "30"]
    argv += ["--rollout-num-engines", "1", "--engine-failure-timeout", str(TIMEOUT_S)]
    argv += ["--debug-rollout-only"]  # rollouts back to back: the stop lands in one (no training between)
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    engine = None
    try:
        fleet, engines = engines_after_first_metrics(proc, run)
        assert len(engines) == 1, fleet
        engine = engines[0]
        os.kill(engine, signal.SIGSTOP)
        stopped, stopped_wall = time.monotonic(), time.time()
        _, err = proc.communicate(timeout=120)
        seconds = time.monotonic() - stopped
    finally:
        if engine is not None:
            for sig in (signal.SIGCONT, signal.SIGKILL):
                try:
                    os.kill(engine, sig)
                except ProcessLookupError:
                    pass
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 1, err[-3000:]
    status = [e for e in read_events(run) if e.get("event") == "status" or e.get("type") == "status"]
    assert status and status[-1].get("status") == "failed", status
    # the run gives up after the hung call's timeout (or the /health watch), the failure timeout, plus at
    # most 1 s of best-effort /continue_generation and a watch interval (measured: 6.0 s)
    assert status[-1]["time"] - stopped_wall < TIMEOUT_S + 5, (status[-1]["time"] - stopped_wall, err[-3000:])
    # then the trainer's stop and the fleet's teardown (~3-6 s on 2 busy cores)
    assert seconds < TIMEOUT_S + 15, (seconds, err[-3000:])
    url = (run / "engines" / "0.log").read_text().split("listening on ", 1)[1].split()[0]
    assert url in err and "rollout engine 'sglang fleet (1 engine behind" in err, err[-3000:]

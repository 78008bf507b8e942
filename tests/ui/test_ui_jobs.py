"""ui/jobs.py: a grpolab command started in the background, polled, its stderr kept."""

from __future__ import annotations

import time
from pathlib import Path

from grpolab.ui import jobs


def test_job_states_and_stderr_tail(tmp_path: Path) -> None:
    key = ("test", str(tmp_path))
    args = ["replay", "logprobs", str(tmp_path), "--rollout", "0"]
    job = jobs.start(key, args)
    assert job.state == "running" and job.returncode is None  # python takes over a second to start
    assert jobs.start(key, args) is job and jobs.get(key) is job  # no duplicate while it runs
    assert job.command == f"grpolab replay logprobs {tmp_path} --rollout 0"
    deadline = time.time() + 60
    while job.state == "running" and time.time() < deadline:
        time.sleep(0.1)
    assert job.state == "failed" and job.returncode == 2
    assert job.stderr_tail() == (
        f"grpolab replay logprobs: error: {tmp_path / 'run.json'}: no such file "
        "(not a run directory, or the run died before writing it)"
    )
    again = jobs.start(key, args)  # an ended job is replaced
    assert again is not job and not job.stderr_path.exists()
    again.process.wait(60)

"""Commands the UI starts in the background: `sys.executable -m grpolab ...` as a subprocess, polled.

The UI only reads run directories; work that writes into one (`grpolab replay logprobs`) runs as the
command a user would type, in a subprocess. Jobs live in one registry per UI process (every browser
session sees the same ones), keyed by what they compute, so a page reload finds a running job again
and a second click does not start a duplicate. stderr goes to a temporary file (a pipe could fill
and block the child); stdout is discarded (the command's result is the file it writes), or, for a
command whose progress lines go to stdout (`grpolab bisect`), written to the same file.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Hashable
from dataclasses import dataclass
from pathlib import Path

TAIL_LINES = 12
"""Lines of stderr a failed job shows (enough for an error line and a short traceback)."""


@dataclass
class Job:
    """One background command.

    Attributes:
        args: the grpolab arguments (after `grpolab`); process: the running child.
        stderr_path: where its stderr goes (and its stdout, when started with `with_stdout`);
        started: unix seconds.
    """

    args: list[str]
    process: subprocess.Popen[bytes]
    stderr_path: Path
    started: float

    @property
    def returncode(self) -> int | None:
        """The exit code, None while it runs (polls the process, reaping it once it ended)."""
        return self.process.poll()

    @property
    def state(self) -> str:
        """running | finished (exit 0) | failed (any other exit code)."""
        rc = self.returncode
        return "running" if rc is None else "finished" if rc == 0 else "failed"

    @property
    def command(self) -> str:
        """The command line as a user would type it."""
        return " ".join(["grpolab", *self.args])

    def stderr_tail(self, lines: int = TAIL_LINES) -> str:
        """The last `lines` lines of its stderr so far ("" when none or unreadable)."""
        try:
            text = self.stderr_path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return ""
        return "\n".join(text.rstrip("\n").splitlines()[-lines:])


_JOBS: dict[Hashable, Job] = {}
_LOCK = threading.Lock()


def get(key: Hashable) -> Job | None:
    """The job started under `key`, running or ended, or None."""
    with _LOCK:
        return _JOBS.get(key)


def start(key: Hashable, args: list[str], *, with_stdout: bool = False) -> Job:
    """Start `python -m grpolab *args` under `key`; a job still running under `key` is returned instead.

    `with_stdout` sends the child's stdout to the stderr file too (interleaved as written), for
    commands whose progress is on stdout (unbuffered, PYTHONUNBUFFERED=1, so each line shows as it is
    printed); otherwise stdout is discarded.

    Raises:
        OSError: the interpreter cannot be started or the temporary file cannot be made.
    """
    with _LOCK:
        job = _JOBS.get(key)
        if job is not None and job.returncode is None:
            return job
        if job is not None:
            job.stderr_path.unlink(missing_ok=True)
        fd, name = tempfile.mkstemp(prefix="grpolab-ui-", suffix=".stderr")
        with open(fd, "wb") as stderr:
            process = subprocess.Popen(
                [sys.executable, "-m", "grpolab", *args],
                stdin=subprocess.DEVNULL,
                stdout=stderr if with_stdout else subprocess.DEVNULL,
                stderr=stderr,
                env={**os.environ, "PYTHONUNBUFFERED": "1"} if with_stdout else None,
            )
        job = _JOBS[key] = Job(list(args), process, Path(name), time.time())
        return job

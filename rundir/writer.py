"""Write a run directory: the contract between the trainer, checkers, diagnose and the UI.

Layout (DESIGN.md): `run.json` (written first), `metrics.jsonl`, `events.jsonl` (a final `status`
event last), `ranks/<rank>.json` (pid, host, heartbeat), `console.log`, `checks/`, `rollouts/`.
Files are append-only with one writer per rank; whole-file writes are atomic. Everything else
reads these files through `rundir.reader` (whose file-name constants this module writes).
"""

from __future__ import annotations

import json
import logging
import os
import platform
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch

import grpolab
from grpolab.core.atomic import atomic_write_json
from grpolab.rundir.reader import CONSOLE_LOG, EVENTS_FILE, METRICS_FILE, RANKS_DIR, RUN_JSON

LOGGER_NAME = "grpolab"
CONSOLE_LOG_ONLY = {"console_log_only": True}
"""`extra=` of a `grpolab` log record that goes to console.log but not to stdout: a line the terminal
already gets on stderr (the CLI's final error, a fault-injection notice), kept in console.log so that
`grpolab diagnose log RUN/console.log` sees it."""


def environment_fingerprint() -> dict[str, Any]:
    """Versions, devices and determinism switches that decide whether two runs can match bitwise."""
    import transformers

    commit = None
    try:
        commit = (
            subprocess.run(
                ["git", "rev-parse", "HEAD"],
                cwd=Path(grpolab.__file__).parent,
                capture_output=True,
                text=True,
                timeout=5,
            ).stdout.strip()
            or None
        )
    except (OSError, subprocess.SubprocessError):
        pass
    devices = ["cpu: " + (platform.processor() or platform.machine())]
    if torch.cuda.is_available():
        devices += [f"cuda:{i}: {torch.cuda.get_device_name(i)}" for i in range(torch.cuda.device_count())]
    return {
        "grpolab_version": grpolab.__version__,
        "git_commit": commit,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "hostname": socket.gethostname(),
        "devices": devices,
        "deterministic": {
            "use_deterministic_algorithms": torch.are_deterministic_algorithms_enabled(),
            "torch_num_threads": torch.get_num_threads(),
            "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS"),
            "CUBLAS_WORKSPACE_CONFIG": os.environ.get("CUBLAS_WORKSPACE_CONFIG"),
        },
    }


def describe_exception(exc: BaseException, *, tail_frames: int = 3) -> str:
    """`Type: message` plus the innermost `tail_frames` traceback lines, for a rank file's "error"."""
    import traceback

    frames = traceback.format_tb(exc.__traceback__)[-tail_frames:] if exc.__traceback__ else []
    return f"{type(exc).__name__}: {exc}" + ("\n" + "".join(frames).rstrip() if frames else "")


class RunDirectory:
    """Writer for one rank's files in a run directory.

    Raises:
        FileExistsError: on `create` when the directory already holds a run (never overwrite a run).
    """

    def __init__(
        self, path: str | Path, *, rank: int = 0, mirror_events_to: str | Path | None = None
    ) -> None:
        self.path = Path(path)
        self.rank = rank
        self.mirror_events_to = None if mirror_events_to is None else Path(mirror_events_to)
        self._log_handler: logging.Handler | None = None

    @classmethod
    def create(
        cls,
        path: str | Path,
        *,
        config: dict,
        argv: list[str],
        seed: int,
        rank: int = 0,
        mirror_events_to: str | Path | None = None,
        extra: dict[str, Any] | None = None,
    ) -> RunDirectory:
        """Make the directory and write `run.json` (first file of every run).

        `mirror_events_to` (`--save-debug-event-data DIR`) receives a copy of every event line.
        """
        run = cls(path, rank=rank, mirror_events_to=mirror_events_to)
        if (run.path / RUN_JSON).exists():
            raise FileExistsError(
                f"--run-dir: {run.path} already holds a run (run.json exists); choose another --run-dir"
            )
        run.path.mkdir(parents=True, exist_ok=True)
        (run.path / RANKS_DIR).mkdir(exist_ok=True)
        atomic_write_json(
            run.path / RUN_JSON,
            {
                "name": run.path.name,
                "config": config,
                "argv": argv,
                "seed": seed,
                "start_time": time.time(),
                "environment": environment_fingerprint(),
                **(extra or {}),
            },
        )
        run.attach_console_log()
        run.event("run_start", pid=os.getpid())
        return run

    # ------------------------------------------------------------------ files
    def _append(self, name: str, record: dict, directory: Path | None = None) -> None:
        directory = self.path if directory is None else directory
        with open(directory / name, "a", encoding="utf-8") as f:
            f.write(json.dumps(record, default=float) + "\n")

    def log_metrics(
        self, kind: str, rollout_id: int, metrics: dict[str, float], *, step: int | None = None
    ) -> None:
        """Append one record to `metrics.jsonl` (kind: rollout | step | perf | eval); rank 0 only."""
        if self.rank != 0:
            return
        self._append(
            METRICS_FILE,
            {"kind": kind, "rollout_id": rollout_id, "step": step, "time": time.time(), "metrics": metrics},
        )

    def event(self, name: str, **fields: Any) -> None:
        """Append a lifecycle event (phase start/end, weight update, checkpoint, status) to `events.jsonl`."""
        if self.rank != 0:
            return  # one writer: other ranks report through their heartbeat file
        record = {"event": name, "time": time.time(), "rank": self.rank, **fields}
        self._append(EVENTS_FILE, record)
        if self.mirror_events_to is not None:
            self.mirror_events_to.mkdir(parents=True, exist_ok=True)
            self._append(EVENTS_FILE, record, self.mirror_events_to)

    def heartbeat(
        self, phase: str, rollout_id: int | None, step: int | None = None, *, error: str | None = None
    ) -> None:
        """Rewrite `ranks/<rank>.json` with pid, host, role and the current phase.

        `error` (exception type, message and a short traceback tail) is stored as "error" so
        `grpolab diagnose hang` can show which rank failed and why.
        """
        record: dict[str, Any] = {
            "rank": self.rank,
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "role": "actor+rollout",
            "heartbeat": {"phase": phase, "rollout_id": rollout_id, "step": step, "time": time.time()},
        }
        if error is not None:
            record["error"] = error
        atomic_write_json(self.path / RANKS_DIR / f"{self.rank}.json", record)

    def finish(self, status: str, **fields: Any) -> None:
        """Write the final `status` event (finished | failed | interrupted) and close console.log."""
        self.event("status", status=status, **fields)
        self.detach_console_log()

    # ------------------------------------------------------------------ console
    def attach_console_log(self) -> None:
        """Tee the `grpolab` logger into `console.log`."""
        handler = logging.FileHandler(self.path / CONSOLE_LOG, encoding="utf-8")
        handler.setFormatter(logging.Formatter("%(message)s"))
        logging.getLogger(LOGGER_NAME).addHandler(handler)
        self._log_handler = handler

    def detach_console_log(self) -> None:
        if self._log_handler is not None:
            logging.getLogger(LOGGER_NAME).removeHandler(self._log_handler)
            self._log_handler.close()
            self._log_handler = None


def setup_console_logging(*, quiet: bool = False) -> logging.Logger:
    """Configure the `grpolab` logger to print bare messages to stdout (idempotent).

    `quiet` (ranks other than 0) keeps warnings only, so a multi-rank run prints each line once.
    Records logged with `extra=CONSOLE_LOG_ONLY` skip stdout (they reach console.log only).
    """
    logger = logging.getLogger(LOGGER_NAME)
    logger.setLevel(logging.WARNING if quiet else logging.INFO)
    logger.propagate = False
    if not any(getattr(h, "_grpolab_stdout", False) for h in logger.handlers):
        handler = logging.StreamHandler(sys.stdout)
        handler.setFormatter(logging.Formatter("%(message)s"))
        handler.addFilter(lambda record: not getattr(record, "console_log_only", False))
        handler._grpolab_stdout = True  # type: ignore[attr-defined]
        logger.addHandler(handler)
    return logger

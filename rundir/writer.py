"""Write a run directory: the contract between the trainer, checkers, diagnose and the UI.

Layout (DESIGN.md): `run.json` (written first), `metrics.jsonl`, `events.jsonl` (a final `status`
event last), `ranks/<rank>.json` (pid, host, heartbeat), `console.log`, `checks/`, `rollouts/`.
Files are append-only with one writer per rank; whole-file writes are atomic. Everything else
reads these files through `rundir.reader` (whose file-name constants this module writes).

A `--load` start of the same run (same config apart from `CONTINUE_MAY_CHANGE`) continues an
existing run directory (`rundir/continuation.py`): run.json gains an entry in "starts", the other
files are appended to, and the `resume` event and a metrics.jsonl marker (kind `resume`) say from
which rollout the records of the earlier start are replaced.
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
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

import grpolab
from grpolab.core.atomic import atomic_write_json
from grpolab.rundir.continuation import (
    continue_run,
    failed_before_first_rollout,
    new_run_refusal,
    restart_failed_run,
)
from grpolab.rundir.reader import (
    CONSOLE_LOG,
    EVENTS_FILE,
    METRICS_FILE,
    RANKS_DIR,
    RESUME_KIND,
    RUN_JSON,
)

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
            **{name: os.environ.get(name) for name in NUMERICS_ENV},
        },
        "numerics": numerics_switches(),
    }


NUMERICS_ENV = (
    "OMP_NUM_THREADS", "CUBLAS_WORKSPACE_CONFIG", "MKL_NUM_THREADS", "MKL_CBWR", "ATEN_CPU_CAPABILITY",
    "NCCL_ALGO", "NCCL_PROTO", "TORCH_COMPILE_DETERMINISTIC", "CUDA_LAUNCH_BLOCKING", "NVIDIA_TF32_OVERRIDE",
)  # fmt: skip
"""Environment variables that change a run's numbers: thread counts (a CPU reduction's order follows
them), the vector ISA torch dispatches to, MKL's reproducibility mode, NCCL's algorithm, cuBLAS's
workspace and TF32 override (the AReaL debugging guide's determinism list, Miles-101 section 8)."""


def numerics_switches() -> dict[str, Any]:
    """The torch settings that change a run's numbers: the CPU kernels' vector ISA, oneDNN, inter-op
    threads, float32 matmul precision and the CUDA TF32/cuDNN switches (False/None on CPU machines)."""
    cuda = torch.backends.cuda.matmul
    cudnn = torch.backends.cudnn
    return {
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "mkldnn_enabled": bool(torch.backends.mkldnn.enabled),
        "torch_num_interop_threads": torch.get_num_interop_threads(),
        "float32_matmul_precision": torch.get_float32_matmul_precision(),
        "cuda_matmul_allow_tf32": bool(cuda.allow_tf32),
        "cudnn_allow_tf32": bool(cudnn.allow_tf32),
        "cudnn_deterministic": bool(cudnn.deterministic),
        "cudnn_benchmark": bool(cudnn.benchmark),
    }


def describe_exception(exc: BaseException, *, tail_frames: int = 3) -> str:
    """`Type: message` plus the innermost `tail_frames` traceback lines, for a rank file's "error"."""
    import traceback

    frames = traceback.format_tb(exc.__traceback__)[-tail_frames:] if exc.__traceback__ else []
    return f"{type(exc).__name__}: {exc}" + ("\n" + "".join(frames).rstrip() if frames else "")


class RunDirectory:
    """Writer for one rank's files in a run directory.

    Attributes:
        continued: `create` continued a run directory that held an earlier start of the same run.

    Raises:
        FileExistsError: on `create` when the directory already holds a run that this start may not
            continue (never overwrite a run).
    """

    def __init__(
        self, path: str | Path, *, rank: int = 0, mirror_events_to: str | Path | None = None
    ) -> None:
        self.path = Path(path)
        self.rank = rank
        self.mirror_events_to = None if mirror_events_to is None else Path(mirror_events_to)
        self._log_handler: logging.Handler | None = None
        self._at_finish: list[Callable[[str], None]] = []
        self.continued = False

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
        continuing: bool = False,
    ) -> RunDirectory:
        """Make the directory and write `run.json` (first file of every run).

        `mirror_events_to` (`--save-debug-event-data DIR`) receives a copy of every event line.
        `continuing` (a `--load` start) continues a directory that holds the same run instead of
        refusing it (`continuation.continue_run`). run.json's top-level argv, cwd (the folder its
        relative paths are relative to; `core.config.paths`), start_time and environment are the
        first start's; "starts" lists every start (argv, start_time, pid, `extra`).
        A directory whose every start failed before its first rollout is reused by any start
        (`continuation.restart_failed_run`: run.json's top level becomes this start's; the
        `run_start` event says how many failed starts came before, `failed_starts_before`).

        Raises:
            FileExistsError: the directory holds a run and this start may not continue it (the
                message says why: not `continuing`, another config, still running).
        """
        run = cls(path, rank=rank, mirror_events_to=mirror_events_to)
        start = {"argv": argv, "start_time": time.time(), "pid": os.getpid(), **(extra or {})}
        body = {"name": run.path.name, "config": config, "argv": argv, "seed": seed, "cwd": os.getcwd()}
        body.update(start_time=start["start_time"], environment=environment_fingerprint(), **(extra or {}))
        failed_starts = 0
        if (run.path / RUN_JSON).exists():
            if failed_before_first_rollout(run.path):
                starts = restart_failed_run(run.path, body, start)
                failed_starts = len(starts) - 1
            elif not continuing:
                raise FileExistsError(new_run_refusal(run.path))
            else:
                starts = continue_run(run.path, config, start)
                run.continued = True
        else:
            starts = [start]
            run.path.mkdir(parents=True, exist_ok=True)
            (run.path / RANKS_DIR).mkdir(exist_ok=True)
            atomic_write_json(run.path / RUN_JSON, {**body, "starts": starts})
        run.attach_console_log()
        if failed_starts:
            logging.getLogger(LOGGER_NAME).info(
                f"--run-dir {run.path}: reusing it, its earlier start(s) failed before the first rollout "
                f"({failed_starts}; their events stay in {EVENTS_FILE})"
            )
        fields = {"failed_starts_before": failed_starts} if failed_starts else {}
        run.event("run_start", pid=os.getpid(), start=len(starts), continued=run.continued, **fields)
        return run

    # ------------------------------------------------------------------ files
    def _append(self, name: str, record: dict, directory: Path | None = None) -> None:
        directory = self.path if directory is None else directory
        with open(directory / name, "a", encoding="utf-8") as f:
            f.write(json.dumps(record, default=float) + "\n")

    def log_metrics(
        self, kind: str, rollout_id: int, metrics: dict[str, float], *, step: int | None = None
    ) -> None:
        """Append one record to `metrics.jsonl` (kind: rollout | step | perf | eval, or the `resume`
        marker of `resumed`); rank 0 only."""
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

    def resumed(self, *, next_rollout_id: int, first_step: int | None, **fields: Any) -> None:
        """The `resume` event of a `--load` start (`fields`: found, path or load).

        In a continued run directory, when this start runs rollouts (`first_step` is not None), the
        event also says from which rollout and step it re-runs what an earlier start logged
        (replaces_from_rollout, replaces_from_step), and a metrics.jsonl line of kind `resume`
        marks the place: the reader drops the records above it with rollout_id >= next_rollout_id.
        """
        replaces = self.continued and first_step is not None
        if replaces:
            fields.update(replaces_from_rollout=next_rollout_id, replaces_from_step=first_step)
        self.event("resume", next_rollout_id=next_rollout_id, **fields)
        if replaces:
            self.log_metrics(RESUME_KIND, next_rollout_id, {}, step=first_step)

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

    def add_to_run_json(self, **fields: Any) -> None:
        """Store `fields` (JSON values) in run.json, at the top level and in this start's entry of
        "starts" (e.g. "wandb": the wandb run of this start; a later start's replaces it at the top
        level); rank 0 only. Atomic rewrite."""
        if self.rank != 0:
            return
        body = json.loads((self.path / RUN_JSON).read_text(encoding="utf-8"))
        body.update(fields)
        if body.get("starts"):
            body["starts"][-1].update(fields)
        atomic_write_json(self.path / RUN_JSON, body)

    def at_finish(self, callback: Callable[[str], None]) -> None:
        """Call `callback(status)` in `finish`, after the status event, before console.log closes
        (the monitoring sinks end there, however the run ends)."""
        self._at_finish.append(callback)

    def finish(self, status: str, **fields: Any) -> None:
        """Write the final `status` event (finished | failed | interrupted), run the `at_finish`
        callbacks, and close console.log."""
        self.event("status", status=status, **fields)
        callbacks, self._at_finish = self._at_finish, []
        for callback in callbacks:
            callback(status)
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

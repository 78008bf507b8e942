"""How a run ends: the console line, the status event, and the engine servers it launched.

Every run ends with exactly one `status` event (finished / failed / interrupted; rundir/status.py reads
it). A failed or interrupted run also writes the line `grpolab train: error: <Type>: <message>` into
console.log, so `grpolab diagnose log RUN/console.log` sees why it ended, and a failed one an `error`
heartbeat. Engines that launched processes (`Closeable`: the HTTP engine's servers and router) are
closed however the run ends, so no process outlives it.
"""

from __future__ import annotations

import logging

from grpolab.core.engine.base import Closeable, capability
from grpolab.rundir.writer import CONSOLE_LOG_ONLY, RunDirectory, describe_exception

log = logging.getLogger("grpolab")


def close_engine(engine: object | None) -> None:
    """End what the engine launched (`Closeable`: the HTTP engine's servers and router); no-op otherwise."""
    closeable = capability(engine, Closeable)
    if closeable is not None:
        closeable.close()


def end_run_with_error(run_dir: RunDirectory, exc: BaseException, rollout_id: int | None) -> None:
    """Write how a run ended on `exc`: interrupted (KeyboardInterrupt: SIGINT/SIGTERM) or failed.

    Args:
        run_dir: the run's directory (its `finish` writes the status event and closes console.log).
        exc: what ended the run.
        rollout_id: the rollout it was at (None before the first rollout).
    """
    log_end(exc)
    if isinstance(exc, KeyboardInterrupt):
        fields = {} if rollout_id is None else {"rollout_id": rollout_id}
        run_dir.finish("interrupted", **fields)
        return
    run_dir.heartbeat("error", rollout_id, error=describe_exception(exc))
    fields = {} if rollout_id is None else {"rollout_id": rollout_id}
    run_dir.finish("failed", **fields, error=f"{type(exc).__name__}: {exc}")


def log_end(exc: BaseException) -> None:
    """The line that ends a failed or interrupted run, into console.log (before `finish` closes it).

    `grpolab train: error: <Type>: <message>` (or `grpolab train: interrupted (<why>)`), so that
    `grpolab diagnose log RUN/console.log` sees why the run ended. It skips stdout: the `grpolab train`
    command prints the error on stderr itself, and the terminal should show it once.
    """
    if isinstance(exc, KeyboardInterrupt):
        log.warning(f"grpolab train: interrupted ({str(exc) or 'Ctrl+C'})", extra=CONSOLE_LOG_ONLY)
    else:
        log.error(f"grpolab train: error: {type(exc).__name__}: {exc}", extra=CONSOLE_LOG_ONLY)

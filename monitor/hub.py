"""The run's monitoring, built from the `monitoring` config section: its sinks and its rollout logger.

`check_monitoring` runs in preflight, before the run directory exists: what `--use-wandb`,
`--use-tensorboard` and `--custom-rollout-log-function-path` need must import. `open_monitor` builds
the `Monitor` once the run directory exists (rank 0 only; other ranks get an empty one), stores the
wandb run in run.json and closes everything when the run directory writes its final status.
"""

from __future__ import annotations

import importlib
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

from grpolab.monitor.custom_logger import RolloutLogger, flat_args, load_rollout_logger
from grpolab.monitor.sinks import MetricSink

if TYPE_CHECKING:  # torch-free import for preflight
    from grpolab.core.batch import Sample
    from grpolab.core.config import Config
    from grpolab.rundir.writer import RunDirectory

log = logging.getLogger("grpolab")

EXTRA = "pip install 'grpolab[monitoring]'"
"""How to install what the monitoring flags need (pyproject's `monitoring` extra)."""


def check_monitoring(config: Config) -> None:
    """Preflight: the packages the monitoring flags need import, and the rollout logger imports.

    Imports wandb (`--use-wandb`, about 1 s) and tensorboard (`--use-tensorboard`) only when asked.

    Raises:
        ValueError: naming the flag, the import error and the extra to install, or the logger path
            and its error (`grpolab train` exits 2, before a run directory is made).
    """
    cfg = config.monitoring
    for flag, wanted, package in (
        ("--use-wandb", cfg.use_wandb, "wandb"),
        ("--use-tensorboard", cfg.use_tensorboard, "tensorboard"),
    ):
        if not wanted:
            continue
        try:
            importlib.import_module(package)
        except ImportError as e:
            raise ValueError(
                f"{flag} needs the {package} package, which does not import ({e}): {EXTRA}"
            ) from e
    if cfg.custom_rollout_log_function_path:
        load_rollout_logger(cfg.custom_rollout_log_function_path)


def build_sinks(config: Config, run_dir: Path, *, continued: bool = False) -> list[MetricSink]:
    """The sinks the config asks for, in order wandb, TensorBoard (call on rank 0 only).

    `continued`: this start continues `run_dir` (RunDirectory.continued): the wandb run of the earlier
    start (run.json's "wandb" id) is resumed, and TensorBoard purges what this start re-runs.

    Raises:
        RuntimeError: wandb.init failed (wandb_sink.WandbSink); OSError: a directory cannot be made.
            A sink built before the failing one is closed (status failed) before the error propagates.
    """
    from grpolab.monitor.tensorboard_sink import TensorBoardSink, tensorboard_dir
    from grpolab.monitor.wandb_sink import WandbSink
    from grpolab.rundir.reader import METRICS_FILE

    cfg, sinks = config.monitoring, []
    try:
        if cfg.use_wandb:
            resume_id = _earlier_wandb_id(run_dir) if continued else None
            sinks.append(WandbSink(cfg, run_dir, config.to_dict(), resume_id=resume_id))
        if cfg.use_tensorboard:
            metrics = run_dir / METRICS_FILE if continued else None
            sinks.append(TensorBoardSink(tensorboard_dir(cfg, run_dir), metrics_file=metrics))
    except BaseException:
        Monitor(sinks).close("failed")
        raise
    return sinks


def _earlier_wandb_id(run_dir: Path) -> str | None:
    """run.json's "wandb" id (an earlier start's wandb run; None when absent or disabled)."""
    from grpolab.rundir.reader import read_run_meta

    info = read_run_meta(run_dir).raw.get("wandb")
    wandb_id = info.get("id") if isinstance(info, dict) else None
    return wandb_id if isinstance(wandb_id, str) and wandb_id else None


class Monitor:
    """Where a run's metrics go besides metrics.jsonl, and its custom rollout logger (rank 0's; an
    empty Monitor elsewhere). The loop calls `record` after each metrics.jsonl record."""

    def __init__(
        self,
        sinks: list[MetricSink],
        rollout_logger: RolloutLogger | None = None,
        *,
        config: Config | None = None,
        run_dir: Path | None = None,
    ) -> None:
        self.sinks, self.rollout_logger = sinks, rollout_logger
        self._config, self._run_dir = config, run_dir

    def record(
        self,
        kind: str,
        rollout_id: int,
        step: int | None,
        metrics: dict[str, float],
        *,
        samples: list[Sample] | None = None,
        rollout_time: float = 0.0,
    ) -> bool:
        """One metrics.jsonl record, already written: call the rollout logger (kind "rollout" with the
        whole rollout's `samples`; `rollout_time` in seconds), then, unless it returned True, send the
        record to every sink. Returns whether the default logging should happen (the caller prints the
        record's line then).

        Raises:
            RuntimeError: the rollout logger raised (custom_logger.RolloutLogger names it and the
                rollout), or a sink failed (naming its flag, the record and the error).
        """
        if kind == "rollout" and samples is not None and self.rollout_logger is not None:
            assert self._config is not None
            extra: dict[str, Any] = {"metrics": dict(metrics), "run_dir": str(self._run_dir)}
            if self.rollout_logger(rollout_id, flat_args(self._config), samples, extra, rollout_time):
                return False
        for sink in self.sinks:
            try:
                sink.log(kind, rollout_id, step, metrics)
            except Exception as e:  # wandb's or tensorboard's own errors: the run fails naming the flag
                raise RuntimeError(
                    f"{sink.flag}: sending the {kind} record of rollout {rollout_id} to {sink.name} failed: "
                    f"{type(e).__name__}: {e}"
                ) from e
        return True

    def close(self, status: str) -> None:
        """Close every sink (wandb's run finishes with the status's exit code). A sink that fails to
        close is reported as a warning line: the run's status is already written and stays."""
        for sink in self.sinks:
            try:
                sink.close(status)
            except Exception as e:  # the run has ended; its own error, if any, is the one to raise
                log.warning(f"warning: closing {sink.name} failed: {type(e).__name__}: {e}")
        self.sinks = []


def open_monitor(config: Config, run_dir: RunDirectory, *, primary: bool) -> Monitor:
    """Build the run's Monitor (`primary`: rank 0; other ranks get an empty one) and tie its end to the
    run directory's final status (`RunDirectory.at_finish`). The wandb run (id, dir, url, ...;
    wandb_sink.WandbSink.info) goes into run.json under "wandb".

    Raises:
        ValueError: the rollout logger does not import (already checked by preflight);
        RuntimeError / OSError: as `build_sinks`.
    """
    if not primary:
        return Monitor([])
    path = config.monitoring.custom_rollout_log_function_path
    rollout_logger = load_rollout_logger(path) if path else None
    sinks = build_sinks(config, run_dir.path, continued=run_dir.continued)
    monitor = Monitor(sinks, rollout_logger, config=config, run_dir=run_dir.path)
    run_dir.at_finish(monitor.close)
    from grpolab.monitor.wandb_sink import WandbSink

    for sink in sinks:
        if isinstance(sink, WandbSink):
            run_dir.add_to_run_json(wandb=sink.info)
    return monitor

"""TensorBoard event files of a run's metrics (`--use-tensorboard`), as Miles writes them.

The same scalars as metrics.jsonl, under their own names (`train/loss`, `rollout/raw_reward`,
`perf/step_time`, `eval/<set>`), each at its record's x-axis value (sinks.x_value: the optimizer step
for train/*, the rollout id for the rest). Written with torch.utils.tensorboard.SummaryWriter (needs
the `tensorboard` package: the `monitoring` extra). Open with `tensorboard --logdir DIR`.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

from grpolab.core.config.monitoring import MonitoringConfig
from grpolab.monitor.sinks import x_value

log = logging.getLogger("grpolab")


def tensorboard_dir(cfg: MonitoringConfig, run_dir: Path) -> Path:
    """Where TensorBoard files go: `--tensorboard-dir`, else $TENSORBOARD_DIR, else RUN_DIR/tensorboard."""
    return Path(cfg.tensorboard_dir or os.environ.get("TENSORBOARD_DIR") or run_dir / "tensorboard")


class TensorBoardSink:
    """Scalars into one TensorBoard event file per run start (the MetricSink of `--use-tensorboard`).

    A start that continues a run directory (`--load` into it: `metrics_file` given) re-runs rollouts
    an earlier start logged. Its writer opens at its first record, with SummaryWriter's `purge_step`
    set to that record's rollout id, so TensorBoard drops the earlier start's values from there on and
    shows one curve, as metrics.jsonl's reader does (rundir/reader.read_metrics_file). TensorBoard
    purges every tag at one step value, and train/* is plotted against the optimizer step, which is at
    least the rollout id: the earlier start's kept train/* records at steps from the purge step on are
    written again from metrics.jsonl.

    Raises (on construction):
        ImportError: tensorboard is not installed (preflight's check_monitoring says so before the run).
        OSError: the directory cannot be made.
    """

    name = "tensorboard"
    flag = "--use-tensorboard"

    def __init__(self, directory: Path, *, metrics_file: Path | None = None) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.directory, self.metrics_file = directory, metrics_file
        directory.mkdir(parents=True, exist_ok=True)
        self._writer_class = SummaryWriter
        self.writer: Any = None if metrics_file is not None else SummaryWriter(log_dir=str(directory))
        log.info(f"Saving tensorboard log to {directory}")  # Miles' line

    def _open(self, first_rollout_id: int) -> Any:
        """The writer of a continued run directory: purge from `first_rollout_id`, then re-write the
        kept train/* records at steps from there on (see the class docstring)."""
        from grpolab.rundir.reader import read_metrics_file

        assert self.metrics_file is not None
        writer = self._writer_class(log_dir=str(self.directory), purge_step=first_rollout_id)
        for record in read_metrics_file(self.metrics_file).records:
            kept = record.rollout_id is not None and record.rollout_id < first_rollout_id
            if record.kind == "step" and kept and record.step is not None and record.step >= first_rollout_id:
                for name, value in record.metrics.items():
                    writer.add_scalar(name, value, global_step=record.step)
        return writer

    def log(self, kind: str, rollout_id: int, step: int | None, metrics: dict[str, float]) -> None:
        """One scalar per metric at the record's x-axis value; flushed at each `perf` record (a
        rollout's last), so a TensorBoard open during the run sees every finished rollout."""
        if self.writer is None:
            self.writer = self._open(rollout_id)
        x = x_value(kind, rollout_id, step)
        for name, value in metrics.items():
            self.writer.add_scalar(name, float(value), global_step=x)
        if kind == "perf":
            self.writer.flush()

    def close(self, status: str) -> None:
        """Flush and close the event file (whatever `status` the run ended with)."""
        if self.writer is not None:
            self.writer.close()

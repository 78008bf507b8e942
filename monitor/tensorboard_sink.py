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

from grpolab.core.config.monitoring import MonitoringConfig
from grpolab.monitor.sinks import x_value

log = logging.getLogger("grpolab")


def tensorboard_dir(cfg: MonitoringConfig, run_dir: Path) -> Path:
    """Where TensorBoard files go: `--tensorboard-dir`, else $TENSORBOARD_DIR, else RUN_DIR/tensorboard."""
    return Path(cfg.tensorboard_dir or os.environ.get("TENSORBOARD_DIR") or run_dir / "tensorboard")


class TensorBoardSink:
    """Scalars into one TensorBoard event file per run start (the MetricSink of `--use-tensorboard`).

    Raises (on construction):
        ImportError: tensorboard is not installed (preflight's check_monitoring says so before the run).
        OSError: the directory cannot be made.
    """

    name = "tensorboard"
    flag = "--use-tensorboard"

    def __init__(self, directory: Path) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.directory = directory
        self.writer = SummaryWriter(log_dir=str(directory))
        log.info(f"Saving tensorboard log to {directory}")  # Miles' line

    def log(self, kind: str, rollout_id: int, step: int | None, metrics: dict[str, float]) -> None:
        """One scalar per metric at the record's x-axis value; flushed at each `perf` record (a
        rollout's last), so a TensorBoard open during the run sees every finished rollout."""
        x = x_value(kind, rollout_id, step)
        for name, value in metrics.items():
            self.writer.add_scalar(name, float(value), global_step=x)
        if kind == "perf":
            self.writer.flush()

    def close(self, status: str) -> None:
        """Flush and close the event file (whatever `status` the run ended with)."""
        self.writer.close()

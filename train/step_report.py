"""What a step tells the world: each record to metrics.jsonl, the monitor and the console, and the
step's `perf N:` record with its summary row.

Order per record (the product's source of truth first): the metrics.jsonl line, then the monitor
(wandb / TensorBoard / `--custom-rollout-log-function-path`, monitor/), then the `<kind> N:` console
line unless the custom rollout logger replaced it.
"""

from __future__ import annotations

import logging
import time

from grpolab.core.batch import Sample
from grpolab.core.engine.base import ReportsStats, capability
from grpolab.core.metrics import PhaseTimer, RunSummary, format_line, perf_metrics, summary_row
from grpolab.monitor import Monitor
from grpolab.rundir.writer import RunDirectory
from grpolab.train.engine_faults import restart_metrics

log = logging.getLogger("grpolab")


class StepReporter:
    """Writes a run's metric records and per-step perf lines.

    Args:
        run_dir: the run directory (metrics.jsonl).
        monitor: the run's metric sinks (`monitor.open_monitor`).
        timer: the run's phase timer (its `rollout` seconds go to the custom rollout logger; `report`
            pops its phases into the perf record).
        num_rollout: `--num-rollout`, for the `[N/M]` summary row.
        summary: the end-of-run summary each reported rollout is added to (made when the run object
            is, so that its clock counts the loading).
    """

    def __init__(
        self,
        run_dir: RunDirectory,
        monitor: Monitor,
        timer: PhaseTimer,
        num_rollout: int,
        summary: RunSummary,
    ) -> None:
        self.run_dir, self.monitor, self.timer, self.num_rollout = run_dir, monitor, timer, num_rollout
        self.summary = summary

    def emit(
        self,
        kind: str,
        index: int,
        metrics: dict[str, float],
        *,
        rollout_id: int | None = None,
        samples: list[Sample] | None = None,
    ) -> None:
        """One record of `kind` ("rollout", "step", "perf", "eval") at `index` (the train step for
        "step", else the rollout id); `samples` (the whole rollout) go to the custom rollout logger."""
        rollout, step = index if rollout_id is None else rollout_id, index if kind == "step" else None
        self.run_dir.log_metrics(kind, rollout, metrics, step=step)
        rollout_time = self.timer.seconds.get("rollout", 0.0)
        if self.monitor.record(kind, rollout, step, metrics, samples=samples, rollout_time=rollout_time):
            log.info(format_line(kind, index, metrics))

    def report(
        self,
        rollout_id: int,
        start: float,
        line: dict[str, float],
        steps: list[dict[str, float]],
        engine: object | None,
    ) -> None:
        """The `perf N:` record (seconds per phase since the last pop, the step's seconds since
        `start` (time.perf_counter), the engine's throughput) and the `[N/M]` summary row."""
        stats = capability(engine, ReportsStats)
        engine_stats = None if stats is None else stats.last_stats
        perf = perf_metrics(
            self.timer.pop(), step_seconds=time.perf_counter() - start, engine_stats=engine_stats
        )
        perf.update(restart_metrics(engine, self.run_dir))  # --use-fault-tolerance
        self.emit("perf", rollout_id, perf)
        log.info(summary_row(rollout_id, self.num_rollout, line, steps, perf))
        self.summary.add(rollout_id, line, steps)

"""The engine's side of a run's faults: the injected ones (`--ci-ft-test-actions` stop and kill actions) and
the restarts `--use-fault-tolerance` made, as events and metrics.

Each restart (core/engine/restart.py) becomes an `engine_restart` event (engine, reason, old and new URL,
weight version, tensors checked, seconds, retried requests), written with the rollout's `perf` record (or
where a failed run ends, before its status) and, in that record, the
metrics `ft/engine_restarts`, `ft/engine_restart_seconds`, `ft/retried_requests` and
`ft/failed_engine_starts` (sums over the restarts since the previous rollout's record; 0 when none; a
restart whose first start died counts once, its failed starts in the last one and in the budget).
"""

from __future__ import annotations

import dataclasses
import logging

from grpolab.core.engine.base import RestartsEngines, Stoppable, capability
from grpolab.rundir.writer import RunDirectory

log = logging.getLogger("grpolab")


def stop_engine(engine: object | None, run_dir: RunDirectory) -> None:
    """The `stop_engine_at_end` fault. Raises RuntimeError when the engine cannot be shut down."""
    reason = "fault injection stop_engine_at_end"
    stoppable = capability(engine, Stoppable)
    if stoppable is None:
        raise RuntimeError(f"--ci-ft-test-actions: {reason}: this run's engine cannot be shut down")
    stoppable.shutdown(reason=reason)
    run_dir.event("engine_stopped", reason=reason)


def kill_engine(engine: object | None, mid_rollout: bool) -> None:
    """The `kill_engine_in_train` (now) and `kill_engine_in_rollout` (once the rollout's requests reached the
    engines) faults, on engine 0 of the launched fleet.

    Raises:
        RuntimeError: the run's engine launched no fleet.
    """
    fleet = capability(engine, RestartsEngines)
    if fleet is None:
        raise RuntimeError(
            "--ci-ft-test-actions: kill_engine_*: this run launched no engines (--rollout-num-engines)"
        )
    fleet.kill_engine(0, when_queued=mid_rollout)


def restart_metrics(engine: object | None, run_dir: RunDirectory) -> dict[str, float]:
    """An `engine_restart` event per restart since the last call, and their metrics (module docstring);
    {} without --use-fault-tolerance."""
    fleet = capability(engine, RestartsEngines)
    records = None if fleet is None else fleet.take_restarts()
    if records is None:
        return {}
    for record in records:
        fields = dataclasses.asdict(record)
        fields.pop("call")  # which call it broke: the HTTP engine's, not a fact of the run
        run_dir.event("engine_restart", **fields)
    return {
        "ft/engine_restarts": float(len(records)),
        "ft/engine_restart_seconds": float(sum(r.seconds for r in records)),
        "ft/retried_requests": float(sum(r.retried_requests for r in records)),
        "ft/failed_engine_starts": float(sum(r.failed_starts for r in records)),
    }

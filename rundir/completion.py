"""Did a run do what it was asked? Its status, why it ended and how many rollouts it ran of how many.

The one place that judges a run directory's completion, for `grpolab gate` (a CI gate must not pass
a run that failed, crashed or was interrupted, or that ran fewer rollouts than asked), the UI's
Health page and `grpolab diff`'s status line. Foreign logs (Miles/slime console logs) record no
status and are not judged here.

Rollouts asked: `--num-rollout`, or `--debug-exit-after-rollout` + 1 when that is smaller (the run
was asked to stop there). Rollouts done: the final `status` event's "rollouts" (the next rollout id
the trainer would have run), else its "rollout_id" (a failed or interrupted run's rollout, which
did not finish), else one past the highest rollout id of the metrics file's `rollout` records (a
run without a final status; a continued run directory's earlier starts count).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from grpolab.rundir import reader
from grpolab.rundir.foreign_logs import MetricRecord

COMPLETE_STATUS = "finished"
"""The only status a complete run has; the others (failed, interrupted, running, crashed) are not."""


@dataclass(frozen=True)
class RunCompletion:
    """A run directory's completion.

    Attributes:
        status: finished | failed | interrupted | running | crashed (`reader.run_status`).
        reason: why it is not complete, in words (the failed status event's error and rollout, a
            crash without a final status, too few rollouts); "" for a complete run.
        rollouts_done: rollouts the run ran (see the module docstring); rollouts_asked: what it
            was asked for, None when run.json holds no readable config.
    """

    status: str
    reason: str
    rollouts_done: int
    rollouts_asked: int | None

    @property
    def complete(self) -> bool:
        """Finished, with at least the rollouts it was asked for (when known)."""
        asked = self.rollouts_asked
        return self.status == COMPLETE_STATUS and (asked is None or self.rollouts_done >= asked)

    @property
    def rollouts(self) -> str:
        """`3/40 rollouts` (or `3 rollouts` when the number asked is unknown)."""
        of = "" if self.rollouts_asked is None else f"/{self.rollouts_asked}"
        return f"{self.rollouts_done}{of} rollouts"

    def describe(self) -> str:
        """One line: `finished, 3/3 rollouts` or `failed, 3/40 rollouts: <reason>`."""
        return f"{self.status}, {self.rollouts}" + (f": {self.reason}" if self.reason else "")


def _rollouts_asked(run_dir: Path) -> int | None:
    """--num-rollout, or --debug-exit-after-rollout + 1 when smaller; None without a readable config."""
    try:
        config = reader.read_run_meta(run_dir).config
    except reader.RunDirError:
        return None
    if config is None:
        return None
    asked = config.rollout.num_rollout
    exit_after = config.debug.debug_exit_after_rollout
    return asked if exit_after is None else min(asked, exit_after + 1)


def _rollouts_done(event: dict[str, Any], records: list[MetricRecord]) -> int:
    """The final status event's "rollouts", else its "rollout_id" (the rollout a failed or
    interrupted run was in, not done), else one past the highest `rollout` record id."""
    for key in ("rollouts", "rollout_id"):  # a failed or interrupted run did not finish rollout_id
        done = event.get(key)
        if isinstance(done, int) and not isinstance(done, bool):
            return done
    ids = [r.rollout_id for r in records if r.kind == "rollout" and r.rollout_id is not None]
    return max(ids) + 1 if ids else 0


def _reason(status: str, event: dict[str, Any], run_dir: Path) -> str:
    """Why a run that is not finished ended (or has not)."""
    at = event.get("rollout_id")
    at_rollout = f" at rollout {at}" if isinstance(at, int) and not isinstance(at, bool) else ""
    if status == "failed":
        return f"it failed{at_rollout}: {event.get('error') or 'no error recorded'}"
    if status == "interrupted":
        return f"it was interrupted{at_rollout} (SIGINT or SIGTERM)"
    if status == "running":
        return "it is still running (its heartbeat is recent and its processes are alive)"
    if status == "crashed":
        return (
            "it stopped without a final status event (killed or crashed: its processes on this host "
            f"are gone, or its heartbeat stopped); see {run_dir / reader.CONSOLE_LOG}"
        )
    return ""


def run_completion(
    run_dir: str | Path,
    records: list[MetricRecord] | None = None,
    *,
    heartbeat_timeout_s: float = reader.HEARTBEAT_TIMEOUT_S,
) -> RunCompletion:
    """The completion of the run in `run_dir`.

    Args:
        run_dir: a run directory (`reader.is_run_dir`).
        records: its metric records when the caller has read them already (else metrics.jsonl is
            read; an unreadable file counts as none).
        heartbeat_timeout_s: seconds; `reader.run_status`'s rule for ranks of other hosts.

    Never raises for the directory's contents: unreadable files count as absent.
    """
    path = Path(run_dir)
    if records is None:
        try:
            records = reader.read_metrics_file(path / reader.METRICS_FILE).records
        except OSError:
            records = []
    status = reader.run_status(path, heartbeat_timeout_s=heartbeat_timeout_s)
    event = reader.final_status_event(path) or {}
    done, asked = _rollouts_done(event, records), _rollouts_asked(path)
    reason = _reason(status, event, path)
    if not reason and asked is not None and done < asked:
        reason = f"it ran {done} of the {asked} rollouts it was asked for"
    return RunCompletion(status, reason, done, asked)


__all__ = ["COMPLETE_STATUS", "RunCompletion", "run_completion"]

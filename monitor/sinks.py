"""What a metric sink is, and the x-axis of each metrics.jsonl record kind (one table for every sink).

A sink receives the records the loop writes to metrics.jsonl (`rundir.writer.RunDirectory.log_metrics`),
after they are written: metrics.jsonl stays the run's source of truth, a sink is a copy for a viewer.
Each record kind has its own x-axis, as Miles' wandb panels do (reference/miles-monitoring.md,
miles/utils/tracking_utils/wandb_utils.py): `train/*` against `train/step` (the optimizer step, the
record's `step`), `rollout/*` and `perf/*` against `rollout/step` (the rollout id), `eval/*` against
`eval/step` (the rollout id the evaluation ran before).
"""

from __future__ import annotations

from typing import Protocol

STEP_KEYS: dict[str, str] = {
    "step": "train/step",
    "rollout": "rollout/step",
    "perf": "rollout/step",
    "eval": "eval/step",
}
"""metrics.jsonl record kind → the metric its values are plotted against (Miles' step metrics)."""
NAMESPACE_AXES: dict[str, str] = {
    "train/*": "train/step",
    "rollout/*": "rollout/step",
    "perf/*": "rollout/step",
    "eval/*": "eval/step",
}
"""Metric-name glob → its x-axis (wandb's define_metric; the namespaces of metrics.jsonl's keys)."""

EXIT_CODES = {"finished": 0, "failed": 1, "interrupted": 130}
"""The run's final `status` (events.jsonl) → the exit code a sink reports (wandb marks non-zero as failed)."""


def x_value(kind: str, rollout_id: int, step: int | None) -> int:
    """The x-axis value of one metrics.jsonl record: its optimizer `step` for kind "step" (train/step),
    else its rollout id. Raises ValueError for a "step" record without a step."""
    if kind != "step":
        return rollout_id
    if step is None:
        raise ValueError("a metrics record of kind 'step' needs its optimizer step")
    return step


def with_step_key(
    kind: str, rollout_id: int, step: int | None, metrics: dict[str, float]
) -> dict[str, float]:
    """`metrics` plus its x-axis metric (`STEP_KEYS[kind]`, default rollout/step) set to `x_value`."""
    return {**metrics, STEP_KEYS.get(kind, "rollout/step"): float(x_value(kind, rollout_id, step))}


class MetricSink(Protocol):
    """Somewhere metrics go besides metrics.jsonl (wandb, TensorBoard); built on rank 0 only."""

    name: str
    """What the sink is, in messages ("wandb", "tensorboard")."""
    flag: str
    """The flag that asked for it ("--use-wandb"), named in its error messages."""

    def log(self, kind: str, rollout_id: int, step: int | None, metrics: dict[str, float]) -> None:
        """One metrics.jsonl record: `kind` (rollout | step | perf | eval), its rollout id, its optimizer
        step (kind "step" only, else None) and its metrics (name → float, Miles' namespaced keys)."""
        ...

    def close(self, status: str) -> None:
        """End the sink's files/run; `status` is the run's final status (finished | failed | interrupted)."""
        ...

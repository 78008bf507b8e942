"""`grpolab diff`: where two runs part (set-up, metric, sample/token, layer).

The door is `diff_runs(run_a, run_b, *, tol=0.0, baselines=()) -> RunDiff` (diff/compare.py); the
report's dataclasses are in diff/report.py, the CLI in diff/command.py.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from grpolab.diff.report import (
    LayerDivergence,
    MetricDivergence,
    RunDiff,
    SampleDivergence,
    SetupDifference,
)

if TYPE_CHECKING:
    from grpolab.diff.compare import diff_runs


def __getattr__(name: str) -> Any:
    """`diff_runs` is imported on first use (it reads recordings: torch), so `grpolab diff --help` stays light."""
    if name == "diff_runs":
        from grpolab.diff.compare import diff_runs

        return diff_runs
    raise AttributeError(f"module 'grpolab.diff' has no attribute {name!r}")


__all__ = [
    "LayerDivergence",
    "MetricDivergence",
    "RunDiff",
    "SampleDivergence",
    "SetupDifference",
    "diff_runs",
]

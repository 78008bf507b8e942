"""`grpolab diff`: where two runs part (set-up, metric, sample/token, layer). See `diff.compare`."""

from __future__ import annotations

from grpolab.diff.report import (
    LayerDivergence,
    MetricDivergence,
    RunDiff,
    SampleDivergence,
    SetupDifference,
)

__all__ = ["LayerDivergence", "MetricDivergence", "RunDiff", "SampleDivergence", "SetupDifference"]

"""Pure comparison logic for the UI (no Streamlit): namespaces, axis labels, same steps, clean steps.

The comparison math (metric series, seed bands, first divergence, config diffs) lives in
`grpolab.diff.series`, shared with `grpolab diff`; it is re-exported here for the pages.

Inputs are the frames `RunStore.read_scalars` returns: indexed by (run, kind, step), one column
per metric key plus `time`. The x axis of a key is its `step` level: the train step for `train/*`
keys (step rows) and the rollout id for every other kind — the same numbers when a rollout makes
one optimizer step. A NaN cell counts as "not logged".
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import pandas as pd

from grpolab.diagnose.gpu import throttle as gpu_throttle
from grpolab.diff.series import (  # noqa: F401  (the pages' names: analysis.first_divergence, ...)
    BandVerdict,
    DivergenceReport,
    band_verdicts,
    config_diff,
    divergence_report,
    first_divergence,
    flatten,
    metric_series,
    seed_band,
    values_equal,
)

NAMESPACES = ("rollout/", "train/", "perf/", "eval/")
"""Metric namespaces offered on the Compare page (Miles' names)."""


def keys_in_namespace(keys: Iterable[str], namespace: str) -> list[str]:
    """The keys starting with `namespace` ("rollout/", ...), sorted; "other" = none of NAMESPACES."""
    if namespace == "other":
        return sorted(k for k in keys if not k.startswith(NAMESPACES))
    return sorted(k for k in keys if k.startswith(namespace))


def key_kind(scalars: pd.DataFrame, key: str) -> str | None:
    """The row kind a key was logged in (the most common one), e.g. "step" for train/loss."""
    if key not in scalars.columns:
        return None
    kinds = scalars[key].dropna().index.get_level_values("kind")
    return None if len(kinds) == 0 else str(pd.Series(kinds).mode().iloc[0])


def axis_label(kind: str | None) -> str:
    """x-axis title for a key's kind: "train step" for step rows, "rollout id" otherwise."""
    return "train step" if kind in ("step", "critic-step") else "rollout id"


def same_steps(series: pd.DataFrame) -> pd.DataFrame:
    """Keep only the step numbers present (non-NaN) in every run column."""
    if series.empty:
        return series
    return series.dropna(how="any")


def throttle_times(gpu: pd.DataFrame) -> np.ndarray:
    """Unix times (s) of gpu.jsonl samples that saw a thermal or power throttle, sorted; empty when
    the run has no gpu.jsonl or no throttle.

    The rule is grpolab.diagnose.gpu.throttle.sample_is_throttled: the `throttle` field when set,
    else the thermal/power names in `throttle_reasons` (gpu_idle and clock settings are not
    throttles).
    """
    if gpu.empty or "time" not in gpu.columns:
        return np.array([], dtype=float)
    return np.asarray(gpu_throttle.throttle_times(gpu.to_dict("records")), dtype=float)


def clean_steps(frame: pd.DataFrame, marks: np.ndarray) -> pd.Series:
    """Which perf rows are clean: no throttle mark inside [time − perf/step_time, time].

    Manual 5.3's timing rule (grpolab.diagnose.gpu.throttle.clean_step_mask, no margin): a step
    counts when its window overlaps no throttle. The window ends at the perf line's time and lasts
    `perf/step_time` (`perf/rollout_time` when no step time; a NaN length counts as 0).

    Args:
        frame: one run's (kind, step) frame (or the run's slice of read_scalars).
        marks: sorted throttle times (`throttle_times`).

    Returns:
        bool Series indexed by rollout id (True = clean); all True when there are no marks.
    """
    if ("perf" not in frame.index.get_level_values("kind")) or "time" not in frame.columns:
        return pd.Series(dtype=bool)
    perf = frame.xs("perf", level="kind")
    length = perf.get("perf/step_time", perf.get("perf/rollout_time"))
    span = length.to_numpy(float) if length is not None else np.zeros(len(perf))
    ends = perf["time"].to_numpy(float).tolist()
    clean = gpu_throttle.clean_step_mask(ends, span.tolist(), np.asarray(marks, dtype=float).tolist())
    return pd.Series(clean, index=perf.index, dtype=bool)

"""Metric records → pandas frames, indexed by (kind, step): what `grpolab diff` and the UI compare.

One rule for both (the Compare page through `ui.runstore.RunStore`, `grpolab diff` through
`diff.sources`): records with the same (kind, step) merge key by key, later values winning. Records
come from `rundir.reader` (run directories) or `rundir.foreign_logs` (Miles/slime logs); no I/O here.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np
import pandas as pd

from grpolab.rundir.foreign_logs import MetricRecord, ParsedLog

INDEX_NAMES = ["kind", "step"]
"""Per-run frame index: kind (rollout | step | perf | eval | ...) and step (the train step for
`step` rows, the rollout id for every other kind)."""
TIME_COLUMN = "time"


def _row_index(rec: MetricRecord) -> tuple[str, int] | None:
    idx = rec.step if rec.kind in ("step", "critic-step") else rec.rollout_id
    return None if idx is None else (rec.kind, idx)


def _merge(records: Iterable[MetricRecord]) -> dict[tuple[str, int], dict[str, Any]]:
    """Records merged by (kind, step), key by key, later values winning; `time` the latest record time."""
    merged: dict[tuple[str, int], dict[str, Any]] = {}
    for rec in records:
        key = _row_index(rec)
        if key is None:
            continue
        row = merged.get(key)
        if row is None:
            row = merged[key] = {}
        last_time = row.get(TIME_COLUMN)
        row.update(rec.metrics)
        row[TIME_COLUMN] = last_time
        if rec.time is not None and (last_time is None or rec.time > last_time):
            row[TIME_COLUMN] = rec.time
    return merged


def records_to_frame(records: Iterable[MetricRecord]) -> pd.DataFrame:
    """Metric records → a wide frame indexed by (kind, step), one column per key.

    Records with the same (kind, step) merge key by key, later values winning (Miles' two
    `perf N:` lines become one perf row; a resumed run's re-logged rollout keeps its last value).
    The `time` column holds the latest record time of the row (unix seconds, NaN when unknown).
    Records without an index (a step line without step) are left out; every column is float64.
    A logged NaN and a key not logged both read NaN here: `logged_frame` tells them apart.
    """
    return _frame(_merge(records), logged=False)


def logged_frame(records: Iterable[MetricRecord]) -> pd.DataFrame:
    """Which cells of `records_to_frame(records)` a record set (a logged NaN included): a bool frame
    with the same (kind, step) index and metric columns (no `time` column)."""
    frame = _frame(_merge(records), logged=True)
    return frame.drop(columns=[TIME_COLUMN]).astype(bool)


def _frame(merged: dict[tuple[str, int], dict[str, Any]], *, logged: bool) -> pd.DataFrame:
    """Merged rows → the wide frame of their values (or, `logged`, 1.0 where a key was set, else 0.0)."""
    if not merged:
        return empty_frame()
    n = len(merged)
    columns: dict[str, np.ndarray] = {}
    for i, row in enumerate(merged.values()):
        for k, v in row.items():
            col = columns.get(k)
            if col is None:
                col = columns[k] = np.zeros(n) if logged else np.full(n, np.nan)
            if v is not None:
                col[i] = 1.0 if logged else v
    index = pd.MultiIndex.from_tuples(list(merged), names=INDEX_NAMES)
    time_col = columns.pop(TIME_COLUMN)
    frame = pd.DataFrame(columns, index=index)
    frame[TIME_COLUMN] = time_col
    return frame.sort_index()


def empty_frame() -> pd.DataFrame:
    """A frame with the per-run index levels and only the time column."""
    index = pd.MultiIndex.from_tuples([], names=INDEX_NAMES)
    return pd.DataFrame({TIME_COLUMN: pd.Series([], dtype="float64")}, index=index)


def log_frame(parsed: ParsedLog) -> pd.DataFrame:
    """A parsed foreign log → the same (kind, step) frame as a run directory's metrics."""
    return records_to_frame(parsed.records)

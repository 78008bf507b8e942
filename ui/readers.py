"""Helpers behind the RunStore: metric records → frames, a bounded cache, file signatures.

Pages never call these; they go through `RunStore`. Run-directory files are parsed by
`grpolab.rundir.reader` (tolerant of a live writer's half-written last line), console logs by
`grpolab.rundir.foreign_logs`; this module only shapes what they return.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from grpolab.rundir.foreign_logs import MetricRecord, ParsedLog

INDEX_NAMES = ["kind", "step"]
"""Per-run frame index: kind (rollout | step | perf | eval | ...) and step (the train step for
`step` rows, the rollout id for every other kind)."""
TIME_COLUMN = "time"


def read_json(path: str | Path) -> dict[str, Any] | None:
    """A JSON object file, or None when missing, unreadable or not an object (e.g. mid-write)."""
    try:
        obj = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return obj if isinstance(obj, dict) else None


def _row_index(rec: MetricRecord) -> tuple[str, int] | None:
    idx = rec.step if rec.kind in ("step", "critic-step") else rec.rollout_id
    return None if idx is None else (rec.kind, idx)


def records_to_frame(records: Iterable[MetricRecord]) -> pd.DataFrame:
    """Metric records → a wide frame indexed by (kind, step), one column per key.

    Records with the same (kind, step) merge key by key, later values winning (Miles' two
    `perf N:` lines become one perf row; a resumed run's re-logged rollout keeps its last value).
    The `time` column holds the latest record time of the row (unix seconds, NaN when unknown).
    Records without an index (a step line without step) are left out; every column is float64.
    """
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
    if not merged:
        return empty_frame()
    n = len(merged)
    columns: dict[str, np.ndarray] = {}
    for i, row in enumerate(merged.values()):
        for k, v in row.items():
            col = columns.get(k)
            if col is None:
                col = columns[k] = np.full(n, np.nan)
            if v is not None:
                col[i] = v
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


class LRU:
    """A bounded, thread-safe mapping for cached values (least recently used evicted first).
    Streamlit serves sessions from several threads, all sharing one RunStore."""

    def __init__(self, max_entries: int) -> None:
        self.max_entries = max_entries
        self.data: OrderedDict[Any, Any] = OrderedDict()
        self.lock = threading.Lock()

    def get(self, key: Any) -> Any:
        """The cached value, or None."""
        with self.lock:
            if key in self.data:
                self.data.move_to_end(key)
                return self.data[key]
            return None

    def put(self, key: Any, value: Any) -> Any:
        """Store and return `value`."""
        with self.lock:
            self.data[key] = value
            self.data.move_to_end(key)
            while len(self.data) > self.max_entries:
                self.data.popitem(last=False)
        return value


def file_signature(path: Path) -> tuple[int, int] | None:
    """(size, mtime_ns) of a file, or None when it does not exist or cannot be stat'ed."""
    try:
        st = path.stat()
    except OSError:
        return None
    return (st.st_size, st.st_mtime_ns)


def count_steps(frame: pd.DataFrame) -> int:
    """Train steps logged (step rows), or rollouts when the run logged no step."""
    kinds = frame.index.get_level_values("kind")
    n = int((kinds == "step").sum())
    return n if n else int((kinds == "rollout").sum())


def last_value(frame: pd.DataFrame, key: str) -> float | None:
    """The last logged value of `key` in (kind, step) order, or None."""
    if key not in frame.columns:
        return None
    values = frame[key].dropna()
    return float(values.iloc[-1]) if len(values) else None

"""Helpers behind the RunStore: metric records → frames (from `grpolab.diff.frames`, shared with
`grpolab diff`), a bounded cache, file signatures.

Pages never call these; they go through `RunStore`. Run-directory files are parsed by
`grpolab.rundir.reader` (tolerant of a live writer's half-written last line), console logs by
`grpolab.rundir.foreign_logs`; this module only shapes what they return.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from pathlib import Path
from typing import Any

import pandas as pd

from grpolab.diff.frames import (  # noqa: F401  (the RunStore's names: readers.records_to_frame, ...)
    INDEX_NAMES,
    TIME_COLUMN,
    empty_frame,
    log_frame,
    records_to_frame,
)


def read_json(path: str | Path) -> dict[str, Any] | None:
    """A JSON object file, or None when missing, unreadable or not an object (e.g. mid-write)."""
    try:
        obj = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return obj if isinstance(obj, dict) else None


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

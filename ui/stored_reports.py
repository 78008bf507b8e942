"""The `grpolab diagnose hang` reports a run directory keeps under RUN_DIR/diagnose/<UTC stamp>/:
their shape and order, for `RunStore.read_hang_reports` (which reads their files through its cache).
"""

from __future__ import annotations

import calendar
import json
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from grpolab.ui import readers


@dataclass(frozen=True)
class StoredHangReport:
    """One `grpolab diagnose hang` report kept in a run directory.

    Attributes:
        folder: its folder relative to the run directory (`diagnose/20261130T024635Z`).
        taken: when it was written, unix seconds: the folder's UTC stamp (`new_dump_dir`'s
            `%Y%m%dT%H%M%SZ`, `-2`… suffix allowed), else verdict.json's mtime.
        report: verdict.json (`HangReport.to_dict`: verdict{kind, pattern, hung, title, evidence,
            rows, next_steps}, hung, progress, ranks, missing_ranks, notes, elapsed_s, ...);
            {} when it is unreadable.
        dumps: rank → the text of rank<r>.txt (py-spy's stacks of every sample), by rank.
        error: why verdict.json is unreadable (`read_verdict`), naming the file; None when it holds a report.
    """

    folder: str
    taken: float
    report: dict[str, Any]
    dumps: dict[int, str]
    error: str | None = None

    @classmethod
    def of(
        cls, folder: str, taken: float, verdict: dict[str, Any] | str, dumps: dict[int, str]
    ) -> StoredHangReport:
        """A report from `read_verdict`'s answer: the report object, or why verdict.json is unreadable."""
        if isinstance(verdict, str):
            return cls(folder, taken, {}, dumps, error=verdict)
        return cls(folder, taken, verdict, dumps)


HANG_VERDICT = "verdict.json"
"""The file that makes a folder under RUN_DIR/diagnose/ a hang report (written last by `write_dumps`)."""
RANK_DUMP = re.compile(r"rank(\d+)\.(txt|json)")
_STAMP = re.compile(r"(\d{8}T\d{6}Z)(?:-(\d+))?")


def stamp_order(folder: Path) -> tuple[float, int]:
    """(unix seconds, suffix) of a `20261130T024635Z[-n]` folder; verdict.json's mtime when unstamped."""
    m = _STAMP.fullmatch(folder.name)
    if m is None:
        sig = readers.file_signature(folder / HANG_VERDICT)
        return (sig[1] / 1e9 if sig else 0.0, 0)
    return (float(calendar.timegm(time.strptime(m[1], "%Y%m%dT%H%M%SZ"))), int(m[2] or 1))


def read_text(path: Path) -> str:
    """A text file (bad bytes replaced), or a line saying why it cannot be read."""
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except OSError as e:
        return f"(cannot read {path.name}: {e.strerror or e})"


def read_json_object(path: Path, what: str) -> dict[str, Any] | str:
    """The JSON object stored at `path`, or why it is unreadable, naming the file: it cannot be read, is
    not JSON, or holds another JSON value than an object (`what` names the object expected, e.g.
    "hang report")."""
    try:
        obj = json.loads(path.read_text(encoding="utf-8"))
    except OSError as e:
        return f"cannot read {path}: {e.strerror or e}"
    except ValueError as e:
        return f"{path} is not JSON ({e})"
    if not isinstance(obj, dict):
        return f"{path} holds a JSON {type(obj).__name__}, not a {what} object"
    return obj


def read_verdict(path: Path) -> dict[str, Any] | str:
    """A hang report's verdict.json (`HangReport.to_dict`), or why it is unreadable: the file cannot be
    read, is not JSON, or is not an object with a boolean "hung" and a "verdict" object (a report
    without them is no verdict, hung or not). The message names the file."""
    obj = read_json_object(path, "hang report")
    if isinstance(obj, str):
        return obj
    if not isinstance(obj.get("hung"), bool) or not isinstance(obj.get("verdict"), dict):
        return f'{path} holds no hang verdict (no boolean "hung" and "verdict" object)'
    return obj

"""The Bisect page's files and command: past `grpolab bisect` reports (BISECT_DIR/<UTC time>/report.json,
written by diff/bisect.py `_write_report`) and the `grpolab bisect` argument list the page starts as a
job (grpolab.ui.jobs).

No Streamlit here: the page (ui/app_pages/bisect.py) shows what these functions return.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from grpolab.ui.stored_reports import read_json_object, stamp_order

REPORT = "report.json"
"""The file `grpolab bisect` writes last into its BISECT_DIR/<UTC time>/ folder."""


@dataclass(frozen=True)
class StoredBisect:
    """One `grpolab bisect` report kept under a bisect folder.

    Attributes:
        folder: the report's folder (BISECT_DIR/<UTC time>).
        taken: when it was written, unix seconds: the folder's UTC stamp (`%Y%m%dT%H%M%SZ`), else
            report.json's mtime.
        report: report.json as `grpolab bisect` wrote it; {} when it is unreadable.
        error: why report.json is unreadable, naming the file; None when it holds a report.
    """

    folder: Path
    taken: float
    report: dict[str, Any] = field(default_factory=dict)
    error: str | None = None

    @property
    def first_bad(self) -> dict[str, Any] | None:
        """The first bad commit's summary (commit, short, subject, author_date, show), or None when the
        bisect named none (it failed, every candidate was skipped, or the report is unreadable)."""
        found = self.report.get("first_bad")
        return found if isinstance(found, dict) else None

    @property
    def tested(self) -> list[dict[str, Any]]:
        """The tested commits in test order, one object each as diff/bisect.py's `Tested.to_dict` writes
        it: commit, short, subject, verdict (good | bad | skip), reason, run (its run directory),
        status, seconds, cached, and first_step / metrics for a commit compared with the good one."""
        rows = self.report.get("tested")
        return [r for r in rows if isinstance(r, dict)] if isinstance(rows, list) else []


def read_report(path: Path) -> dict[str, Any] | str:
    """A bisect's report.json, or why it is unreadable (the message names the file): it cannot be read,
    is not JSON, or is not an object with a "tested" list."""
    obj = read_json_object(path, "bisect report")
    if isinstance(obj, str):
        return obj
    if not isinstance(obj.get("tested"), list):
        return f'{path} holds no bisect report (no "tested" list)'
    return obj


def list_reports(bisect_dir: Path) -> list[StoredBisect]:
    """Every BISECT_DIR/*/report.json, newest first; an unreadable one is kept with its `error`.

    A folder without report.json (a bisect still running, or one that died before its report) is not
    listed. A missing BISECT_DIR lists nothing.
    """
    if not bisect_dir.is_dir():
        return []
    folders = [p.parent for p in bisect_dir.glob(f"*/{REPORT}") if p.is_file()]
    out = []
    for folder in sorted(folders, key=stamp_order, reverse=True):
        taken = stamp_order(folder)[0]
        if taken == 0.0:
            taken = (folder / REPORT).stat().st_mtime
        report = read_report(folder / REPORT)
        if isinstance(report, str):
            out.append(StoredBisect(folder, taken, error=report))
        else:
            out.append(StoredBisect(folder, taken, report))
    return out


@dataclass(frozen=True)
class BisectRequest:
    """What the page's form asks `grpolab bisect` for (the command's flags, issue 13).

    Attributes:
        good / bad: the revisions (`--good`, `--bad`); repo: `--repo` ("" = the grpolab checkout).
        recording: `--recording TEMPLATE` ("" with `cmd`); cmd: `--cmd TEMPLATE with {run_dir}` ("" = none).
        num_rollout: `--num-rollout` (None = the command's default); metrics: `--metric KEY` each.
        tol: `--tol` (0 = bitwise); timeout_s: `--timeout` seconds per tested commit (None = default).
        output_dir: `--output-dir`, the folder the report's <UTC time>/ folder goes under.
        train_flags: the flags after `--`, as a user types them (split with shlex).
    """

    good: str
    bad: str
    output_dir: Path
    recording: str = ""
    repo: str = ""
    cmd: str = ""
    num_rollout: int | None = None
    metrics: tuple[str, ...] = ()
    tol: float = 0.0
    timeout_s: float | None = None
    train_flags: str = ""


def bisect_args(req: BisectRequest) -> list[str]:
    """The arguments after `grpolab` for `req`, in the order the issue writes them.

    Raises:
        ValueError: a required field is empty (--good, --bad, and --recording or --cmd), --tol is
            negative, or the train flags do not split (an unclosed quote); the message names the flag.
    """
    for flag, value in (("--good", req.good), ("--bad", req.bad)):
        if not value.strip():
            raise ValueError(f"{flag} is required")
    if not req.recording.strip() and not req.cmd.strip():
        raise ValueError("--recording (or --cmd) is required")
    if req.tol < 0:
        raise ValueError(f"--tol must be ≥ 0, got {req.tol:g}")
    try:
        extra = shlex.split(req.train_flags)
    except ValueError as e:
        raise ValueError(f"train flags after --: {e}") from None
    args = ["bisect", "--good", req.good.strip(), "--bad", req.bad.strip()]
    if req.repo.strip():
        args += ["--repo", req.repo.strip()]
    if req.recording.strip():
        args += ["--recording", req.recording.strip()]
    if req.cmd.strip():
        args += ["--cmd", req.cmd.strip()]
    if req.num_rollout is not None:
        args += ["--num-rollout", str(req.num_rollout)]
    for key in req.metrics:
        args += ["--metric", key]
    args += ["--tol", f"{req.tol:g}"]
    if req.timeout_s is not None:
        args += ["--timeout", f"{req.timeout_s:g}"]
    args += ["--output-dir", str(req.output_dir)]
    return [*args, "--", *extra] if extra else args

"""What `grpolab gate` reads: a run directory, a run's metrics file or a Miles/slime console log.

Every input must hold at least one `step` record, otherwise the gate cannot judge it
(`GateInputError`, exit 2); for a run directory the message says why, from its status.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from grpolab.checkers import step0
from grpolab.rundir import reader
from grpolab.rundir.completion import COMPLETE_STATUS, run_completion
from grpolab.rundir.foreign_logs import MetricRecord, parse_file


class GateInputError(ValueError):
    """The gate cannot judge: unreadable input, no step records, or a bad flag value (exit 2)."""


@dataclass(frozen=True)
class RunMetrics:
    """The records of one run or log.

    Attributes:
        path: the input as given; source: the file read (the run's metrics file or the log);
        records: file order; run_dir: the run directory when the input is one (or its metrics
        file), None for a foreign log or a loose .jsonl.
    """

    path: str
    source: str
    records: list[MetricRecord]
    run_dir: str | None = None

    @property
    def first_step(self) -> MetricRecord:
        """Step 0: the first `step` record in file order (load_run guarantees one exists)."""
        rec = step0.first_step(self.records)
        assert rec is not None
        return rec

    def where(self, record: MetricRecord) -> dict[str, Any]:
        """Evidence fields of a record: `record` ("step 0", "rollout 3"), `file`, `line_no`."""
        label = f"step {record.step}" if record.kind == "step" else f"{record.kind} {record.index}"
        return {"record": label, "file": self.source, "line_no": record.line_no}


def _no_step_reason(run_dir: Path) -> str:
    """Why a run directory holds no `step` record, from its completion (`rundir.completion`: failed
    with its error, interrupted, crashed, still running), or a finished run that did not train
    (`--debug-rollout-only`)."""
    done = run_completion(run_dir, [])
    if done.status == COMPLETE_STATUS:
        return "the run finished without a training step (a --debug-rollout-only run does not train)"
    return f"the run never reached its first step: {done.reason}"


def _read_records(p: Path, fmt: str) -> list[MetricRecord]:
    """The records of a metrics file (`fmt` "run") or a console log ("log").

    Raises:
        GateInputError: the file cannot be read, or a complete line of a metrics file is not a record.
    """
    try:
        if not p.is_file():
            p.open().close()  # the OSError that names why (no such file, a folder, no permission)
        if fmt == "log":
            return parse_file(p).records
        got = reader.read_metrics_file(p)
    except OSError as e:
        raise GateInputError(f"cannot read {p}: {e.strerror or e}") from None
    if got.bad_lines:  # a complete line that is not a record: cannot judge
        n, why = got.bad_lines[0]
        raise GateInputError(f"{p}:{n}: not a {reader.METRICS_FILE} record ({why})")
    return got.records


def load_run(path: str | Path) -> RunMetrics:
    """Read a run directory, a run's metrics file (.jsonl) or a Miles/slime console log.

    Raises:
        GateInputError: the path is missing or unreadable, a directory is not a run directory, or
            the input holds no `step` record (for a run directory: why, from its status, e.g. "the
            run never reached its first step: it failed at rollout 0: <its error>").
    """
    p = Path(path)
    if p.is_dir():
        if not reader.is_run_dir(p):
            raise GateInputError(f"{p} is not a run directory (none of {', '.join(reader.RUN_MARKERS)})")
        p, fmt = p / reader.METRICS_FILE, "run"
    else:
        fmt = "run" if p.suffix == ".jsonl" else "log"
    run_dir = p.parent if fmt == "run" and reader.is_run_dir(p.parent) else None
    # a run that failed before its first metric has no metrics file: said below, from its status
    records = [] if run_dir is not None and not p.exists() else _read_records(p, fmt)
    if not any(r.kind == "step" for r in records):
        if run_dir is not None:
            raise GateInputError(f"no step record in {run_dir}: {_no_step_reason(run_dir)}; nothing to judge")
        what = 'records of kind "step"' if fmt == "run" else "`step N: {...}` lines"
        raise GateInputError(f"no {what} in {p}; nothing to judge (did the run reach its first step?)")
    return RunMetrics(str(path), str(p), records, None if run_dir is None else str(run_dir))


__all__ = ["GateInputError", "RunMetrics", "load_run"]

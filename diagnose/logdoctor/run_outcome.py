"""What a grpolab run directory records of how its run ended, for the log doctor: `read_run_outcome`.

console.log holds rank 0's output only (the other ranks print to the terminal of `grpolab train`),
so in a multi-rank run that fails, the rank that failed first may be missing from it and rank 0's
final error is often a side effect (gloo: "Connection closed by peer"). Every rank records its own
exception in `ranks/<rank>.json` ("error": type, message and traceback tail, rundir/writer.py
`describe_exception`); this module reads those and the run's final status through the run-directory
reader (`rundir.reader.read_ranks`, `final_status_event`), orders them as `grpolab diagnose hang` does
(common/rank_errors.py), and says where each error is written, so that findings can cite
`ranks/<rank>.json:<line>`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from grpolab.diagnose.common.rank_errors import RankError, recorded_errors
from grpolab.rundir.reader import final_status_event, read_ranks

_ERROR_KEY = re.compile(r'^\s*"error"\s*:')


@dataclass(frozen=True)
class RecordedError:
    """One rank's recorded exception and where it is written.

    Attributes:
        error: the rank, its error text and its heartbeat time (common/rank_errors.py).
        file: the rank file as named in evidence (`<RUN_DIR as given>/ranks/<rank>.json`).
        line: 1-based line of the file's `"error":` key (1 when the file is written on one line).
        text: that line as in the file (trailing whitespace removed).
    """

    error: RankError
    file: str
    line: int
    text: str


@dataclass(frozen=True)
class RunOutcome:
    """What a run directory records of how its run ended.

    Attributes:
        directory: the run directory as given.
        rank_errors: every rank's recorded error, root cause first (`rank_errors.order_rank_errors`).
        last_status: the `status` of events.jsonl's last line when that line is a status event
            (finished | failed | interrupted), else None (no events.jsonl, still running, killed).
        problems: rank files that could not be used, one line each (named, with the reason).
    """

    directory: str
    rank_errors: tuple[RecordedError, ...] = ()
    last_status: str | None = None
    problems: tuple[str, ...] = ()

    @property
    def ordered_errors(self) -> list[RankError]:
        """The recorded errors alone, root cause first (for `rank_errors.error_label`)."""
        return [r.error for r in self.rank_errors]


def _error_line(path: Path) -> tuple[int, str]:
    """(1-based line, text) of the rank file's `"error":` key; (1, first line) when none is found."""
    try:
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return 1, ""
    for n, text in enumerate(lines, 1):
        if _ERROR_KEY.match(text):
            return n, text.rstrip()
    return 1, lines[0].rstrip() if lines else ""


def read_run_outcome(run_dir: str | Path) -> RunOutcome:
    """Every rank's recorded error (root cause first) and the final status of a grpolab run directory.

    A directory without `ranks/*.json` (a console.log copied alone) gives no rank errors and no
    problems; a rank file that is not usable (not JSON, no pid, …) is named in `problems` and skipped.
    Never raises for the run directory's contents; the caller has checked that it is a directory.

    Args:
        run_dir: the run directory as the user gave it (evidence names files under it).
    """
    directory = str(run_dir)
    path = Path(run_dir)
    final = final_status_event(path)
    status = None if final is None else str(final["status"])
    ranks, problems = read_ranks(path)
    files = {r.rank: Path(r.source) for r in ranks}
    recorded = []
    for error in recorded_errors(ranks):
        source = files[error.rank]
        line, text = _error_line(source)
        recorded.append(RecordedError(error, str(source), line, text))
    return RunOutcome(directory, tuple(recorded), status, tuple(problems))


__all__ = ["RecordedError", "RunOutcome", "read_run_outcome"]

"""Log-doctor rules for how a failed `grpolab train` ends: the error line its log ends with, and (for a
run directory) every rank's recorded error, root cause first.

A failed run's console.log ends with `grpolab train: error: <Type>: <message>` (train/loop.py writes it
before the run directory closes the log; the command prints the same error on stderr). A multi-rank
run's root cause is the first error that is not a lost peer connection (common/rank_errors.py); the others
are its consequences. An engine give-up line is engine_dead_timeout's or engine_gone's (logdoctor/rules/announcements.py,
engine_gone.py).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import TYPE_CHECKING

from grpolab.diagnose.common.rank_errors import RankError, error_label, first_line, is_peer_connection_error
from grpolab.diagnose.logdoctor.model import (
    MAX_EVIDENCE,
    Evidence,
    Finding,
    Line,
    Rule,
    Severity,
    launcher_rank,
    register,
    trim_line,
)
from grpolab.diagnose.logdoctor.rules.announcements import (
    FAULT_FLAG,
    FaultInjected,
    injected_note,
    is_engine_error,
)

if TYPE_CHECKING:
    from grpolab.diagnose.logdoctor.ruleset import LogRules
    from grpolab.diagnose.logdoctor.run_outcome import RecordedError, RunOutcome

RANK_TITLE_CHARS = 120
"""Characters of a recorded error's first line shown in a rank_error title (grpolab's: one terminal line
with the rank and its label)."""

_FRAME = re.compile(r'File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<func>\S+)')
_TRAIN_ERROR_PREFIX = "grpolab train: error: "
_LAUNCHER_SUMMARY = re.compile(
    r"grpolab train: error: rank \d+ failed \((?:exit code -?\d+|killed by \w+)\).*its error is above"
)
"""The line the multi-rank launcher ends with (train/launch.py): it names the rank whose error is printed
above, so it is not an error of its own."""
_TRAIN_ERROR = re.compile(
    r"grpolab train: error: (?:(?P<type>[A-Za-z_][\w.]*(?:Error|Exception|Fault|Failure|Exit)): )?"
    r"(?P<message>.*)"
)


@register
class TrainFailed(Rule):
    """`grpolab train: error: …`: the line a failed run ends with (the engine's give-up has its own rule).

    A log with several such lines (a terminal capture of a multi-rank run: every rank prints its own)
    is headlined by its root cause: the first line that is not a lost peer connection
    (`rank_errors.is_peer_connection_error`), else the first line; the others are listed as its
    consequences. For a run directory whose ranks recorded their errors, `rank_error` reports them
    (root cause first) and takes this log's error line as evidence, so this rule then says nothing.
    """

    id = "train_failed"
    severity = "error"
    needles = (b"grpolab train: error: ",)
    source = "grpolab train (the error line a failed run ends with; train/loop.py)"

    def __init__(self, log: LogRules) -> None:
        super().__init__(log)
        self.lines: list[tuple[Line, re.Match[str]]] = []
        """The error lines of this rule (not an engine give-up), in file order."""
        self.errors: list[tuple[Line, str]] = []
        """Every `grpolab train: error:` line (engine give-ups too) and its error text after that prefix."""

    def observe(self, line: Line) -> None:
        m = _TRAIN_ERROR.search(line.text)
        if m is None or _LAUNCHER_SUMMARY.search(line.text):  # the launcher's pointer to the lines above
            return
        self.errors.append((line, line.text[m.start() + len(_TRAIN_ERROR_PREFIX) :].strip()))
        if not is_engine_error(line.text):  # a dead engine: engine_dead_timeout or engine_gone
            self.lines.append((line, m))

    def line_of(self, error: RankError) -> Line | None:
        """This log's `grpolab train: error:` line that prints a rank's recorded `error`, or None.

        The run's line reads `<Type>: <message>` like the recorded error's first line; the command's
        stderr line (a terminal capture) has the message only.
        """
        recorded = first_line(error.error)
        return next((line for line, text in self.errors if _same_error(text, recorded)), None)

    def findings(self, earlier: Sequence[Finding]) -> list[Finding]:
        if not self.lines or self._told_by_rank_error():
            return []
        peer = [is_peer_connection_error(ln.text) for ln, _ in self.lines]
        root_at = min(range(len(self.lines)), key=lambda i: (peer[i], i))
        line, m = self.lines[root_at]
        kind = m["type"]
        error = f"{kind}: {m['message']}" if kind else m["message"]
        injected = kind == "InjectedFault" or m["message"].startswith("injected fault: ")
        fault = self.log.rule(FaultInjected).before(line.line) if injected else None
        rank = launcher_rank(line.text)
        after = f"rank {rank}" if rank is not None else f"the error at line {line.line}"
        others = [i for i in range(len(self.lines)) if i != root_at]
        shown = sorted([root_at, *others[: MAX_EVIDENCE - 1]])
        consequences = [self.lines[i][0].line for i in others if peer[i]]
        separate = [self.lines[i][0].line for i in others if not peer[i]]
        headline = line.text[m.start() + len(_TRAIN_ERROR_PREFIX) :].strip()
        cause = self._cause(headline, peer[root_at], consequences, separate)
        return [
            self.finding(
                trim_line(f"grpolab train failed: {error}", width=160),
                (self.ev(self.lines[i][0], _note(i, root_at, peer, after)) for i in shown),
                {
                    "type": kind,
                    "message": m["message"],
                    "lines": len(self.lines),
                    "root_line": line.line,
                    "rank": rank,
                    "consequence_lines": consequences,
                    "other_lines": separate,
                    "injected": fault is not None,
                },
                cause=cause + injected_note(fault),
                fix=f"Nothing to fix if the fault was meant ({FAULT_FLAG})." if fault else _TRAIN_FAILED_FIX,
            )
        ]

    def _told_by_rank_error(self) -> bool:
        """Every error line of this log is a rank's recorded error, which `rank_error` reports."""
        run = self.log.run
        if run is None or not reports_rank_errors(self.log):
            return False
        printed = {ln.line: text for ln, text in self.errors}
        recorded = [first_line(r.error.error) for r in run.rank_errors]
        return all(any(_same_error(printed[ln.line], r) for r in recorded) for ln, _ in self.lines)

    def _cause(self, headline: str, root_is_peer: bool, consequences: list[int], separate: list[int]) -> str:
        """Why the run stopped: the root error line, which rank recorded it, and what the other lines are."""
        run = self.log.run
        cause = "The run stopped with this error: a failed `grpolab train` ends with this line."
        if run is not None and run.last_status == "failed":
            cause += " The run directory's events.jsonl ends with status failed."
        for recorded in run.rank_errors if run is not None else ():
            if _same_error(headline, first_line(recorded.error.error)):
                cause += f" Rank {recorded.error.rank} recorded it in {recorded.file}."
                break
        if consequences and not root_is_peer:
            verb, pronoun = ("reports", "it follows") if len(consequences) == 1 else ("report", "they follow")
            cause += (
                f" The later {_lines(consequences)} {verb} a lost connection to a peer (gloo's "
                f"\"Connection closed by peer\", NCCL's remote error): {pronoun} from it, since a rank's "
                "failure closes its connections and its peers' next collective fails."
            )
        elif root_is_peer and len(self.lines) > 1:
            cause += (
                " Every error line here reports a lost connection to a peer: the rank that failed first did "
                "not print its error to this log (killed by a signal or the OOM killer?)."
            )
        if separate:
            what = "is not a lost connection: it" if len(separate) == 1 else "are not lost connections: they"
            cause += f" The {_lines(separate)} {what} may be a separate problem."
        return cause


_TRAIN_FAILED_FIX = (
    "Read the message: it names the flag, file or check at fault; fix that and start the run again. "
    "The lines above it show what the run was doing. With several ranks, every rank's error is in "
    "RUN_DIR/ranks/<rank>.json: `grpolab diagnose log RUN_DIR` reports them, root cause first."
)


def _note(i: int, root_at: int, peer: Sequence[bool], after: str) -> str:
    """The evidence note of error line `i` of several: root cause, a consequence, another error."""
    if len(peer) == 1:
        return ""
    if i == root_at:
        return "earliest; a lost peer connection" if peer[i] else "root cause"
    if not peer[i]:
        return "another error"
    return (
        "lost the connection to a peer"
        if peer[root_at]
        else f"a consequence: lost the connection to a peer after {after}"
    )


def _same_error(printed: str, recorded: str) -> bool:
    """Whether an error line's text (after `grpolab train: error: `) prints a recorded error's first line:
    the same `<Type>: <message>`, or its message alone (the command's stderr line)."""
    return bool(printed) and (printed == recorded or recorded.endswith(": " + printed))


def _lines(numbers: Sequence[int]) -> str:
    """`error line 7` or `error lines 7, 9`."""
    return f"error line{'s' * (len(numbers) > 1)} {', '.join(map(str, numbers))}"


def reports_rank_errors(log: LogRules) -> bool:
    """Whether `rank_error` reports the run directory's recorded rank errors: two or more ranks recorded
    one, or the only one is not an error line of this log (then only the rank file tells it)."""
    run = log.run
    if run is None or not run.rank_errors:
        return False
    return len(run.rank_errors) > 1 or log.rule(TrainFailed).line_of(run.rank_errors[0].error) is None


@register
class RankFailed(Rule):
    """Every rank's recorded exception (`ranks/<rank>.json` "error"), root cause first, for a run directory.

    console.log holds rank 0's output only, so in a multi-rank run the rank that failed first is often
    missing from it, and rank 0's final error is a side effect ("Connection closed by peer"). The order
    is `grpolab diagnose hang`'s (common/rank_errors.py): an error that is not a lost peer connection first,
    then the earliest heartbeat. A lost connection after another rank's error is its consequence
    (severity info); every other recorded error is an error. A run with one recorded error that its
    log already prints gets no finding here (train_failed or engine_dead_timeout tells it).
    """

    id = "rank_error"
    severity = "error"
    source = (
        'grpolab\'s run directory: ranks/<rank>.json "error" (rundir/writer.py); root cause first as in '
        "`grpolab diagnose hang` (a lost peer connection is a consequence, else the earliest heartbeat)"
    )

    def findings(self, earlier: Sequence[Finding]) -> list[Finding]:
        run = self.log.run
        if run is None or not reports_rank_errors(self.log):
            return []
        ordered = run.ordered_errors
        return [self._finding(recorded, ordered, run) for recorded in run.rank_errors]

    def _finding(self, recorded: RecordedError, ordered: Sequence[RankError], run: RunOutcome) -> Finding:
        e, root = recorded.error, ordered[0]
        label = error_label(e, ordered)
        kind, _, message = first_line(e.error).partition(": ")
        frames = [f"{m['file']}:{m['line']} in {m['func']}" for m in _FRAME.finditer(e.error)]
        log_line = self.log.rule(TrainFailed).line_of(e)
        evidence = [Evidence(recorded.file, recorded.line, trim_line(recorded.text), label)]
        if log_line is not None:
            evidence.append(self.ev(log_line, "the run's final error line"))
        if e is root and not e.peer_connection_error:
            severity: Severity = "error"
            title, cause, fix = _root_cause_text(e, ordered, frames, printed=log_line is not None, run=run)
        elif e is root:
            severity, (title, cause, fix) = "error", _earliest_peer_text(e)
        elif e.peer_connection_error:
            severity, (title, cause, fix) = "info", _consequence_text(e, root)
        else:
            severity, (title, cause, fix) = "error", _second_error_text(e, root, frames)
        return self.finding(
            title,
            evidence,
            {
                "rank": e.rank,
                "error": e.error,
                "type": kind if message else None,
                "message": message or kind,
                "label": label,
                "root_cause": e is root,
                "peer_connection_error": e.peer_connection_error,
                "heartbeat_time": e.time,
                "frames": frames,
                "injected": kind == "InjectedFault",
                "file": recorded.file,
                "log_line": None if log_line is None else log_line.line,
            },
            severity=severity,
            cause=cause,
            fix=fix,
        )


def _where(frames: Sequence[str]) -> str:
    return f"; its innermost frames: {', '.join(frames)}" if frames else ""


def _root_cause_text(
    e: RankError, ordered: Sequence[RankError], frames: Sequence[str], *, printed: bool, run: RunOutcome
) -> tuple[str, str, str]:
    """(title, cause, fix) of the root cause: the first recorded error that is not a lost connection."""
    r = e.rank
    injected = first_line(e.error).partition(": ")[0] == "InjectedFault"
    title = f"rank {r} {'failed first' if len(ordered) > 1 else 'failed'}: {first_line(e.error, RANK_TITLE_CHARS)}"
    cause = (
        f"Rank {r}'s training loop raised this exception and recorded it in ranks/{r}.json{_where(frames)}."
    )
    later = [x.rank for x in ordered[1:] if x.peer_connection_error]
    if later:
        cause += (
            f" The error{'s' * (len(later) > 1)} of {_ranks(later)} "
            f"{'is a lost connection' if len(later) == 1 else 'are lost connections'} to it that "
            "followed: when a rank fails, its connections close and its peers' next collective fails."
        )
    if not printed and r != 0:
        cause += (
            f" console.log holds rank 0's output only: rank {r} printed this error on the terminal "
            "of `grpolab train`."
        )
    if run.last_status == "failed":
        cause += " The run ended with status failed (events.jsonl's last line)."
    if injected:
        cause += f" It is a CI fault injected on purpose ({FAULT_FLAG}): the expected outcome of a test."
        return title, cause, f"Nothing to fix if the fault was meant ({FAULT_FLAG})."
    output = (
        "console.log has its whole output"
        if r == 0
        else f"rank {r}'s whole output is on the terminal of `grpolab train`"
    )
    fix = f'Fix this error first: its traceback tail is "error" in ranks/{r}.json and {output}; then start the run again.'
    return title, cause, fix


def _earliest_peer_text(e: RankError) -> tuple[str, str, str]:
    """(title, cause, fix) when every recorded error is a lost connection: the earliest of them."""
    return (
        f"rank {e.rank} recorded the earliest error, a lost peer connection: {first_line(e.error, RANK_TITLE_CHARS)}",
        f"Every recorded error is a lost connection to a peer; rank {e.rank}'s heartbeat is the earliest. "
        "The rank that failed first did not record its exception: it was killed (a signal, the OOM "
        "killer) or its host went down.",
        "Find the rank that died first: torchrun's summary on the terminal of `grpolab train` gives "
        "every rank's exit code or signal; `dmesg` (or `journalctl -k`) shows the OOM killer.",
    )


def _consequence_text(e: RankError, root: RankError) -> tuple[str, str, str]:
    """(title, cause, fix) of a lost connection recorded after the root cause."""
    r, head = e.rank, first_line(e.error, RANK_TITLE_CHARS)
    fix = f"Nothing to fix on rank {r}: fix rank {root.rank}'s error (the first finding)."
    if root.peer_connection_error:
        title = f"rank {r}: {head} (a lost peer connection too)"
        return (
            title,
            f"Rank {r}'s collective failed: its connection to a peer closed, as rank {root.rank}'s did.",
            fix,
        )
    title = f"rank {r}: {head} (a consequence of rank {root.rank}'s failure)"
    cause = (
        f"Rank {r}'s collective failed because its connection to a peer closed: rank {root.rank} "
        f"failed first ({first_line(root.error, RANK_TITLE_CHARS)})."
    )
    return title, cause, fix


def _second_error_text(e: RankError, root: RankError, frames: Sequence[str]) -> tuple[str, str, str]:
    """(title, cause, fix) of another recorded error that is not a lost connection."""
    r = e.rank
    return (
        f"rank {r} failed too: {first_line(e.error, RANK_TITLE_CHARS)}",
        f"Rank {r} recorded this exception as well{_where(frames)}. It is not a lost peer connection, so it "
        f"may be a second problem (rank {root.rank}'s error came first).",
        f'Fix it too: its traceback tail is "error" in ranks/{r}.json.',
    )


def _ranks(ranks: Sequence[int]) -> str:
    """`rank 0` or `ranks 0, 2`."""
    return f"rank{'s' * (len(ranks) > 1)} {', '.join(map(str, ranks))}"

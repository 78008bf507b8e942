"""`grpolab diagnose hang` on something that is no longer running: the verdict "not hung", and why.

Two cases, both exit 0: a run directory whose ranks are all gone after the run wrote its final
`status` event (finished, failed, interrupted), and `--pid` / `--match` processes that all ended
during the diagnosis. For a failed run every rank's recorded error (ranks/<r>.json "error") is
shown root cause first (common/rank_errors.py): in a multi-rank run the final status often carries a side
effect ("Connection closed by peer") while the rank that failed first recorded the real error.
A run directory whose ranks are all gone without a final status is not handled here: the caller
reports it as could-not-inspect (killed?).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from grpolab.diagnose.common.rank_errors import RankError, error_label, first_line, recorded_errors
from grpolab.diagnose.hang.activity import RunContext
from grpolab.diagnose.hang.progress import ProgressCheck
from grpolab.diagnose.hang.targets import RankTarget
from grpolab.diagnose.hang.verdict.classify import Verdict, classify
from grpolab.diagnose.hang.verdict.rank_rows import RankObservation

SHORT_CHARS = 100
"""Evidence lines cut an error's first line to this many characters (grpolab's: one terminal line);
the whole recorded error is printed above the evidence."""


def _gone_line(target: RankTarget, why: str | None) -> str:
    reason = why or "exited"
    return f"rank {target.rank} (pid {target.pid}): {reason}"


def ended_run_check(run: RunContext, stall_seconds: float) -> ProgressCheck:
    """The progress check of a run whose ranks are gone after its final status (outcome "ended")."""
    status = run.final_status or {}
    return ProgressCheck(
        "ended",
        f"the run ended (final status {status.get('status')!r}); no rank process is alive",
        0.0,
        stall_seconds,
        None,
        samples=0,
    )


def ended_run_verdict(
    observations: Sequence[RankObservation],
    targets: Sequence[RankTarget],
    gone: dict[int, str],
    run: RunContext,
) -> Verdict:
    """Not hung: the run ended. Title, evidence and next steps name the rank that failed first.

    Args:
        observations: every rank, all gone (no stacks).
        gone: rank → why it is gone (targets.rank_liveness).
        run: the run directory's context; `run.final_status` must be set.
    """
    status = run.final_status or {}
    name = status.get("status")
    status_error = str(status.get("error") or "")
    errors = recorded_errors(targets)
    by_rank = {e.rank: e for e in errors}
    title = f"Not hung: the run ended (final status {name!r})"
    root = errors[0] if errors else None
    if root is not None:
        verb = (
            "failed"
            if len(errors) == 1
            else ("recorded first" if root.peer_connection_error else "failed first")
        )
        title += f"; rank {root.rank} {verb}: {first_line(root.error)}"
    elif status_error:
        title = f"Not hung: the run ended (final status {name!r}: {first_line(status_error)})"
    evidence = []
    for t in targets:
        line = _gone_line(t, gone.get(t.rank))
        if t.rank in by_rank:
            label = error_label(by_rank[t.rank], errors)
            recorded = first_line(by_rank[t.rank].error, SHORT_CHARS)
            line += f"; it recorded {recorded}" + (f" ({label})" if label else "")
        evidence.append(line)
    failed_first = root is not None and name != "finished"
    if failed_first and status_error and first_line(status_error) != first_line(root.error):
        evidence.append(
            f"the final status's error ({first_line(status_error, SHORT_CHARS)}) is not the root cause: "
            f"rank {root.rank}'s error came first"
        )
    steps = _ended_steps(name, errors)
    base = classify(observations, progressed=True)
    return dataclasses.replace(base, title=title, evidence=tuple(evidence), next_steps=tuple(steps))


def _ended_steps(status: str | None, errors: Sequence[RankError]) -> list[str]:
    """The next steps after a run ended with `status`, its recorded errors root cause first."""
    root = errors[0] if errors else None
    if root is not None and status != "finished":
        steps = [
            f"Fix the error on rank {root.rank} first: {first_line(root.error)} (its traceback tail is "
            f'"error" in ranks/{root.rank}.json; console.log has the whole log).'
        ]
        consequences = [e.rank for e in errors[1:] if e.peer_connection_error]
        if consequences and not root.peer_connection_error:
            ranks = ", ".join(map(str, consequences))
            steps.append(
                f"The error{'s' * (len(consequences) > 1)} of rank{'s' * (len(consequences) > 1)} {ranks} "
                f"follow{'s' * (len(consequences) == 1)} from it: the connection to rank {root.rank} closed "
                "when it failed."
            )
        return steps
    if status == "failed":
        return ["Read console.log for the error that ended the run (no rank recorded one)."]
    if status == "interrupted":
        return ["The run was interrupted (Ctrl-C or a signal), not hung: resume or restart it."]
    return []


def processes_ended(
    observations: Sequence[RankObservation],
    targets: Sequence[RankTarget],
    gone: dict[int, str],
    stall_seconds: float,
    samples: int,
) -> tuple[ProgressCheck, Verdict]:
    """Not hung: every `--pid` / `--match` process ended during the diagnosis (no run directory)."""
    pids = ", ".join(f"pid {t.pid}" for t in targets)
    reason = f"every process ended during the diagnosis ({pids}): nothing is left to hang"
    check = ProgressCheck("ended", reason, 0.0, stall_seconds, None, samples=samples)
    base = classify(observations, progressed=True)
    verdict = dataclasses.replace(
        base,
        title=f"Not hung: the processes ended during the diagnosis ({pids})",
        evidence=tuple(_gone_line(t, gone.get(t.rank)) for t in targets),
        next_steps=(
            "If they should still be running, read their logs for how they ended (exit status, last lines).",
        ),
    )
    return check, verdict

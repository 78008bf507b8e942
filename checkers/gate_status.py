"""The gate's first row for a run directory: the run finished and ran every rollout it was asked for.

A CI gate must not pass a run whose metrics look healthy up to the moment it failed: a run whose
status is failed, crashed, interrupted or still running, or that ran fewer rollouts than
`--num-rollout`, fails the `status` check (exit 1), naming the status and its reason
(`rundir.completion`). `--allow-status S ...` accepts those statuses (`any`: every status and fewer
rollouts, the gate's behaviour before this check). Foreign logs record no status: no row.
"""

from __future__ import annotations

from collections.abc import Sequence

from grpolab.rundir.completion import COMPLETE_STATUS, RunCompletion

ALLOWABLE_STATUSES = ("failed", "interrupted", "running", "crashed")
"""The statuses `--allow-status` may accept (finished is always accepted)."""
ANY_STATUS = "any"
"""`--allow-status any`: every status, and fewer rollouts than asked."""


def parse_allow_status(values: Sequence[str]) -> frozenset[str]:
    """`--allow-status` values (each may hold commas) as a set.

    Raises:
        ValueError: a value is not one of ALLOWABLE_STATUSES or `any` (the message names the flag).
    """
    out: set[str] = set()
    for value in values:
        for part in filter(None, (p.strip() for p in value.split(","))):
            if part not in (*ALLOWABLE_STATUSES, ANY_STATUS):
                choices = ", ".join((*ALLOWABLE_STATUSES, ANY_STATUS))
                raise ValueError(f"--allow-status {part!r}: expected one or more of {choices}")
            out.add(part)
    return frozenset(out)


def status_verdict(completion: RunCompletion, allowed: frozenset[str]) -> tuple[bool, str]:
    """(passed, detail) of the status row: passed when the run is complete, or its status is
    allowed (`any` also accepts a finished run with fewer rollouts). detail names the status and
    its reason, and the flag that would accept it."""
    if completion.complete:
        return True, ""
    if ANY_STATUS in allowed or (completion.status != COMPLETE_STATUS and completion.status in allowed):
        return True, f"{completion.describe()} (accepted by --allow-status)"
    flag = ANY_STATUS if completion.status == COMPLETE_STATUS else completion.status
    return False, f"the run is {completion.describe()}; --allow-status {flag} accepts it"


def expectation(completion: RunCompletion) -> str:
    """The rule in words: `finished, 40/40 rollouts`."""
    asked = completion.rollouts_asked
    return f"{COMPLETE_STATUS}, {asked}/{asked} rollouts" if asked is not None else COMPLETE_STATUS


__all__ = ["ALLOWABLE_STATUSES", "ANY_STATUS", "expectation", "parse_allow_status", "status_verdict"]

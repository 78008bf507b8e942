"""Did the run progress between the two stack samples? grpolab's hang confirmation rule; pure.

`decide_progress` takes what `grpolab diagnose hang` observed and decides:
- progressed if any `ranks/*.json`, `metrics.jsonl` or `events.jsonl` changed between the two
  samples (a heartbeat, a metric line or an event was written: the run moves);
- otherwise hung if every rank's stack is identical in both samples (nothing moved in `--interval`
  seconds: the AReaL guide's step 1 "confirm the hang", done by machine);
- otherwise (some stacks moved) hung only if the newest heartbeat / metrics / event is at least
  `--stall-seconds` old (a loop that runs but never reaches the next phase), else progressed.
  Heartbeats are written at phase boundaries only, so a long rollout moves its stacks while its
  heartbeat ages: stale heartbeats alone never make a hang while the stacks still move within the
  stall window.
With one sample (`--interval 0`) or no rank sampled twice, the age of the newest heartbeat /
metrics / event against `--stall-seconds` decides alone (with no age at all the run counts as not
progressed and the reason says so: not confirmed). Without a run directory (`--pid`, `--match`)
there are no heartbeats: the two samples decide.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class ProgressCheck:
    """Whether the run moved, and the figures the decision used (ages in seconds)."""

    progressed: bool
    reason: str
    interval_s: float
    stall_seconds: float
    newest_activity_age_s: float | None
    files_changed: tuple[str, ...] = ()
    ranks_compared: tuple[int, ...] = ()
    ranks_moved: tuple[int, ...] = ()
    note: str | None = None
    """A caveat on a hang decided by identical stacks while heartbeats are still fresh."""


def decide_progress(
    *,
    files_changed: Sequence[str],
    ranks_compared: Sequence[int],
    ranks_moved: Sequence[int],
    newest_activity_age_s: float | None,
    stall_seconds: float,
    interval_s: float,
) -> ProgressCheck:
    """grpolab's hang confirmation rule (the module docstring); pure.

    Args:
        files_changed: run-directory files that changed between the two samples.
        ranks_compared: ranks dumped in both samples.
        ranks_moved: those of `ranks_compared` whose stacks differ between the samples.
        newest_activity_age_s: seconds since the freshest heartbeat, metrics or event write; None
            without a run directory.
        stall_seconds: `--stall-seconds`.
        interval_s: `--interval` (0: one sample only).
    """
    common = dict(
        interval_s=interval_s,
        stall_seconds=stall_seconds,
        newest_activity_age_s=newest_activity_age_s,
        files_changed=tuple(files_changed),
        ranks_compared=tuple(ranks_compared),
        ranks_moved=tuple(ranks_moved),
    )
    age = newest_activity_age_s
    stale = age is not None and age >= stall_seconds
    age_text = "" if age is None else f"the newest heartbeat/metrics/event is {age:.1f} s old"
    if files_changed:
        shown = ", ".join(files_changed[:4]) + (" …" if len(files_changed) > 4 else "")
        return ProgressCheck(
            True, f"the run wrote {shown} during the {interval_s:g} s between the two samples", **common
        )
    if not ranks_compared:
        if age is None:
            return ProgressCheck(
                False, "no rank could be sampled twice and there is no heartbeat: not confirmed", **common
            )
        if stale:
            return ProgressCheck(False, f"{age_text} (>= --stall-seconds {stall_seconds:g})", **common)
        return ProgressCheck(True, f"{age_text} (< --stall-seconds {stall_seconds:g})", **common)
    if ranks_moved:
        moved = ", ".join(map(str, ranks_moved))
        if stale:
            return ProgressCheck(
                False,
                f"the stacks of rank(s) {moved} changed between samples {interval_s:g} s apart, but {age_text} "
                f"(>= --stall-seconds {stall_seconds:g}): code runs without reaching the next phase",
                **common,
            )
        tail = f" and {age_text} (< --stall-seconds {stall_seconds:g})" if age is not None else ""
        return ProgressCheck(
            True,
            f"the stacks of rank(s) {moved} changed between samples {interval_s:g} s apart{tail}",
            **common,
        )
    reason = f"every rank's stack is identical in two samples {interval_s:g} s apart"
    note = None
    if age is not None:
        reason += f", and no file of the run changed; {age_text}"
        if not stale:
            note = (
                f"the hang is younger than --stall-seconds {stall_seconds:g}; if the ranks are in a long "
                "but legitimate operation, run this command again later"
            )
    return ProgressCheck(False, reason, note=note, **common)

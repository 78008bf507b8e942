"""Did the run progress while `grpolab diagnose hang` watched it? grpolab's hang confirmation rule; pure.

`decide_progress` takes what the command observed and returns one of four outcomes (`OUTCOMES`):
- hung if a rank of a run directory exited (pid gone or reused) while the run wrote no final status:
  the other ranks cannot finish a collective without it, whatever else moves;
- progressed if any `ranks/*.json`, the metrics file or `events.jsonl` changed while the ranks were
  sampled (a heartbeat, a metric line or an event was written: the run moves);
- otherwise hung if every rank's stack is identical in both samples (nothing moved in `--interval`
  seconds: the AReaL guide's step 1 "confirm the hang", done by machine);
- otherwise (some stacks moved) hung only if the newest heartbeat / metrics / event is at least
  `--stall-seconds` old (a loop that runs but never reaches the next phase), else progressed.
  Heartbeats are written at phase boundaries only, so a long rollout moves its stacks while its
  heartbeat ages: stale heartbeats alone never make a hang while the stacks still move within the
  stall window.
With one sample (`--interval 0`), or when no rank could be sampled twice, nothing can be seen
moving: hung if the newest heartbeat / metrics / event is at least `--stall-seconds` old, else
not_confirmed (exit 2, with what to do: take two samples, or wait until the heartbeats are older
than `--stall-seconds`). Without a run directory (`--pid`, `--match`) there are no heartbeats: the
two samples decide. The fourth outcome, ended (every process is gone), is decided by the caller.

A hang's reason covers only the ranks compared: "every rank's stack is identical" is said only when
every rank was; otherwise it starts with what was not seen ("2 of 3 ranks inspected; rank 1 on host
h was not", "rank 0 exited during sampling", "no stack could be read for rank 2") and names the
ranks whose stacks are identical.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

OUTCOMES = ("progressed", "hung", "not_confirmed", "ended")


@dataclass(frozen=True)
class ProgressCheck:
    """What the run did while it was watched, and the figures the decision used (ages in seconds).

    `outcome` is one of OUTCOMES; `samples` is how many stack samples were taken (0, 1 or 2).
    """

    outcome: str
    reason: str
    interval_s: float
    stall_seconds: float
    newest_activity_age_s: float | None
    files_changed: tuple[str, ...] = ()
    ranks_compared: tuple[int, ...] = ()
    ranks_moved: tuple[int, ...] = ()
    ranks_exited: tuple[int, ...] = ()
    ranks_not_inspected: tuple[int, ...] = ()
    """Ranks on another host: not sampled (the reason names their host)."""
    ranks_gone: tuple[int, ...] = ()
    """Ranks whose process ended before or during sampling, outside the `ranks_exited` rule."""
    ranks_not_dumped: tuple[int, ...] = ()
    """Live local ranks py-spy could not read in every sample."""
    samples: int = 2
    note: str | None = None
    """A caveat (a hang decided by identical stacks while heartbeats are still fresh), or for
    not_confirmed what to do to decide."""

    def __post_init__(self) -> None:
        if self.outcome not in OUTCOMES:
            raise ValueError(f"ProgressCheck.outcome {self.outcome!r}: expected one of {', '.join(OUTCOMES)}")

    @property
    def progressed(self) -> bool:
        """True when the run moved or already ended (either way: not hung)."""
        return self.outcome in ("progressed", "ended")

    def to_dict(self) -> dict[str, Any]:
        """The JSON form (every field, plus "progressed")."""
        return {**dataclasses.asdict(self), "progressed": self.progressed}


def _ranks(ranks: Sequence[int]) -> str:
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(map(str, sorted(ranks)))


def _age_only(stall_text: str, *, one_sample: bool) -> str:
    """The caveat of a hang decided by the heartbeat age alone."""
    todo = "take two samples or raise --stall-seconds" if one_sample else "raise --stall-seconds"
    return (
        f"decided by the heartbeat age: heartbeats are written at phase changes only, so a healthy "
        f"phase longer than {stall_text} (a long rollout or train step) reads as a hang too; if the run "
        f"may be healthy, {todo}"
    )


def _unseen(
    compared: Sequence[int],
    not_inspected: Mapping[int, str],
    gone: Mapping[int, str],
    not_dumped: Sequence[int],
    total: int | None,
) -> str:
    """What the samples did not cover, e.g. "2 of 3 ranks inspected; rank 1 on host h was not"; ""
    when every rank was compared."""
    parts = []
    if not_inspected:
        total = total or len(set(compared) | set(not_inspected) | set(gone) | set(not_dumped))
        parts.append(f"{total - len(not_inspected)} of {total} ranks inspected")
        by_host: dict[str, list[int]] = {}
        for rank, host in sorted(not_inspected.items()):
            by_host.setdefault(host, []).append(rank)
        for host, ranks in by_host.items():
            parts.append(f"{_ranks(ranks)} on host {host} {'was' if len(ranks) == 1 else 'were'} not")
    by_how: dict[str, list[int]] = {}
    for rank, how in sorted(gone.items()):
        by_how.setdefault(how, []).append(rank)
    parts += [f"{_ranks(ranks)} {how}" for how, ranks in by_how.items()]
    if not_dumped:
        parts.append(f"no stack could be read for {_ranks(not_dumped)}")
    return "; ".join(parts)


@dataclass(frozen=True)
class _Watch:
    """What every branch of the rule words its reason with (ages in seconds)."""

    fields: dict[str, Any]
    """The ProgressCheck fields every outcome carries."""
    scope: str
    """What the samples did not cover, as a reason's prefix ("" when every rank was compared)."""
    age: float | None
    interval_s: float
    samples: int
    stall_text: str

    @property
    def stale(self) -> bool:
        """The newest heartbeat / metrics / event is at least --stall-seconds old."""
        return self.age is not None and self.age >= self.fields["stall_seconds"]

    @property
    def age_text(self) -> str:
        return "" if self.age is None else f"the newest heartbeat/metrics/event is {self.age:.1f} s old"

    def check(self, outcome: str, reason: str, note: str | None = None) -> ProgressCheck:
        return ProgressCheck(outcome, reason, note=note, **self.fields)


def decide_progress(
    *,
    files_changed: Sequence[str],
    ranks_compared: Sequence[int],
    ranks_moved: Sequence[int],
    newest_activity_age_s: float | None,
    stall_seconds: float,
    interval_s: float,
    samples: int = 2,
    ranks_exited: Sequence[int] = (),
    ranks_not_inspected: Mapping[int, str] | None = None,
    ranks_gone: Mapping[int, str] | None = None,
    ranks_not_dumped: Sequence[int] = (),
    ranks_total: int | None = None,
) -> ProgressCheck:
    """grpolab's hang confirmation rule (the module docstring); pure. Never returns "ended".

    Args:
        files_changed: run-directory files that changed while the ranks were sampled.
        ranks_compared: ranks dumped in both samples.
        ranks_moved: those of `ranks_compared` whose stacks differ between the samples.
        newest_activity_age_s: seconds since the freshest heartbeat, metrics or event write; None
            without a run directory.
        stall_seconds: `--stall-seconds`.
        interval_s: seconds between the two samples (`--interval`; 0 with one sample).
        samples: stack samples taken (1 with `--interval 0`).
        ranks_exited: ranks of a run directory that are gone while the run wrote no final status.
        ranks_not_inspected: rank → host, for the ranks on another host (not sampled).
        ranks_gone: rank → how it went, completing "rank N …" (e.g. "exited during sampling"), for
            ranks gone outside the `ranks_exited` rule (`--pid`, `--match`).
        ranks_not_dumped: live local ranks py-spy could not read in every sample.
        ranks_total: how many ranks there are (default: those compared plus those listed above).
    """
    not_inspected, gone = dict(ranks_not_inspected or {}), dict(ranks_gone or {})
    fields: dict[str, Any] = dict(
        interval_s=interval_s,
        stall_seconds=stall_seconds,
        newest_activity_age_s=newest_activity_age_s,
        files_changed=tuple(files_changed),
        ranks_compared=tuple(ranks_compared),
        ranks_moved=tuple(ranks_moved),
        ranks_exited=tuple(ranks_exited),
        ranks_not_inspected=tuple(sorted(not_inspected)),
        ranks_gone=tuple(sorted(gone)),
        ranks_not_dumped=tuple(sorted(ranks_not_dumped)),
        samples=samples,
    )
    unseen = _unseen(ranks_compared, not_inspected, gone, ranks_not_dumped, ranks_total)
    scope = f"{unseen}; " if unseen else ""
    watch = _Watch(
        fields, scope, newest_activity_age_s, interval_s, samples, f"--stall-seconds {stall_seconds:g}"
    )
    decided = _rank_lost_or_file_written(watch, ranks_exited, files_changed)
    if decided is not None:
        return decided
    if not ranks_compared:
        return _nothing_compared(watch)
    if ranks_moved:
        return _stacks_moved(watch, ranks_moved)
    return _stacks_identical(watch, ranks_compared, every_rank=not unseen)


def _rank_lost_or_file_written(
    watch: _Watch, ranks_exited: Sequence[int], files_changed: Sequence[str]
) -> ProgressCheck | None:
    """Hung when a rank exited without the run's final status; else progressed when a run file
    changed; else None (the stacks decide)."""
    if ranks_exited:
        return watch.check(
            "hung",
            f"{watch.scope}{_ranks(sorted(ranks_exited))} exited and the run wrote no final status: the "
            "other ranks cannot finish a collective without it",
        )
    if not files_changed:
        return None
    shown = ", ".join(files_changed[:4]) + (" …" if len(files_changed) > 4 else "")
    when = (
        f"during the {watch.interval_s:g} s between the two samples"
        if watch.samples >= 2
        else "while its ranks were sampled"
    )
    return watch.check("progressed", f"the run wrote {shown} {when}")


def _nothing_compared(watch: _Watch) -> ProgressCheck:
    """No rank was dumped in two samples (one sample, or py-spy failed): the heartbeat age decides."""
    one = watch.samples < 2
    what = "only one sample was taken" if one else "no rank could be sampled twice"
    if watch.stale:
        return watch.check(
            "hung",
            f"{watch.scope}{what}, and {watch.age_text} (>= {watch.stall_text})",
            note=_age_only(watch.stall_text, one_sample=one),
        )
    todo = (
        "take two samples (--interval > 0, e.g. the default 2)"
        if one
        else "run the command again (py-spy must dump a rank in both samples)"
    )
    if watch.age is None:
        return watch.check(
            "not_confirmed",
            f"{what} and there is no heartbeat to date the last progress: nothing can be seen moving",
            note=f"to decide, {todo}",
        )
    return watch.check(
        "not_confirmed",
        f"{what} and {watch.age_text} (< {watch.stall_text}): one sample cannot show whether the ranks move",
        note=f"to decide, {todo}, or run again once the heartbeats are older than {watch.stall_text}",
    )


def _stacks_moved(watch: _Watch, ranks_moved: Sequence[int]) -> ProgressCheck:
    """Some stacks changed between the samples: progress, unless nothing was written for too long."""
    moved = ", ".join(map(str, ranks_moved))
    changed = f"the stacks of rank(s) {moved} changed between samples {watch.interval_s:g} s apart"
    if watch.stale:
        return watch.check(
            "hung",
            f"{watch.scope}{changed}, but {watch.age_text} (>= {watch.stall_text}): code runs without "
            "reaching the next phase",
            note=_age_only(watch.stall_text, one_sample=False),
        )
    tail = f" and {watch.age_text} (< {watch.stall_text})" if watch.age is not None else ""
    return watch.check("progressed", changed + tail)


def _stacks_identical(watch: _Watch, ranks_compared: Sequence[int], *, every_rank: bool) -> ProgressCheck:
    """Every compared rank's stack is the same in both samples and no file changed: hung."""
    apart = f"in two samples {watch.interval_s:g} s apart"
    if every_rank:
        reason = f"every rank's stack is identical {apart}"
    else:
        same = "the stack of" if len(ranks_compared) == 1 else "the stacks of"
        verb = "is" if len(ranks_compared) == 1 else "are"
        reason = f"{watch.scope}{same} {_ranks(ranks_compared)} {verb} identical {apart}"
    note = None
    if watch.age is not None:
        reason += f", and no file of the run changed; {watch.age_text}"
        if not watch.stale:
            note = (
                f"the hang is younger than {watch.stall_text}; if the ranks are in a long "
                "but legitimate operation, run this command again later"
            )
    return watch.check("hung", reason, note=note)

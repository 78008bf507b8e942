"""The dead-engine rule shared by `grpolab watchdog` and the log doctor: pure arithmetic on times.

Source: Miles 101 manual, section 1.2 ("Why the watchdog waits for ten checks"). Every `interval`
seconds (30) the watchdog counts the "503 Service Unavailable" lines of the last `window` seconds
(60). It stops the run only when that count is above `limit` (100) in `checks` (10) checks in a row.
A count alone cannot tell a dead engine (errors that never stop: >= 2,669 per minute for an hour in
the manual's run) from a busy healthy one (bursts of up to about 60 s, up to 2,209 in one minute,
two bursts 45 s apart); the run of checks in a row can. With 6 checks the manual's healthy run was
stopped at 17 of 30 check offsets, with 10 at none.

Also here, as pure functions on text: reading error times out of stored lines (`parse_time`,
`error_times`) and the manual's replay table (`replay_table`), both used by `grpolab watchdog --replay`.
"""

from __future__ import annotations

import bisect
import calendar
import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

DEFAULT_LIMIT = 100
DEFAULT_CHECKS = 10
DEFAULT_INTERVAL_S = 30.0
DEFAULT_WINDOW_S = 60.0
DEFAULT_PATTERN = "503 Service Unavailable"
"""What the manual's watchdog counts: the router's answer when no rollout engine can take a request."""
REPLAY_CHECKS = (6, 8, 10)
"""The checks-in-a-row values of the manual's replay table (section 1.2)."""


@dataclass(frozen=True, kw_only=True)
class WatchdogRule:
    """The watchdog's parameters (defaults: Miles 101 manual, section 1.2).

    Raises:
        ValueError: `limit` < 0, `checks` < 1, or a non-positive `interval`/`window` (seconds).
    """

    limit: int = DEFAULT_LIMIT
    """A check strikes when its window holds more than this many errors."""
    checks: int = DEFAULT_CHECKS
    """Strikes in a row that stop the run."""
    interval: float = DEFAULT_INTERVAL_S
    """Seconds between checks."""
    window: float = DEFAULT_WINDOW_S
    """Seconds of log each check counts."""

    def __post_init__(self) -> None:
        if isinstance(self.limit, bool) or not isinstance(self.limit, int) or self.limit < 0:
            raise ValueError(f"--limit must be a whole number >= 0, got {self.limit!r}")
        if isinstance(self.checks, bool) or not isinstance(self.checks, int) or self.checks < 1:
            raise ValueError(f"--checks must be a whole number >= 1, got {self.checks!r}")
        if not (self.interval > 0 and math.isfinite(self.interval)):
            raise ValueError(f"--interval must be a finite number > 0 seconds, got {self.interval!r}")
        if not (self.window > 0 and math.isfinite(self.window)):
            raise ValueError(f"--window must be a finite number > 0 seconds, got {self.window!r}")

    def strikes_after(self, strikes: int, count: int) -> int:
        """Strikes in a row after a check that counted `count` errors: one more when count > limit, else 0."""
        return strikes + 1 if count > self.limit else 0

    def stops(self, strikes: int) -> bool:
        """True when `strikes` in a row are enough to stop the run."""
        return strikes >= self.checks


@dataclass(frozen=True, kw_only=True)
class WatchdogReplay:
    """What the rule would have done over a stored list of error times.

    Attributes:
        stopped_at: time (same unit as the inputs, seconds) of the check that stopped the run, or None.
        strikes_at_stop: strikes in a row at that check (== rule.checks) or 0.
        most_in_a_row: the longest run of strikes seen (the manual's "most checks in a row").
        last_count: the error count of the last check made (at the stop, or at the end).
        n_checks: how many checks were made.
    """

    stopped_at: float | None
    strikes_at_stop: int
    most_in_a_row: int
    last_count: int
    n_checks: int


def count_in_window(sorted_times: Sequence[float], t: float, window: float) -> int:
    """Number of error times in (t - window, t], from a list sorted ascending (seconds)."""
    return bisect.bisect_right(sorted_times, t) - bisect.bisect_right(sorted_times, t - window)


def replay_rule(
    sorted_times: Sequence[float],
    rule: WatchdogRule,
    *,
    start: float,
    end: float,
) -> WatchdogReplay:
    """Replay the watchdog over error times: checks at start + interval, start + 2·interval, … ≤ end.

    Args:
        sorted_times: error-line times in seconds, ascending (e.g. Unix times of the 503 lines).
        rule: limit, checks, interval and window.
        start: when the watchdog starts (seconds); the first check is one interval later, as the
            manual's script sleeps between checks.
        end: when the log ends (seconds); no check after it.

    Returns:
        The first stop (if any) and the longest run of strikes.

    Raises:
        ValueError: `end` < `start`.
    """
    if end < start:
        raise ValueError(f"end {end} is before start {start}")
    strikes = most = count = n = 0
    t = start + rule.interval
    while t <= end:
        count = count_in_window(sorted_times, t, rule.window)
        n += 1
        strikes = rule.strikes_after(strikes, count)
        most = max(most, strikes)
        if rule.stops(strikes):
            return WatchdogReplay(
                stopped_at=t, strikes_at_stop=strikes, most_in_a_row=most, last_count=count, n_checks=n
            )
        t += rule.interval
    return WatchdogReplay(
        stopped_at=None, strikes_at_stop=0, most_in_a_row=most, last_count=count, n_checks=n
    )


def offsets_stopped(
    sorted_times: Sequence[float], rule: WatchdogRule, *, n_offsets: int | None = None
) -> list[WatchdogReplay]:
    """Replay the rule from each whole-second phase of the check grid (the manual's "30 offsets").

    The watchdog may start at any moment relative to the errors; offset k starts it k seconds before
    the first error. `n_offsets` defaults to int(rule.interval) (30 phases for 30 s checks).

    Returns:
        One `WatchdogReplay` per offset, offset 0 first. Empty when there are no error times.
    """
    if not sorted_times:
        return []
    n = int(rule.interval) if n_offsets is None else n_offsets
    first, last = sorted_times[0], sorted_times[-1]
    return [
        replay_rule(sorted_times, rule, start=first - k, end=last + rule.window + rule.interval)
        for k in range(max(n, 1))
    ]


@dataclass(frozen=True, kw_only=True)
class ReplayRow:
    """One row of the manual's replay table: one checks-in-a-row value over every check offset.

    Attributes:
        checks: the strikes in a row that stop the run.
        offsets: how many check offsets were replayed.
        stopped: how many of them stopped the run.
        most_in_a_row: the longest run of strikes over all offsets.
        stop_after: (earliest, latest) stop, in seconds after the first error; None when none stopped.
    """

    checks: int
    offsets: int
    stopped: int
    most_in_a_row: int
    stop_after: tuple[float, float] | None


def replay_table(
    sorted_times: Sequence[float], rule: WatchdogRule, checks_options: Sequence[int] = REPLAY_CHECKS
) -> list[ReplayRow]:
    """The manual's `watchdog_replay.py` table: for each checks value, `offsets_stopped` over all offsets.

    Args:
        sorted_times: error times in seconds, ascending; must not be empty.
        rule: limit, interval and window (its `checks` is replaced by each of `checks_options`).
        checks_options: checks-in-a-row values, one row each (the manual's 6, 8, 10).

    Raises:
        ValueError: no error times, or a checks value < 1 (from `WatchdogRule`).
    """
    if not sorted_times:
        raise ValueError("no error times to replay")
    first = sorted_times[0]
    rows = []
    for checks in checks_options:
        replays = offsets_stopped(sorted_times, replace(rule, checks=checks))
        stops = [r.stopped_at - first for r in replays if r.stopped_at is not None]
        rows.append(
            ReplayRow(
                checks=checks,
                offsets=len(replays),
                stopped=len(stops),
                most_in_a_row=max(r.most_in_a_row for r in replays),
                stop_after=(min(stops), max(stops)) if stops else None,
            )
        )
    return rows


_DATE_TIME = (
    r"(\d{4})-(\d{2})-(\d{2})[T ](\d{2}):(\d{2}):(\d{2})(?:[.,](\d{1,9}))?"
    r"\s?(Z|UTC|[+-]\d{2}:?\d{2})?"
)
_TIME_ANYWHERE = re.compile(_DATE_TIME)
_BARE_TIME = re.compile(r"\[?" + _DATE_TIME + r"\]?")
_BARE_NUMBER = re.compile(r"[0-9]+(?:\.[0-9]*)?")


def _seconds(m: re.Match[str]) -> float:
    """Unix seconds of a `_DATE_TIME` match; a time without a zone is read as UTC (only differences matter)."""
    year, month, day, hour, minute, second = (int(g) for g in m.groups()[:6])
    frac, zone = m.group(7), m.group(8)
    t = calendar.timegm((year, month, day, hour, minute, second, 0, 0, 0)) + (
        float(f"0.{frac}") if frac else 0.0
    )
    if zone and zone not in ("Z", "UTC"):
        sign = 1 if zone[0] == "+" else -1
        digits = zone[1:].replace(":", "")
        t -= sign * (int(digits[:2]) * 3600 + int(digits[2:]) * 60)
    return t


def parse_time(text: str) -> float | None:
    """Unix seconds of the first date-time in `text`, or None.

    Accepts ISO 8601 (`2026-10-22T07:16:29Z`, `+02:00` offsets) and the Miles log prefix
    (`[2026-10-17 21:03:30.637 rollout_executor]`, comma or dot before the fraction). A time without
    a zone is read as UTC: the watchdog only uses differences between times of one log.
    """
    m = _TIME_ANYWHERE.search(text)
    return _seconds(m) if m else None


@dataclass(frozen=True, kw_only=True)
class ErrorTimes:
    """Error times read from stored lines.

    Attributes:
        times: Unix seconds, ascending.
        unstamped: matching log lines that carried no time (left out of `times`).
    """

    times: list[float]
    unstamped: int


def error_times(lines: Iterable[str], pattern: re.Pattern[str]) -> ErrorTimes:
    """Error times from a stream of lines (read one at a time; only the floats are kept).

    A line counts when it is a bare time (Unix seconds like `1761117389.25`, or an ISO/Miles time,
    optionally in brackets) or when `pattern` matches it and it carries a time (a log line; its first
    time is used). Other lines are skipped, so a whole log can be replayed.
    """
    times: list[float] = []
    unstamped = 0
    for line in lines:
        text = line.strip()
        if not text:
            continue
        if _BARE_NUMBER.fullmatch(text):
            times.append(float(text))
            continue
        bare = _BARE_TIME.fullmatch(text)
        if bare:
            times.append(_seconds(bare))
            continue
        if pattern.search(text):
            t = parse_time(text)
            if t is None:
                unstamped += 1
            else:
                times.append(t)
    times.sort()
    return ErrorTimes(times=times, unstamped=unstamped)

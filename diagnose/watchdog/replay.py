"""`grpolab watchdog --replay FILE`: the manual's replay table (section 1.2) for stored error times."""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import TextIO

from grpolab.diagnose.common.dead_engine import ReplayRow, WatchdogRule, error_times, replay_table
from grpolab.diagnose.common.wording import plural


class ReplayError(ValueError):
    """The replay file cannot be read or holds no error time; the message names it (`--replay FILE`)."""


def format_replay(path: Path, times: list[float], rule: WatchdogRule, rows: list[ReplayRow]) -> str:
    """The manual's replay table (section 1.2, `watchdog_replay.py`) as text."""
    first = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(times[0]))
    lines = [
        f"{path}: {plural(len(times), 'error')} from {first} over {times[-1] - times[0]:.0f} s, checks every "
        f"{rule.interval:g} s over the last {rule.window:g} s, limit {rule.limit}",
        f"{'checks':>6}  {'offsets stopped':<16}  {'most checks in a row':<20}  stopped after (from the first error)",
    ]
    for row in rows:
        after = "-"
        if row.stop_after is not None:
            lo, hi = row.stop_after
            after = f"{lo:.0f} s" if lo == hi else f"{lo:.0f} to {hi:.0f} s"
        stopped = f"{row.stopped} of {row.offsets}"
        lines.append(f"{row.checks:>6}  {stopped:<16}  {row.most_in_a_row:<20}  {after}")
    return "\n".join(lines)


def replay_command(
    path: Path, rule: WatchdogRule, checks: list[int], pattern: re.Pattern[str], out: TextIO
) -> None:
    """Print the replay table for the error times stored in `path`: one row per --checks value in `checks`.

    Raises:
        ReplayError: `path` cannot be read, or holds no error time (the message names the flag and file).
    """
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            found = error_times(f, pattern)
    except OSError as e:
        raise ReplayError(f"--replay {path}: cannot read it ({e.strerror or e})") from None
    if not found.times:
        extra = f" (no time on {plural(found.unstamped, 'matching line')})" if found.unstamped else ""
        raise ReplayError(
            f"--replay {path}: no error times found{extra}; expected one time per line (Unix seconds, "
            f"ISO 8601 or a Miles log time) or log lines matching {pattern.pattern!r} that carry a time"
        )
    rows = replay_table(found.times, rule, checks)
    print(format_replay(path, found.times, rule, rows), file=out)
    if found.unstamped:
        print(f"(left out: {plural(found.unstamped, 'matching line')} without a time)", file=out)

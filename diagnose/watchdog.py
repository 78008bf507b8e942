"""Stop a run whose rollout engine died: the Miles 101 manual's 503 watchdog, for any log being written.

Every --interval seconds (30) the watchdog counts the log lines matching --pattern ("503 Service
Unavailable") written in the last --window seconds (60). A check that counts more than --limit (100)
is a strike; --checks (10) strikes in a row stop the run (Miles 101 manual, section 1.2, whose
replay showed that 6 checks stop a healthy bursty run and 10 do not). The rule itself lives in
`dead_engine.py`.

How the watchdog knows when a line was written: it follows the file like `tail -n 0 -F` (lines
already in the file when it starts are skipped; truncation and rotation are followed) and stamps
each new matching line with the monotonic time it read it, at least every second. Timestamps
inside the lines are not used live: their clock and time zone are the writer's (a Miles container
logs local time), and a line read within a second of being written is stamped well inside a 60 s
window. `--replay` has no read times, so it uses the times in the lines.

LOG_OR_RUN_DIR: a log file, or a grpolab run directory (its console.log is watched and the run
ends with the final `status` event of events.jsonl). A plain log ends when --stop-pid's process
exits, else only with Ctrl+C (exit 130). Started before the run, the watchdog waits up to
--wait-seconds (300) for the file, or the run directory's console.log, to appear (one "waiting" line)
and then reads it from its first line. On a stop the watchdog sends SIGTERM to --stop-pid (for a
run directory without --stop-pid: to the rank processes of ranks/*.json on this host; grpolab
train turns SIGTERM into status "interrupted"), and SIGKILL to those still running --grace-seconds
(10) later, as `docker stop` does (stopping.py).

Exit codes (as the manual's script): 0 the run ended, 1 the watchdog stopped the run, 2 it cannot
read the log (missing after --wait-seconds, permission), --stop-pid is not a process it may signal,
or a bad number (--checks 0, a --limit that is not a whole number). A failed read does not count as
a check.
"""

from __future__ import annotations

import argparse
import bisect
import json
import math
import re
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TextIO

from grpolab.diagnose.dead_engine import (
    DEFAULT_CHECKS,
    DEFAULT_INTERVAL_S,
    DEFAULT_LIMIT,
    DEFAULT_PATTERN,
    DEFAULT_WINDOW_S,
    REPLAY_CHECKS,
    ReplayRow,
    WatchdogRule,
    count_in_window,
    error_times,
    replay_table,
)
from grpolab.diagnose.logfollow import LogFollower
from grpolab.diagnose.procfs import is_alive
from grpolab.diagnose.stopping import DEFAULT_GRACE_S, run_dir_pids, stop_processes
from grpolab.diagnose.watch_target import (
    DEFAULT_WAIT_S,
    WatchTarget,
    check_stop_pid,
    stamped,
    wait_for_target,
)
from grpolab.diagnose.wording import plural

EXIT_ENDED, EXIT_STOPPED, EXIT_CANNOT_WATCH, EXIT_INTERRUPTED = 0, 1, 2, 130
MAX_READ_TICK_S = 1.0
"""Longest pause between two reads of the log (grpolab's: a line is stamped at most 1 s late)."""
ERRORS = ("error from the rollout engine", "errors from the rollout engine")
"""How messages name the lines of the default pattern (one, several)."""


# ---------------------------------------------------------------------- the run's end
def final_status(lines: list[bytes]) -> str | None:
    """The `status` of the final `status` event among events.jsonl lines, or None."""
    for line in lines:
        if b'"status"' not in line:
            continue
        try:
            record = json.loads(line)
        except ValueError:
            continue  # a line being written; it is read again complete
        if isinstance(record, dict) and record.get("event") == "status":
            return str(record.get("status"))
    return None


# ---------------------------------------------------------------------- live watching
class Watchdog:
    """The live loop: follow the log, check every `rule.interval` seconds, stop after `rule.checks` strikes.

    Args:
        target: the log, its run directory, the pids to stop.
        rule: limit, checks, interval, window (seconds).
        pattern: bytes regular expression an error line matches.
        what: how messages name one matching line and several (`ERRORS`).
        grace_s: seconds between SIGTERM and SIGKILL on a stop (`stopping.stop_processes`).
        out: where messages go (default: sys.stdout; one line each, UTC time first, as the manual's script).
        clock / sleep: monotonic seconds and sleeping (injectable).

    Raises:
        OSError: from the constructor when the log cannot be opened.
    """

    def __init__(
        self,
        target: WatchTarget,
        rule: WatchdogRule,
        pattern: re.Pattern[bytes],
        *,
        what: tuple[str, str] = ERRORS,
        grace_s: float = DEFAULT_GRACE_S,
        out: TextIO | None = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.target, self.rule, self.pattern, self.what = target, rule, pattern, what
        self.grace_s = grace_s
        self.out = sys.stdout if out is None else out
        self._clock, self._sleep = clock, sleep
        self._log = LogFollower(target.log, from_end=not target.from_start)
        self._events: LogFollower | None = None
        self._times: list[float] = []  # read time of each matching line, ascending
        self.label = str(target.run_dir or target.log)

    def say(self, message: str) -> None:
        """Print one message line, stamped like `date -u +%FT%TZ`."""
        print(stamped(self.label, message), file=self.out)
        self.out.flush()

    def _count(self, n: int) -> str:
        return plural(n, *self.what)

    def run(self) -> int:
        """Watch until the run ends (0) or the rule stops it (1); Ctrl+C gives 130."""
        rule = self.rule
        tick = min(MAX_READ_TICK_S, rule.interval / 4, rule.window / 4)
        self.say(
            f"watching {self.target.log} for {self.pattern.pattern.decode(errors='replace')!r}: every "
            f"{rule.interval:g} s, more than {rule.limit} in the last {rule.window:g} s is a strike; "
            f"the run is stopped after {plural(rule.checks, 'strike')} in a row"
        )
        strikes = count = 0
        next_check = self._clock() + rule.interval
        try:
            while True:
                ended = self._run_ended()
                if ended is not None:
                    self.say(f"the run ended ({ended})")
                    return EXIT_ENDED
                lines = self._log.poll()
                now = self._clock()
                self._times.extend(now for line in lines if self.pattern.search(line))
                if now >= next_check:
                    if self._log.problem is not None:
                        self.say(f"cannot read the log ({self._log.problem}), this check does not count")
                    else:
                        count = count_in_window(self._times, now, rule.window)
                        before, strikes = strikes, rule.strikes_after(strikes, count)
                        if strikes:
                            self.say(
                                f"strike {strikes} of {rule.checks}: {self._count(count)} in the last "
                                f"{rule.window:g} s (limit {rule.limit})"
                            )
                        elif before:
                            self.say(f"{self._count(count)} in the last {rule.window:g} s, strikes reset")
                        if rule.stops(strikes):
                            self.say(
                                f"more than {self._count(rule.limit)} in each of "
                                f"{plural(rule.checks, 'check')}, last {count} in {rule.window:g} s, "
                                "stopping the run"
                            )
                            self._stop()
                            return EXIT_STOPPED
                        # times at or before now - window fall out of every later window
                        del self._times[: bisect.bisect_right(self._times, now - rule.window)]
                    next_check = max(next_check + rule.interval, now)  # a stalled watchdog does not catch up
                self._sleep(max(0.0, min(tick, next_check - self._clock())))
        except KeyboardInterrupt:
            self.say("interrupted (Ctrl+C), the run is no longer guarded")
            return EXIT_INTERRUPTED
        finally:
            self._log.close()
            if self._events is not None:
                self._events.close()

    def _run_ended(self) -> str | None:
        """Why the run ended (its final status, or its process exited), or None while it runs."""
        for pid in self.target.stop_pids:
            if not is_alive(pid):
                return f"process {pid} exited"
        run_dir = self.target.run_dir
        if run_dir is None:
            return None
        if self._events is None:
            try:
                self._events = LogFollower(run_dir / "events.jsonl", from_end=False)
            except FileNotFoundError:
                return None  # no event written yet
            except OSError:
                return None  # unreadable events do not end the run; the log checks go on
        status = final_status(self._events.poll())
        return None if status is None else f"status {status} in events.jsonl"

    def _stop(self) -> None:
        """SIGTERM to the target pids (or the run's rank processes on this host), SIGKILL after the grace."""
        pids = list(self.target.stop_pids)
        if not pids and self.target.run_dir is not None:
            pids = run_dir_pids(self.target.run_dir)
        if not pids:
            self.say("no process to stop (pass --stop-pid PID); stop the run by hand")
            return
        stop_processes(pids, grace_s=self.grace_s, say=self.say, clock=self._clock, sleep=self._sleep)


# ---------------------------------------------------------------------- replay
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
) -> int:
    """Print the replay table for the error times stored in `path` (0); 2 when it holds none."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            found = error_times(f, pattern)
    except OSError as e:
        return _fail(f"--replay {path}: cannot read it ({e.strerror or e})")
    if not found.times:
        extra = f" (no time on {plural(found.unstamped, 'matching line')})" if found.unstamped else ""
        return _fail(
            f"--replay {path}: no error times found{extra}; expected one time per line (Unix seconds, "
            f"ISO 8601 or a Miles log time) or log lines matching {pattern.pattern!r} that carry a time"
        )
    rows = replay_table(found.times, rule, checks)
    print(format_replay(path, found.times, rule, rows), file=out)
    if found.unstamped:
        print(f"(left out: {plural(found.unstamped, 'matching line')} without a time)", file=out)
    return EXIT_ENDED


# ---------------------------------------------------------------------- CLI
def add_watchdog_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of `grpolab watchdog` (defaults: Miles 101 manual, section 1.2)."""
    parser.epilog = (
        "exit codes: 0 the run ended, 1 the watchdog stopped it, 2 cannot read the log (still missing after "
        "--wait-seconds, permission) or a bad number, 130 Ctrl+C"
    )
    parser.add_argument(
        "target",
        nargs="?",
        metavar="LOG_OR_RUN_DIR",
        help="log file to follow, or a grpolab run directory (its console.log; ends with its final status)",
    )
    parser.add_argument(
        "--limit", type=int, default=DEFAULT_LIMIT, help="a check strikes above this many errors (100)"
    )
    parser.add_argument(
        "--checks",
        type=int,
        default=None,
        help=f"strikes in a row that stop the run ({DEFAULT_CHECKS}; --replay: one row, default 6 8 10)",
    )
    parser.add_argument(
        "--interval", type=float, default=DEFAULT_INTERVAL_S, help="seconds between checks (30)"
    )
    parser.add_argument(
        "--window", type=float, default=DEFAULT_WINDOW_S, help="seconds of log each check counts (60)"
    )
    parser.add_argument(
        "--pattern",
        default=DEFAULT_PATTERN,
        help=f"regular expression of an error line (default {DEFAULT_PATTERN!r})",
    )
    parser.add_argument(
        "--stop-pid",
        type=int,
        default=None,
        metavar="PID",
        help="process to SIGTERM on a stop; the watch also ends when it exits",
    )
    parser.add_argument(
        "--grace-seconds",
        type=float,
        default=DEFAULT_GRACE_S,
        metavar="S",
        help="on a stop, SIGKILL the processes still running this many seconds after SIGTERM "
        f"(default {DEFAULT_GRACE_S:g}, as docker stop)",
    )
    parser.add_argument(
        "--wait-seconds",
        type=float,
        default=DEFAULT_WAIT_S,
        metavar="S",
        help="wait this long for a LOG_OR_RUN_DIR that does not exist yet, or a run directory's console.log, "
        f"to appear (default {DEFAULT_WAIT_S:g}; then exit 2)",
    )
    parser.add_argument(
        "--replay",
        metavar="FILE",
        default=None,
        help="replay stored error times (one per line, or a log) over every check offset and print the table",
    )


def run_watchdog_command(args: argparse.Namespace) -> int:
    """Run `grpolab watchdog`; returns 0 (run ended), 1 (stopped it), 2 (cannot watch), 130 (Ctrl+C)."""
    try:
        rule = WatchdogRule(
            limit=args.limit,
            checks=DEFAULT_CHECKS if args.checks is None else args.checks,
            interval=args.interval,
            window=args.window,
        )
        checks = list(REPLAY_CHECKS) if args.checks is None else [args.checks]
        for flag, seconds in (("--grace-seconds", args.grace_seconds), ("--wait-seconds", args.wait_seconds)):
            if not (math.isfinite(seconds) and seconds >= 0):
                raise ValueError(f"{flag} must be a finite number of seconds >= 0, got {seconds!r}")
        text_pattern = re.compile(args.pattern)
        byte_pattern = re.compile(args.pattern.encode())
    except ValueError as e:
        return _fail(str(e))
    except re.error as e:
        return _fail(f"--pattern {args.pattern!r} is not a regular expression: {e}")
    if args.replay is not None:
        if args.target is not None or args.stop_pid is not None:
            return _fail("--replay FILE replays stored times; give it without LOG_OR_RUN_DIR and --stop-pid")
        return replay_command(Path(args.replay), rule, checks, text_pattern, sys.stdout)
    if args.target is None:
        return _fail("give the LOG_OR_RUN_DIR to watch (or --replay FILE)")
    what = (
        ERRORS
        if args.pattern == DEFAULT_PATTERN
        else (f"line matching {args.pattern!r}", f"lines matching {args.pattern!r}")
    )
    try:
        pids = check_stop_pid(args.stop_pid)
        target = wait_for_target(Path(args.target), pids, wait_s=args.wait_seconds)
        if target is None:
            return EXIT_ENDED
        watchdog = Watchdog(target, rule, byte_pattern, what=what, grace_s=args.grace_seconds)
    except ValueError as e:
        return _fail(str(e))
    except OSError as e:
        return _fail(f"cannot read {e.filename or args.target}: {e.strerror or e}")
    return watchdog.run()


def _fail(message: str) -> int:
    print(f"grpolab watchdog: error: {message}", file=sys.stderr)
    return EXIT_CANNOT_WATCH

"""`grpolab watchdog`'s live loop: follow the log, check every interval, stop the run after enough strikes.

How the watchdog knows when a line was written: it follows the file like `tail -n 0 -F` (lines
already in the file when it starts are skipped; truncation and rotation are followed) and stamps
each new matching line with the monotonic time it read it, at least every second. Timestamps
inside the lines are not used live: their clock and time zone are the writer's (a Miles container
logs local time), and a line read within a second of being written is stamped well inside a 60 s
window. A run directory's run ends with the final `status` event of events.jsonl; a plain log's
when --stop-pid's process exits, else only with Ctrl+C.
"""

from __future__ import annotations

import bisect
import re
import sys
import time
from collections.abc import Callable
from typing import TextIO

from grpolab.diagnose.common.dead_engine import WatchdogRule, count_in_window
from grpolab.diagnose.common.procfs import is_alive
from grpolab.diagnose.common.wording import plural
from grpolab.diagnose.watchdog.follow import LogFollower
from grpolab.diagnose.watchdog.stopping import DEFAULT_GRACE_S, run_dir_pids, stop_processes
from grpolab.diagnose.watchdog.target import WatchTarget, stamped
from grpolab.rundir.reader import EVENTS_FILE, final_status_event

EXIT_ENDED, EXIT_STOPPED, EXIT_CANNOT_WATCH, EXIT_INTERRUPTED = 0, 1, 2, 130
MAX_READ_TICK_S = 1.0
"""Longest pause between two reads of the log (grpolab's: a line is stamped at most 1 s late)."""
ERRORS = ("error from the rollout engine", "errors from the rollout engine")
"""How messages name the lines of the default pattern (one, several)."""


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

    def _run_ended(self) -> str | None:
        """Why the run ended (its final status, or its process exited), or None while it runs."""
        for pid in self.target.stop_pids:
            if not is_alive(pid):
                return f"process {pid} exited"
        if self.target.run_dir is None:
            return None
        event = final_status_event(self.target.run_dir)  # unreadable events do not end the run
        return None if event is None else f"status {event['status']} in {EVENTS_FILE}"

    def _stop(self) -> None:
        """SIGTERM to the target pids (or the run's rank processes on this host), SIGKILL after the grace."""
        pids = list(self.target.stop_pids)
        if not pids and self.target.run_dir is not None:
            pids = run_dir_pids(self.target.run_dir)
        if not pids:
            self.say("no process to stop (pass --stop-pid PID); stop the run by hand")
            return
        stop_processes(pids, grace_s=self.grace_s, say=self.say, clock=self._clock, sleep=self._sleep)

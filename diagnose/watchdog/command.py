"""Stop a run whose rollout engine died: the Miles 101 manual's 503 watchdog, for any log being written.

Every --interval seconds (30) the watchdog counts the log lines matching --pattern ("503 Service
Unavailable") written in the last --window seconds (60). A check that counts more than --limit (100)
is a strike; --checks (10) strikes in a row stop the run (Miles 101 manual, section 1.2, whose
replay showed that 6 checks stop a healthy bursty run and 10 do not). The rule itself lives in
`common/dead_engine.py`.

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
(10) later, as `docker stop` does (watchdog/stopping.py).

Exit codes (as the manual's script): 0 the run ended, 1 the watchdog stopped the run, 2 it cannot
read the log (missing after --wait-seconds, permission), --stop-pid is not a process it may signal,
or a bad number (--checks 0, a --limit that is not a whole number). A failed read does not count as
a check.
"""

from __future__ import annotations

import argparse
import math
import re
import sys
from pathlib import Path

from grpolab.diagnose.common.dead_engine import DEFAULT_CHECKS, DEFAULT_PATTERN, REPLAY_CHECKS
from grpolab.diagnose.common.flags import add_rule_flags, rule_from_args
from grpolab.diagnose.watchdog.live import ERRORS, EXIT_CANNOT_WATCH, EXIT_ENDED, Watchdog
from grpolab.diagnose.watchdog.replay import ReplayError, replay_command
from grpolab.diagnose.watchdog.stopping import DEFAULT_GRACE_S
from grpolab.diagnose.watchdog.target import DEFAULT_WAIT_S, check_stop_pid, wait_for_target


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
    add_rule_flags(
        parser,
        checks_default=None,
        checks_help=f"strikes in a row that stop the run (default {DEFAULT_CHECKS}; --replay: one row each, "
        f"default {' '.join(map(str, REPLAY_CHECKS))})",
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
        rule = rule_from_args(args)
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
        try:
            replay_command(Path(args.replay), rule, checks, text_pattern, sys.stdout)
        except ReplayError as e:
            return _fail(str(e))
        return EXIT_ENDED
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

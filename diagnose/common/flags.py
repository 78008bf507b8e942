"""CLI helpers that several diagnose commands share: the dead-engine rule's flags and the rule built
from them (`grpolab diagnose log` judges 503 lines with it, `grpolab watchdog` stops runs with it).

Defaults: Miles 101 manual, section 1.2 (common/dead_engine.py).
"""

from __future__ import annotations

import argparse
from typing import Any

from grpolab.diagnose.common.dead_engine import (
    DEFAULT_CHECKS,
    DEFAULT_INTERVAL_S,
    DEFAULT_LIMIT,
    DEFAULT_WINDOW_S,
    WatchdogRule,
)

WHOLE_SECONDS_NOTE = "whole seconds: 30.0 is fine, 30.5 is not, the log's times are whole seconds"
"""What --interval and --window need when the rule is judged on a log's own times (the log doctor)."""


def add_rule_flags(
    parser: argparse.ArgumentParser | Any,
    *,
    checks_default: int | None = DEFAULT_CHECKS,
    checks_help: str | None = None,
    whole_seconds: bool = False,
) -> None:
    """Add --limit, --checks, --interval and --window (the dead-engine rule) to a parser or argument group.

    Args:
        parser: an `argparse.ArgumentParser` or one of its argument groups.
        checks_default: --checks' default (None: the command picks one, e.g. `grpolab watchdog --replay`).
        checks_help: --checks' help (default: "strikes in a row that stop the run (default N)").
        whole_seconds: say that --interval and --window must be whole seconds (`WHOLE_SECONDS_NOTE`).
    """
    note = f"; {WHOLE_SECONDS_NOTE}" if whole_seconds else ""
    parser.add_argument(
        "--limit",
        type=int,
        default=DEFAULT_LIMIT,
        help=f"a check strikes above this many error lines (default {DEFAULT_LIMIT})",
    )
    parser.add_argument(
        "--checks",
        type=int,
        default=checks_default,
        help=checks_help or f"strikes in a row that stop the run (default {DEFAULT_CHECKS})",
    )
    parser.add_argument(
        "--interval",
        type=float,
        default=DEFAULT_INTERVAL_S,
        help=f"seconds between checks (default {DEFAULT_INTERVAL_S:g}{note})",
    )
    parser.add_argument(
        "--window",
        type=float,
        default=DEFAULT_WINDOW_S,
        help=f"seconds of log each check counts (default {DEFAULT_WINDOW_S:g}{note})",
    )


def rule_from_args(args: argparse.Namespace) -> WatchdogRule:
    """The dead-engine rule of the parsed flags (`add_rule_flags`; --checks None means DEFAULT_CHECKS).

    Raises:
        ValueError: naming the flag, for a value out of range (`WatchdogRule`).
    """
    checks = DEFAULT_CHECKS if args.checks is None else args.checks
    return WatchdogRule(limit=args.limit, checks=checks, interval=args.interval, window=args.window)

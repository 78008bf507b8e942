"""`grpolab diff RUN_A RUN_B [--tol 0] [--baseline RUN ...] [--json]`: the parser and the command.

Exit codes (issue 13): 0 identical within the tolerance, 1 differs, 2 cannot judge (the report says
why) or bad input (a path that is not a run, a negative --tol: one line naming it, no traceback).
"""

from __future__ import annotations

import argparse
import json
import sys


def add_diff_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Register `grpolab diff` (imports nothing heavy: no torch, no pandas)."""
    p = sub.add_parser(
        "diff",
        help="find where two runs part: set-up, first divergent step, sample/token, layer",
        description=(
            "Compare two runs (grpolab run directories or Miles/slime console logs) on the same step "
            "numbers. Exit 0 identical, 1 differs, 2 cannot judge or bad input."
        ),
    )
    p.add_argument("run_a", metavar="RUN_A", help="run directory or Miles/slime log")
    p.add_argument("run_b", metavar="RUN_B", help="run directory or Miles/slime log")
    p.add_argument(
        "--tol",
        type=float,
        default=0.0,
        help="absolute tolerance for metrics and engine log-probs (default 0: bitwise; token ids are exact)",
    )
    p.add_argument(
        "--baseline",
        metavar="RUN",
        nargs="+",
        action="extend",
        default=[],
        help="other seeds of RUN_A's set-up: a metric of RUN_B differs only outside their band with RUN_A",
    )
    p.add_argument("--json", action="store_true", help="print the report as JSON (same content)")
    return p


def run_diff_command(args: argparse.Namespace) -> int:
    """Run `grpolab diff`; print the report (text or JSON) and return its exit code (2: bad input)."""
    from grpolab.diff.compare import check_tol, diff_runs
    from grpolab.replay.format import RecordingError

    try:
        check_tol(args.tol)
        report = diff_runs(args.run_a, args.run_b, tol=args.tol, baselines=args.baseline)
    except (ValueError, RecordingError, OSError) as e:
        print(f"grpolab diff: error: {e}", file=sys.stderr)
        return 2
    print(json.dumps(report.to_dict(), indent=2) if args.json else report.render())
    return report.exit_code

"""The `grpolab gate` command: its flags, the CI-log table and the exit code (the checks are gate.py's)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, TextIO

from grpolab.checkers import gate as gate_checks
from grpolab.checkers.gate import GAP_KEY, GateInputError, GateReport, gate, verdict_word
from grpolab.checkers.gate_status import ALLOWABLE_STATUSES, ANY_STATUS
from grpolab.checkers.step0 import DEFAULT_GAP_MARGIN


def format_report(report: GateReport) -> list[str]:
    """The CI-log table: CHECK, KEY, VALUE, EXPECTATION, RESULT, EVIDENCE, then failure details."""
    lines = [f"grpolab gate: {report.target} (read {report.source})"]
    lines += [f"note: {n}" for n in report.notes]
    if report.gap_range is not None:
        lines += report.gap_range.describe().split("\n")
    header = ("CHECK", "KEY", "VALUE", "EXPECTATION", "RESULT", "EVIDENCE")
    rows = [
        (c.check, c.key, c.shown or ("missing" if c.value is None else f"{c.value:.6g}"), c.expectation,
         verdict_word(c.passed), c.evidence)
        for c in report.checks
    ]  # fmt: skip
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    for row in [header, *rows]:
        lines.append("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip())
    for c in report.checks:  # why a row failed; or why it passed anyway (--allow-status)
        if c.detail:
            lines.append(f"{'note' if c.passed else 'FAIL'} {c.check} {c.key}: {c.detail}")
    passed = sum(c.passed for c in report.checks)
    lines.append(f"gate: {verdict_word(report.passed)} ({passed}/{len(report.checks)} checks passed)")
    return lines


def add_gate_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add `gate` to an argparse subparsers object (sets `args.command = "gate"`)."""
    p = subparsers.add_parser(
        "gate",
        help="offline CI gate on a run dir or Miles/slime log (exit 0 pass, 1 fail, 2 cannot judge)",
        description=gate_checks.__doc__.split("\n\n", 1)[1] if gate_checks.__doc__ else None,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "target",
        metavar="RUN_OR_LOG",
        help="run directory, its metrics .jsonl file, or a Miles/slime console log",
    )
    p.add_argument("--baseline", action="extend", nargs="+", default=[], metavar="RUN_OR_LOG",
                   help="healthy runs of the same setup (several after one flag, or the flag repeated); used by --gap-range auto")  # fmt: skip
    p.add_argument("--step0-kl", type=float, default=None, metavar="T",
                   help="first step: |train/ppo_kl| < T and train/pg_clipfrac < 1e-10 (Miles: T = 1e-9)")  # fmt: skip
    p.add_argument("--gap-range", default=None, metavar="auto|LO:HI",
                   help=f"first step's {GAP_KEY} must lie in [LO, HI]; auto derives it from --baseline runs")  # fmt: skip
    p.add_argument("--gap-margin", type=float, default=DEFAULT_GAP_MARGIN, metavar="M",
                   help="relative widening of the auto range: [lo*(1-M), hi*(1+M)] (default 0.1)")  # fmt: skip
    p.add_argument("--metric", action="append", default=[], metavar="'KEY>=X'",
                   help="the LAST value of KEY in the run (any record kind) must satisfy the comparison; "
                   "ops >=, <=, >, <, == (repeatable)")  # fmt: skip
    p.add_argument("--allow-status", action="extend", nargs="+", default=[], metavar="STATUS",
                   help=f"accept a run directory whose status is one of {', '.join(ALLOWABLE_STATUSES)} "
                   f"(several after one flag, or commas); '{ANY_STATUS}' also accepts fewer rollouts than asked")  # fmt: skip
    p.add_argument("--json", action="store_true", help="print the verdicts as a JSON document")
    return p


def run_gate_command(
    args: argparse.Namespace, *, out: TextIO | None = None, err: TextIO | None = None
) -> int:
    """Run `grpolab gate`; 0 all passed, 1 a check failed, 2 cannot judge (message on stderr)."""
    out, err = out or sys.stdout, err or sys.stderr
    try:
        report = gate(
            args.target,
            baselines=args.baseline,
            step0_kl=args.step0_kl,
            gap_range=args.gap_range,
            gap_margin=args.gap_margin,
            metrics=args.metric,
            allow_status=args.allow_status,
        )
    except GateInputError as e:
        print(f"grpolab gate: error: {e}", file=err)
        if args.json:
            doc = {"target": args.target, "verdict": "ERROR", "exit_code": 2, "error": str(e), "checks": []}
            print(json.dumps(doc, indent=2), file=out)
        return 2
    if args.json:
        print(json.dumps(report.to_json(), indent=2), file=out)
    else:
        for line in format_report(report):
            print(line, file=out)
    return 0 if report.passed else 1

"""Scan run logs for known failure signatures: each finding gives its rule, evidence lines, cause and fix.

`grpolab diagnose log FILE [FILE…]` reads grpolab console.log files, Miles/slime logs (with or without
Ray's `(Actor pid=N)` prefixes) and torchrun logs (`[rank1]:`, `[default0]:`), as text: a compressed,
UTF-16 or binary file is not scanned, and the message says how to make a text log of it. A grpolab run
directory stands for its console.log and what the directory recorded (logdoctor/run_outcome.py): console.log
holds rank 0's output only, so every rank's recorded error (ranks/<rank>.json "error") is reported
too, root cause first, and the final status is read from events.jsonl. The rules live in rules/ (model
and registry: model.py); scan.py streams each file through them; report.py writes the report; this
module is the command.

Exit codes: 0 no error-severity finding, 1 at least one, 2 a file could not be read (missing, no
permission, a directory that is not a run directory, not a text log; named on stderr, the other files
are still scanned) or a bad option. A file that cannot be read is named once, on stderr; the report's
summary line counts it.
"""

from __future__ import annotations

import argparse
import errno
import sys
from collections.abc import Sequence
from pathlib import Path

from grpolab.diagnose.common.dead_engine import DEFAULT_CHECKS
from grpolab.diagnose.common.flags import add_rule_flags, rule_from_args
from grpolab.diagnose.common.wording import display_path
from grpolab.diagnose.logdoctor.model import (
    DEFAULT_MAX_STEP0_GAP,
    DEFAULT_MIN_KV_TOKENS,
    RuleOptions,
)
from grpolab.diagnose.logdoctor.report import EXIT_UNREADABLE, exit_code, render_json, render_text
from grpolab.diagnose.logdoctor.run_outcome import read_run_outcome
from grpolab.diagnose.logdoctor.scan import DEFAULT_CHUNK_BYTES, FileScan, scan_file


def add_log_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of `grpolab diagnose log`."""
    parser.epilog = (
        "Exit codes: 0 no error-severity finding, 1 at least one, 2 a file could not be read (missing, "
        "no permission, a directory that is not a run directory, compressed or binary; the others are "
        "still scanned) or a bad option."
    )
    parser.add_argument(
        "files",
        nargs="+",
        metavar="FILE",
        help="text log files (console.log, Miles/slime, torchrun), or grpolab run directories (their "
        "console.log, and every rank's recorded error from ranks/*.json, root cause first)",
    )
    parser.add_argument(
        "--json", action="store_true", help="print one JSON object instead of the text report"
    )
    parser.add_argument(
        "--max-step0-gap",
        type=float,
        default=DEFAULT_MAX_STEP0_GAP,
        help="flag a step-0 train/train_rollout_logprob_abs_diff above this (default %(default)s; the manual's "
        "healthy Qwen3-0.6B runs: 0.0148-0.0157)",
    )
    parser.add_argument(
        "--min-kv-tokens",
        type=int,
        default=DEFAULT_MIN_KV_TOKENS,
        help="flag an SGLang KV cache smaller than this many tokens (default %(default)s)",
    )
    group = parser.add_argument_group("dead-engine rule (the manual's 503 watchdog)")
    add_rule_flags(group, checks_help=f"strikes in a row (default {DEFAULT_CHECKS})", whole_seconds=True)
    parser.add_argument(
        "--chunk-bytes",
        type=int,
        default=DEFAULT_CHUNK_BYTES,
        help="read size in bytes (default %(default)s; a longer line is still read whole)",
    )


def options_from_args(args: argparse.Namespace) -> RuleOptions:
    """RuleOptions from the parsed flags.

    Raises:
        ValueError: naming the flag, for a value out of range.
    """
    return RuleOptions(
        watchdog=rule_from_args(args), max_step0_gap=args.max_step0_gap, min_kv_tokens=args.min_kv_tokens
    )


def log_path(file: str) -> Path:
    """The log to scan for a FILE argument: the file itself, or a grpolab run directory's console.log.

    Raises:
        IsADirectoryError: a directory without console.log (the message says what was expected).
    """
    path = Path(file)
    if not path.is_dir():
        return path
    if (path / "console.log").is_file():
        return path / "console.log"
    raise IsADirectoryError(
        errno.EISDIR, "a directory without console.log: give a log file or a grpolab run directory", file
    )


def run_log_command(args: argparse.Namespace) -> int:
    """Scan every file, print the report (text or --json); return the exit code (see `exit_code`)."""
    try:
        options = options_from_args(args)
        if args.chunk_bytes < 1:
            raise ValueError(f"--chunk-bytes must be >= 1, got {args.chunk_bytes}")
    except ValueError as e:
        print(f"grpolab diagnose log: {e}", file=sys.stderr)
        return EXIT_UNREADABLE
    scans: list[FileScan] = []
    for file in map(display_path, args.files):
        try:
            path = log_path(file)
            run = None
            if path != Path(file):  # a run directory
                run = read_run_outcome(file)
                for problem in run.problems:
                    print(f"grpolab diagnose log: {problem}", file=sys.stderr)
            name = file if run is None else str(path)
            scans.append(scan_file(path, name=name, options=options, chunk_bytes=args.chunk_bytes, run=run))
        except OSError as e:
            reason = e.strerror or str(e)
            print(f"grpolab diagnose log: cannot read {file}: {reason}", file=sys.stderr)
            scans.append(FileScan(file=file, error=reason))
    if args.json:
        import json

        print(json.dumps(render_json(scans), indent=1))
    else:
        print(render_text(scans))
    return exit_code(scans)


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m grpolab.diagnose.logdoctor FILE…`: the same command without the `grpolab` CLI's imports."""
    parser = argparse.ArgumentParser(prog="grpolab diagnose log", description=__doc__.split("\n\n")[0])
    add_log_arguments(parser)
    return run_log_command(parser.parse_args(argv))

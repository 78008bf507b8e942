"""Scan run logs for known failure signatures: each finding gives its rule, evidence lines, cause and fix.

`grpolab diagnose log FILE [FILE…]` reads grpolab console.log files, Miles/slime logs (with or without
Ray's `(Actor pid=N)` prefixes) and torchrun logs (`[rank1]:`, `[default0]:`), as text: a compressed,
UTF-16 or binary file is not scanned, and the message says how to make a text log of it. A grpolab run
directory stands for its logs (logdoctor/run_logs.py): console.log with what the directory recorded
(logdoctor/run_outcome.py: console.log holds rank 0's output only, so every rank's recorded error,
ranks/<rank>.json "error", is reported too, root cause first, and the final status is read from
events.jsonl), router.log and engines/<i>.log, whichever exist; they are reported as one story
(logdoctor/story.py): the engine logs first, then the router's, then the trainer's, and the verdict on a
dead engine (`engine_gone`) cites the lines of all three. The rules live in rules/ (model and registry:
model.py); scan.py streams each file through them; report.py writes the report; this module is the
command.

Exit codes: 0 no error-severity finding, 1 at least one, 2 a file could not be read (missing, no
permission, a directory without console.log, router.log or engines/<i>.log, not a text log; named on
stderr, the other files are still scanned) or a bad option. A file that cannot be read is named once, on stderr; the report's
summary line counts it.
"""

from __future__ import annotations

import argparse
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
from grpolab.diagnose.logdoctor.run_logs import EngineLog, RunLogs, find_run_logs, read_engine_log
from grpolab.diagnose.logdoctor.run_outcome import RunOutcome, read_run_outcome
from grpolab.diagnose.logdoctor.scan import DEFAULT_CHUNK_BYTES, FileScan, scan_file
from grpolab.diagnose.logdoctor.story import tell_story


def add_log_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of `grpolab diagnose log`."""
    parser.epilog = (
        "Exit codes: 0 no error-severity finding, 1 at least one, 2 a file could not be read (missing, "
        "no permission, a directory without console.log, router.log or engines/<i>.log, compressed or "
        "binary; the others are still scanned) or a bad option."
    )
    parser.add_argument(
        "files",
        nargs="+",
        metavar="FILE",
        help="text log files (console.log, Miles/slime, torchrun, router.log, an engine's log), or grpolab "
        "run directories (their console.log with every rank's recorded error from ranks/*.json, root cause "
        "first, router.log and engines/<i>.log: told as one story, the engine first)",
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


def _scan(file: str, options: RuleOptions, chunk_bytes: int, run: RunOutcome | None = None) -> FileScan:
    """`scan_file` of `file` (named as given); when it cannot be read, the file and the reason are named on
    stderr and the scan holds the error."""
    try:
        return scan_file(file, name=file, options=options, chunk_bytes=chunk_bytes, run=run)
    except OSError as e:
        reason = e.strerror or str(e)
        print(f"grpolab diagnose log: cannot read {file}: {reason}", file=sys.stderr)
        return FileScan(file=file, error=reason)


def scan_run_dir(logs: RunLogs, options: RuleOptions, chunk_bytes: int) -> list[FileScan]:
    """Scan every log of a run directory (console.log with what the directory recorded, router.log,
    engines/<i>.log) and tell them as one story (logdoctor/story.py): engine logs, router.log, console.log."""
    console = router = None
    if logs.console is not None:
        run = read_run_outcome(logs.directory)
        for problem in run.problems:
            print(f"grpolab diagnose log: {problem}", file=sys.stderr)
        console = _scan(logs.console, options, chunk_bytes, run)
    if logs.router is not None:
        router = _scan(logs.router, options, chunk_bytes)
    engines: list[tuple[FileScan, EngineLog | None]] = []
    for index, file in logs.engines:
        scan, log = _scan(file, options, chunk_bytes), None
        if scan.error is None:
            try:
                log = read_engine_log(index, file)
            except OSError:  # read a moment ago, gone since: its scan stands without the story's part
                log = None
        engines.append((scan, log))
    return tell_story(console, router, engines)


def run_log_command(args: argparse.Namespace) -> int:
    """Scan every file, print the report (text or --json); return the exit code (see `exit_code`).

    A FILE that is a directory stands for its logs (`run_logs.find_run_logs`); one without any is named
    on stderr as a file that could not be read (exit 2)."""
    try:
        options = options_from_args(args)
        if args.chunk_bytes < 1:
            raise ValueError(f"--chunk-bytes must be >= 1, got {args.chunk_bytes}")
    except ValueError as e:
        print(f"grpolab diagnose log: {e}", file=sys.stderr)
        return EXIT_UNREADABLE
    scans: list[FileScan] = []
    for file in map(display_path, args.files):
        if not Path(file).is_dir():
            scans.append(_scan(file, options, args.chunk_bytes))
            continue
        try:
            logs = find_run_logs(file)
        except OSError as e:
            print(f"grpolab diagnose log: cannot read {file}: {e.strerror or e}", file=sys.stderr)
            scans.append(FileScan(file=file, error=e.strerror or str(e)))
            continue
        scans += scan_run_dir(logs, options, args.chunk_bytes)
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

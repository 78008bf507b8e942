"""Scan run logs for known failure signatures: each finding gives its rule, evidence lines, cause and fix.

`grpolab diagnose log FILE [FILE…]` reads grpolab console.log files, Miles/slime logs (with or without
Ray's `(Actor pid=N)` prefixes) and torchrun logs (`[rank1]:`, `[default0]:`), as text: a compressed,
UTF-16 or binary file is not scanned, and the message says how to make a text log of it. A grpolab run
directory stands for its console.log and what the directory recorded (run_outcome.py): console.log
holds rank 0's output only, so every rank's recorded error (ranks/<rank>.json "error") is reported
too, root cause first, and the final status is read from events.jsonl. The rules live in rules_*.py
(model and registry: logrules.py); logscan.py streams each file through them; this module prints the
report and is the command.

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
from typing import Any

from grpolab.diagnose.dead_engine import (
    DEFAULT_CHECKS,
    DEFAULT_INTERVAL_S,
    DEFAULT_LIMIT,
    DEFAULT_WINDOW_S,
    WatchdogRule,
)
from grpolab.diagnose.logrules import (
    DEFAULT_MAX_STEP0_GAP,
    DEFAULT_MIN_KV_TOKENS,
    Finding,
    RuleOptions,
    count_by_severity,
)
from grpolab.diagnose.logscan import DEFAULT_CHUNK_BYTES, FileScan, scan_file
from grpolab.diagnose.run_outcome import read_run_outcome
from grpolab.diagnose.wording import plural

EXIT_OK, EXIT_ERRORS, EXIT_UNREADABLE = 0, 1, 2


# ---------------------------------------------------------------------- report
def _size(n: int) -> str:
    if n >= 1e6:
        return f"{n / 1e6:.1f} MB"
    if n >= 1e3:
        return f"{n / 1e3:.1f} kB"
    return f"{n} B"


def summary_line(scans: Sequence[FileScan]) -> str:
    """`scanned 1 file, 147.2 MB in 1.31 s (112 MB/s): 1 error, 0 warnings, 1 info`."""
    read = [s for s in scans if s.error is None]
    size = sum(s.size for s in read)
    seconds = sum(s.seconds for s in read)
    counts = count_by_severity(f for s in read for f in s.findings)
    rate = f"{size / 1e6 / seconds:.{0 if size / 1e6 >= 10 * seconds else 1}f} MB/s" if seconds > 0 else "-"
    unreadable = len(scans) - len(read)
    text = (
        f"scanned {len(read)} file{'s' if len(read) != 1 else ''}, {_size(size)} in {seconds:.2f} s ({rate}): "
        f"{counts['error']} error{'s' if counts['error'] != 1 else ''}, "
        f"{counts['warning']} warning{'s' if counts['warning'] != 1 else ''}, {counts['info']} info"
    )
    if unreadable:
        text += f"; {plural(unreadable, 'file')} could not be read (named on stderr)"
    return text


def _wrap(label: str, text: str) -> list[str]:
    import textwrap

    return textwrap.wrap(text, width=108, initial_indent=f"  {label:<8}", subsequent_indent=" " * 10) or [
        f"  {label}"
    ]


def render_finding(finding: Finding) -> str:
    """A finding as text: severity, rule and title, evidence lines, cause, fix, source."""
    out = [f"{finding.severity.upper():<7} {finding.rule}: {finding.title}"]
    width = max((len(str(e.line)) for e in finding.evidence), default=1)
    for e in finding.evidence:
        note = f"  [{e.note}]" if e.note else ""
        out.append(f"    {e.file}:{e.line:<{width}}  {e.text}{note}")
    out += _wrap("cause:", finding.cause)
    out += _wrap("fix:", finding.fix)
    out += _wrap("source:", finding.source)
    return "\n".join(out)


def render_text(scans: Sequence[FileScan]) -> str:
    """The whole report: per file read its findings (or that none were found), then the summary line.

    A file that could not be read is only counted in the summary line: the command names it, with the
    reason, on stderr.
    """
    blocks = []
    for scan in scans:
        if scan.error is not None:
            continue
        counts = count_by_severity(scan.findings)
        lines = "" if scan.lines is None else f", {plural(scan.lines, 'line')}"
        head = f"{scan.file} ({_size(scan.size)}{lines}): " + (
            ", ".join(f"{n} {sev}{'s' if n != 1 and sev != 'info' else ''}" for sev, n in counts.items() if n)
            if scan.findings
            else "no known failure signature"
        )
        blocks.append("\n\n".join([head] + [render_finding(f) for f in scan.findings]))
    blocks.append(summary_line(scans))
    return "\n\n".join(blocks)


def render_json(scans: Sequence[FileScan]) -> dict[str, Any]:
    """{files: [FileScan.as_json()], summary: {...}, exit_code}; every finding also carries `file`."""
    read = [s for s in scans if s.error is None]
    size = sum(s.size for s in read)
    seconds = sum(s.seconds for s in read)
    counts = count_by_severity(f for s in read for f in s.findings)
    return {
        "files": [s.as_json() for s in scans],
        "summary": {
            "files": len(read),
            "unreadable": len(scans) - len(read),
            "bytes": size,
            "seconds": round(seconds, 6),
            "mb_per_s": round(size / 1e6 / seconds, 3) if seconds > 0 else None,
            **counts,
            "text": summary_line(scans),
        },
        "exit_code": exit_code(scans),
    }


def exit_code(scans: Sequence[FileScan]) -> int:
    """2 when a file could not be read, else 1 when any finding is an error, else 0."""
    if any(s.error is not None for s in scans):
        return EXIT_UNREADABLE
    return EXIT_ERRORS if any(f.severity == "error" for s in scans for f in s.findings) else EXIT_OK


# ---------------------------------------------------------------------- CLI
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
    group.add_argument(
        "--limit",
        type=int,
        default=DEFAULT_LIMIT,
        help="a check strikes above this count (default %(default)s)",
    )
    group.add_argument(
        "--checks", type=int, default=DEFAULT_CHECKS, help="strikes in a row (default %(default)s)"
    )
    group.add_argument(
        "--interval",
        type=float,
        default=DEFAULT_INTERVAL_S,
        help="whole seconds between checks (default %(default)g; 30.0 is fine, 30.5 is not: the log's times "
        "are whole seconds)",
    )
    group.add_argument(
        "--window",
        type=float,
        default=DEFAULT_WINDOW_S,
        help="whole seconds each check counts (default %(default)g)",
    )
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
    rule = WatchdogRule(limit=args.limit, checks=args.checks, interval=args.interval, window=args.window)
    return RuleOptions(watchdog=rule, max_step0_gap=args.max_step0_gap, min_kv_tokens=args.min_kv_tokens)


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
    for file in args.files:
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


if __name__ == "__main__":
    sys.exit(main())

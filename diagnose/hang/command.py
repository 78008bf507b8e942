"""`grpolab diagnose hang`: py-spy every rank of a run, confirm the hang and classify it.

Usage: `grpolab diagnose hang RUN_DIR`, `--pid P [P ...]` or `--match PATTERN`. This module is the
command's flags and output; the steps live in their own modules: finding the ranks
(hang/targets.py, `--match` in hang/match.py, /proc in common/procfs.py), the sweep (hang/sweep.py),
py-spy (hang/pyspy.py, parsed by hang/stacks.py), the run directory's activity (hang/activity.py), the progress decision
(hang/progress.py, pure), the classifier (hang/verdict/classify.py, pure), runs that already ended
(hang/ended.py) and the report and dumps (hang/report.py).

1. Find the ranks. RUN_DIR: `ranks/*.json` (rank, pid, host, role, heartbeat, optional "error"
   written when the rank's training loop raised). `--pid`: ranks numbered in the order given.
   `--match`: processes whose `/proc/<pid>/cmdline` matches the regular expression (this command
   and its parents excluded); when some of them have `RANK` in their environment (torchrun sets
   it) only those are ranks, numbered by it, and the rest (launchers) are listed as skipped;
   ranks of more than one job (MASTER_ADDR:MASTER_PORT, TORCHELASTIC_RUN_ID) are refused with
   each job's pids. Forked workers are skipped, and a rank found only as an orphaned process (a
   worker of a rank that exited?) is reported as exited or with a caveat (hang/match.py). A rank
   whose pid is gone (or a zombie), or whose pid now belongs to a process started after the
   rank's last heartbeat (a reused pid), is "exited"; a rank on
   another host cannot be py-spied and is reported as not inspected: the headline says how many
   ranks were inspected, and the verdict counts such a rank neither alive nor in a collective.
2. Sample twice. `py-spy dump --json` runs on every live local rank at once (one thread per rank,
   each with its own `--timeout`), then again `--interval` seconds later; `--native` is added to
   the last sample only (the comparison ignores native frames, and native unwinding is the
   expensive part). Measured on a 2-rank gloo hang: one `py-spy dump` of a rank takes 12-16 ms
   with or without `--json`, 0.6-0.7 s with `--native`; so the tool attaches once per sample,
   parses the JSON, and writes the human-readable `rank<r>.txt` from the parsed stacks in
   py-spy's own layout instead of attaching a second time for the text.
3. Decide whether the run progressed between the samples (`decide_progress` in hang/progress.py,
   grpolab's rule): a local rank gone while the run wrote no final status means hung; a run file
   that changed (a heartbeat, a metric line or an event) means progress; otherwise identical
   stacks in both samples confirm the hang (the AReaL guide's step 1 "confirm the hang", done by
   machine); moving stacks confirm it only when the newest heartbeat / metrics / event is at
   least `--stall-seconds` old (at least 1 s; heartbeats are written at phase changes only, so a
   value below the run's longest phase reads a healthy run as hung: the report then says the
   hang rests on the heartbeat age). `--interval 0` takes one sample (needs RUN_DIR): one sample
   shows nothing moving, so heartbeats older than `--stall-seconds` confirm the hang and younger ones
   leave it not confirmed (exit 2). Without RUN_DIR (`--pid`, `--match`) there are no
   heartbeats: the two samples decide. Every process gone: the run ended (with its final status)
   or, for `--pid` / `--match`, the processes ended during the diagnosis: not hung.
4. Classify (classify.classify), print the verdict, every rank's recorded error (root cause
   first), the evidence, the ranks x frame table, the next steps (their NCCL or gloo advice from
   run.json's backend and device, or the frames) and where the dumps are, and keep the dumps in
   `RUN_DIR/diagnose/<UTC time>/`: `rank<r>.txt` (both samples, py-spy layout, or py-spy's
   error), `rank<r>.json` (the parsed samples) and `verdict.json` (the verdict plus its inputs).
   Without RUN_DIR nothing is written unless `--out DIR` is given.

Exit codes: 0 not hung (progress observed, or the run / the processes ended), 1 hung and
classified, 2 not confirmed yet (one sample of heartbeats younger than `--stall-seconds`, or no
rank sampled twice) or could not inspect (the reason is printed: py-spy missing, permission
denied, no such pid, no rank files, every rank gone without a final status, a bad flag, …).
A closed stdout (`… | head -1`) ends the output quietly.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from pathlib import Path

from grpolab.diagnose.hang.match import ranks_from_match
from grpolab.diagnose.hang.pyspy import DEFAULT_TIMEOUT_S, find_py_spy, py_spy_version
from grpolab.diagnose.hang.report import format_report, new_dump_dir, write_dumps
from grpolab.diagnose.hang.sweep import (
    DEFAULT_INTERVAL_S,
    DEFAULT_STALL_SECONDS,
    MAX_INTERVAL_S,
    MIN_STALL_SECONDS,
    NotConfirmed,
    diagnose_hang,
)
from grpolab.diagnose.hang.targets import InspectError, ranks_from_pids, read_rank_files

__all__ = ["NotConfirmed", "add_hang_arguments", "diagnose_hang", "run_hang_command"]


# --------------------------------------------------------------------------------------------- CLI
def add_hang_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of `grpolab diagnose hang`."""
    parser.add_argument(
        "run_dir",
        nargs="?",
        metavar="RUN_DIR",
        help="a grpolab run directory: its ranks/*.json give every rank's pid, host and heartbeat",
    )
    parser.add_argument(
        "--pid",
        action="extend",
        nargs="+",
        type=int,
        metavar="P",
        help="inspect these processes instead (rank = position; repeated flags add up: --pid 1 2 --pid 3 "
        "inspects 1, 2 and 3)",
    )
    parser.add_argument(
        "--match",
        metavar="PATTERN",
        help="inspect the processes whose command line matches this regular expression "
        "(ranks from their RANK environment variable when set)",
    )
    parser.add_argument(
        "--stall-seconds",
        type=float,
        default=DEFAULT_STALL_SECONDS,
        help="heartbeats/metrics older than this (seconds, at least "
        f"{MIN_STALL_SECONDS:g}) confirm a hang even when stacks move (default {DEFAULT_STALL_SECONDS:g}). "
        "Heartbeats are written at phase changes only: a value below the run's longest phase (a long "
        "rollout or train step) reads a healthy run as hung, with --interval 0 or when its stacks move",
    )
    parser.add_argument(
        "--interval",
        type=float,
        default=DEFAULT_INTERVAL_S,
        help="seconds between the two stack samples (at most "
        f"{MAX_INTERVAL_S:g}); 0 takes one sample, which can confirm a hang only when the heartbeats "
        f"are older than --stall-seconds (needs RUN_DIR) (default {DEFAULT_INTERVAL_S:g})",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=DEFAULT_TIMEOUT_S,
        help=f"seconds one py-spy dump may take (at most {MAX_INTERVAL_S:g}; default {DEFAULT_TIMEOUT_S:g})",
    )
    parser.add_argument(
        "--native",
        action="store_true",
        help="include native (C/C++) frames in the last sample (py-spy --native)",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of the report")
    parser.add_argument(
        "--out",
        metavar="DIR",
        help="write the dumps and verdict.json here (default: RUN_DIR/diagnose/<UTC time>/; without "
        "RUN_DIR nothing is written unless --out is given)",
    )
    parser.add_argument("--py-spy", dest="py_spy", metavar="PATH", help="the py-spy executable to use")


def _check_seconds(
    flag: str, value: float, *, low: float, high: float | None, low_open: bool = False
) -> None:
    """A flag's number of seconds is finite and in range; else InspectError naming the flag."""
    in_range = math.isfinite(value) and (value > low if low_open else value >= low)
    if high is not None:
        in_range = in_range and value <= high
    if not in_range:
        bounds = f"{'>' if low_open else '>='} {low:g}" + ("" if high is None else f" and <= {high:g}")
        raise InspectError(f"{flag}: expected a finite number of seconds {bounds}, got {value}")


def _validate(args: argparse.Namespace) -> None:
    given = [
        name
        for name, value in (("RUN_DIR", args.run_dir), ("--pid", args.pid), ("--match", args.match))
        if value
    ]
    if len(given) != 1:
        raise InspectError(
            "give exactly one of RUN_DIR, --pid P [P ...] or --match PATTERN"
            + (f" (got {' and '.join(given)})" if given else "")
        )
    _check_seconds("--interval", args.interval, low=0.0, high=MAX_INTERVAL_S)
    _check_seconds("--stall-seconds", args.stall_seconds, low=MIN_STALL_SECONDS, high=None)
    _check_seconds("--timeout", args.timeout, low=0.0, high=MAX_INTERVAL_S, low_open=True)
    if args.interval == 0 and not args.run_dir:
        raise InspectError(
            "--interval 0 needs RUN_DIR: without heartbeats only two samples can confirm a hang"
        )


def _emit(text: str, *, stream=None) -> bool:
    """Print `text`; False when the reader went away (`… | head -1`): stdout is then pointed at
    /dev/null so the interpreter's final flush cannot raise BrokenPipeError either."""
    stream = stream or sys.stdout
    try:
        print(text, file=stream)
        stream.flush()
    except BrokenPipeError:
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, stream.fileno())
            os.close(devnull)
        except (OSError, ValueError):  # not a real file descriptor (a test's capture)
            pass
        return False
    return True


def run_hang_command(args: argparse.Namespace) -> int:
    """Run `grpolab diagnose hang` from parsed flags; print the report; return 0, 1 or 2 (module doc).

    A closed stdout (`| head -1`) ends the printing quietly; the exit code stays the verdict's.
    """
    try:
        _validate(args)
        py_spy = find_py_spy(args.py_spy)
        notes: list[str] = []
        run_dir = Path(args.run_dir) if args.run_dir else None
        if run_dir is not None:
            targets, notes = read_rank_files(run_dir)
        elif args.pid:
            targets = ranks_from_pids(args.pid)
        else:
            targets, notes = ranks_from_match(args.match)
        report = diagnose_hang(
            targets,
            run_dir=run_dir,
            py_spy=py_spy,
            interval_s=args.interval,
            stall_seconds=args.stall_seconds,
            timeout_s=args.timeout,
            native=args.native,
            notes=notes,
        )
    except InspectError as e:
        status = "not confirmed yet" if isinstance(e, NotConfirmed) else "could not inspect"
        if getattr(args, "json", False):
            _emit(json.dumps({"exit_code": 2, "hung": None, "status": status, "error": str(e)}))
        else:
            _emit(f"grpolab diagnose hang: {status}: {e}", stream=sys.stderr)
        return 2
    report.py_spy_version = py_spy_version(py_spy)
    report.options = {k: v for k, v in vars(args).items() if k in _OPTION_NAMES}
    out = (
        Path(args.out) if args.out else (new_dump_dir(run_dir / "diagnose") if run_dir is not None else None)
    )
    if out is not None and report.samples:
        try:
            write_dumps(report, out)
        except OSError as e:
            report.out_dir = None
            report.notes.append(f"could not keep the dumps in {out}: {e.strerror or e}")
    _emit(json.dumps(report.to_dict(), indent=2, default=str) if args.json else format_report(report))
    return report.exit_code


_OPTION_NAMES = (
    "run_dir",
    "pid",
    "match",
    "stall_seconds",
    "interval",
    "timeout",
    "native",
    "json",
    "out",
    "py_spy",
)

"""`grpolab diagnose hang`: py-spy every rank of a run, confirm the hang and classify it.

Usage: `grpolab diagnose hang RUN_DIR`, `--pid P [P ...]` or `--match PATTERN`. This module is the
command's flags and its orchestration; the steps live in their own modules: finding the ranks
(hang_targets.py), py-spy (pyspy.py, parsed by stacks.py), the run directory's activity
(run_activity.py), the progress decision (hang_progress.py, pure), the classifier (classify.py,
pure) and the report and dumps (hang_report.py).

1. Find the ranks. RUN_DIR: `ranks/*.json` (rank, pid, host, role, heartbeat, optional "error"
   written when the rank's training loop raised). `--pid`: ranks numbered in the order given.
   `--match`: processes whose `/proc/<pid>/cmdline` matches the regular expression (this command
   and its parents excluded); when some of them have `RANK` in their environment (torchrun sets
   it) only those are ranks, numbered by it, and the rest (launchers) are listed as skipped.
   A rank whose pid is gone (or a zombie) is "exited"; a rank on another host cannot be py-spied
   and is reported as not inspected.
2. Sample twice. `py-spy dump --json` runs on every live local rank at once (one thread per rank,
   each with its own `--timeout`), then again `--interval` seconds later; `--native` is added to
   the last sample only (the comparison ignores native frames, and native unwinding is the
   expensive part). Measured on a 2-rank gloo hang: one `py-spy dump` of a rank takes 12-16 ms
   with or without `--json`, 0.6-0.7 s with `--native`; so the tool attaches once per sample,
   parses the JSON, and writes the human-readable `rank<r>.txt` from the parsed stacks in
   py-spy's own layout instead of attaching a second time for the text.
3. Decide whether the run progressed between the samples (`decide_progress` in hang_progress.py,
   grpolab's rule): a run file that changed (a heartbeat, a metric line or an event) means
   progress; otherwise identical stacks in both samples confirm the hang (the AReaL guide's step 1
   "confirm the hang", done by machine); moving stacks confirm it only when the newest heartbeat /
   metrics / event is at least `--stall-seconds` old.
   `--interval 0` takes one sample and decides by `--stall-seconds` alone (needs RUN_DIR).
   Without RUN_DIR (`--pid`, `--match`) there are no heartbeats: the two samples decide.
4. Classify (classify.classify), print the verdict, the evidence, the ranks x frame table, the next
   steps and where the dumps are, and keep the dumps in `RUN_DIR/diagnose/<UTC time>/`:
   `rank<r>.txt` (both samples, py-spy layout, or py-spy's error), `rank<r>.json` (the parsed
   samples) and `verdict.json` (the verdict plus its inputs). Without RUN_DIR nothing is written
   unless `--out DIR` is given.

Exit codes: 0 not hung (progress observed, or the run already ended with its final status),
1 hung and classified, 2 could not inspect (the reason is printed: py-spy missing, permission
denied, no such pid, no rank files, every rank gone without a final status, …).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from grpolab.diagnose.hang_progress import ProgressCheck, decide_progress
from grpolab.diagnose.hang_report import HangReport, format_report, new_dump_dir, write_dumps
from grpolab.diagnose.hang_targets import (
    InspectError,
    RankTarget,
    is_alive,
    ranks_from_match,
    ranks_from_pids,
    read_rank_files,
    refresh_heartbeats,
)
from grpolab.diagnose.pyspy import DEFAULT_TIMEOUT_S, DumpResult, dump_all, find_py_spy, py_spy_version
from grpolab.diagnose.run_activity import RunContext, activity_snapshot, changed_files, read_run_context

if TYPE_CHECKING:
    from grpolab.diagnose.rank_rows import RankObservation

DEFAULT_STALL_SECONDS = 120.0
"""`--stall-seconds`: the issue's default; a grpolab phase (rollout, train) on the default config takes
seconds, so two minutes without a heartbeat, metric or event is far outside normal behaviour."""
DEFAULT_INTERVAL_S = 2.0
"""`--interval`: seconds between the two stack samples (grpolab's: long enough for a running loop to
change its frames, short enough to keep the verdict under the 5 s goal for 4 ranks)."""


def _liveness(targets: Sequence[RankTarget]) -> dict[int, bool]:
    """rank → alive; ranks on another host count as alive (this host cannot tell)."""
    return {t.rank: is_alive(t.pid) if t.local else True for t in targets}


def _sample(
    py_spy: str, targets: Sequence[RankTarget], *, native: bool, timeout_s: float
) -> dict[int, DumpResult]:
    """One `dump_all` over `targets`, keyed by rank."""
    by_pid = dump_all(py_spy, [t.pid for t in targets], native=native, timeout_s=timeout_s)
    return {t.rank: by_pid[t.pid] for t in targets}


def diagnose_hang(
    targets: list[RankTarget],
    *,
    run_dir: Path | None = None,
    py_spy: str,
    interval_s: float = DEFAULT_INTERVAL_S,
    stall_seconds: float = DEFAULT_STALL_SECONDS,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    native: bool = False,
    notes: Iterable[str] = (),
) -> HangReport:
    """Sample every live local rank (twice unless `interval_s` is 0), decide progress and classify.

    Args:
        targets: the ranks (unique rank numbers), from `read_rank_files`, `ranks_from_pids` or
            `ranks_from_match`.
        interval_s, stall_seconds, timeout_s: `--interval`, `--stall-seconds`, `--timeout` (seconds).

    Raises:
        InspectError: no live rank can be dumped (every py-spy failed: the reasons are joined, with a
            hint for permission errors), no rank is alive and the run wrote no final status, or no
            rank has anything to classify (e.g. all on other hosts).
    """
    started = time.perf_counter()
    notes = list(notes)
    run = read_run_context(run_dir, time.time()) if run_dir is not None else None
    alive = _liveness(targets)
    if not any(alive.values()):
        if run is not None and run.final_status is not None:
            return _ended_report(targets, alive, run, run_dir, py_spy, notes, started)
        pids = ", ".join(f"rank {t.rank} pid {t.pid}" for t in targets)
        raise InspectError(
            f"no rank process is alive ({pids})"
            + ("; the run wrote no final status (killed? see console.log)" if run_dir is not None else "")
        )
    before = activity_snapshot(run_dir)
    live_local = [t for t in targets if t.local and alive[t.rank]]
    # --native only on the last sample: unwinding native frames costs 0.1-0.7 s per rank, and the
    # stack comparison looks at Python frames only (ProcessStack.signature), so sample 1 stays cheap.
    samples = [_sample(py_spy, live_local, native=native and interval_s == 0, timeout_s=timeout_s)]
    if live_local and all(d.stack is None for d in samples[0].values()):
        raise InspectError(_no_dump_reason(samples[0]))
    if interval_s > 0:
        time.sleep(interval_s)
        still = [t for t in live_local if is_alive(t.pid)]
        samples.append(_sample(py_spy, still, native=native, timeout_s=timeout_s))
    after = activity_snapshot(run_dir)
    alive = _liveness(targets)
    now = time.time()
    compared, moved = [], []
    if len(samples) == 2:
        for t in live_local:
            a, b = samples[0].get(t.rank), samples[1].get(t.rank)
            if a is not None and b is not None and a.stack is not None and b.stack is not None:
                compared.append(t.rank)
                if a.stack.signature() != b.stack.signature():
                    moved.append(t.rank)
    ages = [
        a for a in (t.heartbeat_age_s(now) for t in refresh_heartbeats(targets, run_dir)) if a is not None
    ]
    if run_dir is not None:
        run = read_run_context(run_dir, now)
        ages += [a for a in (run.metrics_age_s, run.events_age_s) if a is not None]
    progress = decide_progress(
        files_changed=changed_files(before, after),
        ranks_compared=sorted(compared),
        ranks_moved=sorted(moved),
        newest_activity_age_s=min(ages) if ages else None,
        stall_seconds=stall_seconds,
        interval_s=interval_s if len(samples) == 2 else 0.0,
    )
    from grpolab.diagnose.classify import classify

    try:
        verdict = classify(_observations(targets, alive, samples, now), progressed=progress.progressed)
    except ValueError as e:  # e.g. every live rank is on another host: no stack at all
        raise InspectError("; ".join([str(e), *notes])) from None
    report = HangReport(
        verdict=verdict,
        progress=progress,
        targets=targets,
        samples=samples,
        alive=alive,
        notes=notes,
        run_dir=run_dir,
        run=run,
        py_spy=py_spy,
    )
    for rank, why in report.missing_ranks().items():
        if alive[rank]:
            notes.append(f"rank {rank} not inspected: {why}")
    report.elapsed_s = time.perf_counter() - started
    return report


def _observations(
    targets: Sequence[RankTarget],
    alive: dict[int, bool],
    samples: Sequence[dict[int, DumpResult]],
    now: float,
) -> list[RankObservation]:
    """The classifier's input: each rank's liveness, its parsed stacks (earliest first) and heartbeat."""
    from grpolab.diagnose.rank_rows import RankObservation

    return [
        RankObservation(
            rank=t.rank,
            pid=t.pid,
            alive=alive[t.rank],
            stacks=tuple(s[t.rank].stack for s in samples if t.rank in s and s[t.rank].stack is not None),
            heartbeat_age_s=t.heartbeat_age_s(now),
            heartbeat_phase=(t.heartbeat or {}).get("phase"),
            exception=t.error,
            exit_code=None,  # not knowable for processes that are not our children
        )
        for t in targets
    ]


def _no_dump_reason(sample: dict[int, DumpResult]) -> str:
    failures = {d.failure for d in sample.values()}
    lines = [f"rank {rank} (pid {d.pid}): {d.error}" for rank, d in sorted(sample.items())]
    head = "py-spy could not dump any rank"
    if "permission" in failures:
        head = (
            "permission denied: py-spy may not attach to the ranks (ptrace). Run as the ranks' user with "
            "ptrace allowed: `sudo grpolab diagnose hang …`, `sysctl kernel.yama.ptrace_scope=0`, or in "
            "a container `--cap-add SYS_PTRACE`"
        )
    return head + "; " + "; ".join(lines)


def _ended_report(
    targets: list[RankTarget],
    alive: dict[int, bool],
    run: RunContext,
    run_dir: Path | None,
    py_spy: str,
    notes: list[str],
    started: float,
) -> HangReport:
    """No rank is alive and the run wrote its final status: not hung, the run is over."""
    from grpolab.diagnose.classify import classify

    status = run.final_status or {}
    reason = f"the run ended: final status {status.get('status')!r}" + (
        f" ({status.get('error')})" if status.get("error") else ""
    )
    progress = ProgressCheck(True, reason + "; no rank process is alive", 0.0, 0.0, None)
    observations = _observations(targets, alive, [], time.time())
    verdict = dataclasses.replace(
        classify(observations, progressed=True), title=f"Not hung: {reason}; no rank process is alive"
    )
    return HangReport(
        verdict=verdict,
        progress=progress,
        targets=targets,
        samples=[],
        alive=alive,
        notes=notes,
        run_dir=run_dir,
        run=run,
        py_spy=py_spy,
        elapsed_s=time.perf_counter() - started,
    )


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
        "--pid", nargs="+", type=int, metavar="P", help="inspect these processes instead (rank = position)"
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
        help="heartbeats/metrics older than this (seconds) confirm a hang even when stacks move "
        f"(default {DEFAULT_STALL_SECONDS:g})",
    )
    parser.add_argument(
        "--interval",
        type=float,
        default=DEFAULT_INTERVAL_S,
        help="seconds between the two stack samples; 0 takes one sample and relies on --stall-seconds "
        f"(needs RUN_DIR) (default {DEFAULT_INTERVAL_S:g})",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=DEFAULT_TIMEOUT_S,
        help=f"seconds one py-spy dump may take (default {DEFAULT_TIMEOUT_S:g})",
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
    for flag, value, low in (
        ("--interval", args.interval, 0.0),
        ("--stall-seconds", args.stall_seconds, 0.0),
    ):
        if not value >= low:
            raise InspectError(f"{flag}: expected a number of seconds >= {low:g}, got {value}")
    if not args.timeout > 0:
        raise InspectError(f"--timeout: expected a number of seconds > 0, got {args.timeout}")
    if args.interval == 0 and not args.run_dir:
        raise InspectError(
            "--interval 0 needs RUN_DIR: without heartbeats only two samples can confirm a hang"
        )


def run_hang_command(args: argparse.Namespace) -> int:
    """Run `grpolab diagnose hang` from parsed flags; print the report; return 0, 1 or 2 (module doc)."""
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
        if getattr(args, "json", False):
            print(json.dumps({"exit_code": 2, "hung": None, "error": str(e)}))
        else:
            print(f"grpolab diagnose hang: could not inspect: {e}", file=sys.stderr)
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
    if args.json:
        print(json.dumps(report.to_dict(), indent=2, default=str))
    else:
        print(format_report(report))
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

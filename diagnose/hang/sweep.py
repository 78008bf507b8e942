"""The sweep behind `grpolab diagnose hang`: liveness, two py-spy samples, the progress rule, the verdict.

`diagnose_hang` takes the ranks (hang/targets.py) and returns a `HangReport` (hang/report.py); it
raises `NotConfirmed` when nothing could be seen moving yet and `InspectError` when the ranks
cannot be inspected. The steps and their order are described in hang/command.py's module docstring.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from pathlib import Path

from grpolab.diagnose.hang.activity import RunContext, activity_snapshot, changed_files, read_run_context
from grpolab.diagnose.hang.progress import decide_progress
from grpolab.diagnose.hang.pyspy import DEFAULT_TIMEOUT_S, DumpResult, dump_all
from grpolab.diagnose.hang.report import HangReport
from grpolab.diagnose.hang.targets import InspectError, RankTarget, rank_liveness, refresh_heartbeats
from grpolab.diagnose.hang.verdict.rank_rows import RankObservation

DEFAULT_STALL_SECONDS = 120.0
"""`--stall-seconds`: the issue's default; a grpolab phase (rollout, train) on the default config takes
seconds, so two minutes without a heartbeat, metric or event is far outside normal behaviour."""
MIN_STALL_SECONDS = 1.0
"""Smallest `--stall-seconds` (grpolab's): a floor against sub-second values (0.001, a typo for
a minute) that make every heartbeat stale at once. 1 s is still below most grpolab phases: a value
under the run's longest phase reads a healthy run as hung whenever the heartbeat age decides (one
sample, or moving stacks), which the report then says (hang/progress.py); such values are for
tests and runs whose phases are known to be short."""
DEFAULT_INTERVAL_S = 2.0
"""`--interval`: seconds between the two stack samples (grpolab's: long enough for a running loop to
change its frames, short enough to keep the verdict under the 5 s goal for 4 ranks)."""
MAX_INTERVAL_S = 3600.0
"""Largest `--interval` and `--timeout` (grpolab's): a check that waits longer is better run twice."""


class NotConfirmed(InspectError):
    """Neither progress nor a hang could be established (exit 2): e.g. one sample of fresh heartbeats."""


def _liveness(targets: Sequence[RankTarget]) -> tuple[dict[int, bool], dict[int, str]]:
    """(rank → alive, rank → why it is gone); ranks on another host count as alive."""
    alive, gone = {}, {}
    for t in targets:
        alive[t.rank], why = rank_liveness(t)
        if why is not None:
            gone[t.rank] = why
    return alive, gone


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
        NotConfirmed: nothing could be seen moving and the heartbeats are younger than
            `stall_seconds` (one sample), or no rank was sampled twice; the message says what to do.
        InspectError: no live rank can be dumped (every py-spy failed: the reasons are joined, with a
            hint for permission errors), every rank of a run directory is gone and the run wrote no
            final status, or no rank runs on this host.
    """
    started = time.perf_counter()
    notes = list(notes)
    run = read_run_context(run_dir, time.time()) if run_dir is not None else None
    alive, gone = _liveness(targets)
    parts = dict(targets=targets, run_dir=run_dir, py_spy=py_spy, notes=notes, started=started)
    if not any(alive.values()):
        return _all_gone(alive=alive, gone=gone, run=run, samples=[], stall_seconds=stall_seconds, **parts)
    live_local = [t for t in targets if t.local and alive[t.rank]]
    if not live_local and not any(t.local for t in targets):
        hosts = "; ".join(f"rank {t.rank} on {t.host}" for t in targets)
        raise InspectError(f"no rank runs on this host ({hosts}): run grpolab diagnose hang on those hosts")
    before = activity_snapshot(run_dir)
    samples: list[dict[int, DumpResult]] = []
    if live_local:
        # --native only on the last sample: unwinding native frames costs 0.1-0.7 s per rank, and the
        # stack comparison looks at Python frames only (ProcessStack.signature), so sample 1 stays cheap.
        samples.append(_sample(py_spy, live_local, native=native and interval_s == 0, timeout_s=timeout_s))
        alive, gone = _liveness(targets)
        live_local = [t for t in live_local if alive[t.rank]]
        if live_local and all(samples[0][t.rank].stack is None for t in live_local):
            raise InspectError(_no_dump_reason({t.rank: samples[0][t.rank] for t in live_local}))
        if interval_s > 0 and live_local:
            time.sleep(interval_s)
            still = [t for t in live_local if rank_liveness(t)[0]]
            samples.append(_sample(py_spy, still, native=native, timeout_s=timeout_s))
    after = activity_snapshot(run_dir)
    now = time.time()
    refresh_heartbeats(targets, run_dir)  # a heartbeat or an error written while we watched
    alive, gone = _liveness(targets)
    if run_dir is not None:
        run = read_run_context(run_dir, now)
    if not any(alive.values()):
        return _all_gone(
            alive=alive, gone=gone, run=run, samples=samples, stall_seconds=stall_seconds, **parts
        )
    compared, moved = [], []
    if len(samples) == 2:
        for t in targets:
            a, b = samples[0].get(t.rank), samples[1].get(t.rank)
            if a is not None and b is not None and a.stack is not None and b.stack is not None:
                compared.append(t.rank)
                if a.stack.signature() != b.stack.signature():
                    moved.append(t.rank)
    ages = [a for a in (t.heartbeat_age_s(now) for t in targets) if a is not None]
    if run is not None:
        ages += [a for a in (run.metrics_age_s, run.events_age_s) if a is not None]
    exited = []  # a local rank of a run directory gone without the run's final status: never progress
    if run is not None and run.final_status is None:
        exited = [t.rank for t in targets if t.local and not alive[t.rank]]
    sampled_once = samples[0] if samples else {}
    progress = decide_progress(
        files_changed=changed_files(before, after),
        ranks_compared=sorted(compared),
        ranks_moved=sorted(moved),
        newest_activity_age_s=min(ages) if ages else None,
        stall_seconds=stall_seconds,
        interval_s=interval_s if len(samples) == 2 else 0.0,
        samples=len(samples),
        ranks_exited=exited,
        ranks_not_inspected={t.rank: str(t.host) for t in targets if not t.local},
        ranks_gone={
            t.rank: "exited during sampling" if t.rank in sampled_once else "had exited before sampling"
            for t in targets
            if t.local and not alive[t.rank] and t.rank not in exited
        },
        ranks_not_dumped=[
            t.rank
            for t in targets
            if t.local and alive[t.rank] and t.rank not in compared and len(samples) == 2
        ],
        ranks_total=len(targets),
    )
    if progress.outcome == "not_confirmed":
        raise NotConfirmed(progress.reason + (f"; {progress.note}" if progress.note else ""))
    from grpolab.diagnose.hang.verdict.classify import classify

    try:
        verdict = classify(
            _observations(targets, alive, samples, now),
            progressed=progress.progressed,
            backend=run.backend if run is not None else None,
        )
    except ValueError as e:  # e.g. every live rank is on another host: no stack at all
        raise InspectError("; ".join([str(e), *notes])) from None
    report = HangReport(
        verdict=verdict,
        progress=progress,
        samples=samples,
        alive=alive,
        gone=gone,
        run=run,
        **_report_args(parts),
    )
    for rank, why in report.missing_ranks().items():
        if alive[rank] or (rank in gone and why != "exited (pid gone)"):  # a reused pid: say so
            notes.append(f"rank {rank} not inspected: {why}")
    report.elapsed_s = time.perf_counter() - started
    return report


def _report_args(parts: dict) -> dict:
    return {k: parts[k] for k in ("targets", "run_dir", "py_spy", "notes")}


def _observations(
    targets: Sequence[RankTarget],
    alive: dict[int, bool],
    samples: Sequence[dict[int, DumpResult]],
    now: float,
) -> list[RankObservation]:
    """The classifier's input: each rank's liveness, its parsed stacks (earliest first) and heartbeat."""
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
            remote_host=None if t.local else str(t.host),
            caveat=t.caveat,
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


def _all_gone(
    *,
    targets: list[RankTarget],
    alive: dict[int, bool],
    gone: dict[int, str],
    run: RunContext | None,
    run_dir: Path | None,
    samples: list[dict[int, DumpResult]],
    stall_seconds: float,
    py_spy: str,
    notes: list[str],
    started: float,
) -> HangReport:
    """No rank is alive: the run ended (its final status), or the `--pid`/`--match` processes ended.

    Raises:
        InspectError: a run directory whose run wrote no final status (killed?).
    """
    from grpolab.diagnose.hang.ended import ended_run_check, ended_run_verdict, processes_ended

    observations = _observations(targets, alive, [], time.time())
    if run_dir is not None and (run is None or run.final_status is None):
        pids = ", ".join(f"rank {t.rank} pid {t.pid}: {gone.get(t.rank, 'exited')}" for t in targets)
        when = "every rank exited during the diagnosis" if samples else "no rank process is alive"
        raise InspectError(f"{when} ({pids}); the run wrote no final status (killed? see console.log)")
    if run is not None:
        progress = ended_run_check(run, stall_seconds)
        verdict = ended_run_verdict(observations, targets, gone, run)
    else:
        progress, verdict = processes_ended(observations, targets, gone, stall_seconds, len(samples))
    return HangReport(
        verdict=verdict,
        progress=progress,
        samples=[],
        alive=alive,
        gone=gone,
        run=run,
        elapsed_s=time.perf_counter() - started,
        targets=targets,
        run_dir=run_dir,
        py_spy=py_spy,
        notes=notes,
    )

"""The sweep behind `grpolab diagnose hang`: liveness, two py-spy samples, the progress rule, the verdict.

`diagnose_hang` takes the ranks (hang/targets.py) and returns a `HangReport` (hang/report.py); it
raises `NotConfirmed` when nothing could be seen moving yet and `InspectError` when the ranks
cannot be inspected. The steps and their order are described in hang/command.py's module docstring.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from grpolab.diagnose.hang.activity import RunContext, activity_snapshot, changed_files, read_run_context
from grpolab.diagnose.hang.ended import ended_run_check, ended_run_verdict, processes_ended
from grpolab.diagnose.hang.progress import ProgressCheck, decide_progress
from grpolab.diagnose.hang.pyspy import DEFAULT_TIMEOUT_S, DumpResult, dump_all
from grpolab.diagnose.hang.report import HangReport
from grpolab.diagnose.hang.targets import InspectError, RankTarget, rank_liveness, refresh_heartbeats
from grpolab.diagnose.hang.verdict.classify import Verdict, classify
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


@dataclass
class _Sweep:
    """One diagnosis in progress: its inputs, and the run and ranks as last seen."""

    targets: list[RankTarget]
    run_dir: Path | None
    py_spy: str
    notes: list[str]
    stall_seconds: float
    started: float = field(default_factory=time.perf_counter)
    run: RunContext | None = None
    alive: dict[int, bool] = field(default_factory=dict)
    gone: dict[int, str] = field(default_factory=dict)

    def look(self, now: float) -> None:
        """Re-read the run directory's context (ages relative to `now`, Unix seconds) and every rank's
        liveness."""
        if self.run_dir is not None:
            self.run = read_run_context(self.run_dir, now)
        self.alive, self.gone = _liveness(self.targets)

    def report(
        self, verdict: Verdict, progress: ProgressCheck, samples: list[dict[int, DumpResult]]
    ) -> HangReport:
        """The report of what was seen, its elapsed time measured now."""
        return HangReport(
            verdict=verdict,
            progress=progress,
            samples=samples,
            alive=self.alive,
            gone=self.gone,
            run=self.run,
            elapsed_s=time.perf_counter() - self.started,
            targets=self.targets,
            run_dir=self.run_dir,
            py_spy=self.py_spy,
            notes=self.notes,
        )


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
    sweep = _Sweep(targets, run_dir, py_spy, list(notes), stall_seconds)
    sweep.look(time.time())
    if not any(sweep.alive.values()):
        return _all_gone(sweep, samples_taken=0)
    if not any(t.local for t in targets):
        hosts = "; ".join(f"rank {t.rank} on {t.host}" for t in targets)
        raise InspectError(f"no rank runs on this host ({hosts}): run grpolab diagnose hang on those hosts")
    before = activity_snapshot(run_dir)
    samples = _take_samples(sweep, interval_s=interval_s, native=native, timeout_s=timeout_s)
    after = activity_snapshot(run_dir)
    now = time.time()
    refresh_heartbeats(targets, run_dir)  # a heartbeat or an error written while we watched
    sweep.look(now)
    if not any(sweep.alive.values()):
        return _all_gone(sweep, samples_taken=len(samples))
    progress = _progress(sweep, samples, changed_files(before, after), now=now, interval_s=interval_s)
    if progress.outcome == "not_confirmed":
        raise NotConfirmed(progress.reason + (f"; {progress.note}" if progress.note else ""))
    return _classified(sweep, progress, samples, now)


def _take_samples(
    sweep: _Sweep, *, interval_s: float, native: bool, timeout_s: float
) -> list[dict[int, DumpResult]]:
    """py-spy every live local rank once, and again `interval_s` seconds later (unless 0).

    Raises:
        InspectError: py-spy could not dump any live rank in the first sample.
    """
    live_local = [t for t in sweep.targets if t.local and sweep.alive[t.rank]]
    if not live_local:
        return []
    # --native only on the last sample: unwinding native frames costs 0.1-0.7 s per rank, and the
    # stack comparison looks at Python frames only (ProcessStack.signature), so sample 1 stays cheap.
    first = _sample(sweep.py_spy, live_local, native=native and interval_s == 0, timeout_s=timeout_s)
    alive, _ = _liveness(sweep.targets)
    live_local = [t for t in live_local if alive[t.rank]]
    if live_local and all(first[t.rank].stack is None for t in live_local):
        raise InspectError(_no_dump_reason({t.rank: first[t.rank] for t in live_local}))
    if interval_s <= 0 or not live_local:
        return [first]
    time.sleep(interval_s)
    still = [t for t in live_local if rank_liveness(t)[0]]
    return [first, _sample(sweep.py_spy, still, native=native, timeout_s=timeout_s)]


def _compare(
    targets: Sequence[RankTarget], samples: Sequence[dict[int, DumpResult]]
) -> tuple[list[int], list[int]]:
    """(ranks dumped in both samples, those of them whose stacks differ), sorted; ([], []) unless two
    samples were taken."""
    compared, moved = [], []
    if len(samples) == 2:
        for t in targets:
            a, b = samples[0].get(t.rank), samples[1].get(t.rank)
            if a is not None and b is not None and a.stack is not None and b.stack is not None:
                compared.append(t.rank)
                if a.stack.signature() != b.stack.signature():
                    moved.append(t.rank)
    return sorted(compared), sorted(moved)


def _progress(
    sweep: _Sweep,
    samples: list[dict[int, DumpResult]],
    files_changed: list[str],
    *,
    now: float,
    interval_s: float,
) -> ProgressCheck:
    """`decide_progress` on what the sweep saw: stacks, run files, heartbeat ages (seconds before `now`)."""
    targets, alive, run = sweep.targets, sweep.alive, sweep.run
    compared, moved = _compare(targets, samples)
    ages = [a for a in (t.heartbeat_age_s(now) for t in targets) if a is not None]
    if run is not None:
        ages += [a for a in (run.metrics_age_s, run.events_age_s) if a is not None]
    exited = []  # a local rank of a run directory gone without the run's final status: never progress
    if run is not None and run.final_status is None:
        exited = [t.rank for t in targets if t.local and not alive[t.rank]]
    sampled_once = samples[0] if samples else {}
    two = len(samples) == 2
    return decide_progress(
        files_changed=files_changed,
        ranks_compared=compared,
        ranks_moved=moved,
        newest_activity_age_s=min(ages) if ages else None,
        stall_seconds=sweep.stall_seconds,
        interval_s=interval_s if two else 0.0,
        samples=len(samples),
        ranks_exited=exited,
        ranks_not_inspected={t.rank: str(t.host) for t in targets if not t.local},
        ranks_gone={
            t.rank: "exited during sampling" if t.rank in sampled_once else "had exited before sampling"
            for t in targets
            if t.local and not alive[t.rank] and t.rank not in exited
        },
        ranks_not_dumped=[
            t.rank for t in targets if t.local and alive[t.rank] and t.rank not in compared and two
        ],
        ranks_total=len(targets),
    )


def _classified(
    sweep: _Sweep, progress: ProgressCheck, samples: list[dict[int, DumpResult]], now: float
) -> HangReport:
    """Classify the ranks' stacks into a verdict and report it, noting the ranks not inspected.

    Raises:
        InspectError: no stack at all to classify (e.g. every live rank is on another host).
    """
    try:
        verdict = classify(
            _observations(sweep.targets, sweep.alive, samples, now),
            progressed=progress.progressed,
            backend=sweep.run.advice_backend if sweep.run is not None else None,
        )
    except ValueError as e:
        raise InspectError("; ".join([str(e), *sweep.notes])) from None
    report = sweep.report(verdict, progress, samples)
    for rank, why in report.missing_ranks().items():
        if sweep.alive[rank] or (rank in sweep.gone and why != "exited (pid gone)"):  # a reused pid: say so
            sweep.notes.append(f"rank {rank} not inspected: {why}")
    return report


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


def _all_gone(sweep: _Sweep, *, samples_taken: int) -> HangReport:
    """No rank is alive: the run ended (its final status), or the `--pid`/`--match` processes ended.

    Raises:
        InspectError: a run directory whose run wrote no final status (killed?).
    """
    targets, gone, run = sweep.targets, sweep.gone, sweep.run
    observations = _observations(targets, sweep.alive, [], time.time())
    if sweep.run_dir is not None and (run is None or run.final_status is None):
        pids = ", ".join(f"rank {t.rank} pid {t.pid}: {gone.get(t.rank, 'exited')}" for t in targets)
        when = "every rank exited during the diagnosis" if samples_taken else "no rank process is alive"
        raise InspectError(f"{when} ({pids}); the run wrote no final status (killed? see console.log)")
    if run is not None:
        progress = ended_run_check(run, sweep.stall_seconds)
        verdict = ended_run_verdict(observations, targets, gone, run)
    else:
        progress, verdict = processes_ended(observations, targets, gone, sweep.stall_seconds, samples_taken)
    return sweep.report(verdict, progress, [])

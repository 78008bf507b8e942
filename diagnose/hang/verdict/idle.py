"""The words of the hang verdicts where no rank waits in a collective: a Python-side stall, and not hung.

Same shape as hang/verdict/text.py (which has the other kinds): each `describe_<kind>` takes every
rank's view in rank order and returns (title, evidence, next steps). Pure.
"""

from __future__ import annotations

from collections.abc import Sequence

from grpolab.diagnose.hang.verdict.frames import thread_status
from grpolab.diagnose.hang.verdict.rank_rows import RankView
from grpolab.diagnose.hang.verdict.text import slowest_line, slowest_view, state_line


def describe_python_stall(
    views: Sequence[RankView], backend: str | None = None
) -> tuple[str, list[str], list[str]]:
    """No rank is in a collective: names the busiest thread (active, holding the GIL first)."""
    alive = [v for v in views if v.alive and v.thread is not None]
    evidence = [
        f"rank {v.obs.rank} thread {v.row.thread} ({thread_status(v.thread)}): {v.row.where}" for v in alive
    ]
    busy = [v for v in alive if v.thread is not None and v.thread.active]
    busy.sort(key=lambda v: (not v.thread.owns_gil, v.obs.rank))
    if busy:
        top = busy[0]
        title = (
            f"Python-side stall, no rank in a collective: rank {top.obs.rank} thread {top.row.thread} "
            f"is busy in {top.row.where}"
        )
        steps = [
            f"Dump rank {top.obs.rank} again (or `py-spy record --pid {top.obs.pid or 'PID'}`) to see whether "
            f"{top.row.where.split(' ← ')[0]} loops; the other ranks wait for its result outside torch.distributed.",
        ]
    else:
        title = "Python-side stall, no rank in a collective: every rank is idle outside torch.distributed"
        steps = [
            "Every thread waits outside torch.distributed (sleep, a lock, a queue, I/O): look for what "
            "each rank polls for in the frames above.",
        ]
    slowest = slowest_view(views)
    if slowest is not None:
        evidence.append(slowest_line(slowest))
    steps += [
        "Not a communication hang: NCCL/gloo settings will not help; on GPU, CUDA_LAUNCH_BLOCKING=1 "
        "shows whether a CUDA call is what blocks.",
    ]
    return title, evidence, steps


def describe_not_hung(
    views: Sequence[RankView], backend: str | None = None
) -> tuple[str, list[str], list[str]]:
    """Progress was observed: where each rank is, and a hint for a run that is only slow."""
    title = "Not hung: progress was observed (heartbeats, metrics or stacks advanced)"
    evidence = [state_line(v) for v in views]
    steps = ["If it is only slow, look at the step times; re-check later with a longer stall window."]
    return title, evidence, steps

"""The words of the hang verdicts where a rank is gone without a recorded exception. Pure.

- rank_exited: a rank died (no exception recorded, no sign it finished); the survivors wait for it.
- extra_collective: every rank that is gone left normally (its last heartbeat is phase "finished",
  or its exit code is 0), and a rank still running waits in a collective. No rank will ever call
  that collective again: it is an extra one, called only on the waiting ranks and reached after the
  peer left (e.g. a `barrier()` inside a rank-0-only `save_checkpoint` after the other ranks ended
  their loop). This is not "the same collective" (AReaL pattern C, a network or slow-peer problem):
  waiting longer or fixing the network cannot help.

Same shape as hang/verdict/text.py: each `describe_<kind>` takes every rank's view in rank order
and returns (title, evidence, next steps).
"""

from __future__ import annotations

from collections.abc import Sequence

from grpolab.diagnose.hang.verdict.env_advice import env_steps
from grpolab.diagnose.hang.verdict.rank_rows import FINISHED_PHASE, RankView, group_by_collective
from grpolab.diagnose.hang.verdict.text import group_line, ranks_phrase, state_line, wait_phrase


def _gone_line(view: RankView) -> str:
    """`rank 1 (pid 42) is gone (exit code 0) and recorded no exception`, with how it left."""
    code = "unknown exit code" if view.obs.exit_code is None else f"exit code {view.obs.exit_code}"
    pid = "" if view.obs.pid is None else f" (pid {view.obs.pid})"
    line = f"rank {view.obs.rank}{pid} is gone ({code}) and recorded no exception"
    if view.left and view.obs.heartbeat_phase == FINISHED_PHASE:
        line += f"; its last heartbeat is phase {FINISHED_PHASE}: it ended its loop and left"
    return line


def describe_rank_exited(
    views: Sequence[RankView], backend: str | None = None
) -> tuple[str, list[str], list[str]]:
    """A rank is gone without a recorded exception; the survivors wait for it."""
    dead = [v for v in views if v.exited]
    alive = [v for v in views if v.alive]
    evidence = [_gone_line(view) for view in dead]
    for group in group_by_collective(alive).values():
        evidence.append(group_line(group) + " for it")
    for view in alive:
        if view.key is None:
            evidence.append(state_line(view))
    dead_ranks = ranks_phrase([v.obs.rank for v in dead])
    if not alive and all(v.inspected for v in views):
        title = f"No rank process is alive ({dead_ranks} exited): the run ended rather than hung"
    elif not alive:  # the others are on hosts not inspected: hang/verdict/caveats.py names them
        title = f"{dead_ranks.capitalize()} exited"
    else:
        waiting = [v for v in alive if v.key is not None]
        if waiting:
            collectives = ", ".join(sorted({v.row.collective or "?" for v in waiting}))
            title = f"{dead_ranks.capitalize()} exited; {wait_phrase([v.obs.rank for v in waiting])} in {collectives} for it"
        else:
            title = (
                f"{dead_ranks.capitalize()} exited; {ranks_phrase([v.obs.rank for v in alive])} still running"
            )
    steps = [
        f"Find out why {dead_ranks} died: the tail of its log, its exit code, the kernel log "
        "(dmesg: the OOM killer) for a kill or a segfault.",
        "Launch ranks so that one dying stops the job (torchrun does); make each rank record its "
        "exception before exiting so the next diagnosis names it.",
        *env_steps(backend, "timeout", "detail"),
    ]
    return title, evidence, steps


def describe_extra_collective(
    views: Sequence[RankView], backend: str | None = None
) -> tuple[str, list[str], list[str]]:
    """Every gone rank left normally and a live rank waits in a collective only it still calls."""
    gone = [v for v in views if v.exited]
    groups = list(group_by_collective([v for v in views if v.alive]).values())
    waiting = [v for group in groups for v in group]
    gone_ranks = ranks_phrase([v.obs.rank for v in gone])
    evidence = [_gone_line(view) for view in gone]
    for group in groups:
        evidence.append(
            f"{group_line(group)}, a collective no running peer will call: "
            f"{'it was' if len(group) == 1 else 'they were'} reached after {gone_ranks} left"
        )
    evidence += [state_line(v) for v in views if v.alive and v.key is None]
    places = "; ".join(f"{g[0].row.collective} ← {g[0].row.call_site or '?'}" for g in groups)
    title = (
        f"Extra collective on {ranks_phrase([v.obs.rank for v in waiting])}, reached after the peer left: "
        f"{places}; {gone_ranks} finished and exited, so no rank will join it"
    )
    sites = ", ".join(sorted({g[0].row.call_site or "?" for g in groups}))
    steps = [
        f"Make the collective at {sites} run on every rank or on none: it is called after {gone_ranks} "
        "ended its loop, so it waits for a rank that is gone (a barrier or all_reduce inside a "
        "rank-0-only branch such as a checkpoint save). Move it before the point where the other "
        "ranks leave, or do the rank-local work without collectives.",
        "Waiting longer or tuning the network cannot help: no peer is left to join this collective.",
        *env_steps(backend, "torch_debug", "timeout"),
    ]
    return title, evidence, steps

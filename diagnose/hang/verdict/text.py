"""The words of a hang verdict: for each kind its title, evidence lines and next steps. Pure.

The verdicts where no rank waits in a collective (python_stall, not_hung) are in hang/verdict/idle.py,
those where a rank is gone without an exception (rank_exited, extra_collective) in hang/verdict/exits.py.

Each `describe_<kind>` takes every rank's view (rank_rows.RankView, in rank order) and returns
(title, evidence, next steps); hang/verdict/classify.py picks the kind. The advice follows the AReaL debugging
guide's section on training hangs and deadlocks (see hang/verdict/classify.py); its step 4, the environment
variables that give more detail on the next run, comes from hang/verdict/env_advice.py for the run's backend
(`backend`: "nccl", "gloo" or None when not known).
"""

from __future__ import annotations

from collections.abc import Sequence

from grpolab.diagnose.common.rank_errors import is_peer_connection_error
from grpolab.diagnose.hang.verdict.env_advice import env_steps, transport_step
from grpolab.diagnose.hang.verdict.frames import teardown_chain, thread_status, where_collective
from grpolab.diagnose.hang.verdict.rank_rows import RankView, group_by_collective


def ranks_phrase(ranks: Sequence[int]) -> str:
    """`rank 1` or `ranks 0, 2` (sorted)."""
    ranks = sorted(ranks)
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(str(r) for r in ranks)


def _first_line(text: str) -> str:
    for line in text.splitlines():
        if line.strip():
            return line.strip()
    return text.strip()


def _last_traceback_line(text: str) -> str | None:
    lines = [line.strip() for line in text.splitlines() if line.strip().startswith("File ")]
    return lines[-1] if lines else None


def format_age(seconds: float | None) -> str:
    """A heartbeat age for the table: `12.3 s`, or `-` when unknown."""
    return "-" if seconds is None else f"{seconds:.1f} s"


def group_line(views: Sequence[RankView]) -> str:
    """`ranks 0, 2 wait in all_reduce (…) ← train_step (…)` for ranks of one collective group."""
    first = views[0].row
    verb = "waits in" if len(views) == 1 else "wait in"
    return f"{ranks_phrase([v.obs.rank for v in views])} {verb} {first.where}"


def wait_phrase(ranks: Sequence[int]) -> str:
    """`rank 1 waits` or `ranks 0, 2 wait`."""
    return f"{ranks_phrase(ranks)} {'waits' if len(ranks) == 1 else 'wait'}"


def slowest_view(views: Sequence[RankView]) -> RankView | None:
    """The rank with the oldest heartbeat among those not known to have exited (a rank on another
    host counts: its rank file's heartbeat is known even though its process was not inspected)."""
    aged = [v for v in views if not v.exited and v.obs.heartbeat_age_s is not None]
    return max(aged, key=lambda v: v.obs.heartbeat_age_s) if aged else None


def slowest_line(view: RankView) -> str:
    """`slowest heartbeat: rank 1, 12.3 s old, phase train`."""
    phase = f", phase {view.obs.heartbeat_phase}" if view.obs.heartbeat_phase else ""
    return f"slowest heartbeat: rank {view.obs.rank}, {format_age(view.obs.heartbeat_age_s)} old{phase}"


def _not_in_collective_line(view: RankView) -> str:
    thread = f" thread {view.row.thread}" if view.row.thread else ""
    status = thread_status(view.thread) if view.thread is not None else view.row.state
    return f"rank {view.obs.rank} is in no collective:{thread} ({status}) in {view.row.where}"


def common_evidence(views: Sequence[RankView]) -> list[str]:
    """Evidence lines every hung verdict gets: stacks (un)changed between the samples, c10d native
    waits, ranks without a stack."""
    lines = []
    unchanged = [v.obs.rank for v in views if v.row.unchanged is True]
    changed = [v.obs.rank for v in views if v.row.unchanged is False]
    if unchanged:
        lines.append(f"stacks unchanged between the two samples on {ranks_phrase(unchanged)}")
    if changed:
        lines.append(
            f"stacks changed between the two samples on {ranks_phrase(changed)} (still running code)"
        )
    native = [v for v in views if v.row.native_wait and v.row.state in ("collective", "teardown")]
    if native:
        first = native[0].row.native_wait
        lines.append(f"native frames show {ranks_phrase([v.obs.rank for v in native])} blocked in {first}")
    missing = [v.obs.rank for v in views if v.row.state == "no stack"]
    if missing:
        lines.append(f"no stack could be read for {ranks_phrase(missing)} (alive, py-spy gave nothing)")
    return lines


def _root_cause_first(views: Sequence[RankView]) -> list[RankView]:
    """Ranks with a recorded exception, root cause first (common/rank_errors.py's rule): an error that is not
    a lost peer connection first, then the oldest heartbeat (recorded earliest), then the rank."""
    return sorted(
        views,
        key=lambda v: (
            is_peer_connection_error(v.obs.exception or ""),
            v.obs.heartbeat_age_s is None,
            -(v.obs.heartbeat_age_s or 0.0),
            v.obs.rank,
        ),
    )


def state_line(view: RankView) -> str:
    """`rank 0: collective, all_reduce (…)`, or `rank 1: exited` when the place adds nothing."""
    row = view.row
    where = "" if row.where in (row.state, "") else f", {row.where}"
    return f"rank {view.obs.rank}: {row.state}{where}"


def describe_cleanup_deadlock(
    views: Sequence[RankView], backend: str | None = None
) -> tuple[str, list[str], list[str]]:
    """Pattern A: a rank failed (an exception, or stuck in teardown) and the others wait for it."""
    failing = [v for v in views if v.row.state == "teardown" or v.obs.exception]
    failing_ranks = {v.obs.rank for v in failing}
    with_exception = _root_cause_first([v for v in failing if v.obs.exception])
    others = [v for v in views if v.obs.rank not in failing_ranks]
    evidence = _failing_evidence(failing, with_exception)
    for views_in_group in group_by_collective(others).values():
        evidence.append(f"{group_line(views_in_group)} for {ranks_phrase(sorted(failing_ranks))}")
    for view in others:
        if view.key is None and view.inspected:  # ranks not inspected: hang/verdict/caveats.py names them
            evidence.append(state_line(view))
    title = _cleanup_title(failing, with_exception, others)
    steps = []
    if with_exception:
        first = with_exception[0]
        steps.append(
            f"Fix the exception on rank {first.obs.rank} first: {_first_line(first.obs.exception or '')} "
            "(the hang is a consequence of it)."
        )
    else:
        steps.append(
            f"Read the log of {ranks_phrase(sorted(failing_ranks))} for the error or early exit that started its cleanup."
        )
    steps.append(
        "Do not let cleanup swallow the error: re-raise it from __exit__/finally, and skip collectives "
        "(barrier, destroy_process_group) in cleanup after a failure; exit non-zero so the launcher "
        "stops the other ranks."
    )
    steps += env_steps(backend, "timeout", "torch_debug", "detail", "cuda_blocking")
    return title, evidence, steps


def _failing_evidence(failing: Sequence[RankView], with_exception: Sequence[RankView]) -> list[str]:
    """Pattern A's evidence about the failing ranks: each exception (root cause first) and where each
    failing rank is now."""
    evidence: list[str] = []
    for view in with_exception:
        evidence.append(f"rank {view.obs.rank} raised {_first_line(view.obs.exception or '')}")
        last = _last_traceback_line(view.obs.exception or "")
        if last:
            evidence.append(f"rank {view.obs.rank} exception raised at: {last}")
    if not with_exception:
        evidence.append(
            f"{ranks_phrase(sorted(v.obs.rank for v in failing))} in teardown without a recorded exception: its "
            "log should show the error (or early finish) that started the cleanup"
        )
    for view in failing:
        if view.row.state == "teardown" and view.collective is not None:
            evidence.append(f"rank {view.obs.rank} is stuck in teardown: {teardown_chain(view.collective)}")
        elif not view.inspected:
            where = view.row.where
            evidence.append(f"rank {view.obs.rank} recorded that exception; it runs {where}, not inspected")
        elif view.exited:
            code = "" if view.obs.exit_code is None else f" with exit code {view.obs.exit_code}"
            evidence.append(f"rank {view.obs.rank} exited{code} after that exception")
        elif view.row.state == "collective":
            evidence.append(f"rank {view.obs.rank} waits in {view.row.where} after that exception")
        else:
            evidence.append(
                f"rank {view.obs.rank} is in no collective after that exception: {view.row.where}"
            )
    return evidence


def _cleanup_title(
    failing: Sequence[RankView], with_exception: Sequence[RankView], others: Sequence[RankView]
) -> str:
    """Pattern A's title: what the failing ranks did, and what the others wait in."""
    culprit = ranks_phrase(sorted(v.obs.rank for v in failing))
    verb = "is" if len(failing) == 1 else "are"
    exception_kind = ""
    if with_exception:
        exception_kind = f" ({_first_line(with_exception[0].obs.exception or '').split(':', 1)[0]})"
    if any(v.row.state == "teardown" and v.collective is not None for v in failing):
        what = f"{culprit} {verb} stuck in teardown"
        if with_exception:
            what = f"{culprit} failed{exception_kind} and {verb} stuck in teardown"
    elif all(v.exited for v in failing):
        what = f"{culprit} exited after an exception{exception_kind}"
    else:
        what = f"{culprit} failed{exception_kind}"
    waiting = [v for v in others if v.key is not None]
    known = [v for v in others if v.inspected]
    head = f"Cleanup deadlock (pattern A): {what}"
    if waiting:
        collectives = sorted({v.row.collective or "?" for v in waiting})
        return f"{head}; {wait_phrase([v.obs.rank for v in waiting])} in {', '.join(collectives)}"
    if not others:
        return f"{head}; no rank is left in the training loop"
    if known:
        return f"{head}; {wait_phrase([v.obs.rank for v in known])} for it"
    return head  # the other ranks are on hosts not inspected: hang/verdict/caveats.py names them


def describe_threads_same_group(
    views: Sequence[RankView], backend: str | None = None
) -> tuple[str, list[str], list[str]]:
    """Two threads of one rank are each inside a collective (their call orders interleave across ranks)."""
    multi = [v for v in views if len(v.collective_threads) >= 2]
    evidence = []
    for view in multi:
        parts = [
            f"thread {thread.name or thread.thread_id!s} in {where_collective(c)}"
            for thread, c in view.collective_threads
        ]
        evidence.append(f"rank {view.obs.rank}: " + "; ".join(parts))
    first = multi[0]
    names = " and ".join(
        f"'{thread.name or thread.thread_id}' ({c.name})" for thread, c in first.collective_threads
    )
    more = "" if len(multi) == 1 else f" (also on {ranks_phrase([v.obs.rank for v in multi[1:]])})"
    title = f"Threads {names} of rank {first.obs.rank} are each inside a collective{more}"
    evidence.append(
        "collectives on one process group are matched by call order; two threads issuing them "
        "interleave differently on different ranks, so each waits for a peer call that never comes"
    )
    steps = [
        "Issue collectives on one thread only, or give each thread its own process group "
        "(dist.new_group) so their call orders cannot interleave.",
        *env_steps(backend, "torch_debug", "timeout"),
    ]
    return title, evidence, steps


def describe_mismatched_collectives(
    views: Sequence[RankView], backend: str | None = None
) -> tuple[str, list[str], list[str]]:
    """Pattern B: the ranks wait in different collectives, or in one from different call sites."""
    groups = sorted(group_by_collective(views).values(), key=lambda g: (-len(g), g[0].obs.rank))
    evidence = [group_line(group) for group in groups]
    names = {group[0].row.collective for group in groups}
    if len(names) == 1:
        evidence.append(
            f"the same collective ({groups[0][0].row.collective}) is called from different call sites: "
            + "; ".join(f"{ranks_phrase([v.obs.rank for v in g])} from {g[0].row.call_site}" for g in groups)
        )
    largest = len(groups[0])
    majority = groups[0] if len(groups) > 1 and len(groups[1]) < largest else None
    if majority is not None:
        major = majority[0].row
        for group in groups[1:]:
            ranks = [v.obs.rank for v in group]
            subject = ranks_phrase(ranks)
            verb = "is" if len(ranks) == 1 else "are"
            evidence.append(
                f"{subject} {verb} missing the collective the others wait in "
                f"({major.collective} ← {major.call_site}); {'it waits' if len(ranks) == 1 else 'they wait'} "
                f"in {group[0].row.collective} ← {group[0].row.call_site} instead"
            )
        minority = [v for g in groups[1:] for v in g]
        title = (
            f"Mismatched collectives (pattern B): {ranks_phrase([v.obs.rank for v in minority])} "
            f"{'waits' if len(minority) == 1 else 'wait'} in "
            f"{', '.join(sorted({v.row.collective or '?' for v in minority}))}, "
            f"{ranks_phrase([v.obs.rank for v in majority])} in {major.collective}"
        )
    else:
        for group in groups:
            others = [g for g in groups if g is not group]
            evidence.append(
                f"{ranks_phrase([v.obs.rank for v in group])} {'is' if len(group) == 1 else 'are'} missing the "
                "collective the others wait in: "
                + "; ".join(f"{g[0].row.collective} ← {g[0].row.call_site}" for g in others)
            )
        title = "Mismatched collectives (pattern B): " + "; ".join(
            f"{ranks_phrase([v.obs.rank for v in g])} in {g[0].row.collective} ← {g[0].row.call_site}"
            for g in groups
        )
    for view in views:
        if view.key is None and view.row.state in ("python", "idle"):
            evidence.append(_not_in_collective_line(view))
    odd = groups[1:] if majority is not None else groups
    sites = sorted({g[0].row.call_site or "?" for g in odd})
    steps = [
        f"Make the code path that reaches {', '.join(sites)} run on every rank or on none: look for a "
        "branch on rank-local state (rank number, data length, a per-rank flag) around it.",
        *env_steps(backend, "torch_debug", "detail", "timeout"),
    ]
    return title, evidence, steps


def describe_same_collective(
    views: Sequence[RankView], backend: str | None = None
) -> tuple[str, list[str], list[str]]:
    """Pattern C: the ranks wait in one collective; names a straggler outside it or the oldest heartbeat."""
    group = next(iter(group_by_collective(views).values()))
    row = group[0].row
    stragglers = [v for v in views if v.alive and v.key is None and v.row.state in ("python", "idle")]
    evidence = [group_line(group)]
    evidence += [_not_in_collective_line(v) for v in stragglers]
    slowest = slowest_view(views)
    if slowest is not None and (not stragglers or slowest in stragglers):
        evidence.append(slowest_line(slowest))
    in_it = ranks_phrase([v.obs.rank for v in group])
    if stragglers:
        names = ranks_phrase([v.obs.rank for v in stragglers])
        title = (
            f"Same collective (pattern C): {wait_phrase([v.obs.rank for v in group])} in {row.collective} ← {row.call_site}; "
            f"{names} {'has' if len(stragglers) == 1 else 'have'} not arrived (straggler)"
        )
        evidence.append(
            f"{names} {'is a straggler' if len(stragglers) == 1 else 'are stragglers'}: "
            f"alive, outside any collective, the others wait for {'it' if len(stragglers) == 1 else 'them'}"
        )
        steps = [
            f"Find out why {names} {'is' if len(stragglers) == 1 else 'are'} slow: {stragglers[0].row.where} "
            f"(dump it again, or `py-spy record --pid {stragglers[0].obs.pid or 'PID'}` for a profile); a long "
            "generation, I/O or a Python loop there keeps the others waiting.",
            *env_steps(backend, "timeout", "detail"),
        ]
    else:
        everyone = len(group) == len(views)  # "every rank" only when every rank's stack was read
        who = f"every rank ({in_it}) waits" if everyone else wait_phrase([v.obs.rank for v in group])
        title = (
            f"Same collective (pattern C): {who} in {row.collective} ← {row.call_site}: "
            "a network problem, a timeout or a slow peer"
        )
        unread = [v.obs.rank for v in views if v.row.state == "no stack"]
        if unread:
            title += f"; no stack for {ranks_phrase(unread)}"
        if slowest is not None:
            title += f"; slowest heartbeat rank {slowest.obs.rank}"
        agreeing = "every rank" if everyone else f"{in_it} (the ranks whose stacks were read)"
        steps = [
            transport_step(backend, agreeing=agreeing),
            *env_steps(backend, "timeout", "cuda_blocking", "torch_debug"),
        ]
        if slowest is not None:
            steps.insert(1, f"Start with rank {slowest.obs.rank}: its heartbeat is the oldest.")
    return title, evidence, steps

"""Classify a distributed hang from every rank's py-spy stacks. Pure: no I/O, no subprocess.

The patterns, symptoms and advice follow the AReaL debugging guide, section "调试训练挂起和死锁"
(debugging training hangs and deadlocks; ../shared/reference/areal-debugging.zh.md):
- pattern A, cleanup deadlock: some ranks hit an exception (or finished early) and sit in
  `destroy_process_group` / cleanup, or exited, while the others still wait for them in the
  training loop; "the root cause is the exception on the exiting ranks" (its tips);
- pattern B, mismatched collectives: the ranks wait in different collectives, or the same one
  from different code paths (its example: all_reduce from forward on one rank, from backward on
  another);
- pattern C, the same collective on every rank: a network or performance problem (a straggler, a
  timeout) rather than a code bug.
grpolab adds five verdicts the guide's causes table describes but gives no pattern letter: a rank
exited without an exception, an extra collective (every rank that is gone left normally, its last
heartbeat "finished" or exit code 0, while a live rank waits in a collective no peer will call:
reached after the peer left), a Python-side stall outside any collective, two threads of one process
inside collectives (gloo and NCCL pair collectives by call order per group, so two threads issuing
them interleave differently on different ranks and deadlock), and "not hung".

Precedence when several apply (grpolab's, most causal first): not_hung (progress observed) >
cleanup_deadlock (a rank in teardown, or a rank with a recorded exception while another rank is
alive: the exception explains everything downstream, so it beats "a rank exited") >
extra_collective (a special case of a rank exited: the one said instead of it) > rank_exited (a
dead rank without an exception: the survivors wait for it, whatever they wait in) >
threads_same_group > mismatched_collectives > same_collective > python_stall. same_collective
(pattern C: a network problem or a slow peer) needs every inspected rank alive: when a rank is gone,
the ranks waiting together wait for it. The verdicts that also
applied are listed at the end of the evidence ("also fits: ..."). A rank that was not inspected (on
another host: `RankObservation.remote_host`) counts neither alive nor exited, in no collective and
agreeing with no one: the verdict rests on the inspected ranks and says so.

The name tables and frame predicates are in hang/verdict/frames.py, the per-rank rows in hang/verdict/rank_rows.py, the
wording of each verdict (title, evidence, next steps) in hang/verdict/text.py and hang/verdict/idle.py, and
what the verdict could not see (ranks on another host, a process in doubt) in hang/verdict/caveats.py;
this module picks the verdict and renders the table.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from grpolab.diagnose.hang.verdict.caveats import qualify
from grpolab.diagnose.hang.verdict.exits import describe_extra_collective, describe_rank_exited
from grpolab.diagnose.hang.verdict.frames import backend_from_stacks
from grpolab.diagnose.hang.verdict.idle import describe_not_hung, describe_python_stall
from grpolab.diagnose.hang.verdict.rank_rows import (
    RankObservation,
    RankRow,
    RankView,
    group_by_collective,
    view_rank,
)
from grpolab.diagnose.hang.verdict.text import (
    common_evidence,
    describe_cleanup_deadlock,
    describe_mismatched_collectives,
    describe_same_collective,
    describe_threads_same_group,
    format_age,
)

VERDICT_KINDS = (
    "not_hung",
    "cleanup_deadlock",
    "mismatched_collectives",
    "same_collective",
    "rank_exited",
    "python_stall",
    "threads_same_group",
    "extra_collective",
)


@dataclass(frozen=True)
class Verdict:
    """The classification: kind (one of VERDICT_KINDS), AReaL pattern letter, evidence, advice."""

    kind: str
    pattern: str | None
    title: str
    evidence: tuple[str, ...]
    rows: tuple[RankRow, ...]
    next_steps: tuple[str, ...]

    @property
    def hung(self) -> bool:
        """True for every kind except not_hung."""
        return self.kind != "not_hung"

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able dict (rows as dicts, tuples as lists, plus "hung")."""
        return {
            "kind": self.kind,
            "pattern": self.pattern,
            "hung": self.hung,
            "title": self.title,
            "evidence": list(self.evidence),
            "rows": [dataclasses.asdict(row) for row in self.rows],
            "next_steps": list(self.next_steps),
        }


_BUILDERS = {  # hung kind → (its title, evidence and next steps; its AReaL pattern letter)
    "cleanup_deadlock": (describe_cleanup_deadlock, "A"),
    "extra_collective": (describe_extra_collective, None),
    "rank_exited": (describe_rank_exited, None),
    "threads_same_group": (describe_threads_same_group, None),
    "mismatched_collectives": (describe_mismatched_collectives, "B"),
    "same_collective": (describe_same_collective, "C"),
    "python_stall": (describe_python_stall, None),
}


def _applicable_kinds(views: Sequence[RankView]) -> list[str]:
    """Every hung kind whose condition holds, most causal first (the precedence of the module docstring)."""
    kinds = []
    alive = [v for v in views if v.alive]  # ranks on another host are neither alive nor exited
    in_teardown = any(v.row.state == "teardown" for v in views)
    excepted = {v.obs.rank for v in views if v.obs.exception}
    other_alive = any(v.alive and v.obs.rank not in excepted for v in views)
    if in_teardown or (excepted and other_alive):
        kinds.append("cleanup_deadlock")
    groups = group_by_collective(alive)
    gone = [v for v in views if v.exited and not v.obs.exception]
    if gone and groups and not excepted and all(v.left for v in gone):
        kinds.append("extra_collective")
    elif gone:
        kinds.append("rank_exited")
    if any(len(v.collective_threads) >= 2 for v in alive):
        kinds.append("threads_same_group")
    if len(groups) >= 2:
        kinds.append("mismatched_collectives")
    if len(groups) == 1 and not any(v.exited for v in views):
        kinds.append("same_collective")
    if not groups and any(v.thread is not None for v in alive):
        kinds.append("python_stall")
    return kinds


def _kind_label(kind: str) -> str:
    return kind.replace("_", " ")


def run_backend(observations: Sequence[RankObservation], hint: str | None = None) -> str | None:
    """The run's communication backend for the advice: "nccl" when `hint` (from run.json: its backend,
    else its device; hang/activity.py) or any frame says NCCL, else "gloo" when either says gloo, else
    None."""
    found = backend_from_stacks(stack for o in observations for stack in o.stacks)
    for backend in ("nccl", "gloo"):
        if backend in (hint, found):
            return backend
    return None


def classify(
    observations: Sequence[RankObservation], *, progressed: bool = False, backend: str | None = None
) -> Verdict:
    """Classify a hang from every rank's observation (see the module docstring for the rules).

    `progressed` is the caller's finding that heartbeats, metrics or stacks advanced while it
    watched; it makes the verdict not_hung. `backend` ("nccl", "gloo" or None) is what the caller
    knows of the run's backend; frames naming one also count (`run_backend`); the next steps
    depend on it (hang/verdict/env_advice.py). Rows come back in rank order.

    Raises:
        ValueError: no observations, a rank listed twice, or nothing to classify (no rank exited
            and no live rank has a stack).
    """
    if not observations:
        raise ValueError("classify needs at least one rank observation")
    ranks = [o.rank for o in observations]
    if len(set(ranks)) != len(ranks):
        raise ValueError(f"classify got a rank more than once: ranks {sorted(ranks)}")
    views = [view_rank(o) for o in sorted(observations, key=lambda o: o.rank)]
    rows = tuple(v.row for v in views)
    if progressed:
        title, evidence, steps = describe_not_hung(views)
        return Verdict("not_hung", None, title, tuple(evidence), rows, tuple(steps))
    kinds = _applicable_kinds(views)
    if not kinds:
        raise ValueError(
            "nothing to classify: no rank exited and no live rank has a readable stack "
            f"(ranks {', '.join(str(r) for r in sorted(ranks))})"
        )
    kind = kinds[0]
    builder, pattern = _BUILDERS[kind]
    title, evidence, steps = builder(views, run_backend(observations, backend))
    evidence += common_evidence(views)
    title, evidence, steps = qualify(views, title, evidence, steps)
    if len(kinds) > 1:
        evidence.append("also fits: " + "; ".join(_kind_label(k) for k in kinds[1:]))
    return Verdict(kind, pattern, title, tuple(evidence), rows, tuple(steps))


def render_table(verdict: Verdict) -> str:
    """A text table: one line per rank with pid, state, heartbeat age (seconds) and where it is."""
    header = ("rank", "pid", "state", "heartbeat", "where")

    def where(row: RankRow) -> str:
        if row.state == "exited" and row.exit_code is not None:
            return f"exited (exit code {row.exit_code})"
        return row.where if row.thread in (None, "MainThread") else f"[{row.thread}] {row.where}"

    lines = [
        (
            str(row.rank),
            "-" if row.pid is None else str(row.pid),
            row.state,
            format_age(row.heartbeat_age_s),
            where(row),
        )
        for row in verdict.rows
    ]
    widths = [max(len(h), *(len(line[i]) for line in lines)) for i, h in enumerate(header[:-1])]

    def fmt(cells: tuple[str, ...]) -> str:
        return "  ".join(c.ljust(w) for c, w in zip(cells[:-1], widths)) + "  " + cells[-1]

    return "\n".join([fmt(header), *(fmt(line) for line in lines)])

"""Log-doctor rule for hangs that NCCL's watchdog ends: its timeouts, told apart across ranks by the
AReaL debugging guide's hang patterns (the same collective everywhere, mismatched collectives, ranks
behind the others).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from grpolab.diagnose.logdoctor.model import (
    AREAL_HANGS,
    KERNEL_PITFALLS,
    MAX_EVIDENCE,
    Finding,
    Line,
    Rule,
    register,
)
from grpolab.diagnose.logdoctor.rules.kernels import WEIGHT_UPDATE

if TYPE_CHECKING:
    from grpolab.diagnose.logdoctor.ruleset import LogRules

_WATCHDOG = re.compile(
    r"(?:\[(?:PG (?:ID )?(?P<pg>\d+)[^\]]*?)?Rank (?P<rank>\d+)\]\s*)?"
    r"Watchdog caught collective operation timeout: WorkNCCL\((?:SeqNum=(?P<seq>\d+), )?OpType=(?P<op>\w+)"
    r"(?P<rest>[^)]*(?:\)[^)]*)?)\) ran for (?P<ran>\d+) milliseconds"
)
_TIMEOUT_MS = re.compile(r"Timeout\(ms\)=(\d+)")
_LAUNCHER_RANK = re.compile(r"^\[(?:rank|default)(\d+)\]:")


@dataclass(frozen=True)
class _Timeout:
    """One `Watchdog caught collective operation timeout: WorkNCCL(…)` report."""

    rank: int | None
    pg: int | None
    seq: int
    """-1 when this torch's message has no SeqNum."""
    op: str
    timeout_ms: int | None
    ran_ms: int


def _seq(seq: int) -> str:
    return f"SeqNum={seq}" if seq >= 0 else "(no SeqNum in this torch's message)"


def _ranks(ranks: Iterable[int]) -> str:
    items = sorted(set(ranks))
    return ("rank " if len(items) == 1 else "ranks ") + ", ".join(str(r) for r in items)


def _first_per_rank(
    timeouts: Sequence[tuple[Line, _Timeout]],
) -> dict[tuple[int | None, int | None], tuple[Line, _Timeout]]:
    """(process group, rank) → its first timed-out work (the oldest SeqNum it reports)."""
    # torch repeats each timeout ("… thread terminated with exception: [Rank r] Watchdog caught …"),
    # sometimes without the process group the first line names: one report per (rank, SeqNum, op)
    reports: dict[tuple[int | None, int, str], tuple[Line, _Timeout]] = {}
    for line, t in timeouts:
        seen = reports.get((t.rank, t.seq, t.op))
        if seen is None or (seen[1].pg is None and t.pg is not None):
            reports[(t.rank, t.seq, t.op)] = (line if seen is None else seen[0], t)
    first: dict[tuple[int | None, int | None], tuple[Line, _Timeout]] = {}
    for line, t in reports.values():
        key = (t.pg, t.rank)
        if key not in first or t.seq < first[key][1].seq:
            first[key] = (line, t)
    return first


def _verdicts(pg: int | None, ranks: dict[int | None, _Timeout]) -> list[tuple[str, str]]:
    """(kind, verdict) for one process group's first timeouts per rank: "mismatched" (different ops at
    the newest SeqNum), "behind" (ranks at an older SeqNum) or "same" (one op everywhere)."""
    out = []
    where = "" if pg is None else f" (process group {pg})"
    top = max(t.seq for t in ranks.values())
    behind = {r: t for r, t in ranks.items() if t.seq < top}
    front = {r: t for r, t in ranks.items() if t.seq == top}
    ops: dict[str, list[int | None]] = {}
    for r, t in front.items():
        ops.setdefault(t.op, []).append(r)
    named = [r for r in ranks if r is not None]
    if len(ops) > 1:
        out.append(
            (
                "mismatched",
                f"mismatched collectives{where}: at {_seq(top)} "
                + "; ".join(
                    f"{_ranks(r for r in rs if r is not None)} run {op}" for op, rs in sorted(ops.items())
                )
                + ". The ranks took different code paths (a collective called on some ranks only).",
            )
        )
    if behind:
        lows = sorted({t.seq for t in behind.values()})
        out.append(
            (
                "behind",
                f"{_ranks(r for r in behind if r is not None)} behind{where}: timed out at SeqNum "
                + ", ".join(str(s) for s in lows)
                + f" while {_ranks(r for r in front if r is not None)} reached {_seq(top)}. The ranks "
                "behind have not issued the collective the others wait in: they are stuck or slow "
                "before it (read their last lines).",
            )
        )
    if len(ops) == 1 and not behind:
        op = next(iter(ops))
        missing = [r for r in range(max(named) + 1) if r not in ranks] if named else []
        out.append(
            (
                "same",
                f"the same collective timed out on {_ranks(named) if named else 'every rank that reports'}"
                f"{where}: {_seq(top)} {op}. A network problem, a straggler or a timeout too short for "
                "the work, not a code-path mismatch."
                + (
                    f" {_ranks(missing)} did not report a timeout: look there for the straggler or an exit."
                    if missing
                    else ""
                ),
            )
        )
    return out


_TITLES = {
    "same": "NCCL watchdog timeout: the same collective timed out on every reporting rank",
    "mismatched": "NCCL watchdog timeout: mismatched collectives across ranks",
    "behind": "NCCL watchdog timeout: some ranks are behind the others",
}


@register
class NcclWatchdogTimeout(Rule):
    """NCCL watchdog timeouts, judged across ranks by the newest SeqNum and OpType each reports."""

    id = "nccl_watchdog_timeout"
    severity = "error"
    needles = (b"collective operation timeout: WorkNCCL(",)
    mentions = (WEIGHT_UPDATE,)
    fix = (
        "Rerun with NCCL_DEBUG=INFO and TORCH_DISTRIBUTED_DEBUG=DETAIL (logs every collective with its "
        "ranks and shapes), a shorter NCCL timeout so the hang fails fast, and CUDA_LAUNCH_BLOCKING=1 "
        "when a kernel error may be behind it; while it hangs, `grpolab diagnose hang` shows each rank's stack."
    )
    source = AREAL_HANGS

    def __init__(self, log: LogRules) -> None:
        super().__init__(log)
        self.timeouts: list[tuple[Line, _Timeout]] = []

    def observe(self, line: Line) -> None:
        m = _WATCHDOG.search(line.text)
        if m is None:
            return
        rank = m.group("rank")
        if rank is None:
            prefix = _LAUNCHER_RANK.match(line.text)
            rank = prefix.group(1) if prefix else None
        timeout = _TIMEOUT_MS.search(m.group("rest"))
        self.timeouts.append(
            (
                line,
                _Timeout(
                    rank=None if rank is None else int(rank),
                    pg=None if m.group("pg") is None else int(m.group("pg")),
                    seq=int(m.group("seq")) if m.group("seq") else -1,
                    op=m.group("op"),
                    timeout_ms=int(timeout.group(1)) if timeout else None,
                    ran_ms=int(m.group("ran")),
                ),
            )
        )
        if len(self.timeouts) == 1:
            self.log.ask_context(self.id, line)

    def findings(self, earlier: Sequence[Finding]) -> list[Finding]:
        if not self.timeouts:
            return []
        first = _first_per_rank(self.timeouts)
        groups: dict[int | None, dict[int | None, _Timeout]] = {}
        for (pg, rank), (_, t) in first.items():
            groups.setdefault(pg, {})[rank] = t
        judged = [
            v
            for pg in sorted(groups, key=lambda g: -1 if g is None else g)
            for v in _verdicts(pg, groups[pg])
        ]
        kinds = [kind for kind, _ in judged]
        kind = "mismatched" if "mismatched" in kinds else ("behind" if "behind" in kinds else "same")
        weight_line = self.log.near(WEIGHT_UPDATE, self.timeouts[0][0].line)
        evidence_lines = sorted(
            {id(line): line for line, _ in first.values()}.values(), key=lambda ln: ln.line
        )
        return [
            self.finding(
                _TITLES[kind] + (" (during the weight sync)" if weight_line else ""),
                (self.ev(ln, focus="Watchdog caught") for ln in evidence_lines[:MAX_EVIDENCE]),
                {
                    "kind": kind,
                    "ranks": [
                        {"rank": r, "process_group": pg, "seq": t.seq, "op": t.op, "ran_ms": t.ran_ms}
                        for (pg, r), (_, t) in sorted(
                            first.items(), key=lambda kv: (str(kv[0][0]), str(kv[0][1]))
                        )
                    ],
                    "timeout_ms": sorted({t.timeout_ms for _, t in self.timeouts if t.timeout_ms}),
                    "weight_update_line": weight_line,
                },
                cause=" ".join(v[0].upper() + v[1:] for _, v in judged)
                + (f" A weight-update call is at line {weight_line}." if weight_line else ""),
                fix=(
                    "NCCL hang during weight sync: raise the NCCL timeout and rerun with NCCL_DEBUG=INFO. "
                    + self.fix
                    if weight_line
                    else self.fix
                ),
                source=AREAL_HANGS + (f"; {KERNEL_PITFALLS}" if weight_line else ""),
            )
        ]

"""`grpolab diagnose hang --match PATTERN`: which running processes are the ranks of one job.

The processes whose `/proc/<pid>/cmdline` matches the regular expression, this command and its
parents excluded. Ranks come from `RANK` in their environment (torchrun sets it) when some have it;
the others (launchers such as torchrun's agent) are listed as skipped. Ranks of more than one job
(`JOB_ENV_NAMES`) are refused with each job's pids.

Forked workers (a data loader, a socket keeper) inherit their rank's command line and `RANK`, so
they match too. grpolab's rules for them:
- a match whose parent also matches with the same command line and RANK is a forked child of that
  rank: skipped with a note;
- a match is an orphan when its parent is not the parent the job's other ranks share (their
  launcher) but init (pid 1) or an ancestor of that launcher: the kernel reparents a process whose
  parent exited to init or to the nearest ancestor subreaper, so an orphan's parent exited, and a
  process forked by a rank that exited is such an orphan. When a non-orphan has the same RANK, the
  orphans are skipped (the rank is the non-orphan). When only orphans have that RANK:
  - if the job's other ranks each lead their own session and process group (torchrun starts every
    worker in a new session), and the orphans' session and group are led by one process that is
    gone (and is not the launcher's group), the orphans were forked by that leader, the rank
    process, which exited: the rank is reported by the leader's pid, as exited;
  - otherwise the orphan stands for the rank with a caveat (`RankTarget.caveat`) that the verdict
    shows: it may be a forked worker of a rank that exited.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from pathlib import Path

from grpolab.diagnose.common.procfs import (
    is_alive,
    proc_cmdline,
    proc_environ,
    proc_group_and_session,
    proc_parent,
    proc_start_time,
)
from grpolab.diagnose.hang.targets import InspectError, RankTarget

__all__ = ["JOB_ENV_NAMES", "ranks_from_match"]

JOB_ENV_NAMES = ("MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID")
"""The environment variables that tell one distributed job from another: every rank of a job has the
same rendezvous address and port (torch.distributed's env:// init), and torchrun's run id."""


def _own_lineage() -> set[int]:
    """This process and its ancestors: their command lines contain the --match pattern itself."""
    return {os.getpid(), *_ancestors(os.getpid())}


def _ancestors(pid: int) -> list[int]:
    """The parents of `pid`, nearest first, up to init."""
    found: list[int] = []
    parent = proc_parent(pid)
    while parent and parent not in found and parent != pid:
        found.append(parent)
        parent = proc_parent(parent)
    return found


def _job_key(env: dict[str, str] | None) -> tuple[str | None, ...]:
    return tuple((env or {}).get(name) for name in JOB_ENV_NAMES)


def _describe_job(key: tuple[str | None, ...]) -> str:
    addr, port, run_id = key
    if addr is None and port is None and run_id is None:
        return "no MASTER_ADDR/MASTER_PORT in the environment"
    text = f"MASTER_ADDR:MASTER_PORT {addr or '?'}:{port or '?'}"
    return text + (f", TORCHELASTIC_RUN_ID {run_id}" if run_id is not None else "")


def _matching_processes(regex: re.Pattern[str]) -> list[tuple[int, str, dict[str, str] | None]]:
    """(pid, command line, environment) of every live process whose command line matches, except this
    command and its parents."""
    exclude = _own_lineage()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) in exclude:
            continue
        pid = int(entry.name)
        cmd = proc_cmdline(pid)
        if cmd is None or not regex.search(cmd) or not is_alive(pid):
            continue
        found.append((pid, cmd, proc_environ(pid)))
    return found


def _env_rank(env: dict[str, str] | None) -> int | None:
    try:
        return int((env or {})["RANK"])
    except (KeyError, ValueError):
        return None


def _target(rank: int, pid: int, caveat: str | None = None) -> RankTarget:
    return RankTarget(rank=rank, pid=pid, source="--match", started=proc_start_time(pid), caveat=caveat)


def _orphans(ranks: Sequence[tuple[int, int]]) -> tuple[dict[int, int], int | None]:
    """({orphan pid: its parent pid}, the launcher) among one job's (rank, pid) pairs (module docstring).

    The launcher is the parent every non-orphan shares; no orphan is named when the ranks do not
    share one parent other than init (nothing to compare with).
    """
    parents = {pid: proc_parent(pid) for _rank, pid in ranks}
    shared = {p for p in parents.values() if p is not None}
    if len(shared) < 2:
        return {}, None
    for launcher in shared:
        if launcher == 1:
            continue
        adopters = {1, *_ancestors(launcher)}
        orphans = {
            pid: parent for pid, parent in parents.items() if parent != launcher and parent in adopters
        }
        if orphans and len({p for pid, p in parents.items() if pid not in orphans}) == 1:
            return orphans, launcher
    return {}, None


def _session_leader(pids: Sequence[int]) -> int | None:
    """The pid that leads both the process group and the session of every one of `pids` (they were
    forked from it, or from its forks), or None when they differ, one of them leads, or one is gone."""
    ids = {proc_group_and_session(pid) for pid in pids}
    if len(ids) != 1:
        return None
    only = ids.pop()
    if only is None or only[0] != only[1] or only[0] in pids:
        return None
    return only[0]


def _resolve_orphans(ranks: list[tuple[int, int]], notes: list[str]) -> list[RankTarget]:
    """The job's targets with its orphans skipped, replaced by their exited leader, or kept with a
    caveat (the module docstring's rules); notes say which."""
    orphans, launcher = _orphans(ranks)
    by_rank: dict[int, list[int]] = {}
    for rank, pid in ranks:
        by_rank.setdefault(rank, []).append(pid)
    others_lead = all(proc_group_and_session(pid) == (pid, pid) for _rank, pid in ranks if pid not in orphans)
    launcher_group = (proc_group_and_session(launcher) or (None, None))[0] if launcher else None
    targets: list[RankTarget] = []
    for rank, pids in sorted(by_rank.items()):
        kept = [pid for pid in pids if pid not in orphans]
        lost = sorted(pid for pid in pids if pid in orphans)
        if kept:
            targets += [_target(rank, pid) for pid in kept]
            notes += [
                f"pid {pid} matches with RANK {rank} but is an orphan (parent pid {orphans[pid]}, not the "
                f"launcher {launcher}; a forked worker?) while pid {kept[0]} is rank {rank}: skipped"
                for pid in lost
            ]
            continue
        shown = ", ".join(map(str, lost))
        leader = _session_leader(lost)
        if others_lead and leader is not None and leader != launcher_group and not is_alive(leader):
            notes.append(
                f"pid {shown} matches with RANK {rank} but was forked by pid {leader}, its session and "
                f"process group leader, which exited (the other ranks lead their own sessions): rank {rank} "
                f"is pid {leader}"
            )
            targets.append(RankTarget(rank=rank, pid=leader, source="--match"))
            continue
        parent = orphans[lost[0]]
        caveat = (
            f"only {'an orphaned process matches' if len(lost) == 1 else 'orphaned processes match'} "
            f"RANK {rank} (pid {shown}, parent pid {parent}, while the job's other ranks have parent pid "
            f"{launcher}): it may be a forked worker (a data loader, a socket keeper) of a rank {rank} "
            "that exited"
        )
        targets.append(_target(rank, lost[0], caveat))
        notes += [
            f"pid {pid} matches with RANK {rank} like pid {lost[0]}, also an orphan: skipped"
            for pid in lost[1:]
        ]
    return targets


def ranks_from_match(pattern: str) -> tuple[list[RankTarget], list[str]]:
    """`--match PATTERN`: the ranks among the processes whose command line matches (module docstring).

    Ranks are numbered by `RANK` when some matches have it, else by pid order. Returns (targets in
    rank order, notes on the matches skipped or in doubt).

    Raises:
        InspectError: the pattern is not a valid regular expression, nothing matches, or the
            matching ranks belong to more than one job (each job's pids are listed).
    """
    try:
        regex = re.compile(pattern)
    except re.error as e:
        raise InspectError(f"--match {pattern!r}: not a valid regular expression ({e})") from None
    found = _matching_processes(regex)
    if not found:
        raise InspectError(
            f"--match {pattern!r}: no running process's command line (/proc/*/cmdline) matches"
        )
    notes: list[str] = []
    matched = {pid: (cmd, _env_rank(env)) for pid, cmd, env in found}
    workers = {}  # forked children (data-loader workers) inherit the command line and RANK of their rank
    for pid, (cmd, rank) in matched.items():
        parent = proc_parent(pid)
        if parent in matched and rank is not None and matched[parent] == (cmd, rank):
            workers[pid] = parent
    for pid, parent in sorted(workers.items()):
        notes.append(
            f"pid {pid} matches but is a forked child of matching pid {parent} (same command line and "
            "RANK: a worker?): skipped"
        )
    found = [f for f in found if f[0] not in workers]
    with_rank = [
        (pid, _env_rank(env), _job_key(env)) for pid, _cmd, env in found if _env_rank(env) is not None
    ]
    if not with_rank:
        ordered = sorted(pid for pid, _cmd, _env in found)
        return [_target(i, pid) for i, pid in enumerate(ordered)], notes
    jobs: dict[tuple[str | None, ...], list[tuple[int, int]]] = {}
    for pid, rank, key in with_rank:
        jobs.setdefault(key, []).append((int(rank), pid))
    if len(jobs) > 1:
        listed = "; ".join(
            f"job {i} ({_describe_job(key)}): "
            + ", ".join(f"pid {pid} (RANK {rank})" for rank, pid in sorted(members))
            for i, (key, members) in enumerate(sorted(jobs.items(), key=lambda kv: min(kv[1])), 1)
        )
        raise InspectError(
            f"--match {pattern!r} matches the ranks of {len(jobs)} jobs: {listed}. Narrow it to one job: "
            "a pattern only that job's command line matches (e.g. its --run-dir), or --pid with its pids"
        )
    for pid, _cmd, env in found:
        if _env_rank(env) is None:
            notes.append(f"pid {pid} matches but has no RANK in its environment (a launcher?): skipped")
    targets = _resolve_orphans(sorted(next(iter(jobs.values()))), notes)
    if len({t.rank for t in targets}) != len(targets):
        notes.append("several matching processes share one RANK: numbered by pid order")
        ordered = sorted(targets, key=lambda t: t.pid)
        targets = [_target(i, t.pid, t.caveat) for i, t in enumerate(ordered)]
    return targets, notes

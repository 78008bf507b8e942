"""What a hang verdict could not see, said in the verdict itself. Pure: no I/O.

A verdict rests only on the ranks whose process was inspected. `qualify` adds to a hung verdict's
title, evidence and next steps:
- the ranks on another host (py-spy reaches only its own host's processes): they are counted
  neither alive, nor in a collective, nor agreeing; the title says they were not inspected and the
  first next step is to run the same command on their host;
- a doubt about the process found for a rank (`RankObservation.caveat`, e.g. `--match` found only
  an orphaned process for it, which may be a forked worker of a rank that exited): named in the
  title, the evidence and the first next step.
"""

from __future__ import annotations

from collections.abc import Sequence

from grpolab.diagnose.hang.verdict.rank_rows import RankView
from grpolab.diagnose.hang.verdict.text import ranks_phrase as _ranks


def _hosts(views: Sequence[RankView]) -> dict[str, list[int]]:
    """host → its ranks that were not inspected, in rank order."""
    by_host: dict[str, list[int]] = {}
    for view in views:
        if view.obs.remote_host is not None:
            by_host.setdefault(view.obs.remote_host, []).append(view.obs.rank)
    return by_host


def qualify(
    views: Sequence[RankView], title: str, evidence: list[str], steps: list[str]
) -> tuple[str, list[str], list[str]]:
    """(title, evidence, steps) with what the verdict could not see (module docstring); unchanged when
    every rank was inspected and no process is in doubt."""
    by_host = _hosts(views)
    doubtful = [v for v in views if v.obs.caveat and v.inspected]
    if not by_host and not doubtful:
        return title, evidence, steps
    title, evidence, first_steps = title, list(evidence), []
    if by_host:
        missing = [r for ranks in by_host.values() for r in ranks]
        inspected = [v.obs.rank for v in views if v.inspected]
        hosts = " and ".join(by_host)
        title += f" ({_ranks(missing)} not inspected: run this on {hosts} too)"
        for host, ranks in by_host.items():
            verb = "was" if len(ranks) == 1 else "were"
            evidence.append(
                f"{_ranks(ranks)} on host {host} {verb} not inspected (py-spy reaches only the processes "
                f"of its own host): {len(inspected)} of {len(views)} ranks inspected, and this verdict "
                f"rests on {_ranks(inspected) if inspected else 'none of them'}"
            )
            first_steps.append(
                f"Run the same `grpolab diagnose hang` on {host} too: {_ranks(ranks)} "
                f"{'runs' if len(ranks) == 1 else 'run'} there and {verb} not inspected; the rank the "
                "others wait for may be there."
            )
    for view in doubtful:
        rank, pid = view.obs.rank, view.obs.pid
        title += f" (rank {rank}'s process is in doubt: see the evidence)"
        evidence.append(f"rank {rank} (pid {pid}): {view.obs.caveat}")
        first_steps.append(
            f"Check whether rank {rank} still runs: pid {pid} is the only process found for it and it is in "
            f"doubt (see the evidence). If it is a forked worker, rank {rank} exited and the others wait "
            f"for it: read rank {rank}'s log for why it ended."
        )
    return title, evidence, first_steps + list(steps)

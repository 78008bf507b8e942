"""Which rank's recorded error is the root cause, and which are side effects of it. Pure: no I/O.

In a multi-rank run that fails, one rank raises first; the others then fail in their next
collective because that rank's sockets closed (gloo: "Connection closed by peer"; NCCL: "remote
process exited or there was a network error"), and rank 0's final status often carries such a
side effect. `order_rank_errors` puts the root cause first (grpolab's rule): an error that is not a
lost-peer-connection error before one that is, then the earliest heartbeat time (each rank
rewrites its heartbeat when it records its error), then the rank number.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

PEER_CONNECTION_ERROR = re.compile(
    r"connection closed by peer|connection reset by peer|broken pipe|remote process exited"
    r"|ncclRemoteError|DistNetworkError|Connection refused|Socket Timeout|Timed out waiting for peer"
    r"|another rank's process ended during a collective",
    re.IGNORECASE,
)
"""Messages of a collective that failed because a peer went away (gloo's tcp/pair.cc, NCCL's
ncclRemoteError, c10d's TCPStore/DistNetworkError), seen in grpolab runs and the torch sources, and
grpolab's own one-line form of them ("rank R stopped: another rank's process ended during a collective",
train/launch.peer_gone_message)."""


def is_peer_connection_error(error: str) -> bool:
    """True when `error` (an exception text) says a peer's connection was lost: a side effect."""
    return PEER_CONNECTION_ERROR.search(error) is not None


def first_line(text: str, max_chars: int | None = None) -> str:
    """The first non-empty line of `text`, stripped ("" for blank text), cut to `max_chars` with "…"."""
    line = next((ln.strip() for ln in text.splitlines() if ln.strip()), "")
    if max_chars is not None and len(line) > max_chars:
        return line[: max_chars - 1].rstrip() + "…"
    return line


@dataclass(frozen=True)
class RankError:
    """One rank's recorded exception; `time` is its heartbeat time (Unix seconds) or None."""

    rank: int
    error: str
    time: float | None = None

    @property
    def peer_connection_error(self) -> bool:
        """The error is a lost peer connection (`is_peer_connection_error`)."""
        return is_peer_connection_error(self.error)


def order_rank_errors(errors: Sequence[RankError]) -> list[RankError]:
    """`errors`, root cause first (the module docstring's rule)."""
    return sorted(
        errors,
        key=lambda e: (e.peer_connection_error, e.time is None, e.time or 0.0, e.rank),
    )


class RecordsError(Protocol):
    """A rank that may have recorded an error: a rank file's record (`rundir.reader.RankRecord`) or a
    rank `grpolab diagnose hang` inspects (`hang.targets.RankTarget`)."""

    @property
    def rank(self) -> int: ...
    @property
    def error(self) -> str | None: ...
    @property
    def heartbeat(self) -> Mapping[str, Any] | None: ...


def recorded_errors(ranks: Iterable[RecordsError]) -> list[RankError]:
    """Every error the ranks recorded (rank file "error"), root cause first (`order_rank_errors`); the
    time of each is its rank's heartbeat time (Unix seconds; the rank rewrites it with its error)."""
    found = []
    for r in ranks:
        if r.error:
            when = (r.heartbeat or {}).get("time")
            t = float(when) if isinstance(when, int | float) and not isinstance(when, bool) else None
            found.append(RankError(r.rank, r.error, t))
    return order_rank_errors(found)


def error_label(error: RankError, ordered: Sequence[RankError]) -> str:
    """How to read one of several recorded errors: "root cause", "earliest recorded" or a side effect.

    "" when only one rank recorded an error (nothing to tell apart).
    """
    if len(ordered) < 2:
        return ""
    if error is ordered[0]:
        return "earliest recorded" if error.peer_connection_error else "root cause"
    if error.peer_connection_error:
        first = ordered[0]
        culprit = "" if first.peer_connection_error else f" after rank {first.rank} failed"
        return f"a consequence: lost the connection to a peer{culprit}"
    return ""

"""Where each rank is: one rank's observation becomes its row of the verdict table. Pure: no I/O.

`view_rank` reads a rank's latest py-spy sample: a rank on another host (not inspected: neither
alive nor exited as far as the verdict knows), an exited rank, a rank without a stack, a rank
whose thread is inside a collective (in teardown or not), else the busy thread's Python frames.
The row (`RankRow`) is what the table and verdict.json show; the `RankView` around it keeps the
collective and thread it was drawn from for the verdict's wording. `group_by_collective` groups
the ranks that wait in the same collective from the same call site.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from grpolab.diagnose.hang.stacks import ProcessStack, ThreadStack, format_frame
from grpolab.diagnose.hang.verdict.frames import (
    Collective,
    busy_thread,
    collective_threads,
    is_teardown,
    native_wait,
    where_collective,
    where_python,
)

ROW_STATES = ("collective", "teardown", "python", "idle", "exited", "no stack", "not inspected")
FINISHED_PHASE = "finished"
"""The heartbeat phase a rank writes when its loop ended normally (`grpolab train`'s GRPORun.run on
every rank, and the `extra` scenario of fixtures/hangs): a rank gone after it is one that left, not
one that died."""


def thread_label(thread: ThreadStack) -> str:
    """How the verdict names a thread: its name, else py-spy's thread id (py-spy gives no name for
    some threads)."""
    return thread.name or str(thread.thread_id)


@dataclass(frozen=True)
class RankObservation:
    """What was observed for one rank; the input of `classify`.

    `stacks` holds 0..2 py-spy samples, earliest first (none when the process is gone or py-spy
    failed). `heartbeat_age_s` is now minus the time of the rank file's heartbeat, in seconds.
    `exception` is the last exception text found for the rank (its rank file's "error" or log).
    `remote_host` is set for a rank on another host: it was not inspected, so `alive` and `stacks`
    say nothing about it and the verdict counts it neither alive nor exited. `caveat` is a doubt
    about the process found for the rank (e.g. only an orphaned process matched `--match`), shown
    in the evidence and the title.
    """

    rank: int
    pid: int | None
    alive: bool
    stacks: tuple[ProcessStack, ...]
    heartbeat_age_s: float | None = None
    heartbeat_phase: str | None = None
    exception: str | None = None
    exit_code: int | None = None
    remote_host: str | None = None
    caveat: str | None = None


@dataclass(frozen=True)
class RankRow:
    """One line of the verdict table: where a rank is.

    `state` is one of ROW_STATES. `where` is the innermost relevant frame and its caller, e.g.
    "all_reduce (torch/distributed/distributed_c10d.py:3252) ← train_step (train.py:41)", or
    "exited". `collective` is the torch.distributed call the rank is in (the entry point its own
    code called), `call_site` the first frame outside torch above it. `thread` names the thread
    the row describes (`thread_label`: its name, else its thread id); `unchanged` is True/False
    when two samples were compared, else None; `native_wait` a c10d native frame seen with
    `--native`; `exit_code` that of an exited rank.
    """

    rank: int
    pid: int | None
    state: str
    where: str
    collective: str | None
    call_site: str | None
    heartbeat_age_s: float | None
    thread: str | None = None
    unchanged: bool | None = None
    native_wait: str | None = None
    exit_code: int | None = None


@dataclass(frozen=True)
class RankView:
    """One rank's row and what it was drawn from: the collective and thread it shows, and every
    thread of the latest sample that is inside a collective."""

    obs: RankObservation
    row: RankRow
    collective: Collective | None
    thread: ThreadStack | None
    collective_threads: tuple[tuple[ThreadStack, Collective], ...]

    @property
    def inspected(self) -> bool:
        """False for a rank on another host: nothing is known of its process."""
        return self.obs.remote_host is None

    @property
    def alive(self) -> bool:
        """The rank was inspected and its process runs."""
        return self.inspected and self.obs.alive

    @property
    def exited(self) -> bool:
        """The rank was inspected and its process is gone."""
        return self.inspected and not self.obs.alive

    @property
    def left(self) -> bool:
        """The rank exited normally: inspected, gone, no recorded exception, and its exit code is 0,
        or unknown (a process that is not our child) with FINISHED_PHASE as its last heartbeat. A
        rank that died mid-step (heartbeat in a working phase) or with a non-zero exit code (killed
        after its last heartbeat) has not "left"."""
        code = self.obs.exit_code
        finished = code == 0 or (code is None and self.obs.heartbeat_phase == FINISHED_PHASE)
        return self.exited and not self.obs.exception and finished

    @property
    def key(self) -> tuple[str, str] | None:
        """(collective, call site) while the rank waits in a collective outside teardown, else None."""
        if self.row.state != "collective" or self.row.collective is None:
            return None
        return (self.row.collective, self.row.call_site or "?")


def view_rank(obs: RankObservation) -> RankView:
    """Where the rank is, from its latest sample; `unchanged` compares its first and latest samples."""
    common = {"rank": obs.rank, "pid": obs.pid, "heartbeat_age_s": obs.heartbeat_age_s}
    if obs.remote_host is not None:
        where = f"on host {obs.remote_host}"
        row = RankRow(state="not inspected", where=where, collective=None, call_site=None, **common)
        return RankView(obs, row, None, None, ())
    if not obs.alive:
        row = RankRow(
            state="exited", where="exited", collective=None, call_site=None, exit_code=obs.exit_code, **common
        )
        return RankView(obs, row, None, None, ())
    if not obs.stacks:
        row = RankRow(state="no stack", where="no stack", collective=None, call_site=None, **common)
        return RankView(obs, row, None, None, ())
    latest = obs.stacks[-1]
    unchanged = obs.stacks[0].signature() == latest.signature() if len(obs.stacks) >= 2 else None
    in_collective = collective_threads(latest)
    if in_collective:
        main = [pair for pair in in_collective if pair[0].name == "MainThread"]
        thread, collective = (main or in_collective)[0]
        state = "teardown" if is_teardown(collective) else "collective"
        row = RankRow(
            state=state,
            where=where_collective(collective),
            collective=collective.name,
            call_site=format_frame(collective.call_site) if collective.call_site else None,
            thread=thread_label(thread),
            unchanged=unchanged,
            native_wait=native_wait(thread),
            **common,
        )
        return RankView(obs, row, collective, thread, tuple(in_collective))
    thread = busy_thread(latest)
    if thread is None:
        row = RankRow(
            state="idle",
            where="(no Python thread)",
            collective=None,
            call_site=None,
            unchanged=unchanged,
            **common,
        )
        return RankView(obs, row, None, None, ())
    row = RankRow(
        state="python" if thread.active else "idle",
        where=where_python(thread),
        collective=None,
        call_site=None,
        thread=thread_label(thread),
        unchanged=unchanged,
        native_wait=native_wait(thread),
        **common,
    )
    return RankView(obs, row, None, thread, ())


def group_by_collective(views: Sequence[RankView]) -> dict[tuple[str, str], list[RankView]]:
    """The ranks waiting in a collective, grouped by `RankView.key` (collective, call site), in the
    order given."""
    groups: dict[tuple[str, str], list[RankView]] = {}
    for view in views:
        if view.key is not None:
            groups.setdefault(view.key, []).append(view)
    return groups

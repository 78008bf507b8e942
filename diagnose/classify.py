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
grpolab adds four verdicts the guide's causes table describes but gives no pattern letter: a rank
exited without an exception, a Python-side stall outside any collective, two threads of one process
inside collectives (gloo and NCCL pair collectives by call order per group, so two threads issuing
them interleave differently on different ranks and deadlock), and "not hung".

Precedence when several apply (grpolab's, most causal first): not_hung (progress observed) >
cleanup_deadlock (a rank in teardown, or a rank with a recorded exception while another rank is
alive: the exception explains everything downstream, so it beats "a rank exited") >
rank_exited (a dead rank without an exception: the survivors wait for it, whatever they wait in) >
threads_same_group > mismatched_collectives > same_collective > python_stall. The verdicts that also
applied are listed at the end of the evidence ("also: ...").
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from grpolab.diagnose.stacks import Frame, ProcessStack, ThreadStack, format_frame

VERDICT_KINDS = (
    "not_hung",
    "cleanup_deadlock",
    "mismatched_collectives",
    "same_collective",
    "rank_exited",
    "python_stall",
    "threads_same_group",
)
ROW_STATES = ("collective", "teardown", "python", "idle", "exited", "no stack")

# torch.distributed entry points (distributed_c10d.py, the object collectives, p2p, the functional
# collectives' waits) and the names of grpolab's det backend methods (core/det_backend.py).
COLLECTIVE_NAMES = frozenset(
    {
        "all_reduce",
        "all_reduce_coalesced",
        "all_reduce_multigpu",
        "all_gather",
        "all_gather_into_tensor",
        "all_gather_coalesced",
        "all_gather_object",
        "_all_gather_base",
        "reduce_scatter",
        "reduce_scatter_tensor",
        "_reduce_scatter_base",
        "all_to_all",
        "all_to_all_single",
        "broadcast",
        "broadcast_object_list",
        "reduce",
        "gather",
        "gather_object",
        "scatter",
        "scatter_object_list",
        "barrier",
        "monitored_barrier",
        "_store_based_barrier",
        "send",
        "recv",
        "isend",
        "irecv",
        "batch_isend_irecv",
        "send_object_list",
        "recv_object_list",
        "wait",
        "wait_tensor",
        "new_group",
        "new_subgroups",
        "init_process_group",
        "destroy_process_group",
        # det_backend.DetProcessGroup method names (mapped to the c10d names below)
        "allreduce",
        "allreduce_coalesced",
        "allgather",
        "allgather_coalesced",
        "all_gather_single",
        "reduce_scatter_single",
        "alltoall",
        "recv_anysource",
        "shutdown",
        "abort",
    }
)
_CANONICAL = {
    "allreduce": "all_reduce",
    "allreduce_coalesced": "all_reduce_coalesced",
    "allgather": "all_gather",
    "allgather_coalesced": "all_gather_coalesced",
    "all_gather_single": "all_gather_into_tensor",
    "reduce_scatter_single": "reduce_scatter_tensor",
    "alltoall": "all_to_all",
    "recv_anysource": "recv",
}
# Entry points that are themselves teardown.
TEARDOWN_COLLECTIVES = frozenset({"destroy_process_group", "shutdown", "abort"})
# Caller names that mean "this collective runs from cleanup code" (context-manager exit, close,
# atexit, interpreter shutdown). grpolab's list, from the AReaL guide's example stack
# (`destroy_process_group` <- `destroy` <- `close` <- `__exit__`) plus the usual cleanup names.
TEARDOWN_CALLERS = frozenset(
    {
        "__exit__",
        "__aexit__",
        "__del__",
        "close",
        "shutdown",
        "_shutdown",
        "cleanup",
        "teardown",
        "tear_down",
        "destroy",
        "finalize",
        "_run_exitfuncs",
    }
)
_DET_BACKEND_SUFFIX = "core/det_backend.py"
_GRPOLAB_WRAPPER_SUFFIXES = (_DET_BACKEND_SUFFIX, "core/dist.py")
"""grpolab's own thin collective wrappers: skipped like torch frames so the call site is the loop line."""
_THIRD_PARTY = frozenset(
    {
        "torch",
        "transformers",
        "accelerate",
        "deepspeed",
        "numpy",
        "ray",
        "tqdm",
        "safetensors",
        "tokenizers",
        "triton",
        "vllm",
        "sglang",
        "datasets",
        "huggingface_hub",
        "pyarrow",
        "pandas",
        "requests",
        "urllib3",
        "aiohttp",
        "uvicorn",
        "fastapi",
        "zmq",
        "grpc",
        "wandb",
        "_pytest",
        "pytest",
        "pluggy",
    }
)
_STDLIB_MODULES = frozenset(getattr(sys, "stdlib_module_names", ())) | {"threading", "queue", "selectors"}
# Standard-library packages (a path under one of these is the stdlib); a single-file stdlib module
# only counts as a bare `name.py` path, so a user's `code/train.py` is not mistaken for `code`.
_STDLIB_PACKAGES = frozenset(
    {
        "asyncio",
        "collections",
        "concurrent",
        "ctypes",
        "email",
        "encodings",
        "html",
        "http",
        "importlib",
        "json",
        "logging",
        "multiprocessing",
        "sqlite3",
        "tomllib",
        "unittest",
        "urllib",
        "wsgiref",
        "xml",
        "xmlrpc",
        "zoneinfo",
    }
)


# ---------------------------------------------------------------------------------------- records
@dataclass(frozen=True)
class RankObservation:
    """What was observed for one rank; the input of `classify`.

    `stacks` holds 0..2 py-spy samples, earliest first (none when the process is gone or py-spy
    failed). `heartbeat_age_s` is now minus the time of the rank file's heartbeat, in seconds.
    `exception` is the last exception text found for the rank (its rank file's "error" or log).
    """

    rank: int
    pid: int | None
    alive: bool
    stacks: tuple[ProcessStack, ...]
    heartbeat_age_s: float | None = None
    heartbeat_phase: str | None = None
    exception: str | None = None
    exit_code: int | None = None


@dataclass(frozen=True)
class RankRow:
    """One line of the verdict table: where a rank is.

    `state` is one of ROW_STATES. `where` is the innermost relevant frame and its caller, e.g.
    "all_reduce (torch/distributed/distributed_c10d.py:3252) ← train_step (train.py:41)", or
    "exited". `collective` is the torch.distributed call the rank is in (the entry point its own
    code called), `call_site` the first frame outside torch above it. `thread` names the thread
    the row describes; `unchanged` is True/False when two samples were compared, else None;
    `native_wait` a c10d native frame seen with `--native`; `exit_code` that of an exited rank.
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


# ---------------------------------------------------------------------------------------- frames
def _path(frame: Frame) -> str:
    return (frame.full_filename or frame.filename).replace("\\", "/")


def _base_name(frame: Frame) -> str:
    """`DetProcessGroup.allreduce` -> `allreduce`, `_exception_logger.<locals>.wrapper` -> `wrapper`."""
    return frame.name.rsplit(".", 1)[-1]


def is_distributed_frame(frame: Frame) -> bool:
    """A Python frame of torch.distributed or of grpolab's det backend."""
    path = _path(frame)
    return not frame.native and ("torch/distributed/" in path or path.endswith(_DET_BACKEND_SUFFIX))


def is_torch_frame(frame: Frame) -> bool:
    """A frame of torch itself (any `torch/` file) or of grpolab's collective wrappers (det backend, dist)."""
    path = _path(frame)
    return path.startswith("torch/") or "/torch/" in path or path.endswith(_GRPOLAB_WRAPPER_SUFFIXES)


def is_library_frame(frame: Frame) -> bool:
    """Native frames, the standard library and common third-party packages (not the user's code).

    Decided from the path: site-packages/dist-packages or a Python install's lib/python3.x, a
    `<frozen ...>` module, a bare `name.py` that is a standard-library module (`threading.py`, as
    py-spy shortens it), or a first path component that is a standard-library package or one of a
    few ML/serving packages (torch, transformers, ray, vllm, ...).
    """
    if frame.native:
        return True
    path = _path(frame)
    if "site-packages/" in path or "dist-packages/" in path or path.startswith("<frozen"):
        return True
    if frame.full_filename and "/lib/python3" in frame.full_filename:
        return True
    parts = frame.filename.replace("\\", "/").lstrip("/").split("/")
    if len(parts) == 1:
        return parts[0].endswith(".py") and parts[0][:-3] in _STDLIB_MODULES
    return parts[0] in _STDLIB_PACKAGES or parts[0] in _THIRD_PARTY


def is_entry_point(frame: Frame) -> bool:
    """A torch.distributed collective / p2p / teardown entry point (by name and by file)."""
    return is_distributed_frame(frame) and _base_name(frame) in COLLECTIVE_NAMES


@dataclass(frozen=True)
class _Collective:
    name: str  # canonical c10d name
    entry: Frame  # the entry-point frame the user's code called
    call_site: Frame | None  # first non-torch frame above it
    caller_chain: tuple[Frame, ...]  # the non-torch frames above, innermost first


def find_collective(thread: ThreadStack) -> _Collective | None:
    """The collective a thread is in, or None.

    Starts at the innermost entry-point frame and walks outward through torch frames; the
    outermost entry point met before the first non-torch frame is the call the user's code made
    (`all_gather_object` rather than the `all_gather` it runs).
    """
    frames = thread.python_frames
    for index, frame in enumerate(frames):
        if not is_entry_point(frame):
            continue
        entry = frame
        outer = index + 1
        while outer < len(frames) and is_torch_frame(frames[outer]):
            if is_entry_point(frames[outer]):
                entry = frames[outer]
            outer += 1
        callers = tuple(f for f in frames[outer:] if not is_torch_frame(f))
        base = _base_name(entry)
        return _Collective(
            name=_CANONICAL.get(base, base),
            entry=entry,
            call_site=callers[0] if callers else None,
            caller_chain=callers,
        )
    return None


def _native_wait(thread: ThreadStack) -> str | None:
    """A c10d native frame (from `py-spy dump --native`), e.g. `c10d::Work::wait (libtorch_cpu.so)`."""
    for frame in thread.frames:
        if frame.native and "c10d::" in frame.name:
            return f"{frame.name} ({frame.filename})"
    return None


def _teardown_caller(collective: _Collective) -> Frame | None:
    for frame in collective.caller_chain:
        if _base_name(frame) in TEARDOWN_CALLERS:
            return frame
    return None


def _teardown_chain(collective: _Collective, limit: int = 4) -> str:
    """`entry ← caller ← ...` up to the outermost teardown caller among the first `limit` callers."""
    chain = list(collective.caller_chain[:limit])
    last = max((i for i, f in enumerate(chain) if _base_name(f) in TEARDOWN_CALLERS), default=0)
    return " ← ".join(format_frame(f) for f in [collective.entry, *chain[: last + 1]])


def _is_teardown(collective: _Collective) -> bool:
    return collective.name in TEARDOWN_COLLECTIVES or _teardown_caller(collective) is not None


def _user_frames(thread: ThreadStack) -> tuple[Frame, ...]:
    frames = thread.python_frames
    user = tuple(f for f in frames if not is_library_frame(f))
    return user or frames


def _where_python(thread: ThreadStack) -> str:
    frames = _user_frames(thread)
    if not frames:
        native = [f for f in thread.frames if f.native]
        return format_frame(native[0]) if native else "(no frames)"
    where = format_frame(frames[0])
    return where + (f" ← {format_frame(frames[1])}" if len(frames) > 1 else "")


def _where_collective(collective: _Collective) -> str:
    where = format_frame(collective.entry)
    return where + (f" ← {format_frame(collective.call_site)}" if collective.call_site else "")


def _thread_status(thread: ThreadStack) -> str:
    if not thread.active:
        return "idle"
    return "active+gil" if thread.owns_gil else "active"


def busy_thread(stack: ProcessStack) -> ThreadStack | None:
    """The thread doing work: active and holding the GIL, else active, else the main thread."""
    with_frames = [t for t in stack.threads if t.python_frames]
    for wanted in (lambda t: t.active and t.owns_gil, lambda t: t.active):
        candidates = [t for t in with_frames if wanted(t)]
        if candidates:
            main = [t for t in candidates if t.name == "MainThread"]
            return (main or candidates)[0]
    return stack.main_thread


def _collective_threads(stack: ProcessStack) -> list[tuple[ThreadStack, _Collective]]:
    found = []
    for thread in stack.threads:
        collective = find_collective(thread)
        if collective is not None:
            found.append((thread, collective))
    return found


# ---------------------------------------------------------------------------------------- rows
@dataclass(frozen=True)
class _RankView:
    obs: RankObservation
    row: RankRow
    collective: _Collective | None
    thread: ThreadStack | None
    collective_threads: tuple[tuple[ThreadStack, _Collective], ...]

    @property
    def key(self) -> tuple[str, str] | None:
        if self.row.state != "collective" or self.row.collective is None:
            return None
        return (self.row.collective, self.row.call_site or "?")


def _view(obs: RankObservation) -> _RankView:
    common = {"rank": obs.rank, "pid": obs.pid, "heartbeat_age_s": obs.heartbeat_age_s}
    if not obs.alive:
        row = RankRow(
            state="exited", where="exited", collective=None, call_site=None, exit_code=obs.exit_code, **common
        )
        return _RankView(obs, row, None, None, ())
    if not obs.stacks:
        row = RankRow(state="no stack", where="no stack", collective=None, call_site=None, **common)
        return _RankView(obs, row, None, None, ())
    latest = obs.stacks[-1]
    unchanged = obs.stacks[0].signature() == latest.signature() if len(obs.stacks) >= 2 else None
    in_collective = _collective_threads(latest)
    if in_collective:
        main = [pair for pair in in_collective if pair[0].name == "MainThread"]
        thread, collective = (main or in_collective)[0]
        state = "teardown" if _is_teardown(collective) else "collective"
        row = RankRow(
            state=state,
            where=_where_collective(collective),
            collective=collective.name,
            call_site=format_frame(collective.call_site) if collective.call_site else None,
            thread=thread.name,
            unchanged=unchanged,
            native_wait=_native_wait(thread),
            **common,
        )
        return _RankView(obs, row, collective, thread, tuple(in_collective))
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
        return _RankView(obs, row, None, None, ())
    row = RankRow(
        state="python" if thread.active else "idle",
        where=_where_python(thread),
        collective=None,
        call_site=None,
        thread=thread.name,
        unchanged=unchanged,
        native_wait=_native_wait(thread),
        **common,
    )
    return _RankView(obs, row, None, thread, ())


# ---------------------------------------------------------------------------------------- wording
def _ranks(ranks: Sequence[int]) -> str:
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


def _age(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds:.1f} s"


def _group_by_key(views: Sequence[_RankView]) -> dict[tuple[str, str], list[_RankView]]:
    groups: dict[tuple[str, str], list[_RankView]] = {}
    for view in views:
        if view.key is not None:
            groups.setdefault(view.key, []).append(view)
    return groups


def _group_line(views: Sequence[_RankView]) -> str:
    first = views[0].row
    verb = "waits in" if len(views) == 1 else "wait in"
    return f"{_ranks([v.obs.rank for v in views])} {verb} {first.where}"


def _wait(ranks: Sequence[int]) -> str:
    return f"{_ranks(ranks)} {'waits' if len(ranks) == 1 else 'wait'}"


def _slowest(views: Sequence[_RankView]) -> _RankView | None:
    aged = [v for v in views if v.obs.alive and v.obs.heartbeat_age_s is not None]
    return max(aged, key=lambda v: v.obs.heartbeat_age_s) if aged else None


def _slowest_line(view: _RankView) -> str:
    phase = f", phase {view.obs.heartbeat_phase}" if view.obs.heartbeat_phase else ""
    return f"slowest heartbeat: rank {view.obs.rank}, {_age(view.obs.heartbeat_age_s)} old{phase}"


def _not_in_collective_line(view: _RankView) -> str:
    thread = f" thread {view.row.thread}" if view.row.thread else ""
    status = _thread_status(view.thread) if view.thread is not None else view.row.state
    return f"rank {view.obs.rank} is in no collective:{thread} ({status}) in {view.row.where}"


def _common_evidence(views: Sequence[_RankView]) -> list[str]:
    lines = []
    unchanged = [v.obs.rank for v in views if v.row.unchanged is True]
    changed = [v.obs.rank for v in views if v.row.unchanged is False]
    if unchanged:
        lines.append(f"stacks unchanged between the two samples on {_ranks(unchanged)}")
    if changed:
        lines.append(f"stacks changed between the two samples on {_ranks(changed)} (still running code)")
    native = [v for v in views if v.row.native_wait and v.row.state in ("collective", "teardown")]
    if native:
        first = native[0].row.native_wait
        lines.append(f"native frames show {_ranks([v.obs.rank for v in native])} blocked in {first}")
    missing = [v.obs.rank for v in views if v.row.state == "no stack"]
    if missing:
        lines.append(f"no stack could be read for {_ranks(missing)} (alive, py-spy gave nothing)")
    return lines


# The AReaL guide's step 4 ("用于获取更多详细信息的环境变量"), for the next run.
ENV_NCCL_DEBUG = "Before the next run set NCCL_DEBUG=INFO (NCCL logs each collective and its transport)."
ENV_TORCH_DEBUG = (
    "Set TORCH_DISTRIBUTED_DEBUG=DETAIL: torch.distributed logs every collective with its ranks and "
    "shapes, and reports collectives that do not match across ranks."
)
ENV_TIMEOUT = (
    "Make hangs fail fast: a shorter NCCL timeout (NCCL_TIMEOUT=300, or "
    "init_process_group(timeout=timedelta(seconds=300)); the default is 30 min)."
)
ENV_CUDA_BLOCKING = (
    "On GPU, CUDA_LAUNCH_BLOCKING=1 makes CUDA errors surface at the line that caused them "
    "(slow; debugging only)."
)


# ---------------------------------------------------------------------------------------- verdicts
def _cleanup_deadlock(views: Sequence[_RankView]) -> tuple[str, list[str], list[str]]:
    failing = [v for v in views if v.row.state == "teardown" or v.obs.exception]
    failing_ranks = {v.obs.rank for v in failing}
    evidence: list[str] = []
    with_exception = [v for v in failing if v.obs.exception]
    for view in with_exception:
        evidence.append(f"rank {view.obs.rank} raised {_first_line(view.obs.exception or '')}")
        last = _last_traceback_line(view.obs.exception or "")
        if last:
            evidence.append(f"rank {view.obs.rank} exception raised at: {last}")
    if not with_exception:
        evidence.append(
            f"{_ranks(sorted(failing_ranks))} in teardown without a recorded exception: its log should "
            "show the error (or early finish) that started the cleanup"
        )
    teardown_ranks = []
    for view in failing:
        if view.row.state == "teardown" and view.collective is not None:
            teardown_ranks.append(view.obs.rank)
            evidence.append(f"rank {view.obs.rank} is stuck in teardown: {_teardown_chain(view.collective)}")
        elif not view.obs.alive:
            code = "" if view.obs.exit_code is None else f" with exit code {view.obs.exit_code}"
            evidence.append(f"rank {view.obs.rank} exited{code} after that exception")
        elif view.row.state == "collective":
            evidence.append(f"rank {view.obs.rank} waits in {view.row.where} after that exception")
        else:
            evidence.append(
                f"rank {view.obs.rank} is in no collective after that exception: {view.row.where}"
            )
    others = [v for v in views if v.obs.rank not in failing_ranks]
    for views_in_group in _group_by_key(others).values():
        evidence.append(f"{_group_line(views_in_group)} for {_ranks(sorted(failing_ranks))}")
    for view in others:
        if view.key is None:
            evidence.append(f"rank {view.obs.rank}: {view.row.state}, {view.row.where}")

    culprit = _ranks(sorted(failing_ranks))
    exception_kind = ""
    if with_exception:
        exception_kind = f" ({_first_line(with_exception[0].obs.exception or '').split(':', 1)[0]})"
    waiting = [v for v in others if v.key is not None]
    if teardown_ranks:
        what = f"{culprit} failed{exception_kind} and {'is' if len(failing_ranks) == 1 else 'are'} stuck in teardown"
        if not with_exception:
            what = f"{culprit} {'is' if len(failing_ranks) == 1 else 'are'} stuck in teardown"
    elif all(not v.obs.alive for v in failing):
        what = f"{culprit} exited after an exception{exception_kind}"
    else:
        what = f"{culprit} failed{exception_kind}"
    if waiting:
        collectives = sorted({v.row.collective or "?" for v in waiting})
        title = f"Cleanup deadlock (pattern A): {what}; {_wait([v.obs.rank for v in waiting])} in {', '.join(collectives)}"
    elif not others:
        title = f"Cleanup deadlock (pattern A): {what}; no rank is left in the training loop"
    else:
        title = f"Cleanup deadlock (pattern A): {what}; {_wait([v.obs.rank for v in others])} for it"

    steps = []
    if with_exception:
        first = with_exception[0]
        steps.append(
            f"Fix the exception on rank {first.obs.rank} first: {_first_line(first.obs.exception or '')} "
            "(the hang is a consequence of it)."
        )
    else:
        steps.append(f"Read the log of {culprit} for the error or early exit that started its cleanup.")
    steps.append(
        "Do not let cleanup swallow the error: re-raise it from __exit__/finally, and skip collectives "
        "(barrier, destroy_process_group) in cleanup after a failure; exit non-zero so the launcher "
        "stops the other ranks."
    )
    steps += [ENV_TIMEOUT, ENV_TORCH_DEBUG, ENV_NCCL_DEBUG, ENV_CUDA_BLOCKING]
    return title, evidence, steps


def _rank_exited(views: Sequence[_RankView]) -> tuple[str, list[str], list[str]]:
    dead = [v for v in views if not v.obs.alive]
    alive = [v for v in views if v.obs.alive]
    evidence = []
    for view in dead:
        code = "unknown exit code" if view.obs.exit_code is None else f"exit code {view.obs.exit_code}"
        pid = "" if view.obs.pid is None else f" (pid {view.obs.pid})"
        evidence.append(f"rank {view.obs.rank}{pid} is gone ({code}) and recorded no exception")
    for group in _group_by_key(alive).values():
        evidence.append(_group_line(group) + " for it")
    for view in alive:
        if view.key is None:
            evidence.append(f"rank {view.obs.rank}: {view.row.state}, {view.row.where}")
    dead_ranks = _ranks([v.obs.rank for v in dead])
    if not alive:
        title = f"No rank process is alive ({dead_ranks} exited): the run ended rather than hung"
    else:
        waiting = [v for v in alive if v.key is not None]
        if waiting:
            collectives = ", ".join(sorted({v.row.collective or "?" for v in waiting}))
            title = f"{dead_ranks.capitalize()} exited; {_wait([v.obs.rank for v in waiting])} in {collectives} for it"
        else:
            title = f"{dead_ranks.capitalize()} exited; {_ranks([v.obs.rank for v in alive])} still running"
    steps = [
        f"Find out why {dead_ranks} died: the tail of its log, its exit code, the kernel log "
        "(dmesg: the OOM killer) for a kill or a segfault.",
        "Launch ranks so that one dying stops the job (torchrun does); make each rank record its "
        "exception before exiting so the next diagnosis names it.",
        ENV_TIMEOUT,
        ENV_NCCL_DEBUG,
    ]
    return title, evidence, steps


def _threads_same_group(views: Sequence[_RankView]) -> tuple[str, list[str], list[str]]:
    multi = [v for v in views if len(v.collective_threads) >= 2]
    evidence = []
    for view in multi:
        parts = [
            f"thread {thread.name or thread.thread_id!s} in {_where_collective(c)}"
            for thread, c in view.collective_threads
        ]
        evidence.append(f"rank {view.obs.rank}: " + "; ".join(parts))
    first = multi[0]
    names = " and ".join(
        f"'{thread.name or thread.thread_id}' ({c.name})" for thread, c in first.collective_threads
    )
    more = "" if len(multi) == 1 else f" (also on {_ranks([v.obs.rank for v in multi[1:]])})"
    title = f"Threads {names} of rank {first.obs.rank} are each inside a collective{more}"
    evidence.append(
        "collectives on one process group are matched by call order; two threads issuing them "
        "interleave differently on different ranks, so each waits for a peer call that never comes"
    )
    steps = [
        "Issue collectives on one thread only, or give each thread its own process group "
        "(dist.new_group) so their call orders cannot interleave.",
        ENV_TORCH_DEBUG,
        ENV_TIMEOUT,
    ]
    return title, evidence, steps


def _mismatched(views: Sequence[_RankView]) -> tuple[str, list[str], list[str]]:
    groups = sorted(_group_by_key(views).values(), key=lambda g: (-len(g), g[0].obs.rank))
    evidence = [_group_line(group) for group in groups]
    names = {group[0].row.collective for group in groups}
    if len(names) == 1:
        evidence.append(
            f"the same collective ({groups[0][0].row.collective}) is called from different call sites: "
            + "; ".join(f"{_ranks([v.obs.rank for v in g])} from {g[0].row.call_site}" for g in groups)
        )
    largest = len(groups[0])
    majority = groups[0] if len(groups) > 1 and len(groups[1]) < largest else None
    if majority is not None:
        major = majority[0].row
        for group in groups[1:]:
            ranks = [v.obs.rank for v in group]
            subject = _ranks(ranks)
            verb = "is" if len(ranks) == 1 else "are"
            evidence.append(
                f"{subject} {verb} missing the collective the others wait in "
                f"({major.collective} ← {major.call_site}); {'it waits' if len(ranks) == 1 else 'they wait'} "
                f"in {group[0].row.collective} ← {group[0].row.call_site} instead"
            )
        minority = [v for g in groups[1:] for v in g]
        title = (
            f"Mismatched collectives (pattern B): {_ranks([v.obs.rank for v in minority])} "
            f"{'waits' if len(minority) == 1 else 'wait'} in "
            f"{', '.join(sorted({v.row.collective or '?' for v in minority}))}, "
            f"{_ranks([v.obs.rank for v in majority])} in {major.collective}"
        )
    else:
        for group in groups:
            others = [g for g in groups if g is not group]
            evidence.append(
                f"{_ranks([v.obs.rank for v in group])} {'is' if len(group) == 1 else 'are'} missing the "
                "collective the others wait in: "
                + "; ".join(f"{g[0].row.collective} ← {g[0].row.call_site}" for g in others)
            )
        title = "Mismatched collectives (pattern B): " + "; ".join(
            f"{_ranks([v.obs.rank for v in g])} in {g[0].row.collective} ← {g[0].row.call_site}"
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
        ENV_TORCH_DEBUG,
        ENV_NCCL_DEBUG,
        ENV_TIMEOUT,
    ]
    return title, evidence, steps


def _same_collective(views: Sequence[_RankView]) -> tuple[str, list[str], list[str]]:
    group = next(iter(_group_by_key(views).values()))
    row = group[0].row
    stragglers = [v for v in views if v.obs.alive and v.key is None and v.row.state in ("python", "idle")]
    evidence = [_group_line(group)]
    evidence += [_not_in_collective_line(v) for v in stragglers]
    slowest = _slowest(views)
    if slowest is not None and (not stragglers or slowest in stragglers):
        evidence.append(_slowest_line(slowest))
    in_it = _ranks([v.obs.rank for v in group])
    if stragglers:
        names = _ranks([v.obs.rank for v in stragglers])
        title = (
            f"Same collective (pattern C): {_wait([v.obs.rank for v in group])} in {row.collective} ← {row.call_site}; "
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
            ENV_TIMEOUT,
            ENV_NCCL_DEBUG,
        ]
    else:
        title = (
            f"Same collective (pattern C): every rank ({in_it}) waits in {row.collective} ← {row.call_site}: "
            "a network problem, a timeout or a slow peer"
        )
        if slowest is not None:
            title += f"; slowest heartbeat rank {slowest.obs.rank}"
        steps = [
            "The code agrees on every rank; check the transport: NCCL_DEBUG=INFO shows the network path "
            "and errors, and compare the ranks' hosts and interfaces.",
            ENV_TIMEOUT,
            ENV_CUDA_BLOCKING,
            ENV_TORCH_DEBUG,
        ]
        if slowest is not None:
            steps.insert(1, f"Start with rank {slowest.obs.rank}: its heartbeat is the oldest.")
    return title, evidence, steps


def _python_stall(views: Sequence[_RankView]) -> tuple[str, list[str], list[str]]:
    alive = [v for v in views if v.obs.alive and v.thread is not None]
    evidence = [
        f"rank {v.obs.rank} thread {v.row.thread} ({_thread_status(v.thread)}): {v.row.where}" for v in alive
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
    slowest = _slowest(views)
    if slowest is not None:
        evidence.append(_slowest_line(slowest))
    steps += [
        "Not a communication hang: NCCL/gloo settings will not help; on GPU, CUDA_LAUNCH_BLOCKING=1 "
        "shows whether a CUDA call is what blocks.",
    ]
    return title, evidence, steps


def _not_hung(views: Sequence[_RankView]) -> tuple[str, list[str], list[str]]:
    title = "Not hung: progress was observed (heartbeats, metrics or stacks advanced)"
    evidence = [f"rank {v.obs.rank}: {v.row.state}, {v.row.where}" for v in views]
    steps = ["If it is only slow, look at the step times; re-check later with a longer stall window."]
    return title, evidence, steps


_BUILDERS = {
    "not_hung": (_not_hung, None),
    "cleanup_deadlock": (_cleanup_deadlock, "A"),
    "rank_exited": (_rank_exited, None),
    "threads_same_group": (_threads_same_group, None),
    "mismatched_collectives": (_mismatched, "B"),
    "same_collective": (_same_collective, "C"),
    "python_stall": (_python_stall, None),
}
PRECEDENCE = (
    "cleanup_deadlock",
    "rank_exited",
    "threads_same_group",
    "mismatched_collectives",
    "same_collective",
    "python_stall",
)


def _applicable_kinds(views: Sequence[_RankView]) -> list[str]:
    """Every hung kind whose condition holds, in PRECEDENCE order."""
    kinds = []
    alive = [v for v in views if v.obs.alive]
    in_teardown = any(v.row.state == "teardown" for v in views)
    excepted = {v.obs.rank for v in views if v.obs.exception}
    other_alive = any(v.obs.alive and v.obs.rank not in excepted for v in views)
    if in_teardown or (excepted and other_alive):
        kinds.append("cleanup_deadlock")
    if any(not v.obs.alive and not v.obs.exception for v in views):
        kinds.append("rank_exited")
    if any(len(v.collective_threads) >= 2 for v in alive):
        kinds.append("threads_same_group")
    groups = _group_by_key(alive)
    if len(groups) >= 2:
        kinds.append("mismatched_collectives")
    if len(groups) == 1:
        kinds.append("same_collective")
    if not groups and any(v.thread is not None for v in alive):
        kinds.append("python_stall")
    return kinds


def _kind_label(kind: str) -> str:
    return kind.replace("_", " ")


def classify(observations: Sequence[RankObservation], *, progressed: bool = False) -> Verdict:
    """Classify a hang from every rank's observation (see the module docstring for the rules).

    `progressed` is the caller's finding that heartbeats, metrics or stacks advanced while it
    watched; it makes the verdict not_hung. Rows come back in rank order.

    Raises:
        ValueError: no observations, a rank listed twice, or nothing to classify (no rank exited
            and no live rank has a stack).
    """
    if not observations:
        raise ValueError("classify needs at least one rank observation")
    ranks = [o.rank for o in observations]
    if len(set(ranks)) != len(ranks):
        raise ValueError(f"classify got a rank more than once: ranks {sorted(ranks)}")
    views = [_view(o) for o in sorted(observations, key=lambda o: o.rank)]
    rows = tuple(v.row for v in views)
    if progressed:
        title, evidence, steps = _not_hung(views)
        return Verdict("not_hung", None, title, tuple(evidence), rows, tuple(steps))
    kinds = _applicable_kinds(views)
    if not kinds:
        raise ValueError(
            "nothing to classify: no rank exited and no live rank has a readable stack "
            f"(ranks {', '.join(str(r) for r in sorted(ranks))})"
        )
    kind = kinds[0]
    builder, pattern = _BUILDERS[kind]
    title, evidence, steps = builder(views)
    evidence += _common_evidence(views)
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
            _age(row.heartbeat_age_s),
            where(row),
        )
        for row in verdict.rows
    ]
    widths = [max(len(h), *(len(line[i]) for line in lines)) for i, h in enumerate(header[:-1])]

    def fmt(cells: tuple[str, ...]) -> str:
        return "  ".join(c.ljust(w) for c, w in zip(cells[:-1], widths)) + "  " + cells[-1]

    return "\n".join([fmt(header), *(fmt(line) for line in lines)])

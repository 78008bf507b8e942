"""What a py-spy frame is: torch.distributed, torch, library or the user's code; which collective a
thread waits in, and which thread of a process is doing the work. Pure: no I/O.

The name tables say which function names are torch.distributed entry points (collectives, p2p,
teardown), which callers mean cleanup code, and which paths are the standard library or common
third-party packages. `find_collective` walks a thread's frames from the innermost entry point out
to the user's call site; the `where_*` helpers write the "frame ← caller" text of a verdict row.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from dataclasses import dataclass

from grpolab.diagnose.hang.stacks import Frame, ProcessStack, ThreadStack, format_frame

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
class Collective:
    """The collective a thread waits in, as `find_collective` found it."""

    name: str
    """The canonical c10d name (`all_reduce` for the det backend's `allreduce`)."""
    entry: Frame
    """The entry-point frame the user's code called."""
    call_site: Frame | None
    """The first non-torch frame above it."""
    caller_chain: tuple[Frame, ...]
    """The non-torch frames above it, innermost first."""


def find_collective(thread: ThreadStack) -> Collective | None:
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
        return Collective(
            name=_CANONICAL.get(base, base),
            entry=entry,
            call_site=callers[0] if callers else None,
            caller_chain=callers,
        )
    return None


def native_wait(thread: ThreadStack) -> str | None:
    """A c10d native frame (from `py-spy dump --native`), e.g. `c10d::Work::wait (libtorch_cpu.so)`."""
    for frame in thread.frames:
        if frame.native and "c10d::" in frame.name:
            return f"{frame.name} ({frame.filename})"
    return None


def _teardown_caller(collective: Collective) -> Frame | None:
    for frame in collective.caller_chain:
        if _base_name(frame) in TEARDOWN_CALLERS:
            return frame
    return None


def teardown_chain(collective: Collective, limit: int = 4) -> str:
    """`entry ← caller ← ...` up to the outermost teardown caller among the first `limit` callers."""
    chain = list(collective.caller_chain[:limit])
    last = max((i for i, f in enumerate(chain) if _base_name(f) in TEARDOWN_CALLERS), default=0)
    return " ← ".join(format_frame(f) for f in [collective.entry, *chain[: last + 1]])


def is_teardown(collective: Collective) -> bool:
    """The collective is teardown itself (destroy_process_group, …) or called from cleanup code."""
    return collective.name in TEARDOWN_COLLECTIVES or _teardown_caller(collective) is not None


def _user_frames(thread: ThreadStack) -> tuple[Frame, ...]:
    frames = thread.python_frames
    user = tuple(f for f in frames if not is_library_frame(f))
    return user or frames


def where_python(thread: ThreadStack) -> str:
    """The thread's innermost user frame and its caller, `f (a.py:3) ← g (a.py:9)` (library frames
    skipped; all frames when every one is a library frame)."""
    frames = _user_frames(thread)
    if not frames:
        native = [f for f in thread.frames if f.native]
        return format_frame(native[0]) if native else "(no frames)"
    where = format_frame(frames[0])
    return where + (f" ← {format_frame(frames[1])}" if len(frames) > 1 else "")


def where_collective(collective: Collective) -> str:
    """The collective's entry point and its call site, e.g.
    `all_reduce (torch/distributed/distributed_c10d.py:3252) ← train_step (train.py:41)`."""
    where = format_frame(collective.entry)
    return where + (f" ← {format_frame(collective.call_site)}" if collective.call_site else "")


def thread_status(thread: ThreadStack) -> str:
    """`idle`, `active` or `active+gil`."""
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


def collective_threads(stack: ProcessStack) -> list[tuple[ThreadStack, Collective]]:
    """Every thread of the process that is inside a collective, with that collective, in thread order."""
    found = []
    for thread in stack.threads:
        collective = find_collective(thread)
        if collective is not None:
            found.append((thread, collective))
    return found


_BACKEND_MARKERS = (
    ("nccl", ("processgroupnccl", "worknccl", "libnccl", "ncclcomm")),
    ("gloo", ("processgroupgloo", "gloo::", "libgloo")),
)
"""Substrings (lower case) of native frame names or libraries that name the backend a process uses:
c10d's ProcessGroupNCCL / ProcessGroupGloo classes and the NCCL and gloo libraries (`--native`)."""


def backend_from_stacks(stacks: Iterable[ProcessStack]) -> str | None:
    """ "nccl" or "gloo" when a frame names that backend (NCCL first: a CUDA job's gloo side groups do
    not make it a gloo run), else None. Python frames of torch.distributed are the same for both, so
    this usually needs `py-spy dump --native`."""
    text = " ".join(
        f"{frame.name} {frame.filename}".lower()
        for stack in stacks
        for thread in stack.threads
        for frame in thread.frames
    )
    for backend, markers in _BACKEND_MARKERS:
        if any(marker in text for marker in markers):
            return backend
    return None

"""Parse `py-spy dump` output (text and `--json`) into frozen stack records. Pure: no I/O.

The text format, as printed by py-spy 0.3/0.4 (`src/dump.rs`) and checked against real dumps in
fixtures/pyspy/:

    Process 19625: /usr/bin/python train.py --flag
    Python v3.11.7 (/usr/bin/python3.11)
    Parent Process 19600: torchrun ...          (only with --subprocesses)

    Thread 19625 (idle): "MainThread"
        all_reduce (torch/distributed/distributed_c10d.py:3252)
        train_step (train.py:41)
            Arguments:                          (only with --locals)
                self: <Trainer at 0x7f...>
    Thread 19630 (active+gil): "worker"
        pthread_cond_wait (libc.so.6)           (only with --native: no line number)

Frames are innermost first. The thread status is `idle`, `active` or `active+gil`. The thread id is
the OS thread id (or the pthread id in hex when the OS id is unknown). `--json` prints a list of
thread objects (keys pid, thread_id, thread_name, os_thread_id, active, owns_gil, frames,
process_info), each frame with name, filename, short_filename, module (set for native frames),
line (0 when unknown), locals. py-spy's JSON lists threads in the reverse of the text order; the
parser returns the text order for both, so the two forms of one sample compare equal.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_PROCESS = re.compile(r"^Process (?P<pid>\d+): ?(?P<command>.*)$")
_PYTHON = re.compile(r"^Python v\S+")
_PARENT = re.compile(r"^Parent Process \d+:")
_THREAD = re.compile(
    r'^Thread (?P<tid>0[xX][0-9a-fA-F]+|\d+) \((?P<status>[a-z+]+)\)(?:: "(?P<name>.*)")?\s*$'
)
# `name (file:line)` or `name (file)`; the name itself may contain parentheses (C++ signatures),
# the location never does, so the location is the last parenthesised group.
_FRAME = re.compile(r"^(?P<name>.+?) \((?P<loc>[^()]*)\)$")
_LOCATION_WITH_LINE = re.compile(r"^(?P<file>.*):(?P<line>\d+)$")
_SEPARATOR = re.compile(r"^-{3,}$")
_PYTHON_SOURCE_SUFFIXES = (".py", ".pyx", ".pyw", ".pyi")


@dataclass(frozen=True)
class Frame:
    """One stack frame as py-spy reports it.

    `filename` is py-spy's short form (`torch/distributed/distributed_c10d.py`) in both the text
    and the JSON parse; `full_filename` is the absolute path when the JSON gave one. `line` is
    None when py-spy printed none (native frames, or an unknown line). `native` marks frames from
    compiled code (`--native`: libc, libtorch_cpu.so ...).
    """

    name: str
    filename: str
    line: int | None
    native: bool = False
    full_filename: str | None = None


@dataclass(frozen=True)
class ThreadStack:
    """One thread: py-spy's thread id (the OS thread id when known), name, status and frames.

    `active` is py-spy's guess that the thread is running (not waiting in a syscall); `owns_gil`
    is only known for active threads in the text form (`active+gil`). `frames` are innermost first.
    """

    thread_id: int
    name: str | None
    active: bool
    owns_gil: bool
    frames: tuple[Frame, ...]

    @property
    def python_frames(self) -> tuple[Frame, ...]:
        """The frames without the native ones."""
        return tuple(f for f in self.frames if not f.native)


@dataclass(frozen=True)
class ProcessStack:
    """Every Python thread of one process at one moment (one `py-spy dump`)."""

    pid: int
    command: str | None
    threads: tuple[ThreadStack, ...]

    @property
    def main_thread(self) -> ThreadStack | None:
        """The thread named MainThread, else the first thread; None when there is no thread."""
        for thread in self.threads:
            if thread.name == "MainThread":
                return thread
        return self.threads[0] if self.threads else None

    def signature(self) -> tuple:
        """A hashable summary used to decide whether two samples show "the same frames".

        Per thread (sorted by thread id): the id, the name and every Python frame's (name,
        filename, line). Line numbers count (a loop that moves from line to line is progress);
        native frames and the idle/active status do not (a `--native` sample and a plain one of a
        blocked process compare equal).
        """
        return tuple(
            (t.thread_id, t.name, tuple((f.name, f.filename, f.line) for f in t.python_frames))
            for t in sorted(self.threads, key=lambda t: t.thread_id)
        )


def format_frame(frame: Frame) -> str:
    """`name (file:line)`, py-spy's own notation (`name (file)` when there is no line)."""
    if frame.line is None:
        return f"{frame.name} ({frame.filename})"
    return f"{frame.name} ({frame.filename}:{frame.line})"


def _first_line(text: str) -> str:
    for line in text.splitlines():
        if line.strip():
            return line.strip()[:200]
    return "(empty)"


def _not_pyspy(text: str, expected: str) -> ValueError:
    return ValueError(f"not py-spy dump output ({expected}): first line {_first_line(text)!r}")


def _looks_native(name: str, filename: str, line: int | None) -> bool:
    if line is not None:
        return False
    if filename.startswith("<") or filename.endswith(_PYTHON_SOURCE_SUFFIXES):
        return False
    return True


def _parse_frame_line(body: str) -> Frame | None:
    match = _FRAME.match(body)
    if match is None:
        return None
    name, location = match.group("name"), match.group("loc")
    with_line = _LOCATION_WITH_LINE.match(location)
    if with_line is not None:
        filename, line = with_line.group("file"), int(with_line.group("line"))
        line = line if line > 0 else None
    else:
        filename, line = location, None
    return Frame(name=name, filename=filename, line=line, native=_looks_native(name, filename, line))


def parse_pyspy_text_all(text: str) -> tuple[ProcessStack, ...]:
    """Every process in a text dump (several with `py-spy dump --subprocesses`).

    Lines py-spy adds for `--locals` (Arguments:/Locals: and the variables under them) and any
    other line that is neither a header, a thread nor a frame (a warning, a separator) are
    skipped. A dump with no `Process` header is accepted when it has `Thread` lines (the pid is
    then 0; `parse_pyspy_text(pid=...)` fills it in).

    Raises:
        ValueError: the text is not py-spy dump output (no Process header and no Thread line);
            the message quotes the first line.
    """
    text = _ANSI.sub("", text)
    parser = _TextDumpParser()
    for raw in text.splitlines():
        line = raw.rstrip()
        if line.strip():
            parser.feed(line)
    parser.close_process()
    if not parser.processes:
        raise _not_pyspy(text, "no 'Process' header and no 'Thread' line")
    return tuple(parser.processes)


class _TextDumpParser:
    """The state of `parse_pyspy_text_all` between lines: the processes read, the open process and thread."""

    def __init__(self) -> None:
        self.processes: list[ProcessStack] = []
        self.pid: int | None = None
        self.command: str | None = None
        self.threads: list[ThreadStack] = []
        self.current: dict[str, Any] | None = None

    def close_thread(self) -> None:
        if self.current is not None:
            self.threads.append(ThreadStack(**{**self.current, "frames": tuple(self.current["frames"])}))
            self.current = None

    def close_process(self) -> None:
        self.close_thread()
        if self.pid is not None or self.threads:
            self.processes.append(
                ProcessStack(pid=self.pid or 0, command=self.command, threads=tuple(self.threads))
            )
        self.threads, self.pid, self.command = [], None, None

    def feed(self, line: str) -> None:
        """One non-blank line, trailing whitespace removed."""
        process = _PROCESS.match(line)
        if process is not None:
            self.close_process()
            self.pid, self.command = int(process.group("pid")), process.group("command") or None
            return
        if _PYTHON.match(line) or _PARENT.match(line) or _SEPARATOR.match(line.strip()):
            return
        thread = _THREAD.match(line)
        if thread is not None:
            self.close_thread()
            status, tid = thread.group("status"), thread.group("tid")
            self.current = {
                "thread_id": int(tid, 16) if tid.lower().startswith("0x") else int(tid),
                "name": thread.group("name"),
                "active": status.startswith("active"),
                "owns_gil": "gil" in status,
                "frames": [],
            }
            return
        indent = len(line) - len(line.lstrip(" "))
        if self.current is None or indent >= 8:
            return  # a note outside any thread, or --locals ("Arguments:", "Locals:", variables)
        frame = _parse_frame_line(line.strip()) if indent >= 1 else None
        if frame is not None:
            self.current["frames"].append(frame)


def parse_pyspy_text(text: str, *, pid: int | None = None) -> ProcessStack:
    """Parse `py-spy dump` text output into a ProcessStack.

    With several processes in the dump, the one with `pid` is returned (else the first). `pid`
    also fills in a dump without a Process header.

    Raises:
        ValueError: the text is not py-spy dump output, or `pid` is not among its processes.
    """
    processes = parse_pyspy_text_all(text)
    if pid is None:
        return processes[0]
    for process in processes:
        if process.pid == pid:
            return process
    if len(processes) == 1 and processes[0].pid == 0:
        return ProcessStack(pid=pid, command=processes[0].command, threads=processes[0].threads)
    found = ", ".join(str(p.pid) for p in processes)
    raise ValueError(f"py-spy dump holds processes {found}, not pid {pid}")


def _json_frame(raw: Any, where: str) -> Frame:
    if not isinstance(raw, dict) or "name" not in raw or "filename" not in raw:
        raise ValueError(f"not py-spy --json output: {where} is not a frame object with name and filename")
    full = str(raw["filename"])
    short = raw.get("short_filename") or full
    line = raw.get("line")
    line = int(line) if isinstance(line, int) and line > 0 else None
    native = raw["module"] is not None if "module" in raw else _looks_native(raw["name"], short, line)
    return Frame(
        name=str(raw["name"]),
        filename=str(short),
        line=line,
        native=bool(native),
        full_filename=full if full != short else None,
    )


def parse_pyspy_json(text: str, *, pid: int | None = None) -> ProcessStack:
    """Parse `py-spy dump --json` output into a ProcessStack (threads in py-spy's text order).

    The thread id is `os_thread_id` when present (what the text form prints), else `thread_id`.
    The command comes from `process_info.command_line` when py-spy filled it in.

    Raises:
        ValueError: the text is not JSON, or not a list of py-spy thread objects.
    """
    try:
        data = json.loads(_ANSI.sub("", text))
    except json.JSONDecodeError as exc:
        raise _not_pyspy(text, f"invalid JSON: {exc.msg} at line {exc.lineno}") from None
    if not isinstance(data, list):
        raise _not_pyspy(text, "py-spy --json prints a list of threads")
    threads = []
    pids = set()
    command = None
    for index, raw in enumerate(data):
        if not isinstance(raw, dict) or not isinstance(raw.get("frames"), list) or "thread_id" not in raw:
            raise ValueError(
                f"not py-spy --json output: thread {index} is not an object with thread_id and frames"
            )
        if raw.get("pid") is not None:
            pids.add(int(raw["pid"]))
        info = raw.get("process_info")
        if command is None and isinstance(info, dict) and info.get("command_line"):
            command = str(info["command_line"])
        os_tid = raw.get("os_thread_id")
        threads.append(
            ThreadStack(
                thread_id=int(os_tid if os_tid is not None else raw["thread_id"]),
                name=raw.get("thread_name"),
                active=bool(raw.get("active", False)),
                owns_gil=bool(raw.get("owns_gil", False)),
                frames=tuple(
                    _json_frame(frame, f"thread {index} frame {i}") for i, frame in enumerate(raw["frames"])
                ),
            )
        )
    if pid is None:
        pid = min(pids) if pids else 0
    elif pids and pid not in pids:
        raise ValueError(f"py-spy --json output is for pid {sorted(pids)}, not pid {pid}")
    return ProcessStack(pid=pid, command=command, threads=tuple(reversed(threads)))


def parse_pyspy(text: str, *, pid: int | None = None) -> ProcessStack:
    """Parse py-spy dump output, text or `--json` (sniffed from the first non-blank character).

    Raises:
        ValueError: the text is neither form; the message quotes its first line.
    """
    stripped = _ANSI.sub("", text).lstrip()
    if stripped.startswith("["):
        return parse_pyspy_json(text, pid=pid)
    return parse_pyspy_text(text, pid=pid)


def stack_to_dict(stack: ProcessStack) -> dict[str, Any]:
    """A JSON-able form of a ProcessStack (frames as dicts), for storing parsed dumps."""
    return {
        "pid": stack.pid,
        "command": stack.command,
        "threads": [
            {
                "thread_id": t.thread_id,
                "name": t.name,
                "active": t.active,
                "owns_gil": t.owns_gil,
                "frames": [
                    {"name": f.name, "filename": f.filename, "line": f.line, "native": f.native}
                    | ({"full_filename": f.full_filename} if f.full_filename else {})
                    for f in t.frames
                ],
            }
            for t in stack.threads
        ],
    }

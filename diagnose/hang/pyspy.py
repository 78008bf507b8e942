"""py-spy for `grpolab diagnose hang`: find it, dump one process or many at once, render a dump as text.

`dump_stack` runs `py-spy dump --json --pid PID [--native]` and parses the JSON (hang/stacks.py);
py-spy's failures (permission denied, process gone, timeout, unparsable output) come back as a
`DumpResult` with the reason, never as an exception. `render_stack_text` writes a parsed dump in
py-spy's own text layout, so one attach gives both the parsed stack and the human-readable file.
"""

from __future__ import annotations

import dataclasses
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from grpolab.diagnose.common.procfs import is_alive, proc_cmdline
from grpolab.diagnose.hang.stacks import ProcessStack, format_frame, parse_pyspy_json
from grpolab.diagnose.hang.targets import InspectError

DEFAULT_TIMEOUT_S = 10.0
"""`--timeout`: seconds one `py-spy dump` may take before that rank is reported as not dumped."""
PY_SPY_FALLBACK_DIRS: tuple[Path, ...] = (Path(sys.executable).parent,)
"""Where to look for py-spy when it is not on PATH: the bin directory of the Python running grpolab,
where `pip install grpolab` put the py-spy dependency (a venv that is not activated)."""
_PERMISSION_RE = re.compile(r"permission|ptrace|operation not permitted|EPERM", re.IGNORECASE)
_GONE_RE = re.compile(r"no such process|check that the process is running|no such file", re.IGNORECASE)


def find_py_spy(explicit: str | None = None) -> str:
    """The py-spy executable: `--py-spy PATH`, else `py-spy` on PATH, else next to this Python.

    Raises:
        InspectError: not found, or `--py-spy` is not an executable file.
    """
    if explicit is not None:
        found = shutil.which(explicit)
        if found is None:
            raise InspectError(f"--py-spy {explicit}: not an executable file")
        return found
    found = shutil.which("py-spy")
    if found is not None:
        return found
    for directory in PY_SPY_FALLBACK_DIRS:
        candidate = shutil.which("py-spy", path=str(directory))
        if candidate is not None:
            return candidate
    raise InspectError(
        "py-spy not found on PATH (it is a grpolab dependency: `pip install py-spy`, or pass --py-spy PATH)"
    )


def py_spy_version(py_spy: str) -> str | None:
    """`py-spy --version` (e.g. "py-spy 0.4.3"), or None when it does not answer within 5 s."""
    try:
        out = subprocess.run([py_spy, "--version"], capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


@dataclass
class DumpResult:
    """One `py-spy dump` of one process: the parsed stack or the reason there is none."""

    pid: int
    stack: ProcessStack | None = None
    error: str | None = None
    """py-spy's message, shortened to its first lines, when it failed."""
    failure: str | None = None
    """Why it failed: permission | timeout | gone | failed | unparsable."""
    seconds: float = 0.0
    time: float = 0.0
    """Unix time at which the dump started."""


def _first_lines(text: str, n: int = 3) -> str:
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    lines = [ln for ln in lines if not ln.startswith("Stack backtrace")]
    out = []
    for ln in lines:
        if re.match(r"^\d+: ", ln) or ln.startswith("at "):  # rust backtrace frames
            break
        out.append(ln)
    return " ".join(out[:n]) or "(no message)"


def dump_stack(
    py_spy: str, pid: int, *, native: bool = False, timeout_s: float = DEFAULT_TIMEOUT_S
) -> DumpResult:
    """Run `py-spy dump --json --pid PID [--native]` and parse it; never raises for py-spy failures.

    Args:
        timeout_s: seconds before py-spy is killed and the dump reported as `failure="timeout"`.
    """
    cmd = [py_spy, "dump", "--json", "--pid", str(pid)] + (["--native"] if native else [])
    started, t0 = time.time(), time.perf_counter()
    result = DumpResult(pid=pid, time=started)
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        result.error, result.failure = f"py-spy did not answer within --timeout {timeout_s:g} s", "timeout"
    except OSError as e:
        result.error, result.failure = f"could not run {py_spy}: {e.strerror or e}", "failed"
    else:
        if out.returncode != 0:
            message = _first_lines(out.stderr or out.stdout)
            result.error = f"py-spy exited with {out.returncode}: {message}"
            if _PERMISSION_RE.search(out.stderr or ""):
                result.failure = "permission"
            elif _GONE_RE.search(out.stderr or "") or not is_alive(pid):
                result.failure = "gone"
            else:
                result.failure = "failed"
        else:
            try:
                stack = parse_pyspy_json(out.stdout, pid=pid)
            except ValueError as e:
                result.error, result.failure = f"py-spy output could not be parsed: {e}", "unparsable"
            else:
                command = stack.command or proc_cmdline(pid)  # py-spy's JSON leaves it out
                result.stack = dataclasses.replace(stack, command=command)
    result.seconds = time.perf_counter() - t0
    return result


def dump_all(
    py_spy: str, pids: Sequence[int], *, native: bool = False, timeout_s: float = DEFAULT_TIMEOUT_S
) -> dict[int, DumpResult]:
    """`dump_stack` on every pid at once (one thread per pid, each bounded by `timeout_s`)."""
    if not pids:
        return {}
    with ThreadPoolExecutor(max_workers=min(64, len(pids)), thread_name_prefix="py-spy") as pool:
        futures = {
            pid: pool.submit(dump_stack, py_spy, pid, native=native, timeout_s=timeout_s) for pid in pids
        }
        return {pid: f.result() for pid, f in futures.items()}


def render_stack_text(stack: ProcessStack) -> str:
    """A parsed dump in `py-spy dump`'s text layout (Process line, then each thread and its frames)."""
    lines = [f"Process {stack.pid}: {stack.command or '(command unknown)'}", ""]
    for thread in stack.threads:
        status = "active" if thread.active else "idle"
        if thread.owns_gil:
            status += "+gil"
        name = f': "{thread.name}"' if thread.name else ""
        lines.append(f"Thread {thread.thread_id} ({status}){name}")
        lines += [f"    {format_frame(frame)}" for frame in thread.frames]
        lines.append("")
    return "\n".join(lines)

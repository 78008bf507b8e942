"""How an engine's log ends: its last Python traceback, fatal Python error, out-of-memory or kill line. Pure.

A `grpolab serve` engine is a Python process; what it writes last before it dies says why:
- a Python traceback (`Traceback (most recent call last):`, frames, the exception line): an exception
  nobody caught; an exception line naming memory (`torch.OutOfMemoryError`, `MemoryError`) is out of
  memory;
- a fatal Python error (`Fatal Python error: Segmentation fault`, then every thread's frames, most recent
  first; written by faulthandler, which `PYTHONFAULTHANDLER=1` turns on): a crash in native code (a CUDA
  kernel, a C extension) or a fatal signal;
- an out-of-memory line without a traceback, or `Killed` (what a shell prints for a SIGKILLed child);
- nothing of these: a kill -9 or the OOM killer leaves no word in the process's own log (its last lines are
  quoted, not the "Invalid HTTP request received." warnings of sglang-router's probe at registration).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from grpolab.core.engine.fleet import ROUTER_PROBE_NOISE
from grpolab.diagnose.logdoctor.model import Line
from grpolab.diagnose.logdoctor.run_logs import EngineLog

TRACEBACK = "Traceback (most recent call last):"
"""How a Python traceback starts."""
FATAL = "Fatal Python error: "
"""How faulthandler's crash report starts (CPython's `faulthandler` module)."""
CURRENT_THREAD = "Current thread "
"""faulthandler's header of the thread that crashed (`Current thread 0x... (most recent call first):`)."""
KIND_TRACEBACK = "a Python traceback"
KIND_FATAL = "a fatal Python error"
KIND_OOM = "an out-of-memory error"
KIND_KILLED = "a 'Killed' line"
_OUT_OF_MEMORY = re.compile(r"out of memory|OutOfMemoryError|MemoryError|Cannot allocate memory", re.I)
_KILLED = re.compile(r"\bKilled\b")
LAST_LINES = 2
"""Engine log lines quoted when its end holds none of the above."""


@dataclass(frozen=True)
class LastWords:
    """How an engine log ends.

    Attributes:
        kind: KIND_TRACEBACK, KIND_FATAL, KIND_OOM, KIND_KILLED, or "" when the end holds none of them.
        summary: the exception line, the fatal error line, the out-of-memory or kill line, or the last
            line ("" for an empty log).
        lines: the lines to quote: a traceback's first line, last frame and exception line; a fatal
            error's line, the crashed thread's header and its innermost frame; else the one line, or the
            last LAST_LINES lines.
    """

    kind: str
    summary: str
    lines: tuple[Line, ...]


def _traceback(tail: tuple[Line, ...], head: int) -> LastWords:
    after = tail[head + 1 :]
    end = next((i for i, ln in enumerate(after) if ln.text and not ln.text[:1].isspace()), None)
    body = after if end is None else after[:end]
    frames = [ln for ln in body if ln.text.lstrip().startswith("File ")]
    exception = after[end] if end is not None else None
    lines = (tail[head], *frames[-1:], *([exception] if exception else []))
    summary = exception.text if exception else tail[head].text
    return LastWords(KIND_OOM if _OUT_OF_MEMORY.search(summary) else KIND_TRACEBACK, summary, lines)


def _fatal(tail: tuple[Line, ...], head: int) -> LastWords:
    after = tail[head + 1 :]
    current = next((i for i, ln in enumerate(after) if ln.text.startswith(CURRENT_THREAD)), None)
    lines: tuple[Line, ...] = (tail[head],)
    if current is not None:
        innermost = after[current + 1 : current + 2]
        lines += (after[current], *(ln for ln in innermost if ln.text.lstrip().startswith("File ")))
    return LastWords(KIND_FATAL, tail[head].text, lines)


def last_words(log: EngineLog) -> LastWords:
    """How `log` ends: its last traceback or fatal Python error (whichever is later), else its last
    out-of-memory or `Killed` line, else its last LAST_LINES non-blank lines (not the router's probe noise,
    `fleet.ROUTER_PROBE_NOISE`, in every engine log)."""
    tail = log.tail
    tracebacks = [i for i, ln in enumerate(tail) if TRACEBACK in ln.text]
    fatals = [i for i, ln in enumerate(tail) if ln.text.startswith(FATAL)]
    if fatals and (not tracebacks or fatals[-1] > tracebacks[-1]):
        return _fatal(tail, fatals[-1])
    if tracebacks:
        return _traceback(tail, tracebacks[-1])
    for kind, pattern in ((KIND_OOM, _OUT_OF_MEMORY), (KIND_KILLED, _KILLED)):
        hits = [ln for ln in tail if pattern.search(ln.text)]
        if hits:
            return LastWords(kind, hits[-1].text, (hits[-1],))
    lines = tuple(ln for ln in tail if ln.text.strip() and ROUTER_PROBE_NOISE not in ln.text)[-LAST_LINES:]
    return LastWords("", lines[-1].text if lines else "", lines)


__all__ = ["FATAL", "TRACEBACK", "LastWords", "last_words"]

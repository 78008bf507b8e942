"""The logs of a grpolab run directory, for the log doctor: which there are, and what an engine's log ends with.

A run with launched engines (`grpolab train --rollout-num-engines N`, core/engine/fleet.py) writes three
kinds of log: the trainer's `console.log`, the router's `router.log` and each engine's `engines/<i>.log`
(`grpolab serve`, which prints `grpolab serve: listening on URL` once it answers). A run directory
given to `grpolab diagnose log` stands for all of them that exist (`find_run_logs`); an engine log is
scanned like any log, and its URL and last lines are read here (`read_engine_log`) so that
logdoctor/story.py can tie the engine to the trainer's error and the router's lines.
"""

from __future__ import annotations

import errno
import re
from collections import deque
from dataclasses import dataclass
from pathlib import Path

from grpolab.core.engine.fleet import LISTENING
from grpolab.diagnose.logdoctor.model import Line, clean_line

ENGINE_TAIL_LINES = 200
"""Last lines of an engine log kept for the story (logdoctor/last_words.py): room for a Python traceback
of ~90 frames (two lines each), or a faulthandler crash report of every thread (a crashed `grpolab
serve` wrote 36 lines for its 3 threads), which is what an engine that crashed ends with."""

_ENGINE_LOG = re.compile(r"^(?P<index>\d+)\.log$")


@dataclass(frozen=True)
class RunLogs:
    """The logs of a run directory that exist, each as named in evidence (under the directory as given).

    Attributes:
        directory: the run directory as given.
        console: `<dir>/console.log` (the trainer's rank 0), or None.
        router: `<dir>/router.log` (sglang-router), or None.
        engines: (index, `<dir>/engines/<index>.log`) of each engine, by index.
    """

    directory: str
    console: str | None
    router: str | None
    engines: tuple[tuple[int, str], ...]


@dataclass(frozen=True)
class EngineLog:
    """What an engine's log says of the engine: its URL and its last lines.

    Attributes:
        index: the engine's index (`engines/<index>.log`).
        file: the log as named in evidence.
        url: the URL of the log's last `grpolab serve: listening on URL` line (a reused run directory's
            log holds earlier runs' lines too), or None.
        url_line: that line, or None.
        tail: the last ENGINE_TAIL_LINES lines (1-based numbers, colour codes removed), oldest first.
    """

    index: int
    file: str
    url: str | None
    url_line: Line | None
    tail: tuple[Line, ...]


def find_run_logs(run_dir: str) -> RunLogs:
    """The logs of the run directory `run_dir` that exist (see `RunLogs`).

    Raises:
        IsADirectoryError: none of console.log, router.log, engines/<i>.log is there (the message says
            what was expected, naming the directory).
    """
    path = Path(run_dir)

    def named(*parts: str) -> str:
        return str(path.joinpath(*parts))

    engines = []
    if (path / "engines").is_dir():
        for log in (path / "engines").iterdir():
            m = _ENGINE_LOG.match(log.name)
            if m and log.is_file():
                engines.append((int(m["index"]), named("engines", log.name)))
    logs = RunLogs(
        run_dir,
        named("console.log") if (path / "console.log").is_file() else None,
        named("router.log") if (path / "router.log").is_file() else None,
        tuple(sorted(engines)),
    )
    if logs.console is None and logs.router is None and not logs.engines:
        raise IsADirectoryError(
            errno.EISDIR,
            "a directory without console.log, router.log or engines/<i>.log: give a log file or a grpolab "
            "run directory",
            run_dir,
        )
    return logs


def read_engine_log(index: int, file: str) -> EngineLog:
    """The URL and the last lines of the engine log `file` (read line by line: memory stays small).

    Raises:
        OSError: the file cannot be read.
    """
    tail: deque[Line] = deque(maxlen=ENGINE_TAIL_LINES)
    url_line: Line | None = None
    marker = LISTENING.encode()
    with open(file, "rb") as f:
        for number, raw in enumerate(f, 1):
            line = Line(number, clean_line(raw.decode("utf-8", "replace")))
            if marker in raw:
                url_line = line
            tail.append(line)
    words = url_line.text.split(LISTENING, 1)[1].split() if url_line is not None else []
    return EngineLog(index, file, words[0] if words else None, url_line, tuple(tail))


__all__ = ["ENGINE_TAIL_LINES", "EngineLog", "RunLogs", "find_run_logs", "read_engine_log"]

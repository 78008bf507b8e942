"""Stream one log file through the log doctor's rules: `scan_file` → `FileScan` (findings, bytes, lines, seconds).

A file is read in chunks (`chunk_bytes`, 4 MiB) into one reused buffer, cut after the last newline of
each chunk (the rest moves to the next), so memory does not grow with the file and no line is ever
split. Only lines that hold a rule's needle are decoded; the needles are found with `NeedleFinder`
(logdoctor/needles.py). The lines of a counted needle (the dead-engine rule's 503s) are counted per time bucket
with `bytearray.count` between bucket boundaries found by bisection, so 200,000 of them cost no
per-line work. Line numbers come from counting newlines, only as far as a finding needs them (see
`_ChunkScanner`). The scanner knows no rule: needles, dispatch, context and launch flags come from
`LogRules` (logdoctor/ruleset.py).

Only text logs are scanned: a compressed file (gzip, zstd, bzip2, xz, zip), UTF-16 text or other binary
data raises `NotATextLog` (logdoctor/sniff.py; an OSError, so callers report it as a file they cannot read)
naming the command that turns it into a text log.
"""

from __future__ import annotations

import os
import time
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from grpolab.diagnose.logdoctor.model import NEARBY_LINES, Finding, RuleOptions
from grpolab.diagnose.logdoctor.needles import NeedleFinder
from grpolab.diagnose.logdoctor.ruleset import LogRules
from grpolab.diagnose.logdoctor.sniff import SNIFF_BYTES, NotATextLog, not_text_reason

if TYPE_CHECKING:
    from pathlib import Path

    from grpolab.diagnose.logdoctor.run_outcome import RunOutcome

DEFAULT_CHUNK_BYTES = 4 << 20
"""Read size (grpolab's: 4 MiB keeps a chunk in a CPU's last-level cache for the several passes over it,
and the doctor's memory small; the measured throughput is flat from 1 to 16 MiB)."""
ABOVE_LINES = 8
"""Lines kept above the first line of the counted needle (the manual: read the engine lines above the
first 503)."""
CONTEXT_BYTES = 64 << 10
"""Bytes read on each side of an error line for its surroundings (NEARBY_LINES lines of up to 1.6 kB)."""
LAUNCH_HEAD_BYTES = 1 << 20
"""The launch command line (a rule's `launch_flag`) is looked for in the first MiB of a log."""
RECOUNT_BYTES = 4 << 20
"""Read size when skipped chunks are read again to count their lines."""

_FIRST_COUNTED = -1
"""Code of the counted needle's first line among the needle hits of a chunk."""


class _ChunkScanner:
    """Feeds the rules from complete-line chunks of one file, in file order.

    Line numbers are counted only as far as they are needed: a chunk with a needle (or the first line of
    the counted needle) is counted whole; chunks without one are skipped and counted later, by reading them again, only
    if a later chunk needs a line number. A dead-engine log thus pays no newline count for its 60
    minutes of 503s.

    Args:
        rules: the file's rules.
        fd: the open file's descriptor (read again with `os.pread` for skipped chunks).
        eager: count the lines of every chunk.
    """

    def __init__(self, rules: LogRules, fd: int, *, eager: bool = False) -> None:
        self.rules = rules
        self.fd = fd
        self.eager = eager
        """Count every chunk (a small file: its line count is then always known)."""
        self.needles = rules.needles
        self.finder = NeedleFinder(self.needles)
        self.counted_needle, self.counter = rules.counted or (b"", None)
        """The needle counted per time bucket and its counter (the dead-engine rule's 503s), or b"", None."""
        self.offset = 0
        """File offset of the current chunk's first byte."""
        self.counted_to = 0
        """File offset up to which newlines are counted."""
        self.newlines = 0
        """Newlines in the file before `counted_to`."""
        self.tail: deque[bytes] = deque(maxlen=ABOVE_LINES)
        """The last lines before the current chunk (consecutive, the last one just before it)."""
        self.context_offsets: dict[int, int] = {}
        """Line number → file offset of the lines whose surroundings the rules asked for."""
        self._bucket: int | None = None

    def _catch_up(self) -> None:
        """Count the newlines of skipped chunks, [counted_to, offset), reading them again."""
        while self.counted_to < self.offset:
            data = os.pread(self.fd, min(RECOUNT_BYTES, self.offset - self.counted_to), self.counted_to)
            if not data:
                raise OSError(f"the file shrank while it was read (at byte {self.counted_to})")
            self.newlines += data.count(b"\n")
            self.counted_to += len(data)

    def _count(self, buf: bytearray, end: int, points: list[tuple[int, int]]) -> None:
        """Count the counted needle's lines of buf[:end] per bucket; the first one ever goes to `points`."""
        needle, engine = self.counted_needle, self.counter
        if engine is None:
            return
        first = buf.find(needle, 0, end)
        if first < 0:
            return

        def time_at(p: int) -> int | None:
            return engine.time_in(buf, buf.rfind(b"\n", 0, p) + 1, p)

        if engine.timed is None:
            engine.begin(buf, buf.rfind(b"\n", 0, first) + 1, first)
            points.append((first, _FIRST_COUNTED))
        last = buf.rfind(needle, 0, end)
        line_end = buf.find(b"\n", last, end)
        engine.note_last(
            buf[buf.rfind(b"\n", 0, last) + 1 : line_end if line_end >= 0 else end].decode("utf-8", "replace")
        )
        if not engine.timed:
            engine.add(None, buf.count(needle, 0, end))
            return
        t_last = time_at(last)
        cur = first
        while True:
            t = time_at(cur)
            j = engine.bucket(t) if t is not None else self._bucket
            if j is None:
                assert engine.start is not None
                j = engine.bucket(engine.start)
            self._bucket = j
            bucket_end = engine.bucket_end(j)
            if t_last is None or t_last <= bucket_end:
                engine.add(j, buf.count(needle, cur, end))
                return
            # bisect the hits in (cur, last]: lo is in the bucket, hi is past it
            lo, hi = cur, last
            while True:
                h = buf.find(needle, (lo + hi) // 2, hi)
                if h <= lo:
                    h = buf.find(needle, lo + 1, hi)
                if h < 0:
                    break
                th = time_at(h)
                if th is None or th <= bucket_end:
                    lo = h
                else:
                    hi = h
            engine.add(j, buf.count(needle, cur, hi))
            cur = hi

    def _above(self, buf: bytearray, line_start: int, line_no: int) -> list[tuple[int, str]]:
        """Up to ABOVE_LINES lines above the line starting at `line_start` (from earlier chunks too)."""
        texts: list[bytes] = []
        stop = line_start - 1
        while len(texts) < ABOVE_LINES and stop >= 0:
            start = buf.rfind(b"\n", 0, stop) + 1
            texts.append(bytes(buf[start:stop]))
            stop = start - 1
        if len(texts) < ABOVE_LINES:
            texts += list(self.tail)[::-1][: ABOVE_LINES - len(texts)]
        return [(line_no - k, t.decode("utf-8", "replace")) for k, t in enumerate(texts, 1)][::-1]

    def chunk(self, buf: bytearray, end: int) -> None:
        """Scan buf[:end], whole lines (the last one without a newline only at the end of the file)."""
        points: list[tuple[int, int]] = []
        self._count(buf, end, points)
        points += self.finder.find_all(buf, end)
        if points or self.eager:
            points.sort()
            self._catch_up()
            newlines = counted = 0
            rfind, find, count, needles = buf.rfind, buf.find, buf.count, self.needles
            on_line = self.rules.on_line
            i, n = 0, len(points)
            while i < n:
                pos, code = points[i]
                i += 1
                line_start = rfind(b"\n", 0, pos) + 1
                line_end = find(b"\n", pos, end)
                if line_end < 0:
                    line_end = end
                newlines += count(b"\n", counted, line_start)
                counted = line_start
                line_no = self.newlines + newlines + 1
                codes = [code]
                while i < n and points[i][0] < line_end:
                    codes.append(points[i][1])
                    i += 1
                text = buf[line_start:line_end].decode("utf-8", "replace")
                if _FIRST_COUNTED in codes and self.counter is not None:
                    self.counter.note_first(line_no, text, self._above(buf, line_start, line_no))
                found = [needles[c] for c in codes if c >= 0]
                if found and on_line(found, line_no, text):
                    self.context_offsets[line_no] = self.offset + line_start
            # a chunk with needles is counted whole: the next one will likely need it too
            self.newlines += newlines + buf.count(b"\n", counted, end)
            self.counted_to = self.offset + end
        # the last lines of this chunk, for the lines above a counted line at the start of the next one
        stop = end - 1 if end and buf[end - 1] == 0x0A else end
        recent = []
        while len(recent) < ABOVE_LINES and stop > 0:
            start = buf.rfind(b"\n", 0, stop) + 1
            recent.append(bytes(buf[start:stop]))
            stop = start - 1
        self.tail.extend(reversed(recent))
        self.offset += end

    def lines(self, size: int, last_byte: int | None) -> int | None:
        """Lines in the file when every chunk was counted (a last line without a newline counts), else None."""
        if self.counted_to != size:
            return None
        return self.newlines + (1 if last_byte is not None and last_byte != 0x0A else 0)


def _surroundings(f: Any, offset: int, line_no: int) -> list[tuple[int, str]]:
    """Up to NEARBY_LINES lines before and after the line at file `offset` (number `line_no`), read
    again from the file: (line number, text), the line itself included."""
    start = max(0, offset - CONTEXT_BYTES)
    f.seek(start)
    data = f.read(offset - start + CONTEXT_BYTES)
    before = data[: offset - start].split(b"\n")[:-1]  # the piece after the last newline is empty
    if start > 0:
        before = before[1:]  # the first piece may be a partial line
    before = before[-NEARBY_LINES:]
    after = data[offset - start :].split(b"\n")
    if len(data) == offset - start + CONTEXT_BYTES:
        after = after[:-1]  # the window may end inside a line
    after = after[: NEARBY_LINES + 1]
    out = [(line_no - len(before) + i, b.decode("utf-8", "replace")) for i, b in enumerate(before)]
    return out + [(line_no + i, b.decode("utf-8", "replace")) for i, b in enumerate(after)]


@dataclass
class FileScan:
    """The result of scanning one file.

    Attributes:
        file: the name as given.
        size: bytes read.
        lines: lines in the file (a last line without a newline counts), or None when they were not all
            counted (lines after the last needle are not counted).
        seconds: wall time of the scan (reading included).
        findings: ordered by first evidence line.
        error: why the file could not be read (then nothing else is set), or None.
    """

    file: str
    size: int = 0
    lines: int | None = None
    seconds: float = 0.0
    findings: list[Finding] = field(default_factory=list)
    error: str | None = None

    def as_json(self) -> dict[str, Any]:
        """{file, bytes, lines, seconds, mb_per_s, error, findings: [Finding.as_json()]}."""
        return {
            "file": self.file,
            "bytes": self.size,
            "lines": self.lines,
            "seconds": round(self.seconds, 6),
            "mb_per_s": round(self.size / 1e6 / self.seconds, 3) if self.seconds > 0 else None,
            "error": self.error,
            "findings": [f.as_json() for f in self.findings],
        }


def scan_file(
    path: str | Path,
    *,
    name: str | None = None,
    options: RuleOptions | None = None,
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
    run: RunOutcome | None = None,
) -> FileScan:
    """Stream one log file through the rules.

    Args:
        path: the log file.
        name: the file's name in the evidence (default: `path` as given).
        options: rule limits (defaults: `RuleOptions()`).
        chunk_bytes: read size in bytes (≥ 1); a line longer than it grows the buffer to hold it.
        run: what the log's run directory recorded (`run_outcome.read_run_outcome`), when `path` is a
            run directory's console.log: the rules then report every rank's recorded error, root cause
            first, and read the final status. None for a plain log file.

    Returns:
        The findings and the bytes, lines and seconds of the scan.

    Raises:
        OSError: the file cannot be opened or read (missing, permission, a directory).
        NotATextLog: (an OSError) the file is compressed, UTF-16 or binary; the message says how to
            make a text log of it.
        ValueError: chunk_bytes < 1.
    """
    if chunk_bytes < 1:
        raise ValueError(f"--chunk-bytes must be >= 1, got {chunk_bytes}")
    rules = LogRules(name if name is not None else str(path), options, run)
    started = time.perf_counter()
    with open(path, "rb", buffering=0) as f:
        reason = not_text_reason(os.pread(f.fileno(), SNIFF_BYTES, 0), str(path))
        if reason is not None:
            raise NotATextLog(reason)
        scanner = _ChunkScanner(rules, f.fileno(), eager=os.fstat(f.fileno()).st_size <= 4 * chunk_bytes)
        size, last_byte = _stream(f, scanner, chunk_bytes)
        for line_no, offset in sorted(scanner.context_offsets.items()):
            rules.add_context(_surroundings(f, offset, line_no))
        _read_launch_flags(f, rules)
    findings = rules.finish()
    return FileScan(
        file=rules.file,
        size=size,
        lines=scanner.lines(size, last_byte),
        seconds=time.perf_counter() - started,
        findings=findings,
    )


def _stream(f: Any, scanner: _ChunkScanner, chunk_bytes: int) -> tuple[int, int | None]:
    """Feed the whole file to `scanner` in chunks cut after their last newline, one reused buffer.

    Returns:
        (bytes read, the file's last byte or None when empty).
    """
    size = 0
    buf = bytearray(chunk_bytes)
    have = 0
    last_byte: int | None = None
    while True:
        with memoryview(buf) as view, view[have:] as free:
            n = f.readinto(free)
        if not n:
            if have:
                scanner.chunk(buf, have)
            return size, last_byte
        size += n
        have += n
        last_byte = buf[have - 1]
        cut = buf.rfind(b"\n", 0, have) + 1
        if cut == 0:
            if have == len(buf):
                buf.extend(bytes(len(buf)))  # one line longer than the buffer: make room for it
            continue
        scanner.chunk(buf, cut)
        rest = have - cut
        if rest:
            buf[:rest] = buf[cut:have]
        have = rest


def _read_launch_flags(f: Any, rules: LogRules) -> None:
    """Hand the rules the launch line of each flag they ask about (searched in the file's first
    LAUNCH_HEAD_BYTES)."""
    flags = rules.launch_flags()
    if not flags:
        return
    f.seek(0)
    head = f.read(LAUNCH_HEAD_BYTES)
    for flag in flags:
        at = head.find(b"--" + flag.encode())
        if at >= 0:
            line_end = head.find(b"\n", at)
            line = head[head.rfind(b"\n", 0, at) + 1 : line_end if line_end >= 0 else len(head)]
            rules.on_launch_line(flag, line.decode("utf-8", "replace"))

"""Scan run logs for known failure signatures: each finding gives its rule, evidence lines, cause and fix.

`grpolab diagnose log FILE [FILE…]` reads grpolab console.log files, Miles/slime logs (with or without
Ray's `(Actor pid=N)` prefixes) and torchrun logs (`[rank1]:`, `[default0]:`). The rules live in
logrules.py; this module streams the files and prints the report.

Streaming: a file is read in chunks (`--chunk-bytes`, 4 MiB) into one reused buffer, cut after the
last newline of each chunk (the rest moves to the next), so memory does not grow with the file and
no line is ever split. Only lines that hold a rule's needle are decoded. To find about twenty
needles without twenty passes over every chunk, each needle is anchored on one of its bytes that is
rare in the text (chosen from a sample, re-chosen when an anchor turns out common): one
`memchr`-speed pass per anchor byte finds candidate positions, and only those are compared with the
needles (`NeedleFinder`). The 503 lines of the
dead-engine rule are counted per time bucket with `bytearray.count` between bucket boundaries found
by bisection, so 200,000 of them cost no per-line work. Line numbers come from counting newlines,
only as far as a finding needs them (see `_ChunkScanner`).

Exit codes: 0 no error-severity finding, 1 at least one, 2 a file could not be read (named on
stderr; the other files are still scanned) or a bad option.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from grpolab.diagnose.dead_engine import (
    DEFAULT_CHECKS,
    DEFAULT_INTERVAL_S,
    DEFAULT_LIMIT,
    DEFAULT_WINDOW_S,
    WatchdogRule,
)
from grpolab.diagnose.logrules import (
    DEAD_ENGINE_NEEDLE,
    DEFAULT_MAX_STEP0_GAP,
    DEFAULT_MIN_KV_TOKENS,
    NEARBY_LINES,
    SIGNATURES,
    Finding,
    LogRules,
    RuleOptions,
    count_by_severity,
)

if TYPE_CHECKING:
    from pathlib import Path

EXIT_OK, EXIT_ERRORS, EXIT_UNREADABLE = 0, 1, 2
DEFAULT_CHUNK_BYTES = 4 << 20
"""Read size (grpolab's: 4 MiB keeps a chunk in a CPU's last-level cache for the several passes over it,
and the doctor's memory small; the measured throughput is flat from 1 to 16 MiB)."""
ABOVE_LINES = 8
"""Lines kept above the first 503 (the manual: read the engine lines above the first error)."""
CONTEXT_BYTES = 64 << 10
"""Bytes read on each side of an error line for its surroundings (NEARBY_LINES lines of up to 1.6 kB)."""
LAUNCH_HEAD_BYTES = 1 << 20
"""The launch command line (--custom-rm-path) is looked for in the first MiB of a log."""
RECOUNT_BYTES = 4 << 20
"""Read size when skipped chunks are read again to count their lines."""

# Cost model of the anchor choice (seconds, measured with CPython 3.11 on the project's x86-64 machine).
_MEMCHR_S_PER_BYTE = 0.05e-9
"""One `bytearray.find(byte)` pass (glibc memchr on a cache-resident chunk: ~20-40 GB/s)."""
_FIND_S_PER_BYTE = 0.25e-9
"""One `bytearray.find(needle)` pass for a 15-40 byte needle (CPython's two-way search: ~4 GB/s)."""
_HIT_S = 0.5e-6
"""Python work per candidate position of an anchor byte."""
_CHECK_S = 0.15e-6
"""One `startswith` comparison of a needle at a candidate position."""
_SAMPLE_SLICES, _SAMPLE_BYTES = 8, 2048
_REPLAN_EVERY = 64
"""Chunks between two anchor choices when no anchor overflowed (the text can change along a log)."""


# ---------------------------------------------------------------------- finding needles fast
class NeedleFinder:
    """Every occurrence of a fixed set of needles in a buffer, with few C-level passes.

    Each needle is assigned an anchor byte (greedy weighted set cover on byte frequencies of a sample
    of the chunk); a `find(byte)` loop visits the anchor's occurrences and `startswith` confirms the
    needles at their offsets. Needles without a rare byte are searched directly. An anchor that
    shows more than 8× its expected occurrences in a chunk is abandoned for that chunk (its needles
    are searched directly) and the anchors are chosen again on the next chunk.

    Args:
        needles: distinct non-empty byte strings.
    """

    def __init__(self, needles: Sequence[bytes]) -> None:
        if not needles or any(not n for n in needles):
            raise ValueError("needles must be non-empty byte strings")
        self.needles = list(needles)
        self._offsets = [{b: n.index(b) for b in set(n)} for n in self.needles]
        self._candidates = sorted(set().union(*(set(n) for n in self.needles)))
        self._groups: list[tuple[int, list[tuple[int, int]], float]] = []
        self._direct: list[int] = list(range(len(self.needles)))
        self._stale = True
        self._since_plan = 0

    @property
    def plan(self) -> tuple[list[tuple[bytes, list[bytes]]], list[bytes]]:
        """The current choice: [(anchor byte, its needles)], [needles searched directly]."""
        groups = [(bytes([b]), [self.needles[k] for k, _ in members]) for b, members, _ in self._groups]
        return groups, [self.needles[k] for k in self._direct]

    def _choose(self, buf: bytearray, end: int) -> None:
        if end <= _SAMPLE_SLICES * _SAMPLE_BYTES:
            sample = bytes(buf[:end])
        else:
            step = (end - _SAMPLE_BYTES) // (_SAMPLE_SLICES - 1)
            sample = b"".join(buf[i * step : i * step + _SAMPLE_BYTES] for i in range(_SAMPLE_SLICES))
        size = max(len(sample), 1)
        freq = {b: (sample.count(b) + 0.5) / size for b in self._candidates}
        uncovered = set(range(len(self.needles)))
        groups: list[tuple[int, list[tuple[int, int]], float]] = []
        direct: list[int] = []
        while uncovered:
            best: tuple[float, int, list[int]] | None = None
            for b in self._candidates:
                covered = [k for k in uncovered if b in self._offsets[k]]
                if not covered:
                    continue
                per_byte = _MEMCHR_S_PER_BYTE + freq[b] * (_HIT_S + _CHECK_S * len(covered))
                ratio = per_byte / len(covered)
                if best is None or ratio < best[0]:
                    best = (ratio, b, covered)
            assert best is not None  # every needle has at least one byte
            ratio, b, covered = best
            if ratio >= _FIND_S_PER_BYTE:
                direct = sorted(uncovered)
                break
            groups.append((b, [(k, self._offsets[k][b]) for k in sorted(covered)], freq[b]))
            uncovered.difference_update(covered)
        self._groups, self._direct = groups, direct
        self._stale, self._since_plan = False, 0

    def _find_direct(self, buf: bytearray, end: int, k: int, out: list[tuple[int, int]]) -> None:
        needle = self.needles[k]
        i = buf.find(needle, 0, end)
        while i >= 0:
            out.append((i, k))
            i = buf.find(needle, i + len(needle), end)

    def find_all(self, buf: bytearray, end: int) -> list[tuple[int, int]]:
        """(position, needle index) of every needle occurrence in buf[:end], unordered.

        buf[:end] must end at a line end and needles must hold no newline: then no match can run past
        `end` (the bytes after it are stale).
        """
        if self._stale or self._since_plan >= _REPLAN_EVERY:
            self._choose(buf, end)
        self._since_plan += 1
        hits: list[tuple[int, int]] = []
        needles = self.needles
        for anchor, members, freq in self._groups:
            cap = int(freq * end * 8) + 256
            found: list[tuple[int, int]] = []
            seen = 0
            i = buf.find(anchor, 0, end)
            while i >= 0:
                for k, offset in members:
                    start = i - offset
                    if start >= 0 and buf.startswith(needles[k], start, end):
                        found.append((start, k))
                seen += 1
                if seen > cap:
                    break
                i = buf.find(anchor, i + 1, end)
            if seen > cap:
                self._stale = True
                found = []
                for k, _ in members:
                    self._find_direct(buf, end, k, found)
            hits += found
        for k in self._direct:
            self._find_direct(buf, end, k, hits)
        return hits


# ---------------------------------------------------------------------- one file
_FIRST_503 = -1


class _ChunkScanner:
    """Feeds the rules from complete-line chunks of one file, in file order.

    Line numbers are counted only as far as they are needed: a chunk with a needle (or the first 503)
    is counted whole; chunks without one are skipped and counted later, by reading them again, only
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
        self.finder = NeedleFinder([s.needle for s in SIGNATURES])
        self.keys = [s.key for s in SIGNATURES]
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

    def _engine_errors(self, buf: bytearray, end: int, points: list[tuple[int, int]]) -> None:
        """Count the 503 lines of buf[:end] per bucket; the first one ever goes to `points`."""
        needle = DEAD_ENGINE_NEEDLE
        first = buf.find(needle, 0, end)
        if first < 0:
            return
        engine = self.rules.engine

        def time_at(p: int) -> int | None:
            return engine.time_in(buf, buf.rfind(b"\n", 0, p) + 1, p)

        if engine.timed is None:
            engine.begin(buf, buf.rfind(b"\n", 0, first) + 1, first)
            points.append((first, _FIRST_503))
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
            # bisect the 503 hits in (cur, last]: lo is in the bucket, hi is past it
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
        self._engine_errors(buf, end, points)
        points += self.finder.find_all(buf, end)
        if points or self.eager:
            points.sort()
            self._catch_up()
            newlines = counted = 0
            rfind, find, count, keys_of = buf.rfind, buf.find, buf.count, self.keys
            on_line, engine = self.rules.on_line, self.rules.engine
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
                if _FIRST_503 in codes:
                    engine.note_first(line_no, text, self._above(buf, line_start, line_no))
                keys = [keys_of[c] for c in codes if c >= 0]
                if keys and on_line(keys, line_no, text):
                    self.context_offsets[line_no] = self.offset + line_start
            # a chunk with needles is counted whole: the next one will likely need it too
            self.newlines += newlines + buf.count(b"\n", counted, end)
            self.counted_to = self.offset + end
        # the last lines of this chunk, for the lines above a 503 at the start of the next one
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
) -> FileScan:
    """Stream one log file through the rules.

    Args:
        path: the log file.
        name: the file's name in the evidence (default: `path` as given).
        options: rule limits (defaults: `RuleOptions()`).
        chunk_bytes: read size in bytes (≥ 1); a line longer than it grows the buffer to hold it.

    Returns:
        The findings and the bytes, lines and seconds of the scan.

    Raises:
        OSError: the file cannot be opened or read (missing, permission, a directory).
        ValueError: chunk_bytes < 1.
    """
    if chunk_bytes < 1:
        raise ValueError(f"--chunk-bytes must be >= 1, got {chunk_bytes}")
    rules = LogRules(name if name is not None else str(path), options)
    started = time.perf_counter()
    size = 0
    buf = bytearray(chunk_bytes)
    have = 0
    last_byte: int | None = None
    with open(path, "rb", buffering=0) as f:
        scanner = _ChunkScanner(rules, f.fileno(), eager=os.fstat(f.fileno()).st_size <= 4 * chunk_bytes)
        while True:
            with memoryview(buf) as view, view[have:] as free:
                n = f.readinto(free)
            if not n:
                if have:
                    scanner.chunk(buf, have)
                break
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
        for line_no, offset in sorted(scanner.context_offsets.items()):
            rules.add_context(_surroundings(f, offset, line_no))
        if rules.wants_launch_line():
            f.seek(0)
            head = f.read(LAUNCH_HEAD_BYTES)
            at = head.find(b"--custom-rm-path")
            if at >= 0:
                line_end = head.find(b"\n", at)
                line = head[head.rfind(b"\n", 0, at) + 1 : line_end if line_end >= 0 else len(head)]
                rules.on_launch_line(line.decode("utf-8", "replace"))
    findings = rules.finish()
    return FileScan(
        file=rules.file,
        size=size,
        lines=scanner.lines(size, last_byte),
        seconds=time.perf_counter() - started,
        findings=findings,
    )


# ---------------------------------------------------------------------- report
def _size(n: int) -> str:
    if n >= 1e6:
        return f"{n / 1e6:.1f} MB"
    if n >= 1e3:
        return f"{n / 1e3:.1f} kB"
    return f"{n} B"


def summary_line(scans: Sequence[FileScan]) -> str:
    """`scanned 1 file, 147.2 MB in 1.31 s (112 MB/s): 1 error, 0 warnings, 1 info`."""
    read = [s for s in scans if s.error is None]
    size = sum(s.size for s in read)
    seconds = sum(s.seconds for s in read)
    counts = count_by_severity(f for s in read for f in s.findings)
    rate = f"{size / 1e6 / seconds:.{0 if size / 1e6 >= 10 * seconds else 1}f} MB/s" if seconds > 0 else "-"
    unreadable = len(scans) - len(read)
    text = (
        f"scanned {len(read)} file{'s' if len(read) != 1 else ''}, {_size(size)} in {seconds:.2f} s ({rate}): "
        f"{counts['error']} error{'s' if counts['error'] != 1 else ''}, "
        f"{counts['warning']} warning{'s' if counts['warning'] != 1 else ''}, {counts['info']} info"
    )
    if unreadable:
        text += f"; {unreadable} file{'s' if unreadable != 1 else ''} could not be read"
    return text


def _wrap(label: str, text: str) -> list[str]:
    import textwrap

    return textwrap.wrap(text, width=108, initial_indent=f"  {label:<8}", subsequent_indent=" " * 10) or [
        f"  {label}"
    ]


def render_finding(finding: Finding) -> str:
    """A finding as text: severity, rule and title, evidence lines, cause, fix, source."""
    out = [f"{finding.severity.upper():<7} {finding.rule}: {finding.title}"]
    width = max((len(str(e.line)) for e in finding.evidence), default=1)
    for e in finding.evidence:
        note = f"  [{e.note}]" if e.note else ""
        out.append(f"    {e.file}:{e.line:<{width}}  {e.text}{note}")
    out += _wrap("cause:", finding.cause)
    out += _wrap("fix:", finding.fix)
    out += _wrap("source:", finding.source)
    return "\n".join(out)


def render_text(scans: Sequence[FileScan]) -> str:
    """The whole report: per file its findings (or that none were found), then the summary line."""
    blocks = []
    for scan in scans:
        if scan.error is not None:
            blocks.append(f"{scan.file}: cannot read: {scan.error}")
            continue
        counts = count_by_severity(scan.findings)
        lines = "" if scan.lines is None else f", {scan.lines:,} lines"
        head = f"{scan.file} ({_size(scan.size)}{lines}): " + (
            ", ".join(f"{n} {sev}{'s' if n != 1 and sev != 'info' else ''}" for sev, n in counts.items() if n)
            if scan.findings
            else "no known failure signature"
        )
        blocks.append("\n\n".join([head] + [render_finding(f) for f in scan.findings]))
    blocks.append(summary_line(scans))
    return "\n\n".join(blocks)


def render_json(scans: Sequence[FileScan]) -> dict[str, Any]:
    """{files: [FileScan.as_json()], summary: {...}, exit_code}; every finding also carries `file`."""
    read = [s for s in scans if s.error is None]
    size = sum(s.size for s in read)
    seconds = sum(s.seconds for s in read)
    counts = count_by_severity(f for s in read for f in s.findings)
    return {
        "files": [s.as_json() for s in scans],
        "summary": {
            "files": len(read),
            "unreadable": len(scans) - len(read),
            "bytes": size,
            "seconds": round(seconds, 6),
            "mb_per_s": round(size / 1e6 / seconds, 3) if seconds > 0 else None,
            **counts,
            "text": summary_line(scans),
        },
        "exit_code": exit_code(scans),
    }


def exit_code(scans: Sequence[FileScan]) -> int:
    """2 when a file could not be read, else 1 when any finding is an error, else 0."""
    if any(s.error is not None for s in scans):
        return EXIT_UNREADABLE
    return EXIT_ERRORS if any(f.severity == "error" for s in scans for f in s.findings) else EXIT_OK


# ---------------------------------------------------------------------- CLI
def add_log_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of `grpolab diagnose log`."""
    parser.epilog = (
        "Exit codes: 0 no error-severity finding, 1 at least one, 2 a file could not be read (the others "
        "are still scanned) or a bad option."
    )
    parser.add_argument(
        "files", nargs="+", metavar="FILE", help="log files (console.log, Miles/slime, torchrun)"
    )
    parser.add_argument(
        "--json", action="store_true", help="print one JSON object instead of the text report"
    )
    parser.add_argument(
        "--max-step0-gap",
        type=float,
        default=DEFAULT_MAX_STEP0_GAP,
        help="flag a step-0 train/train_rollout_logprob_abs_diff above this (default %(default)s; the manual's "
        "healthy Qwen3-0.6B runs: 0.0148-0.0157)",
    )
    parser.add_argument(
        "--min-kv-tokens",
        type=int,
        default=DEFAULT_MIN_KV_TOKENS,
        help="flag an SGLang KV cache smaller than this many tokens (default %(default)s)",
    )
    group = parser.add_argument_group("dead-engine rule (the manual's 503 watchdog)")
    group.add_argument(
        "--limit",
        type=int,
        default=DEFAULT_LIMIT,
        help="a check strikes above this count (default %(default)s)",
    )
    group.add_argument(
        "--checks", type=int, default=DEFAULT_CHECKS, help="strikes in a row (default %(default)s)"
    )
    group.add_argument(
        "--interval",
        type=int,
        default=int(DEFAULT_INTERVAL_S),
        help="seconds between checks (default %(default)s)",
    )
    group.add_argument(
        "--window",
        type=int,
        default=int(DEFAULT_WINDOW_S),
        help="seconds each check counts (default %(default)s)",
    )
    parser.add_argument(
        "--chunk-bytes",
        type=int,
        default=DEFAULT_CHUNK_BYTES,
        help="read size in bytes (default %(default)s; a longer line is still read whole)",
    )


def options_from_args(args: argparse.Namespace) -> RuleOptions:
    """RuleOptions from the parsed flags.

    Raises:
        ValueError: naming the flag, for a value out of range.
    """
    rule = WatchdogRule(
        limit=args.limit, checks=args.checks, interval=float(args.interval), window=float(args.window)
    )
    return RuleOptions(watchdog=rule, max_step0_gap=args.max_step0_gap, min_kv_tokens=args.min_kv_tokens)


def run_log_command(args: argparse.Namespace) -> int:
    """Scan every file, print the report (text or --json); return the exit code (see `exit_code`)."""
    try:
        options = options_from_args(args)
        if args.chunk_bytes < 1:
            raise ValueError(f"--chunk-bytes must be >= 1, got {args.chunk_bytes}")
    except ValueError as e:
        print(f"grpolab diagnose log: {e}", file=sys.stderr)
        return EXIT_UNREADABLE
    scans: list[FileScan] = []
    for file in args.files:
        try:
            scans.append(scan_file(file, name=file, options=options, chunk_bytes=args.chunk_bytes))
        except OSError as e:
            reason = e.strerror or str(e)
            print(f"grpolab diagnose log: cannot read {file}: {reason}", file=sys.stderr)
            scans.append(FileScan(file=file, error=reason))
    if args.json:
        import json

        print(json.dumps(render_json(scans), indent=1))
    else:
        print(render_text(scans))
    return exit_code(scans)


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m grpolab.diagnose.logdoctor FILE…`: the same command without the `grpolab` CLI's imports."""
    parser = argparse.ArgumentParser(prog="grpolab diagnose log", description=__doc__.split("\n\n")[0])
    add_log_arguments(parser)
    return run_log_command(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())

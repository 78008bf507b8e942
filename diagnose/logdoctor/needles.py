"""Every occurrence of a fixed set of byte strings ("needles") in a buffer, with few C-level passes.

To find about twenty needles without twenty passes over every chunk of a log, each needle is anchored
on one of its bytes that is rare in the text (chosen from a sample, re-chosen when an anchor turns out
common): one `memchr`-speed pass per anchor byte finds candidate positions, and only those are
compared with the needles. The log doctor's scanner (logdoctor/scan.py) uses it on every chunk.
"""

from __future__ import annotations

from collections.abc import Sequence

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


class NeedleFinder:
    """Every occurrence of a fixed set of needles in a buffer, with few C-level passes.

    Each needle is assigned an anchor byte (greedy weighted set cover on byte frequencies of a sample
    of the chunk); a `find(byte)` loop visits the anchor's occurrences and `startswith` confirms the
    needles at their offsets. Needles without a rare byte are searched directly. An anchor that
    shows more than 8× its expected occurrences in a chunk is abandoned for that chunk (its needles
    are searched directly) and the anchors are chosen again on the next chunk.

    Args:
        needles: distinct non-empty byte strings.

    Raises:
        ValueError: no needles, or an empty one.
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

"""`tail -n 0 -F` for one file, as the watchdog needs it: `LogFollower.poll()` returns the complete lines
appended since the last poll, following truncation (copytruncate) and rotation (a new file at the path).
"""

from __future__ import annotations

import os
from pathlib import Path

MAX_LINE_BYTES = 1 << 20
"""A line longer than this (no newline yet) is counted in pieces rather than buffered without end."""


class LogFollower:
    """`tail -n 0 -F` for one file: the complete lines appended since the last `poll()`.

    Follows truncation (copytruncate: reads again from the start) and rotation (a new file at the
    path: the rest of the old file is read first). Lines are bytes without the newline.

    Raises:
        OSError: from the constructor when the file cannot be opened (missing, permission).
    """

    def __init__(self, path: Path, *, from_end: bool = True) -> None:
        self.path = path
        self._file = open(path, "rb")  # kept open while following
        if from_end:
            self._file.seek(0, os.SEEK_END)
        st = os.fstat(self._file.fileno())
        self._id = (st.st_dev, st.st_ino)
        self._partial = b""
        self.problem: str | None = None
        """Why the last `poll()` could not read the path (None when it could)."""

    def poll(self) -> list[bytes]:
        """Read what was appended; sets `problem` when the path cannot be read this time."""
        self.problem = None
        lines: list[bytes] = []
        try:
            lines += self._drain()
            st = os.stat(self.path)
            if (st.st_dev, st.st_ino) != self._id:  # rotated: a new file now lives at the path
                new = open(self.path, "rb")
                lines += self._flush_partial()
                self._file.close()
                self._file, self._id = new, (st.st_dev, st.st_ino)
                lines += self._drain()
            elif st.st_size < self._file.tell():  # truncated in place
                self._file.seek(0)
                self._partial = b""
                lines += self._drain()
        except OSError as e:
            self.problem = f"{type(e).__name__}: {e.strerror or e}"
        return lines

    def close(self) -> None:
        """Close the followed file."""
        self._file.close()

    def _drain(self) -> list[bytes]:
        lines: list[bytes] = []
        while chunk := self._file.read(1 << 20):
            parts = (self._partial + chunk).split(b"\n")
            self._partial = parts.pop()
            lines += parts
            if len(self._partial) > MAX_LINE_BYTES:
                lines += self._flush_partial()
        return lines

    def _flush_partial(self) -> list[bytes]:
        out, self._partial = ([self._partial] if self._partial else []), b""
        return out


__all__ = ["MAX_LINE_BYTES", "LogFollower"]

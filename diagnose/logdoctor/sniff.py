"""Is a file a text log? `not_text_reason` tells compressed, UTF-16 and binary files from text by their
first bytes, and names the command that makes a text log of them (the log doctor reads text only).

Pure: it looks at bytes the caller read (logdoctor/scan.py reads the first SNIFF_BYTES of each file).
"""

from __future__ import annotations

import errno
import re
import shlex

from grpolab.diagnose.common.wording import plural

SNIFF_BYTES = 64 << 10
"""Bytes of a file's head that `not_text_reason` looks at."""
MAX_NUL_FRACTION = 1e-3
"""grpolab's limit for NUL bytes in a text log's head (outside runs of ZERO_RUN or more): random binary
data has one in 256 bytes, four times as many; a text log has none, or a stray one or two."""
ZERO_RUN = 64
"""A run of this many NUL bytes is a zero-filled block, not binary data: a log truncated in place
(copytruncate) while its writer kept its offset starts with one, and a crash can leave one inside."""
_COMPRESSED = (
    (b"\x1f\x8b", "gzip-compressed", "zcat", (".gz", ".tgz")),
    (b"\x28\xb5\x2f\xfd", "zstd-compressed", "zstdcat", (".zst", ".zstd")),
    (b"\xfd7zXZ\x00", "xz-compressed", "xzcat", (".xz",)),
    (b"PK\x03\x04", "a zip archive", "unzip -p", (".zip",)),
)
"""(magic bytes, what it is, the command that prints it as text, its usual suffixes)."""
_BZIP2 = re.compile(rb"BZh[1-9](?:1AY&SY|\x17rE8P\x90)")
"""bzip2: `BZh`, the block size, then the magic of a block or of the end of the stream (an empty file)."""


class NotATextLog(OSError):
    """The file is compressed, UTF-16 or binary: the log doctor reads text logs (UTF-8, ASCII) only.

    `strerror` is the reason with the command that makes a text log of it (see `not_text_reason`).
    """

    def __init__(self, reason: str) -> None:
        super().__init__(errno.EILSEQ, reason)


def _text_name(path: str, suffixes: tuple[str, ...] = ()) -> str:
    """Where to write the text version of `path`: without its compression suffix, ending in .log."""
    for suffix in suffixes:
        if path.lower().endswith(suffix) and len(path) > len(suffix):
            path = path[: -len(suffix)]
            break
    else:
        path = path.removesuffix(".log") + ".utf8"
    return path if path.endswith((".log", ".txt")) else path + ".log"


def not_text_reason(head: bytes, path: str) -> str | None:
    """Why a file whose first bytes are `head` is not a text log, or None when it is one.

    Recognizes gzip, zstd, xz, zip and bzip2 by their magic bytes, UTF-16 by its byte-order mark or by
    NUL bytes at every other position, and other binary data by NUL bytes (more than
    MAX_NUL_FRACTION of the head, after leading NULs and zero-filled blocks are left out). The reason
    names the command that turns `path` into a text log, e.g. `not a text log (gzip-compressed:
    decompress it first, e.g. zcat F.gz > F.log)`.
    """
    quoted = shlex.quote(path)
    for magic, kind, command, suffixes in _COMPRESSED:
        if head.startswith(magic):
            out = shlex.quote(_text_name(path, suffixes))
            return f"not a text log ({kind}: decompress it first, e.g. {command} {quoted} > {out})"
    if _BZIP2.match(head):
        out = shlex.quote(_text_name(path, (".bz2",)))
        return f"not a text log (bzip2-compressed: decompress it first, e.g. bzcat {quoted} > {out})"
    body = head.lstrip(b"\0")
    even, odd = body[0::2], body[1::2]
    utf16 = head.startswith((b"\xff\xfe", b"\xfe\xff")) or (
        len(body) >= 16
        and min(even.count(0), odd.count(0)) <= 0.1 * len(odd)
        and max(even.count(0), odd.count(0)) >= 0.9 * len(odd)
    )
    if utf16:
        out = shlex.quote(_text_name(path))
        return (
            f"not a text log (UTF-16 text: convert it first, e.g. iconv -f UTF-16 -t UTF-8 {quoted} > {out})"
        )
    nuls = re.sub(rb"\x00{%d,}" % ZERO_RUN, b"", body).count(0)
    if nuls > MAX_NUL_FRACTION * len(body):
        return f"not a text log (binary data: {plural(nuls, 'NUL byte')} in its first {len(head):,} bytes)"
    return None


__all__ = ["SNIFF_BYTES", "NotATextLog", "not_text_reason"]

"""The log doctor's report: each file's findings as text (severity, rule, evidence, cause, fix, source)
or one JSON object, the summary line and the exit code. Pure: the scans come in, strings go out.

Exit codes: 0 no error-severity finding, 1 at least one, 2 a file could not be read.
"""

from __future__ import annotations

import textwrap
from collections.abc import Sequence
from typing import Any

from grpolab.diagnose.common.wording import plural
from grpolab.diagnose.logdoctor.model import Finding, count_by_severity
from grpolab.diagnose.logdoctor.scan import FileScan

EXIT_OK, EXIT_ERRORS, EXIT_UNREADABLE = 0, 1, 2


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
        text += f"; {plural(unreadable, 'file')} could not be read (named on stderr)"
    return text


def _wrap(label: str, text: str) -> list[str]:
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
    """The whole report: per file read its findings (or that none were found), then the summary line.

    A file that could not be read is only counted in the summary line: the command names it, with the
    reason, on stderr.
    """
    blocks = []
    for scan in scans:
        if scan.error is not None:
            continue
        counts = count_by_severity(scan.findings)
        lines = "" if scan.lines is None else f", {plural(scan.lines, 'line')}"
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

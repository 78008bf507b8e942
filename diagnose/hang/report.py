"""What one `grpolab diagnose hang` found (`HangReport`), and its outputs: the printed report and the dumps.

`format_report` is the human-readable text (verdict, evidence, ranks x frame table, notes, next
steps, where the dumps are); `HangReport.to_dict` is the `--json` object and verdict.json;
`write_dumps` keeps `rank<r>.txt` (every sample in py-spy's layout, or py-spy's error),
`rank<r>.json` (the parsed samples) and `verdict.json` in a directory.
"""

from __future__ import annotations

import dataclasses
import socket
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from grpolab.core.atomic import atomic_write_bytes, atomic_write_json
from grpolab.diagnose.common.rank_errors import error_label, recorded_errors
from grpolab.diagnose.hang.activity import RunContext
from grpolab.diagnose.hang.progress import ProgressCheck
from grpolab.diagnose.hang.pyspy import DumpResult, render_stack_text
from grpolab.diagnose.hang.stacks import stack_to_dict
from grpolab.diagnose.hang.targets import RankTarget

if TYPE_CHECKING:
    from grpolab.diagnose.hang.verdict.classify import Verdict


@dataclass
class HangReport:
    """Everything one `diagnose hang` found: the verdict, its inputs and where the dumps went."""

    verdict: Verdict
    progress: ProgressCheck
    targets: list[RankTarget]
    samples: list[dict[int, DumpResult]]
    """One dict per sample: rank → dump, for the ranks that were dumped (alive and on this host)."""
    alive: dict[int, bool]
    """rank → alive after the last sample (ranks on other hosts: True here, their liveness is unknown;
    `to_dict` and the dumps say None for them)."""
    gone: dict[int, str] = field(default_factory=dict)
    """rank → why it is not alive (pid gone, or the pid reused by another process)."""
    notes: list[str] = field(default_factory=list)
    """Problems that did not stop the diagnosis (unreadable rank files, ranks not dumped, …)."""
    run_dir: Path | None = None
    run: RunContext | None = None
    out_dir: Path | None = None
    py_spy: str = ""
    py_spy_version: str | None = None
    options: dict[str, Any] = field(default_factory=dict)
    elapsed_s: float = 0.0

    @property
    def exit_code(self) -> int:
        """1 when hung, 0 when progress was observed or everything ended."""
        return 1 if self.verdict.hung else 0

    def missing_ranks(self) -> dict[int, str]:
        """rank → why it has no stack (exited, another host, py-spy error in the last sample)."""
        out: dict[int, str] = {}
        last = self.samples[-1] if self.samples else {}
        for t in self.targets:
            if not t.local:
                out[t.rank] = (
                    f"on host {t.host}, not this one ({socket.gethostname()}): py-spy only reaches "
                    "processes on its own host; run grpolab diagnose hang there"
                )
            elif not self.alive.get(t.rank, False):
                out[t.rank] = self.gone.get(t.rank, "exited (pid gone)")
            elif t.rank in last and last[t.rank].stack is None:
                out[t.rank] = last[t.rank].error or "not dumped"
        return out

    def to_dict(self) -> dict[str, Any]:
        """The JSON object `--json` prints and `verdict.json` stores (verdict plus its inputs)."""
        missing = self.missing_ranks()
        errors = recorded_errors(self.targets)
        return {
            "verdict": self.verdict.to_dict(),
            "hung": self.verdict.hung,
            "exit_code": self.exit_code,
            "run_dir": None if self.run_dir is None else str(self.run_dir),
            "run": None if self.run is None else dataclasses.asdict(self.run),
            "dumps": None if self.out_dir is None else str(self.out_dir),
            "progress": self.progress.to_dict(),
            "rank_errors": [
                {
                    "rank": e.rank,
                    "error": e.error,
                    "heartbeat_time": e.time,
                    "peer_connection_error": e.peer_connection_error,
                    "label": error_label(e, errors),
                }
                for e in errors
            ],
            "ranks": [
                {
                    "rank": t.rank,
                    "pid": t.pid,
                    "host": t.host,
                    "role": t.role,
                    "source": t.source,
                    "inspected": t.local,
                    "alive": self.alive.get(t.rank, False) if t.local else None,
                    "caveat": t.caveat,
                    "heartbeat": t.heartbeat,
                    "error": t.error,
                    "dumped": t.rank not in missing,
                    "missing_reason": missing.get(t.rank),
                    "dump_seconds": [round(s[t.rank].seconds, 4) for s in self.samples if t.rank in s],
                }
                for t in self.targets
            ],
            "missing_ranks": {str(r): why for r, why in missing.items()},
            "notes": self.notes,
            "py_spy": {"path": self.py_spy, "version": self.py_spy_version},
            "command": {"argv": sys.argv, "options": self.options},
            "elapsed_s": round(self.elapsed_s, 3),
        }


def new_dump_dir(parent: Path) -> Path:
    """A new directory path under `parent` named by the UTC time, e.g. `20260101T120000Z` (`-2`, `-3` …
    appended when taken). The directory is not created."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    path, n = parent / stamp, 1
    while path.exists():
        n += 1
        path = parent / f"{stamp}-{n}"
    return path


def write_dumps(report: HangReport, out_dir: Path) -> None:
    """Write rank<r>.txt, rank<r>.json and verdict.json into `out_dir` (each file atomically).

    Raises:
        OSError: the directory or a file cannot be written.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    report.out_dir = out_dir
    for t in report.targets:
        dumps = [s[t.rank] for s in report.samples if t.rank in s]
        head = f"# rank {t.rank}, pid {t.pid}" + (f", host {t.host}" if t.host else "")
        parts = [head]
        if not dumps:
            parts.append(f"# not dumped: {report.missing_ranks().get(t.rank, 'no sample')}")
        for i, d in enumerate(dumps, 1):
            when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(d.time))
            parts.append(f"# sample {i} of {len(dumps)}, {when}, py-spy took {d.seconds:.3f} s")
            parts.append(render_stack_text(d.stack) if d.stack is not None else f"# py-spy failed: {d.error}")
        if t.error:
            parts.append(
                "# the rank recorded this exception:\n"
                + "\n".join(f"#   {ln}" for ln in t.error.splitlines())
            )
        atomic_write_bytes(out_dir / f"rank{t.rank}.txt", ("\n".join(parts).rstrip() + "\n").encode())
        atomic_write_json(
            out_dir / f"rank{t.rank}.json",
            {
                "rank": t.rank,
                "pid": t.pid,
                "host": t.host,
                "alive": report.alive.get(t.rank, False) if t.local else None,
                "samples": [
                    {
                        "time": d.time,
                        "seconds": round(d.seconds, 4),
                        "stack": None if d.stack is None else stack_to_dict(d.stack),
                        "error": d.error,
                        "failure": d.failure,
                    }
                    for d in dumps
                ],
            },
        )
    atomic_write_json(out_dir / "verdict.json", report.to_dict())


def format_report(report: HangReport) -> str:
    """The human-readable report: verdict, evidence, table, notes, next steps, dumps."""
    from grpolab.diagnose.hang.verdict.classify import render_table

    v = report.verdict
    where = (
        str(report.run_dir)
        if report.run_dir is not None
        else ", ".join(f"pid {t.pid}" for t in report.targets)
    )
    lines = [f"grpolab diagnose hang: {where} ({len(report.targets)} rank{'s' * (len(report.targets) != 1)})"]
    if report.run is not None and report.run.final_status is not None:
        s = report.run.final_status
        lines.append(f"run status: {s.get('status')}" + (f" — {s.get('error')}" if s.get("error") else ""))
    p = report.progress
    prefix = {"progressed": "progress observed: ", "hung": "hang confirmed: "}.get(p.outcome, "")
    lines.append(prefix + p.reason)
    if p.note:
        lines.append(f"note: {p.note}")
    lines += ["", f"verdict: {v.title}"]
    errors = recorded_errors(report.targets)
    for e in errors:  # the failing rank's own exception first (AReaL guide, pattern A), root cause first
        label = error_label(e, errors)
        lines.append(f"exception recorded by rank {e.rank}" + (f" ({label})" if label else "") + ":")
        lines += [f"    {ln}" for ln in e.error.splitlines()]
    if v.evidence:
        lines.append("evidence:")
        lines += [f"  - {e}" for e in v.evidence]
    table = render_table(v)
    if table:
        lines += ["", table.rstrip()]
    if report.notes:
        lines += ["", "not inspected / warnings:"]
        lines += [f"  - {n}" for n in report.notes]
    if v.next_steps:
        lines += ["", "next steps:"]
        lines += [f"  {i}. {s}" for i, s in enumerate(v.next_steps, 1)]
    if report.out_dir is not None:
        lines += ["", f"dumps: {report.out_dir}/ (rank<r>.txt, rank<r>.json, verdict.json)"]
    return "\n".join(lines)

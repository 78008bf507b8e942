"""A run directory's logs told as one story: the engine that died, the router's errors about it, the trainer's
failure. Pure: scans and engine logs in, scans out.

Each log of a run directory is scanned on its own (logdoctor/scan.py); `tell_story` then
- orders the scans as the failure happened: engines/<i>.log first, then router.log, then console.log;
- completes the trainer's `engine_gone` finding (logdoctor/rules/engine_gone.py), and `engine_dead_timeout`
  when its error names an engine's URL (a hung engine), with that engine's own last lines
  (engines/<i>.log: a Python traceback, a fatal Python error, an out-of-memory or a "Killed" line when
  there is one, else its last lines; logdoctor/last_words.py) and the router's lines about the engine's
  URL (router.log), in that order, before the trainer's lines (which then no longer quote the engine
  log: its own lines are there);
- drops console.log's `router_engine_errors` when it rests only on router.log lines that the trainer's
  error quotes and router.log itself was read (its own finding has every line);
- names the engine behind each URL of the router's `router_engine_errors` finding (logdoctor/rules/router.py)
  and quotes that engine's last lines, so a run directory without console.log still says which engine
  failed and how its log ends.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import replace

from grpolab.diagnose.logdoctor.last_words import LastWords, last_words
from grpolab.diagnose.logdoctor.model import Evidence, Finding, trim_line
from grpolab.diagnose.logdoctor.rules.announcements import QUOTED_ENGINE_LOG
from grpolab.diagnose.logdoctor.run_logs import EngineLog
from grpolab.diagnose.logdoctor.scan import FileScan

ROUTER_LINES = 2
"""router.log lines about the engine added to `engine_gone`'s evidence (the router finding has them all):
the first failed send and the first failed health check naming its URL, when there are both."""
QUOTED_ROUTER = "[router.log] "
"""How the trainer's error quotes router.log's last lines (core/engine/http_engine.py `log_tail`)."""


def _engine_evidence(log: EngineLog, words: LastWords) -> list[Evidence]:
    note = f"engine log: {words.kind}" if words.kind else "engine log: its last lines"
    return [Evidence(log.file, ln.line, trim_line(ln.text), note) for ln in words.lines]


def _ends_with(words: LastWords, log: EngineLog) -> str:
    """`engines/0.log ends with a traceback (RuntimeError: x)` / `… ends without an error (last line: …)`."""
    if not words.lines:
        return f"{log.file} is empty"
    if words.kind:
        return f"{log.file} ends with {words.kind} ({trim_line(words.summary.strip(), width=160)})"
    return f"{log.file} ends without an error (last line: {trim_line(words.summary.strip(), width=160)})"


def _router_lines(router: FileScan | None, url: str) -> tuple[list[Evidence], dict]:
    """router.log's evidence lines about `url` and the router's counts for it."""
    found = next((f for f in (router.findings if router else []) if f.rule == "router_engine_errors"), None)
    if found is None or url not in found.details.get("engines", []):
        return [], {}
    alone = len(found.details["engines"]) == 1
    about = sorted((e for e in found.evidence if url in e.text or alone), key=lambda e: url not in e.text)
    lines = sorted(about[:ROUTER_LINES], key=lambda e: e.line)
    counts = {
        "failed_sends": found.details["failed_sends"].get(url, 0),
        "health_failures": found.details["health_failures"].get(url, {}),
    }
    return [replace(e, note=e.note or "router") for e in lines], counts


def _engine_of(finding: Finding, engines: dict[int, EngineLog]) -> tuple[EngineLog | None, str | None]:
    """The engine log and URL a finding is about: `engine_gone`'s index or URL, else the first engine URL
    its error text names (`engine_dead_timeout`'s last error, e.g. `GET http://127.0.0.1:P/server_info: no
    answer`); (None, URL or None) when no engine log matches."""
    index, url = finding.details.get("engine_index"), finding.details.get("url")
    if index is not None and index in engines:
        return engines[index], url or engines[index].url
    if url:
        return next((e for e in engines.values() if e.url == url), None), url
    text = f"{finding.details.get('last_error') or ''} {finding.details.get('error_line') or ''}"
    for log in engines.values():
        if log.url and re.search(re.escape(log.url) + r"(?!\d)", text):
            return log, log.url
    return None, None


def _complete_engine_finding(
    finding: Finding, engines: dict[int, EngineLog], router: FileScan | None
) -> Finding:
    """`engine_gone` or `engine_dead_timeout` with the engine's last lines and the router's lines about it
    before the trainer's."""
    log, url = _engine_of(finding, engines)
    evidence: list[Evidence] = []
    own = finding.evidence
    details = dict(finding.details)
    title, cause = finding.title, finding.cause
    if log is not None:
        words = last_words(log)
        evidence += _engine_evidence(log, words)
        own = tuple(e for e in own if e.note != QUOTED_ENGINE_LOG)  # its own lines are quoted instead
        details |= {"engine_index": log.index, "url": url, "engine_log_file": log.file}
        details |= {"engine_log_ends_with": words.kind or None}
        details["engine_log_last_lines"] = [ln.text for ln in words.lines]
        cause += f" {'' if finding.rule == 'engine_gone' else f'The engine is engine {log.index} at {url}: '}"
        cause += f"{_ends_with(words, log)}."
        if words.kind:
            title += f"; its log ends with {words.kind}"
    if url:
        lines, counts = _router_lines(router, url)
        evidence += lines
        if counts:
            details["router"] = counts
            failed = counts["health_failures"]
            checks = f" and health checks that failed ({', '.join(failed)})" if failed else ""
            cause += f" The router logged {counts['failed_sends']} failed sends to it{checks} (router.log)."
    return replace(finding, title=title, evidence=(*evidence, *own), cause=cause, details=details)


def _name_router_engines(finding: Finding, engines: dict[int, EngineLog]) -> Finding:
    """`router_engine_errors` naming the engine behind each URL and quoting that engine's last lines."""
    by_url = {e.url: e for e in engines.values() if e.url}
    named = [by_url[u] for u in finding.details.get("engines", []) if u in by_url]
    if not named:
        return finding
    evidence = list(finding.evidence)
    ends = []
    for log in named:
        words = last_words(log)
        evidence += _engine_evidence(log, words)
        ends.append(_ends_with(words, log))
    details = dict(finding.details)
    details["engine_logs"] = {log.url: log.file for log in named}
    who = ", ".join(f"engine {log.index} is {log.url} ({log.file})" for log in named)
    return replace(
        finding, evidence=tuple(evidence), cause=f"{finding.cause} {who}; {'; '.join(ends)}.", details=details
    )


def _quotes_router_log(finding: Finding, router: FileScan | None) -> bool:
    """Whether `finding` is a `router_engine_errors` of console.log resting only on router.log lines that
    the trainer's error quotes, while router.log itself was read."""
    return (
        finding.rule == "router_engine_errors"
        and router is not None
        and router.error is None
        and all(e.text.lstrip().startswith(QUOTED_ROUTER) for e in finding.evidence)
    )


def tell_story(
    console: FileScan | None, router: FileScan | None, engines: Sequence[tuple[FileScan, EngineLog | None]]
) -> list[FileScan]:
    """The scans of one run directory in story order (engine logs, router.log, console.log), with
    `engine_gone` and `router_engine_errors` completed from the other logs (see the module docstring).

    Args:
        console: console.log's scan, or None when the directory has none.
        router: router.log's scan, or None.
        engines: each engine log's scan and what `run_logs.read_engine_log` read of it (None when it
            could not be read; the scan then holds the error), by index.
    """
    logs = {log.index: log for _, log in engines if log is not None}

    def completed(scan: FileScan | None) -> FileScan | None:
        if scan is None or scan.error is not None:
            return scan
        out = []
        for f in scan.findings:
            if scan is console and _quotes_router_log(f, router):
                continue  # router.log's own finding tells it, with every line
            if f.rule in ("engine_gone", "engine_dead_timeout"):
                f = _complete_engine_finding(f, logs, router)
            elif f.rule == "router_engine_errors" and scan is router:
                f = _name_router_engines(f, logs)
            out.append(f)
        return replace(scan, findings=out)

    ordered = [scan for scan, _ in engines] + [completed(router), completed(console)]
    return [scan for scan in ordered if scan is not None]


__all__ = ["tell_story"]

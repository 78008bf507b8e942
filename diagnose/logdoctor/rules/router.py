"""Log-doctor rule for sglang-router's errors: engines behind the router that it cannot reach.

The lines are sglang-router 0.3.2's (the Rust `smg` router grpolab starts for `--rollout-num-engines`
and Miles starts in front of its SGLang engines), captured on CPU with a kill -9'd and a SIGSTOPped
`grpolab serve` engine (tests/diagnose/router_logs/). In `router.log`:

    ... ERROR http_request{method=POST uri=/generate ...}: smg::routers::http::router: ...: Failed to send
        typed request worker_url=http://127.0.0.1:36331 route=/generate error=error sending request for url (...)
    ...  WARN smg::core::worker: ...: HTTP health check failed for http://127.0.0.1:32983/health: reqwest::Error
        { ..., source: ... ConnectionRefused ... }          (or `source: TimedOut`: alive, not answering)
    ...  INFO http_request{...}: smg::core::circuit_breaker: ...: Circuit breaker state transition: closed -> open
    ... ERROR http_request{... status_code=503 latency=392441}: smg::response: ...: request failed with server error

and in the console of the trainer that called it (grpolab quotes the router's answer):

    ... HTTP 503: {"error":{"type":"Service Unavailable","code":"no_available_workers","message":"No available
        workers (all circuits open or unhealthy)"}}
    ... HTTP 500: {"error":{..., "code":"call_upstream_request_error","message":"error sending request for url (...)"}}
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence
from typing import TYPE_CHECKING

from grpolab.diagnose.logdoctor.model import (
    MAX_EVIDENCE,
    Evidence,
    Finding,
    Line,
    Rule,
    keep_line,
    register,
)

if TYPE_CHECKING:
    from grpolab.diagnose.logdoctor.ruleset import LogRules

ROUTER_SOURCE = (
    "sglang-router 0.3.2's log lines and answers (smg::routers::http::router, smg::core::worker, "
    "smg::core::circuit_breaker), captured with a kill -9'd and a SIGSTOPped engine behind it"
)
_SEND = re.compile(r"Failed to send typed request worker_url=(?P<url>\S+) route=(?P<route>\S+)")
_HEALTH = re.compile(r"HTTP health check failed for (?P<url>\S+?)/health\S*: (?P<why>.*)")
_STATUS = re.compile(r"status_code=(?P<status>\d+)")
_ANSWER = re.compile(r'"code":"(?P<code>\w+)","message":"(?P<message>(?:[^"\\]|\\.)*)"')
ANSWER_CODES = ("no_available_workers", "call_upstream_request_error")
"""The router's error codes a client quotes: no engine can take the request; the one it picked failed."""


def health_reason(text: str) -> str:
    """ "connection refused", "timed out" or the error's source, from a router health-check failure."""
    if "ConnectionRefused" in text or "Connection refused" in text:
        return "connection refused"
    if "TimedOut" in text or "timed out" in text:
        return "timed out"
    m = re.search(r"source: ([^{}(]+)", text)
    return m.group(1).strip(" ,") if m else text[:80]


@register
class RouterEngineErrors(Rule):
    """sglang-router could not reach one or more engines (router.log), or a client quotes its error
    answer (`no_available_workers`, `call_upstream_request_error`) in its console."""

    id = "router_engine_errors"
    severity = "error"
    needles = (
        b"Failed to send typed request",
        b"HTTP health check failed for ",
        b"Circuit breaker state transition: closed -> open",
        b"request failed with server error",
        b'"code":"no_available_workers"',
        b'"code":"call_upstream_request_error"',
    )
    source = ROUTER_SOURCE

    def __init__(self, log: LogRules) -> None:
        super().__init__(log)
        self.sends: Counter[str] = Counter()  # engine URL -> failed sends
        self.health: dict[str, Counter[str]] = {}  # engine URL -> reason -> failed health checks
        self.statuses: Counter[int] = Counter()  # status code of the router's failed answers
        self.answers: Counter[tuple[str, str]] = Counter()  # (code, message) quoted by a client
        self.circuits = 0
        self.lines: list[Line] = []  # the first line of each kind, for evidence
        self._kinds_seen: set[str] = set()

    def observe(self, line: Line) -> None:
        text, kind = line.text, ""
        if m := _SEND.search(text):
            self.sends[m["url"]] += 1
            kind = f"send {m['url']}"
        elif m := _HEALTH.search(text):
            reason = health_reason(m["why"])
            self.health.setdefault(m["url"], Counter())[reason] += 1
            kind = f"health {m['url']} {reason}"
        elif "Circuit breaker state transition: closed -> open" in text:
            self.circuits += 1
            kind = "circuit"
        elif "request failed with server error" in text:
            m = _STATUS.search(text)
            self.statuses[int(m["status"]) if m else 0] += 1
            kind = "status"
        elif m := _ANSWER.search(text):
            if m["code"] in ANSWER_CODES:
                self.answers[(m["code"], m["message"].replace('\\"', '"'))] += 1
                kind = f"answer {m['code']}"
        if kind and kind not in self._kinds_seen:
            self._kinds_seen.add(kind)
            keep_line(self.lines, line)

    def findings(self, earlier: Sequence[Finding]) -> list[Finding]:
        if not (self.sends or self.health or self.answers or self.circuits):
            return []  # a lone failed answer (status line) names no engine problem
        urls = sorted(set(self.sends) | set(self.health))
        reasons = sorted({r for counts in self.health.values() for r in counts})
        parts = []
        if self.sends:
            parts.append(f"{sum(self.sends.values())} failed sends to the engines")
        if reasons:
            parts.append(f"health checks failed: {', '.join(reasons)}")
        if self.circuits:
            parts.append(f"{self.circuits} circuit{'s' if self.circuits != 1 else ''} opened")
        if self.statuses:
            parts.append("answered " + ", ".join(f"{n} x HTTP {s}" for s, n in sorted(self.statuses.items())))
        for (code, _), n in sorted(self.answers.items()):
            parts.append(f"the router answered {code} ({n} line{'s' if n != 1 else ''})")
        who = f"engine{'s' if len(urls) != 1 else ''} {', '.join(urls)}" if urls else "its engines"
        evidence: list[Evidence] = [self.ev(ln, focus=_focus(ln.text)) for ln in self.lines[:MAX_EVIDENCE]]
        return [
            self.finding(
                f"sglang-router could not reach {who}: {'; '.join(parts)}",
                evidence,
                {
                    "engines": urls,
                    "failed_sends": dict(self.sends),
                    "health_failures": {u: dict(c) for u, c in self.health.items()},
                    "circuits_opened": self.circuits,
                    "router_statuses": {str(s): n for s, n in self.statuses.items()},
                    "router_answers": [
                        {"code": c, "message": m, "lines": n} for (c, m), n in self.answers.items()
                    ],
                },
                cause=_cause(reasons, self.answers, sends=bool(self.sends), circuits=self.circuits),
                fix=_FIX,
            )
        ]


def _focus(text: str) -> str | None:
    for word in ("Failed to send", "health check failed", "Circuit breaker", "request failed", '"code"'):
        if word in text:
            return word
    return None


def _cause(reasons: list[str], answers: Counter[tuple[str, str]], *, sends: bool, circuits: int) -> str:
    out = [
        "The router forwards each request to an engine it has registered; here it could not: the engine "
        "did not take the connection or did not answer."
    ]
    if sends:
        out.append(
            "'Failed to send typed request ... error sending request' is a connection that failed (refused "
            "or reset mid-request): usually the engine's process exited while requests were in flight."
        )
    if circuits:
        out.append(
            "The circuit breaker opened: after repeated failures the router stopped sending to that engine."
        )
    if "connection refused" in reasons or any(c == "call_upstream_request_error" for c, _ in answers):
        out.append(
            "A refused connection means nothing listens at the engine's port any more: its process exited "
            "(killed, out of host memory, crashed)."
        )
    if "timed out" in reasons:
        out.append(
            "A health check that timed out means the process is alive but does not answer: hung, stopped "
            "or overloaded."
        )
    if any(c == "no_available_workers" for c, _ in answers):
        out.append(
            "no_available_workers: every engine the router knows is unhealthy or its circuit breaker is "
            "open, so it refuses requests (HTTP 503) until one recovers; a run that keeps retrying waits "
            "on an engine that may never come back."
        )
    return " ".join(out)


_FIX = (
    "Read the last lines of the engine's own log (grpolab: RUN_DIR/engines/<i>.log, quoted in the run's "
    "error) and the host's OOM-killer messages (dmesg) for why it stopped; for a hung engine, dump its "
    "stacks (py-spy dump --pid PID). Restart the engine and register it with the router again (POST "
    '/workers {"url": ...}). grpolab ends a run whose launched engine exited at once, and one whose '
    "engine keeps failing after --engine-failure-timeout; a Miles/slime run needs `grpolab watchdog` "
    "for that."
)

"""The log doctor on real sglang-router 0.3.2 logs and a real trainer console (tests/diagnose/router_logs).

Captured on CPU: killed_engine_* from `grpolab train --sglang-router-ip` against a router + 1 `grpolab
serve` engine that was kill -9'd as the first /generate reached the router (--engine-failure-timeout 5);
dead_and_hung_router.log from a router with 2 engines, one kill -9'd and one SIGSTOPped, router request
timeout 8 s; healthy_* from a normal `--rollout-num-engines 1` run (its first 150 lines) and a weight-sync
benchmark on SmolLM2's GGUF (a harmless tokenizer WARN). The files keep the router's colour codes.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from grpolab.diagnose.logdoctor.rules.router import health_reason
from grpolab.diagnose.logdoctor.scan import scan_file

LOGS = Path(__file__).resolve().parent / "router_logs"


def _found(name: str) -> dict:
    return {f.rule: f for f in scan_file(LOGS / name, name=name).findings}


def _line_of(name: str, text: str) -> int:
    for number, line in enumerate((LOGS / name).read_text().splitlines(), 1):
        if text in line:
            return number
    raise AssertionError(f"{text!r} not in {name}")


def test_a_killed_engine_in_the_routers_log() -> None:
    found = _found("killed_engine_router.log")
    assert set(found) == {"router_engine_errors"}
    f = found["router_engine_errors"]
    assert f.severity == "error"
    assert f.details["engines"] == ["http://127.0.0.1:36331"]
    assert f.details["failed_sends"] == {"http://127.0.0.1:36331": 16}
    assert (f.details["circuits_opened"], f.details["router_statuses"]) == (1, {"503": 16})
    assert f.title == (
        "sglang-router could not reach engine http://127.0.0.1:36331: 16 failed sends to the engines; "
        "1 circuit opened; answered 16 x HTTP 503"
    )
    lines = [e.line for e in f.evidence]
    assert _line_of("killed_engine_router.log", "Failed to send typed request") == lines[0]
    assert _line_of("killed_engine_router.log", "closed -> open") in lines
    assert "process exited" in f.cause and "circuit breaker opened" in f.cause
    assert "RUN_DIR/engines/<i>.log" in f.fix and "POST /workers" in f.fix.replace("\n", " ")


def test_a_dead_and_a_hung_engine_are_told_apart_by_the_health_checks() -> None:
    f = _found("dead_and_hung_router.log")["router_engine_errors"]
    assert f.details["engines"] == ["http://127.0.0.1:32983", "http://127.0.0.1:45839"]
    health = f.details["health_failures"]
    assert set(health["http://127.0.0.1:32983"]) == {"connection refused"}  # kill -9
    assert set(health["http://127.0.0.1:45839"]) == {"timed out"}  # SIGSTOP
    assert f.details["router_statuses"] == {"500": 2}
    assert sum(f.details["failed_sends"].values()) == 18
    assert "connection refused, timed out" in f.title
    assert "alive but does not answer" in f.cause and "nothing listens" in f.cause


def test_the_trainer_console_quoting_the_routers_answer() -> None:
    found = _found("killed_engine_console.log")
    assert set(found) == {"engine_dead_timeout", "router_engine_errors"}
    f = found["router_engine_errors"]
    (answer,) = f.details["router_answers"]
    assert answer["code"] == "no_available_workers"
    assert answer["message"] == "No available workers (all circuits open or unhealthy)"
    assert answer["lines"] == 2  # the first failure and the give-up line
    assert f.evidence[0].line == _line_of("killed_engine_console.log", "waiting up to 5 s")
    assert "circuit breaker is open" in f.cause


@pytest.mark.parametrize("name", ["healthy_router_excerpt.log", "healthy_gguf_router.log"])
def test_healthy_router_logs_have_no_finding(name: str) -> None:
    scan = scan_file(LOGS / name, name=name)
    assert scan.findings == [], [x.title for x in scan.findings]


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ('source: hyper_util::client::legacy::Error(Connect, ConnectError("tcp connect error", '
         '127.0.0.1:1, Os { code: 111, kind: ConnectionRefused, message: "Connection refused" })) }',
         "connection refused"),
        ('reqwest::Error { kind: Request, url: "http://127.0.0.1:2/health", source: TimedOut }', "timed out"),
        ("reqwest::Error { kind: Decode, source: BadBody }", "BadBody"),
    ],
)  # fmt: skip
def test_health_reason(text: str, reason: str) -> None:
    assert health_reason(text) == reason

"""A hung engine (accepts connections, never answers) is bounded by --engine-failure-timeout: each call's
timeout is capped at it, the failure is timed from the start of the call that hung, and while /generate
requests run the liveness watch declares an engine that leaves /server_info unanswered hung, as gone."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from grpolab.core.engine.base import GenerationRequest, SamplingParams
from grpolab.core.engine.client import EngineClient, EngineDeadError, EngineGoneError
from grpolab.core.engine.http_engine import HttpEngine
from grpolab.core.engine.liveness import LivenessWatch

TIMEOUT_S = 0.5


@pytest.fixture
def hung_url() -> Iterator[str]:
    """A port whose kernel completes every connection (listen backlog) while nothing ever reads or answers:
    what a SIGSTOPped engine looks like from the trainer."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(64)
        yield f"http://127.0.0.1:{s.getsockname()[1]}"


class _Engine(BaseHTTPRequestHandler):
    """Answers /health_generate, then hangs every /generate and, once one arrived, /server_info too."""

    generating = threading.Event()
    release = threading.Event()

    def do_GET(self) -> None:
        if self.path == "/server_info" and self.generating.is_set():
            self.release.wait(30)
        self._ok({})

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        if self.path == "/generate":
            self.generating.set()
            self.release.wait(30)
        self._ok({})

    def _ok(self, body: object) -> None:
        data = json.dumps(body).encode()
        try:
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        except OSError:
            pass

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def stalling_url() -> Iterator[str]:
    _Engine.generating.clear()
    _Engine.release.clear()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Engine)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        _Engine.release.set()
        server.shutdown()
        server.server_close()


def _engine(url: str) -> HttpEngine:
    return HttpEngine(
        router_url=url, engine_urls=[url], fleet=None, request_timeout_s=600, failure_timeout_s=TIMEOUT_S
    )


def test_a_control_call_to_a_hung_engine_fails_within_the_failure_timeout(hung_url: str) -> None:
    """Was 120 s (CONTROL_TIMEOUT_S) per call, then a retry of up to the timeout on top."""
    client = EngineClient(_engine(hung_url), failure_timeout=TIMEOUT_S, poll_interval=0.1)
    start = time.monotonic()
    with pytest.raises(EngineDeadError) as info:
        client.flush_cache()
    seconds = time.monotonic() - start
    assert TIMEOUT_S <= seconds < TIMEOUT_S + 1.5, seconds
    # timed from the start of the call that hung, not from when it returned (was "failed for 0.5 s" after ~1 s)
    assert TIMEOUT_S <= info.value.failed_for <= seconds
    assert f"POST {hung_url}/flush_cache: no answer: timed out after {TIMEOUT_S:g} s" in str(info.value)


def test_a_health_check_of_a_hung_engine_fails_within_the_failure_timeout(hung_url: str) -> None:
    """Was 20 s (SGLang's health-check timeout) whatever --engine-failure-timeout said."""
    start = time.monotonic()
    with pytest.raises(RuntimeError, match=f"engine 0 \\({hung_url}\\) failed its health check"):
        _engine(hung_url).check_health()
    assert time.monotonic() - start < TIMEOUT_S + 1.5


def test_a_generate_that_hangs_is_ended_by_the_liveness_watch(stalling_url: str) -> None:
    """/generate may run for --sglang-router-request-timeout-secs (600 s here); the engine's /server_info
    going unanswered for the failure timeout ends it as a gone engine, naming it and its URL."""
    client = EngineClient(_engine(stalling_url), failure_timeout=TIMEOUT_S, poll_interval=0.1)
    start = time.monotonic()
    with pytest.raises(EngineDeadError) as info:
        client.generate([GenerationRequest(prompt_ids=[1, 2], seed=0)], SamplingParams(max_new_tokens=2))
    seconds = time.monotonic() - start
    assert seconds < TIMEOUT_S + 2, seconds
    message = str(info.value)
    assert info.value.gone and message.startswith("rollout engine 'sglang fleet (1 engine behind ")
    assert f"is gone: engine 0 ({stalling_url}) has not answered GET /server_info for " in message
    silent = float(message.split("has not answered GET /server_info for ")[1].split(" s")[0])
    assert TIMEOUT_S <= silent < TIMEOUT_S + 1.5


def test_the_watch_names_the_silent_engine_and_spares_the_one_that_answers(
    hung_url: str, stalling_url: str
) -> None:
    watch = LivenessWatch([stalling_url, hung_url], failure_timeout=TIMEOUT_S)
    start = time.monotonic()
    try:
        with pytest.raises(EngineGoneError, match=f"engine 1 \\({hung_url}\\) has not answered"):
            while time.monotonic() - start < 5:
                watch.check()
                time.sleep(0.05)
    finally:
        watch.close()
    assert watch.hung == 1 and TIMEOUT_S <= time.monotonic() - start < TIMEOUT_S + 1.2


class _Unwell(BaseHTTPRequestHandler):
    """Answers 503 to everything (a server shutting down, or an error page)."""

    def do_GET(self) -> None:
        data = b"engine not ok: scheduler stuck\n"
        self.send_response(503)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: object) -> None:
        pass


def test_an_engine_answering_503_counts_as_not_answering() -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Unwell)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    watch = LivenessWatch([url], failure_timeout=TIMEOUT_S)
    start = time.monotonic()
    try:
        with pytest.raises(EngineGoneError) as info:
            while time.monotonic() - start < 5:
                watch.check()
                time.sleep(0.05)
    finally:
        watch.close()
        server.shutdown()
        server.server_close()
    assert str(info.value).endswith(
        "; its last answer: HTTP 503: a text answer: 'engine not ok: scheduler stuck'"
    )
    assert f"engine 0 ({url}) has not answered GET /server_info for " in str(info.value)


def test_a_probe_of_a_hung_engine_does_not_hold_the_exit(hung_url: str) -> None:
    """A probe still waiting on a hung engine (an already running fleet: nothing kills it) held the
    trainer's exit up to --engine-failure-timeout after the run had failed: the probes ran in a
    ThreadPoolExecutor, whose threads Python joins at exit. They are daemon threads now."""
    import subprocess
    import sys

    code = (
        "import time; from grpolab.core.engine.liveness import LivenessWatch\n"
        f"w = LivenessWatch([{hung_url!r}], failure_timeout=30)\n"
        "w.check(); time.sleep(0.3); w.close()\n"
    )
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert time.monotonic() - started < 15, "the exit waited for the probe's 30 s timeout"

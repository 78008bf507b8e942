"""An engine killed mid-rollout behind a router that re-sends its requests elsewhere: the rollout ends well,
and the next call to the dead engine comes seconds later. Its failure is timed from its last answer (a
liveness probe's), so the run fails --engine-failure-timeout after the kill, not after the next call.

Stand-ins: a "router" that answers /generate after `ROLLOUT_S` (as a router whose retry succeeded), and two
engines answering the control and probe paths; engine 1's server is closed mid-rollout (a kill -9'd
engine's port refuses connections)."""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import torch

from grpolab.core.engine.base import GenerationRequest, GenerationResult, SamplingParams
from grpolab.core.engine.client import EngineClient, EngineDeadError
from grpolab.core.engine.http_engine import HttpEngine
from grpolab.serve.protocol import GenerateItem
from grpolab.serve.responses import generate_response

TIMEOUT_S = 2.0
ROLLOUT_S = 1.0
GAP_S = 1.5  # from the rollout's end to the next call to the engines (release_memory)
PARAMS = SamplingParams(temperature=1.0, max_new_tokens=2)


def _answer() -> dict:
    result = GenerationResult(
        response_ids=[4, 5], log_probs=torch.tensor([-0.5, -0.25]), finish_reason="length"
    )
    item = GenerateItem(
        rid="r", prompt_ids=[1], params=PARAMS, seed=0, return_logprob=True, return_sampling_mask=False
    )
    return generate_response(item, result, weight_version="0", text="", vocab_size=10, seconds=0.1)


class _Server(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self._ok({})

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        if self.path == "/generate":
            time.sleep(ROLLOUT_S)
            self._ok(_answer())
        else:
            self._ok({"success": True})

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


def _serve() -> ThreadingHTTPServer:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Server)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def _url(server: ThreadingHTTPServer) -> str:
    return f"http://127.0.0.1:{server.server_address[1]}"


@pytest.fixture
def servers() -> Iterator[list[ThreadingHTTPServer]]:
    started = [_serve() for _ in range(3)]  # router, engine 0, engine 1
    yield started
    for server in started:
        server.shutdown()
        server.server_close()


def test_an_engine_killed_mid_rollout_fails_the_run_within_the_timeout_of_the_kill(servers, caplog) -> None:
    router, engine0, engine1 = servers
    engine = HttpEngine(
        router_url=_url(router), engine_urls=[_url(engine0), _url(engine1)], fleet=None,
        request_timeout_s=30, failure_timeout_s=TIMEOUT_S,
    )  # fmt: skip
    client = EngineClient(engine, failure_timeout=TIMEOUT_S, poll_interval=0.1)
    killed: list[float] = []

    def kill() -> None:
        time.sleep(0.3)
        engine1.shutdown()
        engine1.server_close()
        killed.append(time.monotonic())

    threading.Thread(target=kill, daemon=True).start()
    with caplog.at_level(logging.WARNING, logger="grpolab"):
        results = client.generate([GenerationRequest(prompt_ids=[1, 2], seed=3)], PARAMS)
    assert [r.response_ids for r in results] == [[4, 5]] and killed  # the rollout itself succeeded
    warned = [r.getMessage() for r in caplog.records if "stopped answering" in r.getMessage()]
    assert len(warned) == 1 and warned[0].startswith(
        f"engine 1 ({_url(engine1)}) stopped answering GET /server_info"
    )
    time.sleep(GAP_S)
    with pytest.raises(EngineDeadError) as info:
        client.release_memory()
    since_kill = time.monotonic() - killed[0]
    # before: the clock started at release_memory, GAP_S + ~0.7 s after the kill: ~4.2 s after it
    assert TIMEOUT_S - 0.3 <= since_kill < TIMEOUT_S + 0.5, since_kill
    assert TIMEOUT_S <= info.value.failed_for < TIMEOUT_S + 0.6
    assert _url(engine1) + "/release_memory_occupation" in info.value.last_error
    engine.close()

"""The kept-alive pool the HTTP engine sends /generate through (libcurl's multi interface): a connection
reused from call to call; one the peer closed while idle is reopened; call_json's errors for 400, 5xx, a
timeout (`timed_out` set) and a refused connection; close() fails the calls in flight."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from grpolab.core.engine.http_calls import EngineRequestError, HttpCallError
from grpolab.core.engine.http_pool import KeepAlivePool


class _Echo(BaseHTTPRequestHandler):
    """Answers the client's port (which connection carried the call) and the body it got; /bad is a 400,
    /boom a 500, /close answers HTTP/1.0-style and closes the connection."""

    protocol_version = "HTTP/1.1"

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"null")
        status = {"/bad": 400, "/boom": 500}.get(self.path, 200)
        data = json.dumps({"port": self.client_address[1], "body": body}).encode()
        self.send_response(status)
        self.send_header("Content-Length", str(len(data)))
        if self.path == "/close":
            self.send_header("Connection", "close")
            self.close_connection = True
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        data = json.dumps({"port": self.client_address[1], "path": self.path}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def echo_url() -> Iterator[tuple[str, ThreadingHTTPServer]]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Echo)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", server
    finally:
        server.shutdown()
        server.server_close()


def test_one_thread_reuses_its_connection_and_gets_the_json_back(echo_url) -> None:
    url, _ = echo_url
    pool = KeepAlivePool(1)
    try:
        first = pool.submit("POST", url + "/generate", {"input_ids": [1, 2]}, timeout=5).result()
        second = pool.submit("POST", url + "/generate", {"x": 0.1}, timeout=5).result()
    finally:
        pool.close()
    assert first["body"] == {"input_ids": [1, 2]} and second["body"] == {"x": 0.1}
    assert first["port"] == second["port"]  # the same TCP connection carried both calls


def test_more_calls_than_connections_all_answered_in_their_own_futures(echo_url) -> None:
    url, _ = echo_url
    pool = KeepAlivePool(4)
    try:
        futures = [pool.submit("POST", url + "/generate", {"rid": i}, timeout=10) for i in range(64)]
        answers = [f.result(timeout=30) for f in futures]
        info = pool.call("GET", url + "/server_info", None, timeout=10)
    finally:
        pool.close()
    assert [a["body"] for a in answers] == [{"rid": i} for i in range(64)]
    assert len({a["port"] for a in answers}) <= 4  # at most max_workers connections, each reused
    assert info["path"] == "/server_info"


def test_a_connection_the_server_closed_is_reopened(echo_url) -> None:
    url, _ = echo_url
    pool = KeepAlivePool(1)
    try:
        closed = pool.call("POST", url + "/close", {}, timeout=5)
        after = pool.call("POST", url + "/generate", {}, timeout=5)
        again = pool.call("POST", url + "/generate", {}, timeout=5)
    finally:
        pool.close()
    assert after["port"] != closed["port"] and again["port"] == after["port"]


def test_a_kept_connection_dropped_while_idle_is_sent_again_once() -> None:
    """A server that reads one call per connection, answers it keep-alive, then drops the connection
    (an idle timeout): the second call on the stale connection is retried on a fresh one."""
    answers: list[int] = []
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(4)
        port = listener.getsockname()[1]

        def serve() -> None:
            for _ in range(2):
                conn, _ = listener.accept()
                with conn:
                    conn.recv(65536)
                    data = json.dumps({"n": len(answers)}).encode()
                    answers.append(1)
                    head = f"HTTP/1.1 200 OK\r\nContent-Length: {len(data)}\r\n\r\n".encode()
                    conn.sendall(head + data)

        thread = threading.Thread(target=serve, daemon=True)
        thread.start()
        pool = KeepAlivePool(1)
        try:
            assert pool.call("POST", f"http://127.0.0.1:{port}/generate", {}, timeout=5) == {"n": 0}
            assert pool.call("POST", f"http://127.0.0.1:{port}/generate", {}, timeout=5) == {"n": 1}
        finally:
            pool.close()
        thread.join(5)
    assert len(answers) == 2


def test_errors_are_call_jsons(echo_url) -> None:
    url, _ = echo_url
    pool = KeepAlivePool(2)
    try:
        with pytest.raises(EngineRequestError, match=f'POST {url}/bad answered HTTP 400: .*"port"'):
            pool.call("POST", url + "/bad", {}, timeout=5)
        with pytest.raises(HttpCallError) as boom:
            pool.call("POST", url + "/boom", {}, timeout=5)
        assert boom.value.status == 500 and boom.value.url == url + "/boom"
        with pytest.raises(ValueError, match="http://HOST:PORT"):
            pool.call("POST", "https://127.0.0.1:1/generate", {}, timeout=5)
    finally:
        pool.close()


def test_a_silent_peer_times_out_and_a_refused_one_has_no_status() -> None:
    with socket.socket() as silent:  # the kernel accepts, nothing ever answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(4)
        url = f"http://127.0.0.1:{silent.getsockname()[1]}/generate"
        pool = KeepAlivePool(1)
        try:
            with pytest.raises(HttpCallError, match="no answer: timed out after 0.2 s") as info:
                pool.call("POST", url, {}, timeout=0.2)
            assert info.value.status is None and info.value.timed_out
        finally:
            pool.close()
    pool = KeepAlivePool(1)
    try:
        with pytest.raises(HttpCallError) as refused:
            pool.call("POST", url, {}, timeout=1)  # the listener is closed now
    finally:
        pool.close()
    assert refused.value.status is None and not refused.value.timed_out
    assert "connection refused" in refused.value.text.lower()


def test_close_fails_a_call_in_flight_and_stops_the_pool() -> None:
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(4)
        silent.settimeout(10)
        pool = KeepAlivePool(1)
        future = pool.submit("POST", f"http://127.0.0.1:{silent.getsockname()[1]}/g", {}, timeout=30)
        peer, _ = silent.accept()  # the call is in flight: connected, waiting for an answer
        pool.close()
        peer.close()
        with pytest.raises(HttpCallError):
            future.result(timeout=5)  # not after the 30 s timeout
    assert pool.closed
    with pytest.raises(RuntimeError, match="shutdown"):
        pool.submit("POST", "http://127.0.0.1:1/g", {}, timeout=1)
    pool.close()  # idempotent

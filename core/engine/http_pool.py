"""JSON-over-HTTP calls from a pool of worker threads, each keeping its HTTP/1.1 connections alive.

`http_calls.call_json` opens a new TCP connection per call (urllib), and `HttpEngine` used to start a
new thread per request for every rollout: for the tiny model's 64 requests of ~0.15 s of decoding
that cost ~35 ms before the engine held them all. `KeepAlivePool` keeps its threads between
rollouts, and each thread one `http.client.HTTPConnection` per host (the router; the engines for
sampling-mask requests), reused from call to call. The errors are `call_json`'s: HTTP 400 raises
`EngineRequestError` (the answer quoted), any other error status or a connection that failed raises
`HttpCallError`, a timeout says "timed out after T s". A kept-alive connection the peer has closed in
the meantime (idle timeout; an HTTP/1.0 server closes after each answer) fails before any answer
arrives: the call is sent once more on a new connection, as urllib3 does; a fresh connection is
never retried.
"""

from __future__ import annotations

import http.client
import json
import socket
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from urllib.parse import urlsplit

from grpolab.core.engine.http_calls import HttpCallError, decode_answer

_STALE = (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError, ConnectionAbortedError)
"""What a reused connection the peer closed while it idled raises before any answer arrives."""


class KeepAlivePool:
    """Worker threads sending JSON calls over kept-alive connections (one per thread and host).

    Args:
        max_workers: the most calls in flight at once (threads, started as calls need them); >= 1.

    Raises:
        ValueError: `max_workers` < 1.
    """

    def __init__(self, max_workers: int) -> None:
        if max_workers < 1:
            raise ValueError(f"KeepAlivePool needs max_workers >= 1, got {max_workers}")
        self._executor = ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="http-pool")
        self._local = threading.local()
        self._lock = threading.Lock()
        self._connections: list[http.client.HTTPConnection] = []
        self.closed = False

    def submit(self, method: str, url: str, body: object | None, *, timeout: float) -> Future:
        """Queue one call; its future holds the decoded JSON answer (None when empty or not JSON).

        Args:
            method: "GET", "POST", ...
            url: "http://HOST:PORT/path" (https is not supported: engines and router speak plain HTTP).
            body: sent as JSON (None: no body).
            timeout: seconds for the connect and for each socket read of this call; > 0.

        The future raises `EngineRequestError` (HTTP 400) or `HttpCallError` (anything else).
        """
        return self._executor.submit(self.call, method, url, body, timeout=timeout)

    def call(self, method: str, url: str, body: object | None, *, timeout: float) -> object:
        """The call `submit` queues, made on this thread (its kept-alive connection to the host).

        Raises:
            EngineRequestError: HTTP 400 (the answer quoted, at most `MAX_QUOTED` characters).
            HttpCallError: another error status, or no answer (refused, reset, timed out).
            ValueError: a URL that is not http://HOST[:PORT]/...
        """
        parts = urlsplit(url)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"KeepAlivePool calls http://HOST:PORT/... URLs, got {url!r}")
        path = parts.path + (f"?{parts.query}" if parts.query else "")
        data = None if body is None else json.dumps(body).encode()
        headers = {"Content-Type": "application/json"}
        for attempt in (0, 1):
            conn, reused = self._connection(parts.hostname, parts.port or 80, timeout)
            try:
                conn.request(method, path, body=data, headers=headers)
                response = conn.getresponse()
                status, raw = response.status, response.read()
            except _STALE as e:
                conn.close()
                if reused and attempt == 0 and not self.closed:
                    continue  # closed while idle: this call never reached the peer
                raise HttpCallError(method, url, None, str(e)) from None
            except TimeoutError:
                conn.close()
                raise HttpCallError(method, url, None, f"timed out after {timeout:g} s") from None
            except (OSError, http.client.HTTPException) as e:
                conn.close()
                raise HttpCallError(method, url, None, str(e) or type(e).__name__) from None
            return decode_answer(method, url, status, raw.decode(errors="replace"))
        raise AssertionError("unreachable: the second attempt returns or raises")

    def close(self) -> None:
        """Drop queued calls and end the connections (a call in flight fails); idempotent."""
        self.closed = True
        self._executor.shutdown(wait=False, cancel_futures=True)
        with self._lock:
            connections, self._connections = self._connections, []
        for conn in connections:
            sock = conn.sock
            if sock is not None:
                try:
                    sock.shutdown(socket.SHUT_RDWR)  # wakes a worker blocked reading it
                except OSError:
                    pass
            conn.close()

    def _connection(self, host: str, port: int, timeout: float) -> tuple[http.client.HTTPConnection, bool]:
        """This thread's connection to (host, port), with `timeout` set; True when it was used before."""
        pool: dict[tuple[str, int], http.client.HTTPConnection] = self._local.__dict__.setdefault("conns", {})
        conn = pool.get((host, port))
        if conn is None:
            conn = http.client.HTTPConnection(host, port, timeout=timeout)
            pool[(host, port)] = conn
            with self._lock:
                self._connections.append(conn)
        conn.timeout = timeout
        reused = conn.sock is not None
        if reused:
            conn.sock.settimeout(timeout)
        return conn, reused

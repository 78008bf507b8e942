"""JSON-over-HTTP calls through libcurl's multi interface (pycurl): many calls in flight, one thread.

A rollout sends one `/generate` per sample (64 in the default run) and waits for all of them. With a
thread per call (`http.client`), each call cost ~0.25 ms of Python under the GIL (header formatting,
two `sendall`s, `email`-based header parsing); 64 round trips to an instant server took 16-19 ms, with
libcurl 5-11 ms, and the default run's rollout through the router and 1 engine went from 1.35-1.58x
to 1.19-1.31x the in-process one in the same runs (benchmarks/bench_http_engine.py). libcurl keeps the
connections alive in the multi handle's cache (one per call in flight, reused from call to call),
resends a call once on a fresh connection when a kept-alive one turns out closed by the peer, and
parses the answers in C. One thread drives every transfer (`CurlMulti.socket_action` on the sockets
libcurl asks to watch, through `selectors`); callers get `concurrent.futures.Future`s.

The errors are `call_json`'s: HTTP 400 raises `EngineRequestError` (the answer quoted), any other
error status or a call that got no answer raises `HttpCallError` (the OS error, e.g. "Connection
refused", or "timed out after T s" with `timed_out` set).
"""

from __future__ import annotations

import io
import json
import os
import queue
import selectors
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass
from urllib.parse import urlsplit

import pycurl

from grpolab.core.engine.http_calls import HttpCallError, decode_answer

_EVENTS = {
    pycurl.POLL_IN: selectors.EVENT_READ,
    pycurl.POLL_OUT: selectors.EVENT_WRITE,
    pycurl.POLL_INOUT: selectors.EVENT_READ | selectors.EVENT_WRITE,
}
"""libcurl's "watch this socket for" -> the selector's events."""


@dataclass
class _Call:
    """One queued or running call: what to send, where its answer goes, and the future to settle."""

    method: str
    url: str
    data: bytes | None
    timeout: float
    future: Future
    answer: io.BytesIO


class KeepAlivePool:
    """Concurrent JSON calls over kept-alive connections, driven by one libcurl multi handle.

    Args:
        max_workers: the most calls in flight at once (connections; more calls wait their turn); >= 1.

    Raises:
        ValueError: `max_workers` < 1.
    """

    def __init__(self, max_workers: int) -> None:
        if max_workers < 1:
            raise ValueError(f"KeepAlivePool needs max_workers >= 1, got {max_workers}")
        self.closed = False
        self._lock = threading.Lock()  # submit vs close: no call is queued after the pool drained its queue
        self._queue: queue.SimpleQueue[_Call] = queue.SimpleQueue()
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._wake_r, selectors.EVENT_READ)
        self._deadline: float | None = None  # libcurl's next timeout (monotonic seconds)
        self._multi = pycurl.CurlMulti()
        self._multi.setopt(pycurl.M_MAX_TOTAL_CONNECTIONS, max_workers)
        self._multi.setopt(pycurl.M_SOCKETFUNCTION, self._on_socket)
        self._multi.setopt(pycurl.M_TIMERFUNCTION, self._on_timer)
        self._running: dict[pycurl.Curl, _Call] = {}
        self._spare: list[pycurl.Curl] = []
        self._thread = threading.Thread(target=self._loop, name="http-pool", daemon=True)
        self._thread.start()

    def submit(self, method: str, url: str, body: object | None, *, timeout: float) -> Future:
        """Queue one call; its future holds the decoded JSON answer (None when empty or not JSON).

        Args:
            method: "GET", "POST", ...
            url: "http://HOST:PORT/path" (https is not supported: engines and router speak plain HTTP).
            body: sent as JSON (None: no body).
            timeout: seconds the whole call may take (connect, send, answer); > 0.

        The future raises `EngineRequestError` (HTTP 400) or `HttpCallError` (anything else, also when
        the pool is closed while the call waits or runs).

        Raises:
            ValueError: a URL that is not http://HOST[:PORT]/...
            RuntimeError: the pool was shut down (`close()`).
        """
        parts = urlsplit(url)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"KeepAlivePool calls http://HOST:PORT/... URLs, got {url!r}")
        data = None if body is None else json.dumps(body).encode()
        call = _Call(method, url, data, timeout, Future(), io.BytesIO())
        with self._lock:
            if self.closed:
                raise RuntimeError("KeepAlivePool: cannot submit a call after shutdown (close() was called)")
            self._queue.put(call)
            os.write(self._wake_w, b"\0")
        return call.future

    def call(self, method: str, url: str, body: object | None, *, timeout: float) -> object:
        """`submit` and wait for the answer (from any thread but the pool's own).

        Raises:
            EngineRequestError: HTTP 400 (the answer quoted, at most `MAX_QUOTED` characters).
            HttpCallError: another error status, or no answer (refused, reset, timed out).
            ValueError / RuntimeError: as `submit`.
        """
        return self.submit(method, url, body, timeout=timeout).result()

    def close(self) -> None:
        """Fail the calls waiting or in flight (`HttpCallError`), end the connections; idempotent."""
        with self._lock:
            if self.closed:
                return
            self.closed = True
            os.write(self._wake_w, b"\0")
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout=10)

    # ------------------------------------------------------------------ the pool's thread
    def _loop(self) -> None:
        try:
            while not self.closed:
                self._start_queued()
                timeout = None if self._deadline is None else max(0.0, self._deadline - time.monotonic())
                for key, mask in self._selector.select(timeout):
                    if key.fd == self._wake_r:
                        _drain(self._wake_r)
                        continue
                    flags = (pycurl.CSELECT_IN if mask & selectors.EVENT_READ else 0) | (
                        pycurl.CSELECT_OUT if mask & selectors.EVENT_WRITE else 0
                    )
                    self._multi.socket_action(key.fd, flags)
                if self._deadline is not None and time.monotonic() >= self._deadline:
                    self._deadline = None
                    self._multi.socket_action(pycurl.SOCKET_TIMEOUT, 0)
                self._finish_done()
        finally:
            with self._lock:  # also when the loop itself failed: no call may wait on a dead thread
                self.closed = True
            self._shut_down()

    def _start_queued(self) -> None:
        while True:
            try:
                call = self._queue.get_nowait()
            except queue.Empty:
                return
            if not call.future.set_running_or_notify_cancel():
                continue
            handle = self._spare.pop() if self._spare else pycurl.Curl()
            _configure(handle, call)
            self._running[handle] = call
            self._multi.add_handle(handle)

    def _finish_done(self) -> None:
        while True:
            queued, done, failed = self._multi.info_read()
            for handle in done:
                call = self._release(handle)
                status = int(handle.getinfo(pycurl.RESPONSE_CODE))
                text = call.answer.getvalue().decode(errors="replace")
                try:
                    call.future.set_result(decode_answer(call.method, call.url, status, text))
                except Exception as e:  # EngineRequestError / HttpCallError of an error status
                    call.future.set_exception(e)
            for handle, code, message in failed:
                call = self._release(handle)
                call.future.set_exception(_no_answer(call, handle, code, message))
            if not queued:
                return

    def _release(self, handle: pycurl.Curl) -> _Call:
        self._multi.remove_handle(handle)
        call = self._running.pop(handle)
        self._spare.append(handle)
        return call

    def _shut_down(self) -> None:
        message = "the HTTP pool was closed while the call waited or ran"
        for handle, call in list(self._running.items()):
            self._multi.remove_handle(handle)
            call.future.set_exception(HttpCallError(call.method, call.url, None, message))
        self._running.clear()
        while True:
            try:
                call = self._queue.get_nowait()
            except queue.Empty:
                break
            if call.future.set_running_or_notify_cancel():
                call.future.set_exception(HttpCallError(call.method, call.url, None, message))
        self._multi.close()
        for handle in self._spare:
            handle.close()
        self._selector.close()
        os.close(self._wake_r)
        os.close(self._wake_w)

    # ------------------------------------------------------------------ libcurl's callbacks
    def _on_socket(self, what: int, fd: int, multi: object, data: object) -> None:
        """libcurl asks to watch `fd` for `what` (POLL_IN/OUT/INOUT) or to stop (POLL_REMOVE)."""
        if what == pycurl.POLL_REMOVE:
            try:
                self._selector.unregister(fd)
            except (KeyError, ValueError):
                pass
            return
        events = _EVENTS[what]
        try:
            self._selector.modify(fd, events)
        except KeyError:
            self._selector.register(fd, events)

    def _on_timer(self, timeout_ms: int) -> None:
        """libcurl wants `socket_action(SOCKET_TIMEOUT)` in `timeout_ms` (-1: no timer)."""
        self._deadline = None if timeout_ms < 0 else time.monotonic() + timeout_ms / 1000


def _configure(handle: pycurl.Curl, call: _Call) -> None:
    """Set `handle` up for `call` (a reused handle is reset first; its connection stays in the cache)."""
    handle.reset()
    handle.setopt(pycurl.URL, call.url)
    handle.setopt(pycurl.PROXY, "")  # engines and router are reached directly, whatever *_proxy says
    handle.setopt(pycurl.NOSIGNAL, 1)
    handle.setopt(pycurl.HTTPHEADER, ["Content-Type: application/json", "Expect:"])
    handle.setopt(pycurl.TIMEOUT_MS, max(1, int(call.timeout * 1000)))
    handle.setopt(pycurl.WRITEDATA, call.answer)
    if call.data is not None:
        handle.setopt(pycurl.POSTFIELDS, call.data)
    handle.setopt(pycurl.CUSTOMREQUEST, call.method)


def _no_answer(call: _Call, handle: pycurl.Curl, code: int, message: str) -> HttpCallError:
    """The HttpCallError of a call libcurl ended with error `code` (the OS error's text when there is one)."""
    if code == pycurl.E_OPERATION_TIMEDOUT:
        return HttpCallError(
            call.method, call.url, None, f"timed out after {call.timeout:g} s", timed_out=True
        )
    errno = int(handle.getinfo(pycurl.OS_ERRNO))
    text = f"{os.strerror(errno)} ({message})" if errno else message
    return HttpCallError(call.method, call.url, None, text)


def _drain(fd: int) -> None:
    try:
        while os.read(fd, 4096):
            pass
    except BlockingIOError:
        pass

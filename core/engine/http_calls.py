"""One JSON-over-HTTP call with a timeout, and the error that says what answered (stdlib only).

Every call the trainer makes to an engine or a router goes through `call_json`, so none can wait
forever: a connection refused, a timeout and an HTTP error all raise `HttpCallError` with the URL,
the status (None when nothing answered) and the answer's text. A 4xx answer that describes the
request (`EngineRequestError`, a ValueError) is not retried by `client.EngineClient`.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request

MAX_QUOTED = 500
"""How many characters of an error answer a message quotes."""


class HttpCallError(RuntimeError):
    """An HTTP call failed: nothing answered (status None) or the answer was an error status.

    Attributes:
        url: the URL called.
        status: the HTTP status, or None (refused, reset, timed out).
        text: the answer's body (or the connection error), at most `MAX_QUOTED` characters.
    """

    def __init__(self, method: str, url: str, status: int | None, text: str) -> None:
        self.url, self.status, self.text = url, status, text[:MAX_QUOTED]
        what = f"HTTP {status}" if status is not None else "no answer"
        super().__init__(f"{method} {url}: {what}: {self.text}")


class EngineRequestError(ValueError):
    """The engine refused the request itself (HTTP 400): repeating it cannot help; quotes its error."""


def call_json(
    method: str,
    url: str,
    body: object | None,
    *,
    timeout: float,
    headers: dict[str, str] | None = None,
) -> object:
    """Send `body` as JSON (None: no body) and return the decoded JSON answer (None when empty or text).

    Args:
        timeout: seconds for the whole call's socket operations (connect, each read); must be > 0.

    Raises:
        EngineRequestError: HTTP 400 (the engine's error quoted).
        HttpCallError: any other failure.
    """
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method)
    req.add_header("Content-Type", "application/json")
    for key, value in (headers or {}).items():
        req.add_header(key, value)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            raw = resp.read()
    except urllib.error.HTTPError as e:
        text = _read_error(e)
        if e.code == 400:
            raise EngineRequestError(f"{method} {url} answered HTTP 400: {text[:MAX_QUOTED]}") from None
        raise HttpCallError(method, url, e.code, text) from None
    except OSError as e:  # URLError, refused, reset, timed out
        reason = getattr(e, "reason", e)
        if isinstance(reason, TimeoutError):
            reason = f"timed out after {timeout:g} s"
        raise HttpCallError(method, url, None, str(reason)) from None
    text = raw.decode(errors="replace")
    try:
        return json.loads(text) if text else None
    except json.JSONDecodeError:
        return None


def _read_error(e: urllib.error.HTTPError) -> str:
    try:
        return e.read().decode(errors="replace").strip()
    except OSError:
        return str(e)

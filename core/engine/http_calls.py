"""One JSON-over-HTTP call with a timeout, and the error that says what answered (stdlib only).

Every call the trainer makes to an engine or a router goes through `call_json`, so none can wait
forever: a connection refused, a timeout and an HTTP error all raise `HttpCallError` with the URL,
the status (None when nothing answered) and the answer's text. A 4xx answer that describes the
request (`EngineRequestError`, a ValueError) is not retried by `client.EngineClient`. An error answer
that is not JSON (a web server's HTML page) is quoted as one line: its title or first line. A router
path (`GET /workers`) answered with anything but JSON says the address is not an sglang-router.
"""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.parse
import urllib.request

MAX_QUOTED = 500
"""How many characters of an error answer a message quotes."""
ONE_LINE = 120
"""How many characters of a non-JSON error answer (an HTML page's title or first line) a message quotes."""
ROUTER_PATHS = ("/workers",)
"""sglang-router's worker API: an SGLang engine never serves it, so a non-JSON answer there means the
address is some other server."""


class HttpCallError(RuntimeError):
    """An HTTP call failed: nothing answered (status None) or the answer was an error status.

    Attributes:
        url: the URL called.
        status: the HTTP status, or None (refused, reset, timed out).
        text: the answer's body (or the connection error), at most `MAX_QUOTED` characters.
        timed_out: nothing answered within the call's timeout (the peer accepted, then said nothing: a
            hung process rather than an exited one, whose connections are refused or reset).
    """

    def __init__(
        self, method: str, url: str, status: int | None, text: str, *, timed_out: bool = False
    ) -> None:
        self.url, self.status, self.text, self.timed_out = url, status, text[:MAX_QUOTED], timed_out
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
            status, text = resp.status, resp.read().decode(errors="replace")
    except urllib.error.HTTPError as e:
        status, text = e.code, _read_error(e)
    except OSError as e:  # URLError, refused, reset, timed out
        reason = getattr(e, "reason", e)
        timed_out = isinstance(reason, TimeoutError)
        if timed_out:
            reason = f"timed out after {timeout:g} s"
        raise HttpCallError(method, url, None, str(reason), timed_out=timed_out) from None
    return decode_answer(method, url, status, text)


def decode_answer(method: str, url: str, status: int, text: str) -> object:
    """What an answer with HTTP `status` and body `text` means: the decoded JSON (None when empty, or
    not JSON outside the router's paths), or the error (a non-JSON body quoted as one line).

    Raises:
        EngineRequestError: HTTP 400.
        HttpCallError: any other status >= 400, or a router path that did not answer JSON.
    """
    if status >= 400:
        quoted = _quote_body(url, text)
        if status == 400:
            raise EngineRequestError(f"{method} {url} answered HTTP 400: {quoted[:MAX_QUOTED]}")
        raise HttpCallError(method, url, status, quoted)
    try:
        return json.loads(text) if text else None
    except json.JSONDecodeError:
        if _is_router_path(url):
            raise HttpCallError(method, url, status, _quote_body(url, text)) from None
        return None


def _is_router_path(url: str) -> bool:
    return urllib.parse.urlsplit(url).path.rstrip("/") in ROUTER_PATHS


def _quote_body(url: str, text: str) -> str:
    """A JSON body as it is (cut at MAX_QUOTED by the caller); anything else as one line: an HTML page's
    <title> or the first line with text, cut at `ONE_LINE`, saying so for a router path."""
    stripped = text.strip()
    if stripped[:1] in ("{", "[") or not stripped:
        return stripped
    title = re.search(r"<title[^>]*>(.*?)</title>", stripped, re.IGNORECASE | re.DOTALL)
    lines = (re.sub(r"<[^>]*>", " ", line).strip() for line in stripped.splitlines())
    line = " ".join(title[1].split()) if title else next((x for x in lines if x), "")
    what = (
        "an HTML page titled" if title else "an HTML page:" if stripped.startswith("<") else "a text answer:"
    )
    quote = f"{what} {line[:ONE_LINE]!r}"
    if _is_router_path(url):
        path = urllib.parse.urlsplit(url).path
        quote += f" (not an sglang-router: GET {path} did not answer JSON)"
    return quote


def _read_error(e: urllib.error.HTTPError) -> str:
    try:
        return e.read().decode(errors="replace").strip()
    except OSError:
        return str(e)

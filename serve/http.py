"""Small HTTP helpers shared by the server's handlers: reading a JSON body, SGLang's error answers.

Bodies are parsed with `json.loads` only: the server never unpickles anything it receives.
"""

from __future__ import annotations

import json

from starlette.requests import Request
from starlette.responses import JSONResponse

from grpolab.serve.protocol import RequestError


async def read_json(request: Request, *, default: object = None, contract: bool = True) -> object:
    """The request's JSON body, or `default` when the body is empty.

    Raises:
        RequestError: the body is not valid JSON (SGLang answers 400 too), in the contract-gate shape
            `{"error": "<text>"}` of `/generate`, or with `contract=False` the OpenAI routes' handler
            shape `{"error": {"message": "<text>"}}` (what the `openai` client reads).
    """
    raw = await request.body()
    if not raw.strip():
        return default
    try:
        return json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise RequestError(f"the request body is not valid JSON: {e}", contract=contract) from e
    except RecursionError as e:  # e.g. 10 MB of "[" answered "maximum recursion depth exceeded ..."
        raise RequestError(
            "the request body nests JSON arrays or objects too deeply to read (Python's reader stops near "
            "1,000 levels)",
            contract=contract,
        ) from e


async def read_object(request: Request, *, contract: bool = True) -> dict:
    """The request's JSON body as an object (`{}` when empty); `contract` as in `read_json`.

    Raises:
        RequestError: not JSON, or JSON that is not an object.
    """
    body = await read_json(request, default={}, contract=contract)
    if not isinstance(body, dict):
        raise RequestError(f"{request.url.path}: the request body must be a JSON object")
    return body


def error_response(message: str, status: int = 400) -> JSONResponse:
    """SGLang's handler error shape: `{"error": {"message": ...}}` with `status`."""
    return JSONResponse({"error": {"message": message}}, status_code=status)


def bool_field(body: dict, key: str, default: bool, *, route: str) -> bool:
    """`body[key]` as a JSON boolean (`default` when absent or null).

    Raises:
        ValueError: the value is not `true` or `false` (`"no"`, 0, 1 are refused, not read as truthy).
    """
    value = body.get(key)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise ValueError(f"{route}: {key} must be true or false, got {value!r}")
    return value

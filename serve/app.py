"""`build_app`: the torch engine as an ASGI app speaking SGLang 0.5.23's native HTTP API.

Routes (what each answers: `../shared/reference/notes-sglang-http.md`): `/generate` (POST, PUT),
`/health` and `/health_generate`, `/model_info` (+ `model_fingerprint`, grpolab's), `/server_info`
(+ the batcher's counters in `internal_states[0]`), the control routes of `control.py`, and
`/v1/models` + `/v1/chat/completions` (`openai.py`), and the token-in/token-out `/sessions` routes
(`sessions.py`). Starlette routes, no FastAPI: the server parses
every body itself to give SGLang's 400 texts (FastAPI's own validation answers 422 in another shape).

Auth as SGLang's `decide_request_auth` with an `--api-key` only: every route but `/health*` needs
`Authorization: Bearer <key>` (constant-time compare); otherwise 401 `{"error": "Unauthorized"}`.
"""

from __future__ import annotations

import secrets
from contextlib import asynccontextmanager

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from grpolab.serve import control, generation, openai, profiling, sessions
from grpolab.serve.protocol import (
    RequestError,
)
from grpolab.serve.state import SERVER_VERSION, ServerState


class ApiKeyMiddleware:
    """ASGI middleware: with an api key, refuse (401) any route but /health* without `Bearer <key>`."""

    def __init__(self, app, *, api_key: str) -> None:
        self.app = app
        self.api_key = api_key

    async def __call__(self, scope, receive, send) -> None:
        if (
            scope["type"] == "http"
            and scope.get("method") != "OPTIONS"
            and not scope["path"].startswith("/health")
        ):
            header = dict(scope.get("headers") or []).get(b"authorization", b"").decode("latin-1")
            scheme, _, token = header.partition(" ")
            if scheme.lower() != "bearer" or not secrets.compare_digest(token, self.api_key):
                await JSONResponse({"error": "Unauthorized"}, status_code=401)(scope, receive, send)
                return
        await self.app(scope, receive, send)


async def model_info(state: ServerState, request: Request) -> Response:
    """SGLang's `/model_info` fields, plus `model_fingerprint` (grpolab's check that two processes
    serve the same model: `core.modeling.model_fingerprint`)."""
    return JSONResponse(
        {
            "model_path": state.settings.model_path,
            "served_model_name": state.model_name,
            "tokenizer_path": state.settings.model_path,
            "is_generation": True,
            "preferred_sampling_params": None,
            "weight_version": state.weight_version,
            "load_format": "auto",
            "reasoning_parser": None,
            "tool_call_parser": None,
            "disaggregation_mode": "null",
            "has_image_understanding": False,
            "has_audio_understanding": False,
            "model_type": state.model_type,
            "architectures": state.architectures,
            "model_fingerprint": state.fingerprint,
        }
    )


async def server_info(state: ServerState, request: Request) -> Response:
    """Resolved settings, the launch command, version and the batcher's live counters."""
    s = state.settings
    return JSONResponse(
        {
            "model_path": s.model_path,
            "served_model_name": state.model_name,
            "tokenizer_path": s.model_path,
            "host": s.host,
            "port": s.port,
            "max_context_length": state.context_len,
            "enable_deterministic_inference": s.deterministic,
            "true_on_policy_mode": bool(getattr(state.engine, "true_on_policy", False)),
            "launch_command": s.launch_command,
            "device": str(getattr(state.engine, "device", "cpu")),
            "batch_wait_s": s.batch_wait_s,
            "disaggregation_mode": "null",
            "incremental_streaming_output": False,
            "startup_time": state.started,
            "internal_states": [state.batcher.stats()],
            "version": SERVER_VERSION,
            "frontend": "grpolab",
        }
    )


def _route(state: ServerState, path: str, handler, methods: list[str]) -> Route:
    """A route whose handler gets the state; RequestError -> 400 with its body."""

    async def endpoint(request: Request) -> Response:
        try:
            return await handler(state, request)
        except RequestError as e:
            return JSONResponse(e.body, status_code=400)

    return Route(path, endpoint, methods=methods)


ROUTES = [
    ("/generate", generation.generate, ["POST", "PUT"]),
    ("/health", generation.health, ["GET"]),
    ("/health_generate", generation.health, ["GET"]),
    ("/model_info", model_info, ["GET"]),
    ("/server_info", server_info, ["GET"]),
    ("/flush_cache", control.flush_cache, ["GET", "POST"]),
    ("/pause_generation", control.pause_generation, ["POST"]),
    ("/continue_generation", control.continue_generation, ["POST"]),
    ("/abort_request", control.abort_request, ["POST"]),
    ("/release_memory_occupation", control.release_memory, ["GET", "POST"]),
    ("/resume_memory_occupation", control.resume_memory, ["GET", "POST"]),
    ("/update_weights_from_disk", control.update_weights_from_disk, ["POST"]),
    ("/update_weight_version", control.update_weight_version, ["POST"]),
    ("/weights_checker", control.weights_checker, ["GET", "POST"]),
    ("/start_profile", profiling.start_profile, ["GET", "POST"]),
    ("/stop_profile", profiling.stop_profile, ["GET", "POST"]),
    ("/v1/models", openai.list_models, ["GET"]),
    ("/v1/chat/completions", openai.chat_completions, ["POST"]),
    ("/sessions", sessions.open_session, ["POST"]),
    ("/sessions/{sid}", sessions.session_record, ["GET"]),
    ("/sessions/{sid}", sessions.close_session, ["DELETE"]),
    ("/sessions/{sid}/v1/chat/completions", sessions.session_chat, ["POST"]),
]
"""(path, handler(state, request), methods) of every route."""


async def _http_error(request: Request, exc: Exception) -> Response:
    """An unknown path (404) or a method the route does not take (405) as JSON, FastAPI's (so SGLang's)
    shape `{"detail": "Method Not Allowed"}`, with the `Allow` header Starlette sets, not plain text."""
    assert isinstance(exc, HTTPException)
    return JSONResponse({"detail": exc.detail}, status_code=exc.status_code, headers=exc.headers)


def build_app(state: ServerState) -> Starlette:
    """The ASGI app serving `state` (its batcher starts and stops with the app's lifespan)."""

    @asynccontextmanager
    async def lifespan(app: Starlette):
        state.batcher.start()
        try:
            yield
        finally:
            await state.batcher.stop()

    app = Starlette(
        routes=[_route(state, p, h, m) for p, h, m in ROUTES],
        lifespan=lifespan,
        exception_handlers={HTTPException: _http_error},
    )
    if state.settings.api_key:
        app.add_middleware(ApiKeyMiddleware, api_key=state.settings.api_key)
    return app

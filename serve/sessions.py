"""Token-in/token-out sessions: one agent trajectory whose every turn keeps the exact ids.

Routes: `POST /sessions` -> `{"session_id"}` (`{"count": N}` -> `{"session_ids"}`); `POST /sessions/<id>/v1/chat/completions` takes the
whole message history each turn (as agents send it) and generates on the session's ids plus only
the new messages tokenised (`core/turns/record.py` gives the rule); `GET /sessions/<id>` returns the
token record (ids, per-token source and turn, loss mask, log-probs, weight version per generated
token); `DELETE /sessions/<id>` forgets it. A history that rewrites an earlier message is a 409
naming the message; an unknown session is a 404; a turn sent while the session's previous turn
still runs is a 409 (a trajectory is sequential). A turn that fails (a 400, an engine error, an
abort) leaves the record as it was. Sessions live in the server's memory (at most `MAX_SESSIONS`).
"""

from __future__ import annotations

import asyncio
import secrets
from dataclasses import dataclass, field

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from grpolab.core.turns.codec import ChatCodec
from grpolab.core.turns.record import (
    HistoryRewrite,
    Render,
    TemplateNotIncremental,
    TokenRecord,
    add_reply,
    append_turn,
    new_messages,
)
from grpolab.serve.chat_request import ChatRequest, parse_chat
from grpolab.serve.http import error_response, read_object
from grpolab.serve.openai import answer_chat, render_template, template_ids
from grpolab.serve.protocol import RequestError
from grpolab.serve.state import ServerState

MAX_SESSIONS = 1024
"""Open sessions one server keeps (grpolab's bound; `DELETE /sessions/<id>` frees one)."""


@dataclass
class Session:
    """One trajectory: its token record, the tools and template arguments of its first turn, a lock, and
    why its last refused turn was refused (`GET /sessions/<id>`'s `last_error`: an agent whose own
    client shows only "HTTP Error 409" is failed by grpolab with the reason)."""

    record: TokenRecord = field(default_factory=TokenRecord)
    tools: list | None = None
    template_kwargs: dict = field(default_factory=dict)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    last_error: str | None = None


def _session(state: ServerState, request: Request) -> tuple[str, Session]:
    sid = request.path_params["sid"]
    session = state.sessions.get(sid)
    if session is None:
        raise LookupError(
            f"no session {sid!r} (open one with POST /sessions; sessions live until DELETE or restart)"
        )
    return sid, session


async def open_session(state: ServerState, request: Request) -> Response:
    """`POST /sessions`: an empty body or `{}` -> `{"session_id": "<hex>"}`; `{"count": N}` opens N at once
    -> `{"session_ids": [...]}` (a rollout that starts its episodes together opens their sessions in one
    request, not N). 400 naming any other field or a count that is not an integer >= 1; 503 when the
    sessions would pass `MAX_SESSIONS` open."""
    body = await read_object(request, contract=False)
    given = "count" in body
    count = body.pop("count", None)
    if body:
        return error_response(
            f"POST /sessions takes only 'count', got {', '.join(map(repr, sorted(body)))} (send {{}}, no body "
            'or {"count": N}; sampling settings go with each turn\'s chat request)'
        )
    if given and (not isinstance(count, int) or isinstance(count, bool) or count < 1):
        return error_response(f"POST /sessions 'count' must be an integer >= 1, got {count!r}")
    store = state.sessions
    if len(store) + (count or 1) > MAX_SESSIONS:
        return error_response(
            f"{len(store)} of at most {MAX_SESSIONS} sessions are open, {count or 1} more asked; "
            "DELETE /sessions/<id> the finished ones",
            503,
        )
    sids = [secrets.token_hex(16) for _ in range(count or 1)]
    for sid in sids:
        store[sid] = Session()
    return JSONResponse({"session_id": sids[0]} if count is None else {"session_ids": sids})


async def session_record(state: ServerState, request: Request) -> Response:
    """`GET /sessions/<id>`: the token record (`TokenRecord.as_json`) and the session id."""
    try:
        sid, session = _session(state, request)
    except LookupError as e:
        return error_response(str(e), 404)
    extra = {} if session.last_error is None else {"last_error": session.last_error}
    return JSONResponse({"session_id": sid, **session.record.as_json(), **extra})


async def close_session(state: ServerState, request: Request) -> Response:
    """`DELETE /sessions/<id>`: forget the session."""
    try:
        sid, _ = _session(state, request)
    except LookupError as e:
        return error_response(str(e), 404)
    del state.sessions[sid]
    return JSONResponse({"success": True})


def _render(state: ServerState, session: Session) -> Render:
    """The chat template's text over messages, with the session's first-turn tools and arguments."""

    def render(messages: list, generation_prompt: bool) -> str:
        text = render_template(
            state, messages, generation_prompt=generation_prompt, tokenize=False,
            tools=session.tools, **session.template_kwargs,
        )  # fmt: skip
        assert isinstance(text, str)
        return text

    return render


def _next_record(state: ServerState, session: Session, req: ChatRequest) -> TokenRecord:
    """The record with this turn's prompt appended (a copy: the session's own changes on success only).

    Raises:
        RequestError: n > 1, `input_ids`, tools or template arguments that differ from the first turn's.
        HistoryRewrite / TemplateNotIncremental: from `core.turns.record`.
    """
    if req.n != 1:
        raise RequestError(f"a session is one trajectory: n must be 1, got {req.n}")
    if req.input_ids is not None or req.messages is None:
        raise RequestError(
            "a session turn sends messages (the session keeps the ids); input_ids is refused here"
        )
    record = session.record.copy()
    if not record.ids:
        session.tools, session.template_kwargs = req.tools, dict(req.chat_template_kwargs)
        ids = template_ids(state, req.messages, tools=req.tools, **req.chat_template_kwargs)
        record.add(ids, "prompt", 0)
        record.prompt_length, record.messages = len(ids), list(req.messages)
        return record
    if req.tools != session.tools or dict(req.chat_template_kwargs) != session.template_kwargs:
        raise HistoryRewrite(
            "tools or chat_template_kwargs differ from the session's first turn (the first prompt was "
            "rendered with those)", turn=0
        )  # fmt: skip
    added = new_messages(record, req.messages)
    codec = ChatCodec(state.tokenizer)
    append_turn(record, added, _render(state, session), codec.encode, codec.decode)
    return record


async def session_chat(state: ServerState, request: Request) -> Response:
    """`POST /sessions/<id>/v1/chat/completions`: one turn, answered as `/v1/chat/completions` is."""
    try:
        _, session = _session(state, request)
    except LookupError as e:
        return error_response(str(e), 404)
    try:
        req = parse_chat(
            await read_object(request, contract=False),
            eos_ids=state.eos_ids,
            deterministic=state.settings.deterministic,
        )
    except RequestError as e:  # kept as the session's last refusal too, for the agent's runner
        session.last_error = f"400: {e}"
        return JSONResponse(e.body, status_code=400)
    if session.lock.locked():
        return error_response(
            "this session's previous turn is still running; a trajectory's turns are sequential", 409
        )
    async with session.lock:
        try:
            record = _next_record(state, session, req)
        except HistoryRewrite as e:
            session.last_error = f"409 at turn {e.turn}: {e}"
            return JSONResponse({"error": {"message": str(e), "turn": e.turn}}, status_code=409)
        except TemplateNotIncremental as e:
            session.last_error = f"400: {e}"
            return error_response(str(e))
        except RequestError as e:
            session.last_error = f"400: {e}"
            return JSONResponse(e.body, status_code=400)
        response, answers = await answer_chat(state, req, record.ids, with_logprobs=True)
        if not answers or answers[0][1].finish_reason == "abort":
            return response
        out, reply = answers[0]  # the message the client got, tool-call ids included
        logprobs = [lp for lp, _, _ in out["meta_info"]["output_token_logprobs"]]
        add_reply(
            record,
            out["output_ids"],
            logprobs,
            out["meta_info"]["weight_version"],
            reply.message,
            reply.finish_reason,
        )
        session.record = record
        return response

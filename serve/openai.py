"""OpenAI-compatible `/v1/models` and `/v1/chat/completions`, for pointing an agent at the live policy.

Chat prompts go through the checkpoint's chat template (`apply_chat_template`, generation prompt
added) and then the same batcher as `/generate`, so chat requests batch with rollout requests and
run on the current weights (`metadata.weight_version` says which, as SGLang adds it). Supported:
`messages`, `max_tokens` / `max_completion_tokens`, `temperature`, `top_p`, `top_k`, `seed`; only
`n == 1`, no streaming; other OpenAI fields (`stop` strings, penalties, tools) are ignored.
"""

from __future__ import annotations

import secrets
import time

from jinja2 import TemplateError
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from grpolab.serve.generation import run_items
from grpolab.serve.http import error_response, read_object
from grpolab.serve.protocol import GenerateItem, RequestError, parse_sampling
from grpolab.serve.state import ServerState

DEFAULT_MAX_TOKENS = 128
"""New tokens when a chat request names no limit (SGLang's `max_new_tokens` default)."""


async def list_models(state: ServerState, request: Request) -> Response:
    """`{"object": "list", "data": [model card]}` with the one served model."""
    card = {
        "id": state.model_name,
        "object": "model",
        "created": int(state.started),
        "owned_by": "grpolab",
        "root": state.model_name,
        "max_model_len": state.context_len,
    }
    return JSONResponse({"object": "list", "data": [card]})


def _chat_sampling(body: dict) -> dict:
    """OpenAI chat fields -> an SGLang `sampling_params` dict (validated later by `parse_sampling`).

    Raises:
        RequestError: streaming, n != 1, or a non-integer max_tokens.
    """
    if body.get("stream"):
        raise RequestError("grpolab serve does not stream; send stream: false")
    if body.get("n", 1) != 1:
        raise RequestError(f"grpolab serve answers n = 1 only, got n = {body.get('n')!r}")
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens")) or DEFAULT_MAX_TOKENS
    sp: dict = {"max_new_tokens": max_tokens}
    for ours, theirs in (
        ("temperature", "temperature"),
        ("top_p", "top_p"),
        ("top_k", "top_k"),
        ("sampling_seed", "seed"),
    ):
        if body.get(theirs) is not None:
            sp[ours] = body[theirs]
    return sp


def _prompt_ids(state: ServerState, messages: object) -> list[int]:
    """The chat-templated prompt ids of `messages` (a list of {role, content}).

    Raises:
        RequestError: messages missing or malformed (a message without a string `role` or without
            `content`, a string or a list of parts), or the chat template fails on them.
    """
    if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) for m in messages):
        raise RequestError("messages must be a non-empty list of {role, content} objects")
    for i, m in enumerate(messages):
        if not isinstance(m.get("role"), str) or not isinstance(m.get("content"), (str, list)):
            raise RequestError(
                f"messages[{i}] must have a string role and a content (a string or a list of parts), "
                f"got {sorted(m)}"
            )
    try:
        ids = state.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    except (ValueError, TypeError, KeyError, TemplateError) as e:
        raise RequestError(f"cannot apply the chat template of {state.settings.model_path}: {e}") from e
    if isinstance(ids, dict) or hasattr(ids, "input_ids"):  # transformers 5 returns a BatchEncoding
        ids = ids["input_ids"]
    return [int(t) for t in ids]


async def chat_completions(state: ServerState, request: Request) -> Response:
    """One chat completion in OpenAI's shape (`chat.completion`), plus `metadata.weight_version`."""
    body = await read_object(request)
    params, seed, skip = parse_sampling(
        _chat_sampling(body), eos_ids=state.eos_ids, deterministic=state.settings.deterministic
    )
    rid = f"chatcmpl-{secrets.token_hex(12)}"
    item = GenerateItem(
        rid=rid,
        prompt_ids=_prompt_ids(state, body.get("messages")),
        params=params,
        seed=seed,
        skip_special_tokens=skip,
    )
    try:
        (out,) = await run_items(state, [item])
    except RuntimeError as e:
        return error_response(str(e))
    meta = out["meta_info"]
    finish = meta["finish_reason"]["type"]
    choice = {
        "index": 0,
        "message": {"role": "assistant", "content": out["text"]},
        "finish_reason": {"stop": "stop", "length": "length"}.get(finish, "abort"),
        "logprobs": None,
    }
    usage = {
        "prompt_tokens": meta["prompt_tokens"],
        "completion_tokens": meta["completion_tokens"],
        "total_tokens": meta["prompt_tokens"] + meta["completion_tokens"],
    }
    return JSONResponse(
        {
            "id": rid,
            "object": "chat.completion",
            "created": int(time.time()),
            "model": state.model_name,
            "choices": [choice],
            "usage": usage,
            "metadata": {"weight_version": meta["weight_version"]},
        }
    )

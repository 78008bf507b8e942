"""OpenAI-compatible `/v1/models` and `/v1/chat/completions`, for pointing an agent at the live policy.

Chat prompts go through the checkpoint's chat template (`apply_chat_template`, generation prompt
added, the request's `tools` and `chat_template_kwargs` passed to it) and then the same batcher as
`/generate`, so chat requests batch with rollout requests and run on the current weights
(`metadata.weight_version` says which, as SGLang adds it). What a body may hold and what this
engine honours: `chat_request.py`; the answer's shape (log-probs, token ids, meta_info, tool calls,
the event stream): `chat_response.py`.
"""

from __future__ import annotations

import secrets
import time

from jinja2 import TemplateError
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from grpolab.serve.chat_request import ChatRequest, parse_chat
from grpolab.serve.chat_response import Reply, TokenText, choice, reply_message, stream_events, usage
from grpolab.serve.generation import run_items
from grpolab.serve.http import error_response, read_object
from grpolab.serve.protocol import DEFAULT_SEED, GenerateItem, RequestError
from grpolab.serve.state import ServerState


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


def render_template(
    state: ServerState, messages: list, *, generation_prompt: bool, tokenize: bool,
    tools: list | None = None, **kwargs,
) -> str | list[int]:  # fmt: skip
    """The checkpoint's chat template over `messages`: its text, or (`tokenize`) its token ids.

    Raises:
        RequestError: the chat template fails on them (naming the checkpoint and the template's error).
    """
    if tools:
        kwargs["tools"] = tools
    try:
        out = state.tokenizer.apply_chat_template(
            messages, add_generation_prompt=generation_prompt, tokenize=tokenize, **kwargs
        )
    except (ValueError, TypeError, KeyError, TemplateError) as e:
        raise RequestError(f"cannot apply the chat template of {state.settings.model_path}: {e}") from e
    if not tokenize:
        return out
    if isinstance(out, dict) or hasattr(out, "input_ids"):  # transformers 5 returns a BatchEncoding
        out = out["input_ids"]
    return [int(t) for t in out]


def template_ids(state: ServerState, messages: list, *, tools: list | None = None, **kwargs) -> list[int]:
    """The chat-templated prompt ids of `messages` (generation prompt added).

    Raises:
        RequestError: the chat template fails on them.
    """
    ids = render_template(state, messages, generation_prompt=True, tokenize=True, tools=tools, **kwargs)
    assert isinstance(ids, list)
    return ids


def choice_items(
    state: ServerState, req: ChatRequest, prompt_ids: list[int], rid: str, *, with_logprobs: bool = False
) -> list[GenerateItem]:
    """One `GenerateItem` per choice (`rid_<i>`), sharing the prompt (prefilled once by the engine);
    `with_logprobs` asks the engine's log-probs even when the answer does not show them (a session).

    Choice i samples with seed `seed + i` when the request gave a seed (or the server is
    deterministic: SGLang's default seed 42 + i), else with a fresh random seed each.
    """
    s = req.sampling
    seeded = req.seed_given or state.settings.deterministic
    base = s.seed if req.seed_given else DEFAULT_SEED
    return [
        GenerateItem(
            rid=f"{rid}_{i}" if req.n > 1 else rid,
            prompt_ids=prompt_ids,
            params=s.params,
            seed=(base + i) % (1 << 63) if seeded else secrets.randbits(63),
            return_logprob=req.logprobs or req.return_meta_info or with_logprobs,
            skip_special_tokens=s.skip_special_tokens,
            stop=s.stop,
            no_stop_trim=s.no_stop_trim,
        )
        for i in range(req.n)
    ]


async def answer_chat(
    state: ServerState, req: ChatRequest, prompt_ids: list[int], *, with_logprobs: bool = False
) -> tuple[Response, list[tuple[dict, Reply]]]:
    """Generate the request's choices on `prompt_ids` and answer in OpenAI's shape (JSON or events);
    also return each choice's `/generate` answer and the reply built from it (a session records
    them; [] when generation failed).

    Raises:
        RequestError: the prompt does not fit the context or holds an id outside the vocabulary.
    """
    rid = req.rid or f"chatcmpl-{secrets.token_hex(12)}"
    try:
        outs = await run_items(state, choice_items(state, req, prompt_ids, rid, with_logprobs=with_logprobs))
    except (RuntimeError, ValueError) as e:  # memory released, the engine failed, non-finite log-probs
        return error_response(str(e)), []
    replies = [reply_message(req, out) for out in outs]
    token_text = TokenText.of(state.tokenizer)
    created = int(time.time())
    if req.stream:

        def decode(ids: list[int]) -> str:
            return state.tokenizer.decode(ids, skip_special_tokens=req.sampling.skip_special_tokens)

        events = stream_events(
            req, rid, created, state.model_name, outs, replies, len(prompt_ids), token_text, decode
        )
        return StreamingResponse(events, media_type="text/event-stream"), list(zip(outs, replies))
    body = {
        "id": rid,
        "object": "chat.completion",
        "created": created,
        "model": state.model_name,
        "choices": [
            choice(req, i, out, reply, prompt_ids, token_text)
            for i, (out, reply) in enumerate(zip(outs, replies))
        ],
        "usage": usage(outs, len(prompt_ids)),
        "metadata": {"weight_version": state.weight_version},
    }
    return JSONResponse(body), list(zip(outs, replies))


async def chat_completions(state: ServerState, request: Request) -> Response:
    """`/v1/chat/completions`: n choices in OpenAI's shape (`chat.completion`, or its event stream)."""
    req = parse_chat(
        await read_object(request, contract=False),
        eos_ids=state.eos_ids,
        deterministic=state.settings.deterministic,
    )
    if req.input_ids is not None:
        prompt_ids = req.input_ids
    else:
        assert req.messages is not None
        prompt_ids = template_ids(state, req.messages, tools=req.tools, **req.chat_template_kwargs)
    response, _ = await answer_chat(state, req, prompt_ids)
    return response

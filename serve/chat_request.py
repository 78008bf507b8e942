"""An OpenAI/SGLang `/v1/chat/completions` body, parsed and checked without the engine (pure).

The known fields are SGLang 0.5.23's `ChatCompletionRequest` (`srt/entrypoints/openai/protocol.py`,
with its `PDRoutingFields`), in its order; tests/serve checks the list against that file. An unknown
field is a 400 naming it (a misspelt `logprob` would otherwise answer without log-probs), as
`/generate` refuses unknown keys. A known field this engine cannot honour at a non-neutral value
(penalties, grammars, `tool_choice: required`, hidden states) is a 400 naming it, never ignored.

Honoured: `messages` (or SGLang's pre-tokenised `input_ids`), `max_tokens` / `max_completion_tokens`,
`temperature`, `top_p`, `top_k`, `seed`, `stop`, `stop_token_ids`, `ignore_eos`, `no_stop_trim`,
`skip_special_tokens`, `n`, `stream` + `stream_options.include_usage`, `logprobs` + `top_logprobs`,
`return_token_ids`, `return_prompt_token_ids`, `return_meta_info`, `tools` + `tool_choice`
(auto/none), `chat_template_kwargs`, `rid`. Accepted and without effect here: `model`, `user`,
`parallel_tool_calls`, routing and caching hints (`rid`-like keys, `priority`, `session_id`, ...).
"""

from __future__ import annotations

from dataclasses import dataclass

from grpolab.core.turns.tool_calls import tool_names_of
from grpolab.serve.protocol import (
    ParsedSampling,
    RequestError,
    is_one_of,
    parse_sampling,
    top_logprobs_count,
)

CHAT_KEYS: tuple[str, ...] = (
    "bootstrap_host", "bootstrap_port", "bootstrap_room", "routed_dp_rank", "disagg_prefill_dp_rank",
    "messages", "model", "frequency_penalty", "logit_bias", "logprobs", "top_logprobs", "max_tokens",
    "max_completion_tokens", "n", "presence_penalty", "response_format", "seed", "stop", "stream",
    "stream_options", "temperature", "top_p", "user", "tools", "tool_choice", "parallel_tool_calls",
    "return_hidden_states", "return_routed_experts", "routed_experts_start_len",
    "return_cached_tokens_details", "return_spec_tokens_details", "return_prompt_token_ids",
    "return_token_ids", "return_meta_info", "return_input_ids_in_sglext", "return_output_ids_in_sglext",
    "return_sampling_mask", "sampling_logprobs_mode", "return_flat_raw_output_top_logprobs",
    "return_flat_raw_top_logprobs_b64", "reasoning_effort", "thinking", "task", "top_k", "min_p",
    "min_tokens", "regex", "ebnf", "repetition_penalty", "stop_token_ids", "stop_regex", "no_stop_trim",
    "ignore_eos", "continue_final_message", "skip_special_tokens", "lora_path", "session_id",
    "session_params", "separate_reasoning", "stream_reasoning", "chat_template_kwargs",
    "max_dynamic_patch", "min_dynamic_patch", "use_audio_in_video", "images_config", "video_config",
    "mm_processor_kwargs", "custom_logit_processor", "custom_params", "watermark", "input_ids", "rid",
    "extra_key", "cache_salt", "priority", "data_parallel_rank",
)  # fmt: skip
"""SGLang 0.5.23's `ChatCompletionRequest` fields (routing fields first), in its order."""

_NEUTRAL: dict[str, tuple] = {
    "frequency_penalty": (None, 0, 0.0), "presence_penalty": (None, 0, 0.0), "logit_bias": (None, {}),
    "response_format": (None, {"type": "text"}), "return_hidden_states": (None, False),
    "return_routed_experts": (None, False), "return_cached_tokens_details": (None, False),
    "return_spec_tokens_details": (None, False), "return_input_ids_in_sglext": (None, False),
    "return_output_ids_in_sglext": (None, False), "return_sampling_mask": (None, False),
    "sampling_logprobs_mode": (None,), "return_flat_raw_output_top_logprobs": (None, False),
    "min_p": (None, 0, 0.0), "min_tokens": (None, 0), "regex": (None,), "ebnf": (None,),
    "repetition_penalty": (None, 1, 1.0), "stop_regex": (None, "", []), "continue_final_message": (None, False),
    "lora_path": (None,), "custom_logit_processor": (None,), "custom_params": (None,), "watermark": (None,),
    "task": (None,),
}  # fmt: skip
"""Known fields this engine cannot honour, and the values that mean "off" (accepted)."""

_BOOLS = (
    "logprobs", "stream", "return_token_ids", "return_prompt_token_ids", "return_meta_info", "ignore_eos",
    "no_stop_trim", "skip_special_tokens", "parallel_tool_calls",
)  # fmt: skip
_INTS = ("max_tokens", "max_completion_tokens", "seed", "top_k")
_FLOATS = ("temperature", "top_p")
MAX_N = 64
"""The most choices one request may ask for (grpolab's bound: a GRPO group is rarely larger)."""
DEFAULT_MAX_TOKENS = 128
"""New tokens when a chat request names no limit (SGLang's `max_new_tokens` default)."""


@dataclass(frozen=True, kw_only=True)
class ChatRequest:
    """A checked chat request (the prompt is tokenised by the handler, which owns the tokenizer).

    Attributes:
        messages: the message list (OpenAI shape), or None when `input_ids` gave the prompt.
        input_ids: SGLang's pre-tokenised prompt (bypasses the chat template), or None.
        tools: the request's `tools` (passed to the chat template), or None; `tool_names` their names.
        parse_tools: whether the answer's `<tool_call>` blocks become `message.tool_calls`.
        chat_template_kwargs: extra keyword arguments for `apply_chat_template`.
        sampling: the sampling settings, stop strings and text rules every choice shares.
        n: choices to sample (choice i uses seed `seed + i` when a seed is given).
        stream / include_usage: answer as server-sent events; end with a usage chunk.
        logprobs / top_logprobs: `choices[i].logprobs.content` with k alternatives per token.
        return_prompt_token_ids / return_token_ids / return_meta_info: SGLang's choice fields.
        rid: the request id base (`chatcmpl-<hex>` when none was given).
        seed_given: the request named a `seed`.
    """

    messages: list | None
    input_ids: list[int] | None
    tools: list | None
    tool_names: list[str]
    parse_tools: bool
    chat_template_kwargs: dict
    sampling: ParsedSampling
    n: int
    stream: bool
    include_usage: bool
    logprobs: bool
    top_logprobs: int
    return_prompt_token_ids: bool
    return_token_ids: bool
    return_meta_info: bool
    rid: str | None
    seed_given: bool


ROLES = ("system", "user", "assistant", "tool")
"""The message roles the chat route takes (the chat templates' roles; OpenAI's legacy `function` and `developer` are refused)."""


def _check_messages(messages: object) -> list:
    """The messages list, each with a role of `ROLES` and a string content (an assistant message with
    `tool_calls` may have none; content parts are refused: text models only).

    Raises:
        RequestError: missing, empty, or a malformed message (naming its index and keys).
    """
    if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) for m in messages):
        raise RequestError("messages must be a non-empty list of {role, content} objects")
    for i, m in enumerate(messages):
        if m.get("role") not in ROLES:
            raise RequestError(
                f"messages[{i}] has role {m.get('role')!r}; expected one of {', '.join(ROLES)} (keys {sorted(m)})"
            )
        content = m.get("content")
        calls = m.get("role") == "assistant" and isinstance(m.get("tool_calls"), list)
        if isinstance(content, list):
            raise RequestError(
                f"messages[{i}] ({m['role']}) has a list of content parts; this server takes text models' "
                "string content only (send the text as one string)"
            )
        if not (isinstance(content, str) or (content is None and calls)):
            kind = "missing" if "content" not in m else "null" if content is None else type(content).__name__
            raise RequestError(
                f"messages[{i}] ({m['role']}) needs a string content; it is {kind} (only an assistant "
                "message with tool_calls may have none)"
            )
    # an assistant turn that only called tools (OpenAI's content: null) renders as an empty content
    return [dict(m, content="") if m.get("content") is None else m for m in messages]


def _chat_names(message: str, body: dict) -> str:
    """A sampling error in the chat request's own field names (`seed`, `max_tokens` or
    `max_completion_tokens`), not SGLang's (`sampling_seed`, `max_new_tokens`)."""
    limit = "max_completion_tokens" if "max_completion_tokens" in body else "max_tokens"
    return (
        message.replace("sampling_params.", "")
        .replace("sampling_seed", "seed")
        .replace("max_new_tokens", limit)
    )


def _sampling_dict(body: dict) -> dict:
    """The chat fields that are SGLang sampling params, under SGLang's names."""
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    sp: dict = {"max_new_tokens": DEFAULT_MAX_TOKENS if max_tokens is None else max_tokens}
    for ours, theirs in (
        ("temperature", "temperature"), ("top_p", "top_p"), ("top_k", "top_k"), ("sampling_seed", "seed"),
        ("stop", "stop"), ("stop_token_ids", "stop_token_ids"), ("ignore_eos", "ignore_eos"),
        ("no_stop_trim", "no_stop_trim"), ("skip_special_tokens", "skip_special_tokens"),
    ):  # fmt: skip
        if body.get(theirs) is not None:
            sp[ours] = body[theirs]
    return sp


def parse_chat(body: object, *, eos_ids: tuple[int, ...], deterministic: bool) -> ChatRequest:
    """A `/v1/chat/completions` JSON body -> `ChatRequest`.

    Raises:
        RequestError: not an object; an unknown field (named); a field of the wrong type; a value this
            engine cannot honour; `top_logprobs` without `logprobs`; `n` outside [1, 64]; streaming
            with `return_token_ids` / `return_prompt_token_ids` / `return_meta_info` (SGLang refuses
            these too); `tool_choice` other than auto/none; malformed `tools` or messages.
    """
    if not isinstance(body, dict):
        raise RequestError("the body must be a JSON object (an OpenAI chat completion request)")
    unknown = [k for k in body if k not in CHAT_KEYS]
    if unknown:
        raise RequestError(
            f"unknown field(s) {', '.join(repr(k) for k in unknown)} in /v1/chat/completions; grpolab serve "
            f"refuses fields it does not know rather than ignore them; expected some of {', '.join(CHAT_KEYS)}"
        )
    for key in _BOOLS:
        if body.get(key) is not None and not isinstance(body[key], bool):
            raise RequestError(f"{key} must be true or false, got {body[key]!r}")
    for key in _INTS:
        if body.get(key) is not None and (not isinstance(body[key], int) or isinstance(body[key], bool)):
            raise RequestError(f"{key} must be an integer, got {body[key]!r}")
    for key in _FLOATS:
        if body.get(key) is not None and (
            not isinstance(body[key], (int, float)) or isinstance(body[key], bool)
        ):
            raise RequestError(f"{key} must be a number, got {body[key]!r}")
    for key, neutral in _NEUTRAL.items():
        if key in body and not is_one_of(body[key], neutral):
            raise RequestError(
                f"grpolab serve does not support {key} = {body[key]!r} in /v1/chat/completions"
            )
    n = body.get("n")
    n = 1 if n is None else n
    if not isinstance(n, int) or isinstance(n, bool) or not 1 <= n <= MAX_N:
        raise RequestError(f"n must be an integer in [1, {MAX_N}], got {n!r}")
    logprobs = body.get("logprobs") is True
    top = top_logprobs_count(body.get("top_logprobs"), "top_logprobs")
    if top and not logprobs:
        raise RequestError("top_logprobs needs logprobs: true (OpenAI's rule)")
    stream = body.get("stream") is True
    flags = {
        k: body.get(k) is True for k in ("return_token_ids", "return_prompt_token_ids", "return_meta_info")
    }
    if stream and any(flags.values()):
        named = ", ".join(k for k, v in flags.items() if v)
        raise RequestError(
            f"{named} is not supported with streaming; send stream: false (as SGLang refuses it)"
        )
    options = body.get("stream_options")
    if options is not None and (
        not isinstance(options, dict)
        or set(options) - {"include_usage", "continuous_usage_stats"}
        or not all(v is None or isinstance(v, bool) for v in options.values())
    ):
        raise RequestError(f"stream_options must be {{include_usage: bool}}, got {options!r}")
    tool_choice = body.get("tool_choice", "auto")
    named = isinstance(tool_choice, dict) and tool_choice.get("type") == "function"
    if tool_choice not in (None, "auto", "none", "required") and not named:
        raise RequestError(
            f"tool_choice must be auto, none, required or {{type: function, function: {{name}}}} (OpenAI's "
            f"values), got {tool_choice!r}"
        )
    if tool_choice not in (None, "auto", "none"):
        raise RequestError(
            f"grpolab serve does not support tool_choice = {tool_choice!r}: forcing a call needs constrained "
            "decoding; use auto (calls are parsed when the model writes them) or none"
        )
    try:
        tool_names = tool_names_of(body.get("tools"))
    except ValueError as e:
        raise RequestError(str(e)) from e
    kwargs = body.get("chat_template_kwargs") or {}
    if not isinstance(kwargs, dict):
        raise RequestError(f"chat_template_kwargs must be an object, got {kwargs!r}")
    input_ids = body.get("input_ids")
    if input_ids is not None and (
        not isinstance(input_ids, list) or not input_ids or not all(type(t) is int for t in input_ids)
    ):
        raise RequestError("input_ids must be a non-empty list of integer token ids")
    messages = (
        None if input_ids is not None and "messages" not in body else _check_messages(body.get("messages"))
    )
    rid = body.get("rid")
    if rid is not None and not isinstance(rid, str):
        raise RequestError(f"rid must be a string in /v1/chat/completions, got {rid!r}")
    try:
        sampling = parse_sampling(
            _sampling_dict(body), eos_ids=eos_ids, deterministic=deterministic, top_logprobs_num=top
        )
    except RequestError as e:  # SGLang's sampling names, said as the chat fields the client sent
        raise RequestError(_chat_names(str(e), body)) from None
    if sampling.prefill_only:
        raise RequestError("max_tokens must be >= 1 in /v1/chat/completions, got 0")
    return ChatRequest(
        messages=messages,
        input_ids=input_ids,
        tools=body.get("tools"),
        tool_names=tool_names,
        parse_tools=bool(tool_names) and tool_choice != "none",
        chat_template_kwargs=kwargs,
        sampling=sampling,
        n=n,
        stream=stream,
        include_usage=bool(options and options.get("include_usage") is True),
        logprobs=logprobs,
        top_logprobs=top,
        rid=rid,
        seed_given=body.get("seed") is not None,
        **flags,
    )

"""OpenAI `chat.completion` answers (and their `chat.completion.chunk` stream) built from `/generate`
answers (pure: the tokenizer is passed in).

Shapes are SGLang 0.5.23's (`srt/entrypoints/openai/protocol.py`): `choices[i].logprobs.content[j]`
= `{token, logprob, bytes, top_logprobs: [{token, logprob, bytes}]}`; `choices[i].prompt_token_ids`
and `response_token_ids` (`return_prompt_token_ids` / `return_token_ids`), `meta_info` (the choice's
`/generate` meta_info, `output_token_logprobs` included: `return_meta_info`), `matched_stop`; a top-
level `metadata.weight_version`. A token's `bytes` are its own bytes (byte-level BPE tokens mapped
back through GPT-2's byte table, as SGLang does, so a piece of a multi-byte character is not U+FFFD);
`token` is its decoded text. The log-probs are the engine's: each token's log-prob under the
distribution it was sampled from (temperature and top-p/top-k applied), the numbers a GRPO trainer
compares with its own.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterator
from dataclasses import dataclass

from grpolab.core.turns.tool_calls import parse_tool_calls
from grpolab.serve.chat_request import ChatRequest

_FINISH = {"stop": "stop", "length": "length", "abort": "abort"}
_TOKEN_TEXTS: dict[int, TokenText] = {}


class TokenText:
    """Each token's text and bytes for logprobs entries, cached per id.

    Args:
        tokenizer: a transformers tokenizer (`convert_ids_to_tokens`, `decode`).
    """

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer
        self._cache: dict[int, tuple[str, list[int]]] = {}
        try:
            from transformers.models.gpt2.tokenization_gpt2 import bytes_to_unicode

            self._byte_of = {c: b for b, c in bytes_to_unicode().items()}
        except ImportError:  # pragma: no cover - transformers always ships it
            self._byte_of = {}

    @classmethod
    def of(cls, tokenizer) -> TokenText:
        """The cache of `tokenizer` (one per tokenizer object: a server has one)."""
        cached = _TOKEN_TEXTS.get(id(tokenizer))
        if cached is None or cached.tokenizer is not tokenizer:
            cached = _TOKEN_TEXTS[id(tokenizer)] = cls(tokenizer)
        return cached

    def __call__(self, token_id: int) -> tuple[str, list[int]]:
        """(decoded text, the token's bytes) of one id."""
        if token_id not in self._cache:
            text = self.tokenizer.decode([token_id], skip_special_tokens=False)
            piece = self.tokenizer.convert_ids_to_tokens(token_id)
            if isinstance(piece, str) and piece and all(c in self._byte_of for c in piece):
                raw = [self._byte_of[c] for c in piece]
            else:
                raw = list(text.encode("utf-8"))
            self._cache[token_id] = (text, raw)
        return self._cache[token_id]


def logprob_entries(out: dict, token_text: TokenText, *, top: int) -> list[dict]:
    """`logprobs.content` of one `/generate` answer (its meta_info's `output_token_logprobs` and, with
    `top` > 0, `output_top_logprobs`)."""
    meta = out["meta_info"]
    rows = meta.get("output_top_logprobs") or [[] for _ in meta.get("output_token_logprobs", [])]
    entries = []
    for (lp, tok, _), alts in zip(meta.get("output_token_logprobs", []), rows):
        text, raw = token_text(tok)
        alternatives = []
        for alt_lp, alt_tok, _ in alts[:top]:
            alt_text, alt_raw = token_text(alt_tok)
            alternatives.append({"token": alt_text, "logprob": alt_lp, "bytes": alt_raw})
        entries.append({"token": text, "logprob": lp, "bytes": raw, "top_logprobs": alternatives})
    return entries


@dataclass(frozen=True)
class Reply:
    """One answer as the assistant's message: `message` (content, and `tool_calls` when parsed), the
    OpenAI `finish_reason`, and how many `<tool_call>` blocks did not parse."""

    message: dict
    finish_reason: str
    parse_errors: int


def reply_message(req: ChatRequest, out: dict) -> Reply:
    """The assistant's message of one `/generate` answer, tool calls parsed when the request asks.

    Built once per answer: the tool-call ids it draws are the ones the client gets and a session keeps.
    """
    finish = out["meta_info"]["finish_reason"]["type"]
    reason = _FINISH.get(finish, "abort")
    message: dict = {"role": "assistant", "content": out["text"]}
    if not req.parse_tools:
        return Reply(message, reason, 0)
    parsed = parse_tool_calls(out["text"], req.tool_names)
    if parsed.calls:
        message["content"] = parsed.content
        message["tool_calls"] = [
            {
                "id": f"call_{secrets.token_hex(12)}",
                "index": i,
                "type": "function",
                "function": {"name": c.name, "arguments": c.arguments},
            }
            for i, c in enumerate(parsed.calls)
        ]
        if reason == "stop":
            reason = "tool_calls"
    return Reply(message, reason, len(parsed.parse_errors))


def choice(
    req: ChatRequest, index: int, out: dict, reply: Reply, prompt_ids: list[int], token_text: TokenText
) -> dict:
    """`choices[index]` of a non-streamed answer, from the choice's `/generate` answer `out` and its
    `reply_message`."""
    reason = reply.finish_reason
    meta = out["meta_info"]
    matched = meta["finish_reason"].get("matched") if reason == "stop" else None
    entry: dict = {
        "index": index,
        "message": reply.message,
        "logprobs": {"content": logprob_entries(out, token_text, top=req.top_logprobs)}
        if req.logprobs
        else None,
        "finish_reason": reason,
        "matched_stop": matched,
    }
    if req.return_prompt_token_ids or req.return_token_ids:
        entry["prompt_token_ids"] = list(prompt_ids)
    if req.return_token_ids:
        entry["response_token_ids"] = list(out["output_ids"])
    if req.return_meta_info:
        entry["meta_info"] = dict(meta, tool_parse_errors=reply.parse_errors)
    return entry


def usage(outs: list[dict], prompt_len: int) -> dict:
    """OpenAI usage: the prompt counted once (all choices share it), completion tokens summed."""
    completion = sum(o["meta_info"]["completion_tokens"] for o in outs)
    return {
        "prompt_tokens": prompt_len,
        "completion_tokens": completion,
        "total_tokens": prompt_len + completion,
    }


def _text_deltas(ids: list[int], final: str, decode) -> list[str]:
    """Per-token pieces of `final` (the answer's text) in token order: piece j is what token j adds
    to the common prefix of `decode(ids[:j+1])` and `final`, so the pieces join to `final` exactly (a
    token ending inside a multi-byte character adds nothing until the character is complete; text
    trimmed by a stop string never appears)."""
    pieces, sent = [], 0
    for j in range(len(ids)):
        text = decode(ids[: j + 1])
        common = 0
        limit = min(len(text), len(final))
        while common < limit and text[common] == final[common]:
            common += 1
        pieces.append(final[sent:common] if common > sent else "")
        sent = max(sent, common)
    if pieces:
        pieces[-1] += final[sent:]
    return pieces


def stream_events(
    req: ChatRequest,
    rid: str,
    created: int,
    model: str,
    outs: list[dict],
    replies: list[Reply],
    prompt_len: int,
    token_text: TokenText,
    decode,
) -> Iterator[str]:
    """The answer as server-sent events (`data: {chunk}\\n\\n` ... `data: [DONE]\\n\\n`).

    Each choice: a role chunk, then one chunk per token (its text piece and, with logprobs, its entry),
    then a chunk with the finish reason; with tools, the content and `tool_calls` come in one chunk
    after the tokens (the parse needs the whole answer). With `stream_options.include_usage`, a last
    chunk with empty choices carries the usage, as OpenAI sends it. The engine decodes a batch as one
    call, so the events are written when the decode ends (`/server_info`'s
    `incremental_streaming_output` is false).
    """

    def event(choices: list[dict], **extra) -> str:
        chunk = {
            "id": rid,
            "object": "chat.completion.chunk",
            "created": created,
            "model": model,
            "choices": choices,
        }
        chunk.update(extra)
        return f"data: {json.dumps(chunk)}\n\n"

    for index, (out, reply) in enumerate(zip(outs, replies)):
        yield event(
            [
                {
                    "index": index,
                    "delta": {"role": "assistant", "content": ""},
                    "logprobs": None,
                    "finish_reason": None,
                }
            ]
        )
        entries = logprob_entries(out, token_text, top=req.top_logprobs) if req.logprobs else None
        reason = reply.finish_reason
        if req.parse_tools:
            yield event([{"index": index, "delta": {k: v for k, v in reply.message.items() if k != "role"},
                          "logprobs": {"content": entries} if entries is not None else None, "finish_reason": None}])  # fmt: skip
        else:
            for j, piece in enumerate(_text_deltas(out["output_ids"], out["text"], decode)):
                logprobs = {"content": [entries[j]]} if entries is not None else None
                yield event(
                    [
                        {
                            "index": index,
                            "delta": {"content": piece},
                            "logprobs": logprobs,
                            "finish_reason": None,
                        }
                    ]
                )
        matched = out["meta_info"]["finish_reason"].get("matched") if reason == "stop" else None
        yield event(
            [
                {
                    "index": index,
                    "delta": {},
                    "logprobs": None,
                    "finish_reason": reason,
                    "matched_stop": matched,
                }
            ]
        )
    if req.include_usage:
        yield event([], usage=usage(outs, prompt_len))
    yield "data: [DONE]\n\n"

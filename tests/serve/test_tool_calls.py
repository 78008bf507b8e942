"""Tool calls, stop strings and chat answers built without a server (core/turns/tool_calls.py, serve/stops.py,
chat_response.py), checked against the real `openai` package's response types."""

from __future__ import annotations

import openai.types.chat as oa
import pytest
from transformers import AutoTokenizer

from grpolab.core.turns.tool_calls import parse_tool_calls
from grpolab.serve.chat_request import parse_chat
from grpolab.serve.chat_response import TokenText, choice, reply_message
from grpolab.serve.stops import find_stop

CALL = '<tool_call>\n{"name": "calc", "arguments": {"expression": "3 + 4"}}\n</tool_call>'


def test_a_call_becomes_a_tool_call_and_leaves_the_text_around_it():
    parsed = parse_tool_calls("Let me compute.\n" + CALL + "\n" + CALL.replace("3 + 4", "7 * 2"), ["calc"])
    assert parsed.content == "Let me compute."
    assert [(c.name, c.arguments) for c in parsed.calls] == [
        ("calc", '{"expression": "3 + 4"}'),
        ("calc", '{"expression": "7 * 2"}'),
    ]
    assert parsed.parse_errors == []


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ('<tool_call>{"name": "calc", "arguments": {"expression": 3 +}}</tool_call>', "not JSON"),
        ('<tool_call>{"arguments": {}}</tool_call>', 'a string "name"'),
        ('<tool_call>{"name": "search", "arguments": {}}</tool_call>', "'search', which the request's tools"),
        ('<tool_call>{"name": "calc", "arguments": [1]}</tool_call>', "are not an object"),
        ('<tool_call>{"name": "calc", "arguments": {"expression": "1"}}', "no closing </tool_call>"),
    ],
)
def test_a_block_that_does_not_parse_stays_the_models_text(text, error):
    parsed = parse_tool_calls("answer: " + text, ["calc"])
    assert parsed.calls == [] and parsed.content == "answer: " + text
    assert len(parsed.parse_errors) == 1 and error in parsed.parse_errors[0]


def test_arguments_written_as_a_json_text_are_accepted():
    parsed = parse_tool_calls(
        '<tool_call>{"name": "calc", "arguments": "{\\"expression\\": \\"1\\"}"}</tool_call>'
    )
    assert parsed.calls[0].arguments == '{"expression": "1"}' and parsed.content == ""


def _out(text: str, ids: list[int], finish: dict) -> dict:
    meta = {
        "finish_reason": finish, "prompt_tokens": 3, "completion_tokens": len(ids), "weight_version": "3",
        "output_token_logprobs": [[-0.5, t, None] for t in ids],
    }  # fmt: skip
    return {"text": text, "output_ids": ids, "meta_info": meta}


def test_a_parsed_answer_is_a_valid_openai_chat_completion(tiny_model_dir):
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    body = {
        "messages": [{"role": "user", "content": "3 + 4?"}], "logprobs": True, "return_token_ids": True,
        "tools": [{"type": "function", "function": {"name": "calc", "parameters": {"type": "object"}}}],
    }  # fmt: skip
    req = parse_chat(body, eos_ids=(0,), deterministic=True)
    text = "Sure. " + CALL
    ids = tok.encode(text, add_special_tokens=False)
    out = _out(text, ids, {"type": "stop", "matched": 0})
    ch = choice(req, 0, out, reply_message(req, out), [1, 2, 3], TokenText(tok))
    full = {"id": "x", "object": "chat.completion", "created": 0, "model": "m", "choices": [ch]}
    parsed = oa.ChatCompletion.model_validate(full)
    call = parsed.choices[0].message.tool_calls[0]
    assert call.function.name == "calc" and call.function.arguments == '{"expression": "3 + 4"}'
    assert parsed.choices[0].finish_reason == "tool_calls" and parsed.choices[0].message.content == "Sure."
    assert ch["response_token_ids"] == ids and ch["prompt_token_ids"] == [1, 2, 3]
    assert b"".join(bytes(e["bytes"]) for e in ch["logprobs"]["content"]).decode() == text
    bad_out = _out("<tool_call>{bad</tool_call>", ids, {"type": "stop", "matched": 0})
    bad = choice(req, 0, bad_out, reply_message(req, bad_out), [1], TokenText(tok))
    assert bad["message"] == {"role": "assistant", "content": "<tool_call>{bad</tool_call>"}
    assert bad["finish_reason"] == "stop"


def test_a_stop_string_across_tokens_is_found_at_the_token_that_completes_it(tiny_model_dir):
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    ids = tok.encode("12 + 30 = 42\n#### 42", add_special_tokens=False)

    def decode(xs) -> str:
        return tok.decode(list(xs))

    for stop in ("= 4", "####", "\n#", "2", "42\n", "30 ="):
        cut = find_stop(ids, decode, [stop, "zzz"], no_stop_trim=False)
        linear = next(k for k in range(1, len(ids) + 1) if stop in decode(ids[:k]))
        assert cut is not None and cut.keep == linear and cut.matched == stop
        assert cut.text == decode(ids[:linear])[: decode(ids[:linear]).index(stop)]
    assert find_stop(ids, decode, ["zzz", ""], no_stop_trim=False) is None
    both = find_stop(ids, decode, ["####", "="], no_stop_trim=True)
    assert both.matched == "=" and both.text.endswith("=")

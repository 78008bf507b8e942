"""`/v1/chat/completions` as an RL agent uses it, through the real `openai` package (sync, async,
streaming) against one `grpolab serve --enable-deterministic-inference` (tiny-qwen3)."""

from __future__ import annotations

import asyncio
import json
import re
import urllib.request

import openai
import pytest
from serving import CONTRACT, start_server, stop_server

from grpolab.serve.chat_request import CHAT_KEYS

USER = [{"role": "user", "content": "Tom has 3 apples and buys 4 more. How many apples does Tom have?"}]


@pytest.fixture(scope="module")
def server(tiny_model_dir):
    s = start_server(tiny_model_dir, "--enable-deterministic-inference")
    yield s
    assert stop_server(s) == 143


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


def test_the_known_fields_are_sglangs_chat_completion_request():
    src = (CONTRACT.parents[2] / "srt" / "entrypoints" / "openai" / "protocol.py").read_text()

    def fields(cls: str) -> list[str]:
        body = src[src.index(f"class {cls}(") :]
        body = body[body.index("\n") + 1 :]
        body = body[
            : min(i for i in (body.find("\n    def "), body.find("\n    @"), body.find("\nclass ")) if i > 0)
        ]
        return [f for f in re.findall(r"(?m)^    ([a-z_][a-z0-9_]*)\s*:", body) if not f.startswith("_")]

    assert CHAT_KEYS == tuple(fields("PDRoutingFields") + fields("ChatCompletionRequest"))


def test_logprobs_token_ids_and_meta_info_are_the_engines_own(server, client):
    """Each choice's tokens and log-probs are bitwise those of /generate on the same prompt ids and seed
    (choice i samples with seed + i), in OpenAI's logprobs shape and SGLang's token-id fields."""
    r = client.chat.completions.create(
        model="tiny-qwen3", messages=USER, max_tokens=12, seed=7, n=2, logprobs=True, top_logprobs=3,
        extra_body={"return_token_ids": True, "return_meta_info": True},
    )  # fmt: skip
    assert len(r.choices) == 2 and r.to_dict()["metadata"]["weight_version"] == "default"
    prompt = r.choices[0].model_extra["prompt_token_ids"]
    assert r.usage.prompt_tokens == len(prompt)  # counted once for both choices
    assert r.usage.completion_tokens == sum(len(c.model_extra["response_token_ids"]) for c in r.choices)
    for i, ch in enumerate(r.choices):
        ids, meta = ch.model_extra["response_token_ids"], ch.model_extra["meta_info"]
        body = {
            "input_ids": prompt,
            "return_logprob": True,
            "sampling_params": {"max_new_tokens": 12, "sampling_seed": 7 + i},
        }
        ref = server.call("/generate", body).body
        assert ids == ref["output_ids"] and ch.message.content == ref["text"]
        assert [e.logprob for e in ch.logprobs.content] == [
            lp for lp, _, _ in ref["meta_info"]["output_token_logprobs"]
        ]
        assert meta["output_token_logprobs"] == ref["meta_info"]["output_token_logprobs"]
        assert meta["weight_version"] == "default" and meta["completion_tokens"] == len(ids)
        assert meta["prompt_tokens"] == len(prompt) and ch.finish_reason == meta["finish_reason"]["type"]
        assert len(ch.logprobs.content) == len(ids)
        for entry in ch.logprobs.content:
            tops = entry.top_logprobs
            assert len(tops) == 3 and [t.logprob for t in tops] == sorted(
                (t.logprob for t in tops), reverse=True
            )
            assert entry.logprob <= tops[0].logprob
            assert bytes(entry.bytes).decode("utf-8", "replace") == entry.token or len(entry.bytes) == 0
    assert r.choices[0].model_extra["response_token_ids"] != r.choices[1].model_extra["response_token_ids"]


def test_streaming_sends_the_same_answer_token_by_token(server, client):
    kwargs = dict(model="tiny-qwen3", messages=USER, max_tokens=16, seed=3, logprobs=True)
    whole = client.chat.completions.create(**kwargs)
    text, logprobs, finish, usage = "", [], None, None
    for chunk in client.chat.completions.create(
        **kwargs, stream=True, stream_options={"include_usage": True}
    ):
        if not chunk.choices:
            usage = chunk.usage
            continue
        text += chunk.choices[0].delta.content or ""
        if chunk.choices[0].logprobs and chunk.choices[0].logprobs.content:
            logprobs += chunk.choices[0].logprobs.content
        finish = chunk.choices[0].finish_reason or finish
    assert text == whole.choices[0].message.content and finish == whole.choices[0].finish_reason
    assert [e.logprob for e in logprobs] == [e.logprob for e in whole.choices[0].logprobs.content]
    assert usage.completion_tokens == whole.usage.completion_tokens == len(logprobs)
    raw = urllib.request.urlopen(
        urllib.request.Request(
            server.url + "/v1/chat/completions",
            data=json.dumps({"messages": USER, "max_tokens": 4, "stream": True}).encode(),
            headers={"Content-Type": "application/json"},
        )
    ).read().decode()  # fmt: skip
    assert raw.startswith("data: {") and raw.endswith("data: [DONE]\n\n")


def test_the_async_client_gets_concurrent_answers_that_repeat(server):
    async def main() -> list[str]:
        aclient = openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
        calls = [
            aclient.chat.completions.create(model="tiny-qwen3", messages=USER, max_tokens=8, seed=s)
            for s in (1, 2, 1)
        ]
        answers = await asyncio.gather(*calls)
        stream = await aclient.chat.completions.create(
            model="tiny-qwen3", messages=USER, max_tokens=8, seed=1, stream=True
        )
        streamed = "".join([chunk.choices[0].delta.content or "" async for chunk in stream if chunk.choices])
        await aclient.close()
        return [a.choices[0].message.content for a in answers] + [streamed]

    a, b, c, streamed = asyncio.run(main())
    assert a == c == streamed and isinstance(b, str)


def test_stop_strings_cut_the_answer_as_a_stopping_decode_would(server, client):
    base = dict(
        model="tiny-qwen3", messages=USER, max_tokens=24, seed=5, extra_body={"return_token_ids": True}
    )
    free = client.chat.completions.create(**base).choices[0]
    assert "=" in free.message.content, free.message.content  # the tiny model writes "a + b = c"
    cut = client.chat.completions.create(**base, stop=["=", "never"]).choices[0]
    kept = cut.model_extra["response_token_ids"]
    assert cut.finish_reason == "stop" and cut.model_extra["matched_stop"] == "="
    assert free.model_extra["response_token_ids"][: len(kept)] == kept and len(kept) < len(
        free.model_extra["response_token_ids"]
    )
    assert cut.message.content == free.message.content[: free.message.content.index("=")]
    kept_body = dict(base["extra_body"], no_stop_trim=True)
    untrimmed = client.chat.completions.create(**dict(base, extra_body=kept_body), stop="=").choices[0]
    assert untrimmed.message.content == cut.message.content + "="
    body = {
        "input_ids": cut.model_extra["prompt_token_ids"],
        "sampling_params": {"max_new_tokens": 24, "sampling_seed": 5, "stop": "="},
    }
    gen = server.call("/generate", body).body
    assert gen["output_ids"] == kept and gen["meta_info"]["finish_reason"] == {"type": "stop", "matched": "="}


def test_top_logprobs_stay_inside_the_kept_support(server):
    body = {
        "input_ids": [1, 2, 3], "top_logprobs_num": 5, "return_logprob": True,
        "sampling_params": {"max_new_tokens": 6, "top_k": 2, "sampling_seed": 1},
    }  # fmt: skip
    meta = server.call("/generate", body).body["meta_info"]
    for (lp, tok, _), tops in zip(meta["output_token_logprobs"], meta["output_top_logprobs"]):
        assert 1 <= len(tops) <= 2 and tok in [t for _, t, _ in tops] and lp in [v for v, _, _ in tops]


def test_tools_reach_the_template_and_a_plain_answer_stays_text(client):
    tools = [{"type": "function", "function": {"name": "calc", "parameters": {"type": "object"}}}]
    r = client.chat.completions.create(model="tiny-qwen3", messages=USER, max_tokens=6, seed=1, tools=tools)
    assert isinstance(r.choices[0].message.content, str) and r.choices[0].message.tool_calls is None
    history = USER + [
        {"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "calc", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "7"},
    ]  # fmt: skip
    r = client.chat.completions.create(
        model="tiny-qwen3", messages=history, max_tokens=4, seed=1, tools=tools
    )
    assert isinstance(r.choices[0].message.content, str)
    calls_only = [{**history[1], "content": None}]  # OpenAI's shape of a turn that only called tools
    history = [history[0], *calls_only, *history[2:]]
    r = client.chat.completions.create(
        model="tiny-qwen3", messages=history, max_tokens=4, seed=1, tools=tools
    )
    assert isinstance(r.choices[0].message.content, str)


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        ({"retrun_token_ids": True}, "unknown field(s) 'retrun_token_ids'"),
        ({"logprobs": "yes"}, "logprobs must be true or false"),
        ({"top_logprobs": 2}, "top_logprobs needs logprobs: true"),
        ({"logprobs": True, "top_logprobs": 21}, "top_logprobs must be an integer in [0, 20]"),
        ({"n": 0}, "n must be an integer in [1, 64]"),
        ({"stream": True, "return_token_ids": True}, "return_token_ids is not supported with streaming"),
        ({"tool_choice": "required"}, "tool_choice = 'required'"),
        ({"tools": [{"type": "function"}]}, "tools[0] must be {type: function"),
        ({"frequency_penalty": 0.5}, "does not support frequency_penalty = 0.5"),
        ({"stop": [1]}, "stop must be a string or a list of strings"),
        ({"tool_choice": "sometimes"}, "tool_choice must be auto, none, required or {type: function"),
        ({"seed": 2**64}, "seed must be an integer in [-2**63, 2**63 - 1]"),
        ({"max_tokens": -1}, "max_tokens must be >= 0"),
        ({"messages": [{"role": "user", "content": None}]}, "messages[0] (user) needs a string content"),
        ({"messages": [{"role": 5, "content": "hi"}]}, "messages[0] has role 5; expected one of system"),
        ({"max_tokens": "5"}, "max_tokens must be an integer, got '5'"),
        ({"temperature": "hot"}, "temperature must be a number"),
        (
            {"stream": True, "stream_options": {"include_usage": "yes"}},
            "stream_options must be {include_usage: bool}",
        ),
    ],
)
def test_a_request_the_server_cannot_honour_is_a_400_naming_the_field(server, extra, needle):
    ans = server.call("/v1/chat/completions", {"messages": USER, "max_tokens": 2, **extra})
    assert ans.status == 400 and needle in ans.body["error"]["message"], ans.text


def test_the_openai_client_raises_on_an_unknown_field(client):
    with pytest.raises(openai.BadRequestError, match="unknown field"):
        client.chat.completions.create(
            model="tiny-qwen3", messages=USER, extra_body={"return_tokens_ids": True}
        )


def test_a_body_that_is_not_json_is_a_400_in_the_openai_error_shape(server):
    """The shape the `openai` client reads its message from, as every other error of these routes."""
    session = server.call("/sessions", {}).body["session_id"]
    for path in ("/v1/chat/completions", f"/sessions/{session}/v1/chat/completions"):
        headers = {"Content-Type": "application/json"}
        req = urllib.request.Request(server.url + path, data=b"{not json", headers=headers)
        with pytest.raises(urllib.error.HTTPError) as answer:
            urllib.request.urlopen(req)
        assert answer.value.code == 400
        assert "not valid JSON" in json.loads(answer.value.read())["error"]["message"]

"""Token-in/token-out sessions over real HTTP (`grpolab serve`, tiny-qwen3) with the real `openai`
client pointed at a session URL, as an agent would use it."""

from __future__ import annotations

import openai
import pytest
from serving import start_server, stop_server
from transformers import AutoTokenizer

from grpolab.core.turns.record import TemplateNotIncremental, TokenRecord, add_reply, append_turn

USER = {"role": "user", "content": "Tom has 3 apples and buys 4 more. How many apples does Tom have?"}
TOOL = {"role": "tool", "content": "7"}


@pytest.fixture(scope="module")
def server(tiny_model_dir):
    s = start_server(tiny_model_dir, "--enable-deterministic-inference")
    yield s
    assert stop_server(s) == 143


def _session(server) -> tuple[str, openai.OpenAI]:
    sid = server.call("/sessions", {}).body["session_id"]
    return sid, openai.OpenAI(base_url=f"{server.url}/sessions/{sid}/v1", api_key="unused", max_retries=0)


def _turn(client, messages, **kw):
    r = client.chat.completions.create(
        model="m", messages=messages, extra_body={"return_token_ids": True}, **kw
    ).choices[0]
    return r, r.message.model_dump(exclude_none=True)


def test_each_turn_is_the_last_turns_ids_plus_only_the_new_messages(server, tiny_model_dir):
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    sid, client = _session(server)
    first, reply1 = _turn(client, [USER], max_tokens=24, seed=1)
    assert first.finish_reason == "stop"  # ends in <|im_end|>: the template's "\n" is the boundary
    history = [USER, reply1, TOOL]
    second, reply2 = _turn(client, history, max_tokens=2, seed=2)  # cut by the length limit
    third, _ = _turn(client, history + [reply2, USER], max_tokens=8, seed=3)
    rec = server.call(f"/sessions/{sid}").body
    ids, sources, turns = rec["input_ids"], rec["sources"], rec["turns"]
    assert rec["num_turns"] == 3 and rec["finish_reasons"] == ["stop", "length", third.finish_reason]
    for k, ch in enumerate((first, second, third), start=1):
        model_ids = [t for t, s, u in zip(ids, sources, turns) if s == "model" and u == k]
        assert model_ids == ch.model_extra["response_token_ids"]  # the sampled ids, exactly
        start = next(i for i, (s, u) in enumerate(zip(sources, turns)) if s == "model" and u == k)
        assert ids[:start] == ch.model_extra["prompt_token_ids"]  # turn k's prompt is the record so far

    def text_of(source: str, turn: int) -> str:
        return tok.decode([t for t, s, u in zip(ids, sources, turns) if s == source and u == turn])

    assert text_of("boundary", 1) == "\n<|im_start|>assistant\n"  # after <|im_end|>, then the gen prompt
    assert text_of("boundary", 2) == "<|im_end|>\n<|im_start|>assistant\n"  # the cut reply is closed
    assert text_of("tool", 1) == "<|im_start|>tool\n7<|im_end|>\n" and "Tom has 3" in text_of("user", 2)
    response = sources[rec["prompt_length"] :]
    assert rec["loss_mask"] == [int(s == "model") for s in response] and rec["response_length"] == len(
        response
    )
    assert rec["trainable_tokens"] == sum(
        len(c.model_extra["response_token_ids"]) for c in (first, second, third)
    )
    assert all((lp is None) == (s != "model") for lp, s in zip(rec["logprobs"], sources))
    assert {v for v, s in zip(rec["weight_versions"], sources) if s == "model"} == {"default"}
    assert rec["messages"][-1]["role"] == "assistant" and len(rec["messages"]) == 6


def test_keys_a_client_library_adds_empty_are_not_a_rewrite(server):
    """openai's `model_dump()` of a reply carries refusal/annotations/audio/function_call as null and the
    tool calls' ids: the same message."""
    sid, client = _session(server)
    first = client.chat.completions.create(model="m", messages=[USER], max_tokens=6, seed=1).choices[0]
    reply = first.message.model_dump()
    assert {"refusal", "audio", "function_call"} <= set(reply)
    ans = server.call(
        f"/sessions/{sid}/v1/chat/completions", {"messages": [USER, reply, TOOL], "max_tokens": 2}
    )
    assert ans.status == 200, ans.text


def test_a_rewritten_history_is_a_409_and_a_failed_turn_changes_nothing(server):
    sid, client = _session(server)
    _, reply = _turn(client, [USER], max_tokens=6, seed=1)
    before = server.call(f"/sessions/{sid}").body
    cases = [
        ([dict(USER, content="Tom has 5 apples."), reply, TOOL], 0, "messages[0] (user) differs"),
        ([USER, dict(reply, content="7"), TOOL], 1, "differs from the session's reply"),
        ([dict(USER, name="tom"), reply, TOOL], 0, "messages[0] (user) differs"),  # a template may render it
        ([USER, dict(reply, name="bot"), TOOL], 1, "differs from the session's reply"),
        ([USER, reply], 2, "appends no message"),
        ([USER], 1, "the history has 1 messages but the session holds 2"),
    ]
    for messages, turn, needle in cases:
        ans = server.call(f"/sessions/{sid}/v1/chat/completions", {"messages": messages, "max_tokens": 2})
        assert (
            ans.status == 409 and ans.body["error"]["turn"] == turn and needle in ans.body["error"]["message"]
        )
    too_long = server.call(
        f"/sessions/{sid}/v1/chat/completions", {"messages": [USER, reply, TOOL], "max_tokens": 100000}
    )
    assert too_long.status == 400 and "maximum context length" in too_long.text
    parts = {
        "role": "tool",
        "content": [{"type": "text", "text": "7"}],
    }  # text models' string content only
    ans = server.call(
        f"/sessions/{sid}/v1/chat/completions", {"messages": [USER, reply, parts], "max_tokens": 2}
    )
    assert ans.status == 400 and "has a list of content parts" in ans.text
    after = server.call(f"/sessions/{sid}").body
    assert after.pop("last_error").startswith(
        "400: messages[2] (tool) has a list of content parts"
    )  # for the runner
    assert after == before
    for body, needle in (
        ({"messages": [USER], "n": 2}, "n must be 1"),
        ({"input_ids": [1, 2]}, "input_ids is refused"),
    ):
        ans = server.call(f"/sessions/{sid}/v1/chat/completions", body)
        assert ans.status == 400 and needle in ans.text


def test_an_unknown_or_closed_session_is_a_404(server):
    sid, client = _session(server)
    assert server.call(f"/sessions/{sid}", method="DELETE").body == {"success": True}
    for path, body in (
        (f"/sessions/{sid}", None),
        ("/sessions/nope/v1/chat/completions", {"messages": [USER]}),
    ):
        ans = server.call(path, body)
        assert ans.status == 404 and "no session" in ans.body["error"]["message"]


def test_a_template_that_rewrites_earlier_turns_is_refused():
    """A template that renders the last assistant turn differently from earlier ones (as templates that
    strip reasoning from past turns do) cannot give exact turns: refused, not re-tokenised."""

    def render(messages: list, generation_prompt: bool) -> str:
        parts = []
        for i, m in enumerate(messages):
            content = m["content"] if i == len(messages) - 1 or m["role"] != "assistant" else "[...]"
            parts.append(f"<{m['role']}>{content}</s>")
        return "".join(parts) + ("<assistant>" if generation_prompt else "")

    record = TokenRecord()
    record.add([1, 2], "prompt", 0)
    record.prompt_length, record.messages = 2, [USER]
    add_reply(record, [5, 6], [-0.1, -0.2], "1", {"role": "assistant", "content": "hm"}, "stop")
    with pytest.raises(TemplateNotIncremental, match=r"messages\[2\] \(tool\)"):
        append_turn(record, [TOOL], render, lambda text: [len(text)], lambda ids: "hm</s>")


def test_truncate_cuts_the_record_and_its_turns():
    """A budget spent inside model turn 2: turn 2 ends "length" with the tokens kept; turn 3 is gone."""
    record = TokenRecord(prompt_length=2, messages=[USER])
    record.add([1, 2], "prompt", 0)
    for turn, ids in enumerate(([5, 6], [7, 8, 9], [10]), 1):
        add_reply(record, ids, [-0.5] * len(ids), "1", {"role": "assistant", "content": "x"}, "stop")
        record.add([3], "tool", turn)
    assert not record.truncate(len(record.ids))
    assert record.truncate(7)  # prompt 2, turn 1: 2 + tool 1, turn 2: 2 of its 3
    assert record.ids == [1, 2, 5, 6, 3, 7, 8] and record.sources[-1] == "model"
    assert record.reply_lengths == [2, 2] and record.finish_reasons == ["stop", "length"]
    assert record.loss_mask() == [1, 1, 0, 1, 1]
    assert [m["role"] for m in record.messages] == ["user", "assistant", "assistant"]  # turn 3's reply gone
    record.messages = record.messages[:2] + [TOOL] + record.messages[2:3]  # as the turns appended them
    assert record.truncate(5) and record.reply_lengths == [2] and record.finish_reasons == ["stop"]
    assert record.messages == [USER, record.messages[1], TOOL]  # turn 2's reply gone, the tool kept


def test_open_takes_no_fields_and_wrong_methods_answer_json(server):
    assert server.call("/sessions", method="POST").status == 200  # no body at all
    ans = server.call("/sessions", {"capacity_of_str_len": 100})
    assert (
        ans.status == 400
        and "POST /sessions takes only 'count', got 'capacity_of_str_len'" in ans.body["error"]["message"]
    )
    many = server.call("/sessions", {"count": 3})  # a rollout's episodes open theirs in one request
    assert many.status == 200 and len(set(many.body["session_ids"])) == 3
    assert all(
        server.call(f"/sessions/{sid}", method="GET").status == 200 for sid in many.body["session_ids"]
    )
    for bad in (0, -1, 2.5, True, "3", None):
        ans = server.call("/sessions", {"count": bad})
        assert ans.status == 400 and "'count' must be an integer >= 1" in ans.body["error"]["message"], bad
    ans = server.call("/sessions", {"count": 5000})
    assert ans.status == 503 and "at most 1024 sessions" in ans.body["error"]["message"]
    wrong = server.call("/sessions", method="GET")  # the route takes POST only
    assert wrong.status == 405 and wrong.body == {"detail": "Method Not Allowed"}
    missing = server.call("/no_such_route")
    assert missing.status == 404 and missing.body == {"detail": "Not Found"}

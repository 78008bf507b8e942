"""`/generate` over real HTTP against one `grpolab serve` (tiny-qwen3): SGLang's contract, batching,
bitwise agreement with the in-process engine, and the 400s SGLang gives."""

from __future__ import annotations

import threading
import time

import pytest
import torch
from serving import start_server, stop_server

from grpolab.core.engine.base import GenerationRequest, SamplingParams
from grpolab.core.engine.torch_engine import TorchEngine
from grpolab.serve.batching import rid_order

EOS = 2  # tiny-qwen3's eos (generation_config.json)
PROMPTS = [[1, 17, 33, 5], [9, 8], [100, 200, 300]]


@pytest.fixture(scope="module")
def server(tiny_model_dir):
    s = start_server(tiny_model_dir)
    yield s
    assert stop_server(s) == 143  # 128 + SIGTERM, after the graceful shutdown


@pytest.fixture(scope="module")
def engine(tiny_model_dir):
    return TorchEngine(tiny_model_dir, show_progress=False)


def generate(server, contract, body: dict):
    """POST /generate after checking the body against SGLang's GenerateRequest; check every answer
    against GenerateResponse; return the answer."""
    contract.GenerateRequest.from_json_value(body)
    ans = server.call("/generate", body)
    assert ans.status == 200, ans.text
    for one in ans.body if isinstance(ans.body, list) else [ans.body]:
        contract.GenerateResponse.from_json_value(one)
    return ans.body


def stats(server) -> dict:
    return server.call("/server_info").body["internal_states"][0]


def test_single_response_shape(server, contract):
    body = {
        "input_ids": PROMPTS[0],
        "sampling_params": {
            "max_new_tokens": 6,
            "temperature": 1.0,
            "sampling_seed": 5,
            "stop_token_ids": [EOS],
        },
        "return_logprob": True,
        "rid": "r-single",
    }
    out = generate(server, contract, body)
    meta = out["meta_info"]
    n = len(out["output_ids"])
    assert 1 <= n <= 6 and meta["completion_tokens"] == n and meta["prompt_tokens"] == 4
    assert meta["id"] == "r-single"
    assert [t[1] for t in meta["output_token_logprobs"]] == out["output_ids"]
    assert all(t[2] is None and t[0] <= 0 for t in meta["output_token_logprobs"])
    if meta["finish_reason"]["type"] == "stop":
        assert meta["finish_reason"]["matched"] == EOS == out["output_ids"][-1]
    else:
        assert meta["finish_reason"] == {"type": "length", "length": 6}
    assert meta["weight_version"] == "default"
    assert meta["weight_versions"] == [{"version": "default", "start": 0, "end": n}]


def test_batch_and_sampling_mask(server, contract, engine):
    """A batch request: one answer per prompt, in order; top-k 5 masks hold 5 ids with the token in them."""
    params = {"max_new_tokens": 4, "top_k": 5, "ignore_eos": True, "sampling_seed": 11}
    body = {"input_ids": PROMPTS, "sampling_params": params, "rid": "b"}
    out = generate(server, contract, {**body, "return_logprob": True, "return_sampling_mask": True})
    assert [o["meta_info"]["id"] for o in out] == ["b_0", "b_1", "b_2"]
    for o in out:
        masks = o["meta_info"]["output_token_sampling_mask"]
        assert o["meta_info"]["finish_reason"] == {"type": "length", "length": 4}
        assert len(masks) == 4 and all(len(m) == 5 and t in m for m, t in zip(masks, o["output_ids"]))
        lps = [t[0] for t in o["meta_info"]["output_token_logprobs"]]
        assert o["meta_info"]["output_token_sampling_logprobs"] == lps
    # the in-process engine, same seed for the three (one dict for all), same batch: bitwise
    reqs = [GenerationRequest(prompt_ids=p, seed=11) for p in PROMPTS]
    local = engine.generate(reqs, SamplingParams(top_k=5, max_new_tokens=4))
    for o, r in zip(out, local):
        assert o["output_ids"] == r.response_ids
        assert [m for m in o["meta_info"]["output_token_sampling_mask"]] == [
            k.tolist() for k in r.kept_token_ids
        ]


@pytest.mark.parametrize("seed", [0, 1234567, -5])
def test_bitwise_equal_to_in_process_engine(server, contract, engine, seed):
    """Same prompt, seed and settings: the server's tokens and float32 log-probs equal the engine's."""
    body = {
        "input_ids": PROMPTS[1],
        "sampling_params": {"max_new_tokens": 12, "temperature": 0.8, "top_p": 0.9, "sampling_seed": seed},
        "return_logprob": True,
    }
    out = generate(server, contract, body)
    (ref,) = engine.generate(
        [GenerationRequest(prompt_ids=PROMPTS[1], seed=seed)],
        SamplingParams(temperature=0.8, top_p=0.9, max_new_tokens=12, stop_token_ids=(EOS,)),
    )
    assert out["output_ids"] == ref.response_ids
    served = torch.tensor([t[0] for t in out["meta_info"]["output_token_logprobs"]], dtype=torch.float32)
    assert torch.equal(served, ref.log_probs)
    assert out["meta_info"]["finish_reason"]["type"] == ref.finish_reason


def test_greedy_is_temperature_zero(server, contract, engine):
    body = {
        "input_ids": PROMPTS[2],
        "sampling_params": {"max_new_tokens": 5, "temperature": 0, "ignore_eos": True},
    }
    out = generate(server, contract, body)
    (ref,) = engine.generate(
        [GenerationRequest(prompt_ids=PROMPTS[2], seed=0)], SamplingParams(top_k=1, max_new_tokens=5)
    )
    assert out["output_ids"] == ref.response_ids


def _send_concurrently(server, contract, bodies: list[dict]) -> list:
    answers: list = [None] * len(bodies)

    def one(i: int) -> None:
        answers[i] = generate(server, contract, bodies[i])

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(bodies))]
    for t in threads:
        t.start()
    return answers, threads


def _wait_for(server, key: str, value: int, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while stats(server)[key] != value:
        assert time.monotonic() < deadline, f"{key} never reached {value}: {stats(server)}"
        time.sleep(0.02)


def test_concurrent_requests_share_one_decode(server, contract):
    """Eight single requests queued while paused run as one batch (one engine.generate call); while
    they wait, /flush_cache and /release_memory_occupation refuse."""
    assert server.call("/pause_generation", {"mode": "in_place"}).status == 200
    before = stats(server)
    bodies = [
        {
            "input_ids": [i + 1, 7],
            "sampling_params": {"max_new_tokens": 3, "sampling_seed": i},
            "rid": f"c{i}",
        }
        for i in range(8)
    ]
    answers, threads = _send_concurrently(server, contract, bodies)
    _wait_for(server, "waiting_requests", 8)
    flush = server.call("/flush_cache", {})
    assert flush.status == 400 and "8 waiting" in flush.text
    release = server.call("/release_memory_occupation", {"tags": ["weights"]})
    assert release.status == 400 and "idle" in release.body["error"]["message"]
    assert server.call("/continue_generation", {}).status == 200
    for t in threads:
        t.join(60)
    after = stats(server)
    assert after["batches"] - before["batches"] == 1
    assert after["recent_batch_sizes"][-1] == 8
    assert [a["meta_info"]["id"] for a in answers] == [f"c{i}" for i in range(8)]
    # the decode's own seconds: within each request's end-to-end time (which includes the pause)
    assert 0 < after["last_batch_seconds"] <= min(a["meta_info"]["e2e_latency"] for a in answers)


def test_a_batch_decodes_in_rid_order_bitwise_like_one_in_process_call(server, contract, engine):
    """Requests arriving in reverse order decode as rows sorted by rid ("q-2" before "q-10"), so their
    log-probs equal the in-process engine's for the rid-ordered list, bit for bit (reversed rows give
    other float32 bits on this model: max |diff| ~3e-6 measured)."""
    prompts = [[1 + i, 17, 33, 5, 9][: 2 + i % 4] for i in range(12)]
    params = {"max_new_tokens": 20, "stop_token_ids": [EOS], "temperature": 1.0}
    bodies = [
        {
            "input_ids": p,
            "sampling_params": {**params, "sampling_seed": i},
            "rid": f"q-{i}",
            "return_logprob": True,
        }
        for i, p in enumerate(prompts)
    ]
    assert server.call("/pause_generation", {"mode": "in_place"}).status == 200
    answers: list = [None] * len(bodies)
    threads = []
    for k, i in enumerate(reversed(range(len(bodies)))):  # arrival order: q-11 first, q-0 last
        got, started = _send_concurrently(server, contract, [bodies[i]])
        threads.append((i, got, started))
        _wait_for(server, "waiting_requests", k + 1)
    assert server.call("/continue_generation", {}).status == 200
    for i, got, started in threads:
        started[0].join(60)
        answers[i] = got[0]
    assert stats(server)["recent_batch_sizes"][-1] == len(bodies)
    sp = SamplingParams(temperature=1.0, max_new_tokens=20, stop_token_ids=(EOS,))
    local = engine.generate([GenerationRequest(prompt_ids=p, seed=i) for i, p in enumerate(prompts)], sp)
    for a, r in zip(answers, local):
        assert a["output_ids"] == r.response_ids
        served = torch.tensor([t[0] for t in a["meta_info"]["output_token_logprobs"]], dtype=torch.float32)
        assert torch.equal(served, r.log_probs), a["meta_info"]["id"]


@pytest.mark.parametrize(
    ("rids", "ordered"),
    [
        (["r_10", "r_2", "r_1"], ["r_1", "r_2", "r_10"]),
        (
            ["grpolab-ab12-3-10", "grpolab-ab12-3-9", "grpolab-ab12-2-11"],
            ["grpolab-ab12-2-11", "grpolab-ab12-3-9", "grpolab-ab12-3-10"],
        ),
        (["b", "7", "a1", "a"], ["7", "a", "a1", "b"]),
    ],
)
def test_rid_order_compares_digit_runs_as_numbers(rids, ordered):
    assert sorted(rids, key=rid_order) == ordered


def test_requests_arriving_during_a_batch_join_the_next(server, contract):
    before = stats(server)
    long = {
        "input_ids": [5, 6],
        "sampling_params": {"max_new_tokens": 100, "ignore_eos": True, "sampling_seed": 1},
    }
    first, t_first = _send_concurrently(server, contract, [long])
    _wait_for(server, "running_requests", 1)
    bodies = [{"input_ids": [i + 3], "sampling_params": {"max_new_tokens": 2}} for i in range(3)]
    rest, t_rest = _send_concurrently(server, contract, bodies)
    for t in t_first + t_rest:
        t.join(120)
    after = stats(server)
    assert after["recent_batch_sizes"][-2:] == [1, 3]
    assert after["batches"] - before["batches"] == 2
    assert len(first[0]["output_ids"]) == 100 and all(len(r["output_ids"]) == 2 for r in rest)


def test_abort_a_queued_request(server, contract):
    assert server.call("/pause_generation", {"mode": "retract"}).status == 200
    answers, threads = _send_concurrently(
        server, contract, [{"input_ids": [3, 4], "rid": "to-abort", "return_logprob": True}]
    )
    _wait_for(server, "waiting_requests", 1)
    abort = {"rid": "to-abort"}
    contract.AbortRequest.from_json_value(abort)
    ans = server.call("/abort_request", abort)
    assert ans.status == 200 and ans.text == ""
    threads[0].join(30)
    assert server.call("/continue_generation", {}).status == 200
    meta = answers[0]["meta_info"]
    assert meta["finish_reason"]["type"] == "abort" and answers[0]["output_ids"] == []


def test_pause_abort_mode_aborts_the_queue(server, contract):
    assert server.call("/pause_generation", {"mode": "in_place"}).status == 200
    answers, threads = _send_concurrently(server, contract, [{"input_ids": [3]}, {"input_ids": [4]}])
    _wait_for(server, "waiting_requests", 2)
    assert server.call("/pause_generation", {}).status == 200  # SGLang's default mode: abort
    for t in threads:
        t.join(30)
    assert [a["meta_info"]["finish_reason"]["type"] for a in answers] == ["abort", "abort"]
    assert server.call("/continue_generation", {}).status == 200


@pytest.mark.parametrize(
    ("body", "expect"),
    [
        (
            {"sampling_params": {"max_new_tokens": 2}},
            "Either text, input_ids or input_embeds should be provided.",
        ),
        ({"input_ids": [1], "sampling_params": {"bogus": 1}}, "unknown field `bogus`"),
        (
            {"input_ids": [1], "sampling_params": {"temperature": "hot"}},
            'invalid type: string "hot", expected f64',
        ),
        (
            {"input_ids": [1], "sampling_params": {"top_k": 0}},
            "top_k must be -1 (disable) or at least 1, got 0.",
        ),
        (
            {"input_ids": [1], "sampling_params": {"repetition_penalty": 1.3}},
            "sampling_params.repetition_penalty",
        ),
        ({"input_ids": [1], "stream": True}, "does not support stream"),
        # was accepted (bool("yes")); SGLang's contract refuses every wrong-typed bool/int/float field
        (
            {"input_ids": [1], "return_logprob": "yes"},
            'invalid type: string "yes", expected a value or an array of values for BoolOrList',
        ),
        ({"input_ids": [1], "sampling_params": {"ignore_eos": "yes"}}, 'string "yes", expected a boolean'),
        (
            {"input_ids": [[1], [2]], "sampling_params": [{}]},
            "sampling_params has 1 entries for a batch of 2",
        ),
        # said "must be a list of integer token ids, got sequence": now the bad element and its index
        ({"input_ids": [1.5, 2]}, "input_ids[0]: invalid type: floating point `1.5`, expected i64"),
        ({"input_ids": [3, True]}, "input_ids[1]: invalid type: boolean `true`, expected i64"),
        ({"input_ids": [[1], [2, 2.5]]}, "input_ids[1][1]: invalid type: floating point `2.5`, expected i64"),
        # both were accepted, input_ids silently winning: give one
        ({"input_ids": [1], "text": "1 + 1 ="}, "give one of text and input_ids, not both"),
        # was ignored (SGLang ignores it): a misspelt return_logprob gave an answer without log-probs
        (
            {"input_ids": [1], "retrun_logprob": True},
            "unknown top-level key(s) `retrun_logprob` in /generate",
        ),
        ({"input_ids": [1], "return_routed_experts": True}, "does not support return_routed_experts"),
    ],
)
def test_bad_requests_are_400_with_error(server, contract, body, expect):
    ans = server.call("/generate", body)
    assert ans.status == 400, ans.text
    err = ans.body["error"]
    message = err if isinstance(err, str) else err["message"]
    assert expect in message
    if isinstance(err, str):  # the contract gate: SGLang's own decoder refuses it (same text, but the index)
        with pytest.raises(contract.JsonContractError, match="unknown field|invalid type") as refused:
            contract.GenerateRequest.from_json_value(body)
        if "input_ids[" not in message:
            assert str(refused.value) == message


def test_text_prompt_and_not_json(server, contract):
    out = generate(server, contract, {"text": "1 + 1 =", "sampling_params": {"max_new_tokens": 2}})
    assert out["meta_info"]["prompt_tokens"] > 0 and len(out["output_ids"]) >= 1
    ans = server.call("/generate", None, method="POST")
    assert ans.status == 400 and "Either text, input_ids" in ans.body["error"]["message"]


VOCAB, CONTEXT = 1024, 512  # tiny-qwen3's vocab_size and max_position_embeddings (config.json)


@pytest.mark.parametrize(
    ("input_ids", "bad", "position"),
    [([-1, 2], -1, 0), ([5, 99999999], 99999999, 1), ([[1], [3, VOCAB]], VOCAB, 1)],
)
def test_out_of_vocab_ids_are_400_and_spare_queued_requests(server, contract, input_ids, bad, position):
    """An id outside [0, V) is refused before it is queued: a valid request waiting beside it is answered."""
    assert server.call("/pause_generation", {"mode": "in_place"}).status == 200
    valid = {"input_ids": [4, 5], "sampling_params": {"max_new_tokens": 2}, "rid": "ok"}
    answers, threads = _send_concurrently(server, contract, [valid])
    _wait_for(server, "waiting_requests", 1)
    ans = server.call("/generate", {"input_ids": input_ids, "sampling_params": {"max_new_tokens": 2}})
    assert ans.status == 400, ans.text
    message = ans.body["error"]["message"]
    assert f"token id {bad} (position {position})" in message and f"vocab size {VOCAB}" in message
    batch = isinstance(input_ids[0], list)  # a batch says which prompt; one prompt keeps SGLang's text
    assert message.startswith("prompt 1 of the batch: ") if batch else message.startswith("The input_ids")
    assert stats(server)["waiting_requests"] == 1
    assert server.call("/continue_generation", {}).status == 200
    threads[0].join(60)
    assert answers[0]["meta_info"]["id"] == "ok" and len(answers[0]["output_ids"]) >= 1


@pytest.mark.parametrize(
    ("n", "max_new", "expect"),
    [
        (600, 1, f"The input (600 tokens) is longer than the model's context length ({CONTEXT} tokens)."),
        (CONTEXT, 1, f"The input ({CONTEXT} tokens) is longer than the model's context length"),
        (
            3,
            100000000,
            f"maximum context length of {CONTEXT} tokens. You requested a total of 100000003 tokens",
        ),
        (12, CONTEXT - 12, f"You requested a total of {CONTEXT} tokens: 12 tokens from the input messages"),
    ],
)
def test_context_length_is_enforced_like_sglang(server, n, max_new, expect):
    """SGLang's rules: prompt < context length, and prompt + max_new_tokens < context length."""
    body = {"input_ids": [7] * n, "sampling_params": {"max_new_tokens": max_new}}
    ans = server.call("/generate", body)
    assert ans.status == 400, ans.text
    assert expect in ans.body["error"]["message"]


def test_context_length_boundary_is_answered(server, contract):
    out = generate(
        server, contract, {"input_ids": [7] * (CONTEXT - 2), "sampling_params": {"max_new_tokens": 1}}
    )
    assert out["meta_info"]["prompt_tokens"] == CONTEXT - 2 and len(out["output_ids"]) == 1


def test_the_trainers_liveness_probe_leaves_an_idle_server_idle(server):
    """/health on an idle engine runs a one-token generation (SGLang's rule, kept here), so a liveness probe
    still in flight after a rollout made the next /release_memory_occupation fail; the probe the trainer
    sends while its requests run (core/engine/liveness.py) must start no batch."""
    from grpolab.core.engine.liveness import LivenessWatch

    before = server.call("/server_info").body["internal_states"][0]["batches"]
    watch = LivenessWatch([server.url], failure_timeout=2)  # a probe every 0.5 s
    try:
        deadline = time.monotonic() + 1.2
        while time.monotonic() < deadline:
            watch.check()
            time.sleep(0.05)
    finally:
        watch.close()
    assert server.call("/server_info").body["internal_states"][0]["batches"] == before
    assert server.call("/health").status == 200  # what /health does instead: one batch
    assert server.call("/server_info").body["internal_states"][0]["batches"] == before + 1


def test_a_body_nested_too_deeply_is_a_400_that_says_so(server):
    """10 MB of "[" answered Python's "maximum recursion depth exceeded while decoding a JSON array"."""
    import json
    import urllib.error
    import urllib.request

    req = urllib.request.Request(server.url + "/generate", data=b"[" * 100_000, method="POST")
    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(req, timeout=60)
    assert info.value.code == 400
    assert json.loads(info.value.read())["error"].startswith("the request body nests JSON arrays or objects")
    assert server.call("/generate", {"input_ids": [1, 2]}).status == 200  # still serving


def test_every_known_top_level_key_is_sglangs(server, contract):
    """The keys /generate accepts are the contract's GenerateRequest fields (and SGLang's Python-only
    ones): a field SGLang knows and this engine ignores (priority, extra_key) still answers."""
    import re
    from pathlib import Path

    from grpolab.serve.protocol import GENERATE_KEYS, PYTHON_ONLY_KEYS

    assert GENERATE_KEYS == tuple(contract.GenerateRequest.__struct_fields__)
    io_struct = (Path(contract.__file__).parents[2] / "srt" / "managers" / "io_struct.py").read_text()
    fields = io_struct[io_struct.index("class GenerateReqInput:") :]
    python = re.findall(r"(?m)^    ([a-z_][a-z0-9_]*)\s*:", fields[: fields.index("\n    def ")])
    assert [k for k in python if k not in GENERATE_KEYS] == list(PYTHON_ONLY_KEYS[:-1])  # then the router's
    assert PYTHON_ONLY_KEYS[-1] == "model"
    body = {"input_ids": [1, 2], "priority": 3, "extra_key": "k", "return_routed_experts": False}
    body["sampling_params"] = {"max_new_tokens": 2}
    ans = server.call("/generate", body)
    assert ans.status == 200 and len(ans.body["output_ids"]) >= 1, ans.text


def test_prefill_rescoring_gives_input_token_logprobs(server, contract, engine):
    """Miles' prefill re-scoring (`prefill_logprobs.py`): the prompt + answer sent back with
    `max_new_tokens` 0, `temperature` 0 and `logprob_start_len` = prompt length - 1 gives
    `input_token_logprobs` whose first entry is null and whose tail scores the answer: the engine's
    prefill of it alone, bitwise, and within 1e-5 of the decode's own log-probs."""
    prompt = PROMPTS[0]
    sampled = generate(server, contract, {"input_ids": prompt, "return_logprob": True,
                       "sampling_params": {"max_new_tokens": 6, "sampling_seed": 3}})  # fmt: skip
    answer = sampled["output_ids"]
    body = {"input_ids": prompt + answer, "return_logprob": True, "logprob_start_len": len(prompt) - 1,
            "sampling_params": {"max_new_tokens": 0, "temperature": 0}}  # fmt: skip
    out = generate(server, contract, body)
    meta = out["meta_info"]
    assert out["output_ids"] == [] and meta["finish_reason"] == {"type": "length", "length": 0}
    triples = meta["input_token_logprobs"]
    assert [t[1] for t in triples] == [prompt[-1], *answer] and triples[0][0] is None
    tail = torch.tensor([t[0] for t in triples[1:]], dtype=torch.float32)
    assert torch.equal(tail, engine.prompt_log_probs(prompt + answer, len(prompt) - 1, 1.0))
    decode = torch.tensor([t[0] for t in sampled["meta_info"]["output_token_logprobs"]])
    assert (tail - decode).abs().max() < 1e-5


@pytest.mark.parametrize("start", [3, 7, -2])
def test_a_logprob_start_len_outside_the_prompt_is_a_400(server, start):
    ans = server.call(
        "/generate", {"input_ids": [1, 2, 3], "return_logprob": True, "logprob_start_len": start}
    )
    assert ans.status == 400 and "logprob_start_len must be -1" in ans.text and "[0, 3)" in ans.text

"""Control, info and OpenAI routes over real HTTP against one `grpolab serve --api-key` (tiny-qwen3)."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file, save_file
from serving import start_server, stop_server

KEY = "test-key-123"


@pytest.fixture(scope="module")
def server(tiny_model_dir):
    s = start_server(tiny_model_dir, "--api-key", KEY, "--enable-deterministic-inference")
    yield s
    assert stop_server(s) == 143  # 128 + SIGTERM, after the graceful shutdown


def test_api_key_is_required_except_health(server):
    for path in ("/model_info", "/server_info", "/v1/models"):
        ans = server.call(path, key=None)
        assert ans.status == 401 and ans.body == {"error": "Unauthorized"}
    assert server.call("/model_info", key="wrong").status == 401
    assert server.call("/generate", {"input_ids": [1]}, key=None).status == 401
    assert server.call("/health", key=None).status == 200
    assert server.call("/health_generate", key=None).status == 200


def test_model_and_server_info(server, contract, tiny_model_dir):
    from grpolab.core.modeling import model_fingerprint

    info = server.call("/model_info").body
    contract.GetModelInfoResponse.from_json_value(info)
    assert info["weight_version"] == "default" and info["is_generation"] is True
    assert info["model_fingerprint"] == model_fingerprint(tiny_model_dir)
    assert info["architectures"] == ["Qwen3ForCausalLM"]
    sinfo = server.call("/server_info").body
    contract.GetServerInfoResponse.from_json_value(sinfo)
    assert sinfo["enable_deterministic_inference"] is True and sinfo["version"] == "0.5.23"
    assert sinfo["port"] == int(server.url.rsplit(":", 1)[1])
    assert (
        "--api-key REDACTED" in sinfo["launch_command"] and KEY not in sinfo["launch_command"]
    )  # not echoed


def test_seedless_requests_get_seed_42_when_deterministic(server, contract):
    body = {"input_ids": [4, 5, 6], "sampling_params": {"max_new_tokens": 8, "ignore_eos": True}}
    seeded = {**body, "sampling_params": {**body["sampling_params"], "sampling_seed": 42}}
    a, b, c = (server.call("/generate", x).body for x in (body, body, seeded))
    assert a["output_ids"] == b["output_ids"] == c["output_ids"]


def test_memory_release_and_resume(server):
    assert server.call("/release_memory_occupation", {"tags": ["weights", "kv_cache"]}).body is None
    ans = server.call("/generate", {"input_ids": [1], "sampling_params": {"max_new_tokens": 1}})
    assert ans.status == 400 and "memory is released (weights, kv_cache)" in ans.body["error"]["message"]
    twice = server.call("/release_memory_occupation", {"tags": ["weights"]})
    assert twice.status == 400 and "already released" in twice.body["error"]["message"]
    not_released = server.call("/resume_memory_occupation", {"tags": ["cuda_graph"]})
    assert (
        not_released.status == 400
        and "['cuda_graph'] are not released" in not_released.body["error"]["message"]
    )
    assert server.call("/health").status == 200  # alive, not generating
    for tag in ("weights", "kv_cache"):  # slime resumes weights first
        assert server.call("/resume_memory_occupation", {"tags": [tag]}).status == 200
    assert (
        server.call("/generate", {"input_ids": [1], "sampling_params": {"max_new_tokens": 1}}).status == 200
    )
    bad = server.call("/release_memory_occupation", {"tags": ["gpu"]})
    assert bad.status == 400 and "unknown memory tag" in bad.body["error"]["message"]


def test_weights_checker_and_update_from_disk(server, contract, tiny_model_dir, tmp_path):
    """snapshot -> reset -> compare fails naming tensors -> load the checkpoint from disk in two
    buckets (the second sets version "3") -> compare passes, checksum is back to the original."""
    original = server.call("/weights_checker", {"action": "checksum"}).body
    assert original["success"] and original["ranks"][0]["per_gpu_checksum"] == original["per_engine_checksum"]
    assert server.call("/weights_checker", {"action": "snapshot"}).body["success"]
    assert server.call("/weights_checker", {"action": "reset_tensors"}).body["success"]
    compare = server.call("/weights_checker", {"action": "compare"})
    assert compare.status == 400 and "model.embed_tokens.weight" in compare.body["message"]
    reset_sum = server.call("/weights_checker").body["per_engine_checksum"]  # default action: checksum
    assert reset_sum != original["per_engine_checksum"]

    tensors = load_file(str(tiny_model_dir / "model.safetensors"))
    names = sorted(tensors)
    for i, part in enumerate((names[: len(names) // 2], names[len(names) // 2 :])):
        (tmp_path / f"b{i}").mkdir()
        save_file({n: tensors[n] for n in part}, str(tmp_path / f"b{i}" / "model.safetensors"))
    first = server.call("/update_weights_from_disk", {"model_path": str(tmp_path / "b0")})
    assert first.status == 200 and first.body["success"] and first.body["num_paused_requests"] == 0
    assert server.call("/model_info").body["weight_version"] == "default"
    second = server.call(
        "/update_weights_from_disk", {"model_path": str(tmp_path / "b1"), "weight_version": "3"}
    )
    assert second.body["success"] and second.body["message"].endswith("Weight version updated to 3.")
    assert server.call("/weights_checker", {"action": "compare"}).body == {
        "success": True,
        "message": "compare: ok",
    }
    assert server.call("/weights_checker", {"action": "checksum"}).body == original
    out = server.call("/generate", {"input_ids": [1], "sampling_params": {"max_new_tokens": 2}}).body
    assert out["meta_info"]["weight_version"] == "3"


def test_update_weights_refusals(server, tmp_path):
    missing = server.call("/update_weights_from_disk", {"model_path": str(tmp_path / "nope")})
    assert missing.status == 400 and "does not exist" in missing.body["message"]
    (tmp_path / "pickle").mkdir()
    torch.save({"x": torch.zeros(1)}, tmp_path / "pickle" / "pytorch_model.bin")
    pickled = server.call("/update_weights_from_disk", {"model_path": str(tmp_path / "pickle")})
    assert pickled.status == 400 and "holds no *.safetensors file" in pickled.body["message"]
    (tmp_path / "wrong").mkdir()
    save_file({"not.a.param": torch.zeros(2)}, str(tmp_path / "wrong" / "model.safetensors"))
    wrong = server.call(
        "/update_weights_from_disk", {"model_path": str(tmp_path / "wrong"), "weight_version": "9"}
    )
    assert wrong.status == 400 and "not.a.param" in wrong.body["message"]
    assert server.call("/model_info").body["weight_version"] != "9"
    bad_version = server.call(
        "/update_weights_from_disk", {"model_path": str(tmp_path / "wrong"), "weight_version": 9}
    )
    assert bad_version.status == 400 and "weight_version must be a string" in bad_version.body["message"]


def test_a_tensor_of_another_dtype_kind_is_refused_naming_both(server, tiny_model_dir, tmp_path):
    """copy_ cast an int64 tensor into a float32 weight silently; another float precision is still cast."""
    name = "model.norm.weight"
    weight = load_file(str(tiny_model_dir / "model.safetensors"))[name]
    before = server.call("/weights_checker", {"action": "checksum"}).body
    (tmp_path / "ints").mkdir()
    save_file(
        {name: torch.ones_like(weight, dtype=torch.int64)}, str(tmp_path / "ints" / "model.safetensors")
    )
    ints = server.call("/update_weights_from_disk", {"model_path": str(tmp_path / "ints")})
    assert ints.status == 400 and ints.body["message"] == (
        f"Failed to update weights: dtype mismatch for {name!r}: the file holds int64, the engine's tensor "
        "is float32"
    )
    assert server.call("/weights_checker", {"action": "checksum"}).body == before  # nothing was copied
    (tmp_path / "unknown").mkdir()
    save_file({"foo.bar.weight": weight}, str(tmp_path / "unknown" / "model.safetensors"))
    unknown = server.call("/update_weights_from_disk", {"model_path": str(tmp_path / "unknown")})
    assert unknown.status == 400 and unknown.body["message"] == (  # no stray quotes around it (KeyError)
        "Failed to update weights: update_weights: the engine has no tensor named 'foo.bar.weight'"
    )
    (tmp_path / "noise").mkdir()
    (tmp_path / "noise" / "model.safetensors").write_bytes(b"\xff" * 64)
    noise = server.call("/update_weights_from_disk", {"model_path": str(tmp_path / "noise")})
    assert noise.status == 400  # the file is named (safetensors' own text was only "header too large")
    assert (
        f"{tmp_path / 'noise' / 'model.safetensors'}: not a readable safetensors file"
        in noise.body["message"]
    )
    (tmp_path / "half").mkdir()
    save_file({name: weight.to(torch.bfloat16)}, str(tmp_path / "half" / "model.safetensors"))
    half = server.call("/update_weights_from_disk", {"model_path": str(tmp_path / "half")})
    assert half.status == 200 and half.body["success"] is True
    save_file({name: weight}, str(tmp_path / "half" / "model.safetensors"))  # the shared server's weight back
    assert server.call("/update_weights_from_disk", {"model_path": str(tmp_path / "half")}).status == 200
    assert server.call("/weights_checker", {"action": "checksum"}).body == before


def test_update_weight_version_and_flush(server):
    ans = server.call("/update_weight_version", {"new_version": "v7"})
    assert ans.body == {"success": True, "message": "Weight version updated to v7", "new_version": "v7"}
    assert server.call("/model_info").body["weight_version"] == "v7"
    flush = server.call("/flush_cache", {})
    assert flush.status == 200 and flush.text.startswith("Cache flushed.")
    bad = server.call("/pause_generation", {"mode": "sideways"})
    assert bad.status == 400 and "mode must be abort, retract or in_place" in bad.body["error"]["message"]


def test_openai_routes(server, contract):
    models = server.call("/v1/models").body
    assert models["object"] == "list" and [m["id"] for m in models["data"]] == ["tiny-qwen3"]
    contract.ModelCard.from_json_value(models["data"][0])
    body = {
        "model": "tiny-qwen3",
        "messages": [{"role": "user", "content": "2 + 2 ="}],
        "max_tokens": 4,
        "seed": 3,
    }
    a, b = (server.call("/v1/chat/completions", body).body for _ in range(2))
    assert a["object"] == "chat.completion" and a["choices"][0]["message"]["role"] == "assistant"
    assert a["choices"][0]["message"]["content"] == b["choices"][0]["message"]["content"]  # same seed
    assert (
        a["usage"]["completion_tokens"] <= 4 and a["usage"]["total_tokens"] > a["usage"]["completion_tokens"]
    )
    assert a["metadata"]["weight_version"] == server.call("/model_info").body["weight_version"]
    bad = server.call("/v1/chat/completions", {"messages": []})
    assert bad.status == 400 and "messages must be a non-empty list" in bad.body["error"]["message"]


def test_corrupt_safetensors_and_unknown_checker_action_are_400(server, tmp_path):
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "x.safetensors").write_text("garbage\n")
    ans = server.call("/update_weights_from_disk", {"model_path": str(tmp_path / "d"), "weight_version": "8"})
    assert ans.status == 400 and ans.body["success"] is False, ans.text
    assert ans.body["message"].startswith("Failed to update weights: ")
    assert server.call("/model_info").body["weight_version"] != "8"
    bad = server.call("/weights_checker", {"action": "audit"})
    assert bad.status == 400 and bad.body == {
        "success": False,
        "message": "unknown weights_checker action 'audit'; expected one of "
        "snapshot, reset_tensors, compare, checksum",
    }


@pytest.mark.parametrize(
    ("messages", "needle"),
    [
        (
            [{"role": "user"}],
            "messages[0] (user) needs a string content; it is missing",
        ),
        ([{"content": "hi"}], "messages[0] has role None; expected one of system, user, assistant, tool"),
        ([{"role": "bogus", "content": "hi"}], "messages[0] has role 'bogus'; expected one of"),
        (
            [{"role": "user", "content": [{"type": "text", "text": "hi"}]}],
            "messages[0] (user) has a list of content parts; this server takes text models' string content only",
        ),
        (
            [{"role": "user", "content": None}],
            "messages[0] (user) needs a string content; it is null",
        ),
    ],
)
def test_chat_message_without_content_or_role_is_400(server, messages, needle):
    ans = server.call("/v1/chat/completions", {"messages": messages})
    assert ans.status == 400, ans.text
    assert needle in ans.body["error"]["message"]


def test_chat_prompt_too_long_for_the_context_is_400(server):
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 100000}
    ans = server.call("/v1/chat/completions", body)
    assert ans.status == 400, ans.text
    assert (
        "Requested token count exceeds the model's maximum context length of 512"
        in ans.body["error"]["message"]
    )


def test_a_boolean_field_must_be_a_boolean(server, tmp_path):
    """`flush_cache: "no"` was accepted (and `abort_all: "no"` read as true): JSON true/false only."""
    for path, body, field in (
        ("/update_weights_from_disk", {"model_path": str(tmp_path), "flush_cache": "no"}, "flush_cache"),
        (
            "/update_weights_from_disk",
            {"model_path": str(tmp_path), "abort_all_requests": 1},
            "abort_all_requests",
        ),
        ("/update_weight_version", {"new_version": "v", "abort_all_requests": "no"}, "abort_all_requests"),
        ("/abort_request", {"abort_all": "no"}, "abort_all"),
    ):
        ans = server.call(path, body)
        assert ans.status == 400, (path, ans.text)
        assert f"{field} must be true or false, got" in ans.text, ans.text
    assert server.call("/model_info").body["weight_version"] != "v"  # the refused call changed nothing

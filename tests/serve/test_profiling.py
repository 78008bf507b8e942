"""/start_profile and /stop_profile over real HTTP against one `grpolab serve` (tiny-qwen3): the trace holds
exactly the asked decodes, SGLang's texts and 400s."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
from serving import start_server, stop_server

from grpolab.serve.profiling import DECODE_RANGE

GENERATE = {"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 2}}


@pytest.fixture(scope="module")
def server(tiny_model_dir):
    s = start_server(tiny_model_dir)
    yield s
    assert stop_server(s) == 143  # 128 + SIGTERM, after the graceful shutdown


def _decodes(path: Path) -> int:
    """grpolab/decode ranges in a gzipped Chrome trace."""
    with gzip.open(path, "rt", encoding="utf-8") as f:
        events = json.load(f)["traceEvents"]
    return sum(1 for e in events if e.get("ph") == "X" and e.get("name") == DECODE_RANGE)


def _generate(server, n: int) -> None:
    for _ in range(n):
        assert server.call("/generate", GENERATE).status == 200


def test_num_steps_stops_by_itself(server, tmp_path: Path) -> None:
    ans = server.call("/start_profile", {"output_dir": str(tmp_path), "num_steps": 2, "activities": ["CPU"]})
    assert (ans.status, ans.text) == (200, "Start profiling.\n")
    again = server.call("/start_profile", {"output_dir": str(tmp_path)})
    assert again.status == 400
    assert again.body == {"error": {"message": "Profiling is already in progress. Call /stop_profile first."}}
    _generate(server, 3)
    (trace,) = tmp_path.glob("*.trace.json.gz")
    assert trace.name.endswith("-TP-0.trace.json.gz")
    assert _decodes(trace) == 2  # the third decode ran after the profile stopped
    assert server.call("/stop_profile").status == 400  # stopped already


def test_start_step_and_stop_profile(server, tmp_path: Path) -> None:
    _generate(server, 1)
    batches = server.call("/server_info").body["internal_states"][0]["batches"]
    body = {"output_dir": str(tmp_path), "start_step": batches + 1, "profile_prefix": "run7"}
    assert server.call("/start_profile", body).status == 200
    _generate(server, 3)  # decode `batches` is skipped, the next two are traced
    ans = server.call("/stop_profile", method="POST")
    assert (ans.status, ans.text) == (200, "Stop profiling. This will take some time.\n")
    (trace,) = tmp_path.glob("run7-*-TP-0.trace.json.gz")
    assert _decodes(trace) == 2


def test_stop_without_start_and_bad_fields(server) -> None:
    ans = server.call("/stop_profile")
    assert ans.status == 400
    assert ans.body == {"error": {"message": "Profiling is not in progress. Call /start_profile first."}}
    for body, message in (
        ({"num_steps": 0}, "num_steps must be >= 1, got 0"),
        ({"activities": ["RPD"]}, "activities must be among ['CPU', 'GPU', 'MEM'], got ['RPD']"),
        ({"start_step": "3"}, "start_step must be int, got '3'"),
        ({"with_stack": 1}, "with_stack must be bool, got 1"),
    ):
        ans = server.call("/start_profile", body)
        assert ans.status == 400 and ans.body == {"error": {"message": f"/start_profile: {message}"}}, (
            ans.text
        )
    assert server.call("/stop_profile").status == 400  # none of them started a profile


def test_output_dir_that_is_a_file_is_400_and_starts_nothing(server, tmp_path: Path) -> None:
    a_file = tmp_path / "a_file"
    a_file.write_text("x")
    ans = server.call("/start_profile", {"output_dir": str(a_file / "sub"), "activities": ["CPU"]})
    assert ans.status == 400 and "output_dir" in ans.body["error"]["message"]
    assert str(a_file / "sub") in ans.body["error"]["message"]
    assert server.call("/stop_profile").status == 400  # no profile is believed to run
    ans = server.call("/start_profile", {"output_dir": str(tmp_path / "ok"), "activities": ["CPU"]})
    assert ans.status == 200  # the server is not stuck "in progress"
    assert server.call("/stop_profile").status == 200

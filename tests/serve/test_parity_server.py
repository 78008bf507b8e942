"""`grpolab check parity --server URL`: the engine's rungs against a running `grpolab serve` (tiny-qwen3).

The served answers are the in-process engine's, so the clean ladder passes as in-process, with the
server's own prefill (`logprob_start_len`, `max_new_tokens` 0) on the decode rung and the bitwise rung;
a server in `--true-on-policy-mode` is bitwise with top-p/top-k too; a server holding other weights fails
the trainer-vs-engine rung first."""

from __future__ import annotations

import json

import pytest
from safetensors.torch import load_file, save_file
from serving import start_server, stop_server

from grpolab.cli import main

FAST = ["check", "parity", "--num-prompts", "4", "--batch-size", "4", "--rollout-max-response-len", "12",
        "--no-world-size", "--json"]  # fmt: skip


def ladder(capsys: pytest.CaptureFixture, *extra: str) -> tuple[int, dict]:
    code = main([*FAST, *extra])
    out = capsys.readouterr()
    return code, json.loads(out.out) if out.out else {"err": out.err}


def rung(report: dict, prefix: str) -> dict:
    return next(r for r in report["rungs"] if r["name"].startswith(prefix))


@pytest.fixture(scope="module")
def server(tiny_model_dir):
    s = start_server(tiny_model_dir)
    yield s
    stop_server(s)


def test_the_clean_ladder_passes_against_a_server(server, capsys) -> None:
    code, report = ladder(capsys, "--server", server.url)
    assert code == 0 and report["settings"]["server"] == server.url
    decode = rung(report, "engine decode vs engine prefill")
    assert not decode["skipped"] and decode["total"] > 0 and 0 < decode["max_abs"] < 1e-5
    exact = rung(report, "trainer vs engine, each answer alone")
    assert not exact["skipped"] and exact["equal"] == exact["total"] > 0


def test_a_server_with_other_weights_fails_the_trainer_vs_engine_rung(
    tiny_model_dir, tmp_path, capsys
) -> None:
    tensors = load_file(str(tiny_model_dir / "model.safetensors"))
    (tmp_path / "stale").mkdir()
    save_file(
        {"model.norm.weight": tensors["model.norm.weight"] * 1.01},
        str(tmp_path / "stale" / "model.safetensors"),
    )
    s = start_server(tiny_model_dir)
    try:
        assert s.call("/update_weights_from_disk", {"model_path": str(tmp_path / "stale")}).status == 200
        code, report = ladder(capsys, "--server", s.url)
    finally:
        stop_server(s)
    assert code == 1 and report["failed"] == "trainer vs engine"
    assert rung(report, "engine decode vs engine prefill")["passed"]  # the server agrees with itself
    assert not rung(report, "trainer vs engine, each answer alone")["passed"]


def test_a_true_on_policy_server_is_bitwise_with_top_p_top_k(tiny_model_dir, capsys) -> None:
    s = start_server(tiny_model_dir, "--true-on-policy-mode")
    try:
        code, report = ladder(capsys, "--server", s.url, "--rollout-top-p", "0.9", "--rollout-top-k", "20")
    finally:
        stop_server(s)
    assert code == 0
    assert rung(report, "engine decode vs engine prefill")["skipped"]  # no prefill over a kept support
    exact = rung(report, "trainer vs engine, each answer alone")
    assert not exact["skipped"] and exact["equal"] == exact["total"] > 0


@pytest.mark.parametrize("url", ["localhost:1", "http://127.0.0.1:1"])
def test_a_bad_server_url_exits_2(url: str, capsys) -> None:
    assert main(["check", "parity", "--server", url]) == 2
    assert f"--server {url}" in capsys.readouterr().err

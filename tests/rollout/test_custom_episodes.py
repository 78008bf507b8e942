"""Custom generate functions and agent workflows on the run's own engine (rollout/custom_generate.py,
rollout/agent_episode.py, serve/embedded.py): the shipped calculator agent and naive generate
function, the real `openai` client, and the ways a user's function breaks its contract."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
import torch
from runs import metrics, train_short

from grpolab.cli import main
from grpolab.core.turns.episode import AGENT_REWARD, KEY, response_sources
from grpolab.examples.calculator.tools import execute_tool
from grpolab.replay.recording import load_rollout

REPO = Path(__file__).resolve().parents[2]
BASE = [
    "--hf-checkpoint", str(REPO / "fixtures" / "tiny-qwen3-tools"), "--apply-chat-template",
    "--rollout-batch-size", "2", "--n-samples-per-prompt", "4", "--rollout-max-response-len", "96",
    "--num-rollout", "1",
]  # fmt: skip


def _run(tmp: Path, name: str, *extra: str) -> Path:
    run_dir = tmp / name
    return train_short(run_dir, *BASE, *extra, "--save-debug-rollout-data", str(run_dir / "{rollout_id}.grz"))


def test_agent_workflow_trains_on_its_sessions_exact_ids(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    run_dir = _run(
        tmp_path,
        "agent",
        "--custom-agent-function-path",
        "grpolab.examples.calculator.agent.run",
        "--ci-test",
    )
    samples = load_rollout(run_dir / "0.grz").samples
    for s in samples:
        sources = response_sources(s.metadata[KEY])
        assert torch.equal(s.loss_mask.bool(), torch.tensor([src == "model" for src, _ in sources]))
        assert s.reward == s.metadata[AGENT_REWARD]  # the agent's own score, not the --rm-type's
    assert any(len(s.metadata[KEY]["finish_reasons"]) > 1 for s in samples)
    for s in samples:  # the session's tool calls, each with the result the agent sent back
        for call in s.metadata[KEY]["tool_calls"]:
            assert call["result"] == asyncio.run(execute_tool(call["name"], json.loads(call["arguments"])))
    rollout = metrics(run_dir, "rollout")[0]
    assert rollout["rollout/tool_calls"] > 0
    assert rollout["rollout/raw_reward"] == pytest.approx(sum(s.reward for s in samples) / len(samples))
    assert main(["check", "turns", str(run_dir / "0.grz")]) == 0
    assert "every boundary holds the chat template's ids" in capsys.readouterr().out


def test_openai_client_agent_with_per_turn_rewards(tmp_path: Path) -> None:
    run_dir = _run(tmp_path, "openai", "--custom-agent-function-path", "agent_tools.agent_openai")
    for s in load_rollout(run_dir / "0.grz").samples:
        per_turn = s.metadata[AGENT_REWARD]
        turns = len(s.metadata[KEY]["finish_reasons"])  # fewer when the budget cut whole turns away
        assert s.reward == sum(per_turn) and (len(per_turn) == turns or s.metadata[KEY]["ended"] == "length")


def test_an_agent_keeps_the_response_budget_over_all_its_turns(tmp_path: Path) -> None:
    """Each request may ask for --rollout-max-response-len tokens; the sample keeps that many in all."""
    run_dir = tmp_path / "budget"
    train_short(run_dir, *BASE, "--rollout-max-response-len", "24", "--custom-agent-function-path",
                "grpolab.examples.calculator.agent.run", "--save-debug-rollout-data", str(run_dir / "{rollout_id}.grz"))  # fmt: skip
    samples = load_rollout(run_dir / "0.grz").samples
    assert all(s.response_length <= 24 for s in samples)
    cut = [s for s in samples if s.metadata[KEY]["ended"] == "length"]
    assert cut and all(s.finish_reason == "length" and s.response_length == 24 for s in cut)
    for s in cut:
        episode = s.metadata[KEY]
        assert sum(episode["reply_lengths"]) == int(s.loss_mask.sum())


def test_naive_generate_trains_but_check_turns_names_the_dropped_boundary(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    run_dir = _run(
        tmp_path,
        "naive",
        "--custom-generate-function-path",
        "grpolab.examples.calculator.naive_generate.generate",
    )
    samples = load_rollout(run_dir / "0.grz").samples
    assert metrics(run_dir, "step")  # it trains without an error
    multi = [s for s in samples if 0 in s.loss_mask.tolist()]  # a tool turn appended the naive way
    assert multi
    capsys.readouterr()
    assert main(["check", "turns", str(run_dir / "0.grz"), "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert {e["sample"] for e in report["errors"]} == {s.index for s in multi}
    assert {e["cause"] for e in report["errors"]} == {"template boundary token"}


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--custom-agent-function-path", "agent_tools.agent_silent"], "the agent sent no chat request"),
        (
            ["--custom-agent-function-path", "agent_tools.agent_too_many_rewards"],
            "returned 3 per-turn rewards for 1 model turns",
        ),
        (
            ["--custom-generate-function-path", "agent_tools.generate_bad_mask"],
            "len(loss_mask) = 2 but response_length = 3",
        ),
        (
            ["--custom-agent-function-path", "agent_tools.agent_sleeps", "--agent-timeout", "0.2"],
            "ran past --agent-timeout 0.2 s",
        ),
        (
            ["--custom-agent-function-path", "agent_tools.agent_blocks", "--agent-timeout", "0.3"],
            "blocked the event loop for more than --agent-timeout 0.3 s at ",
        ),
        (
            ["--custom-agent-function-path", "agent_tools.agent_rewrites_history"],
            "; its session refused the last turn: 409 at turn 0: messages[0] (user) differs from the message",
        ),
    ],
)
def test_a_broken_episode_function_fails_the_run_naming_it(
    tmp_path: Path, extra: list[str], message: str
) -> None:
    with pytest.raises(RuntimeError) as error:
        train_short(tmp_path / "run", *BASE, *extra)
    assert message in str(error.value) and " on sample " in str(error.value)


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (
            ["--custom-generate-function-path", "agent_tools.not_async"],
            "must be `async def generate(args, sample",
        ),
        (
            ["--custom-agent-function-path", "agent_tools.nothing"],
            "module 'agent_tools' has no attribute 'nothing'",
        ),
        (
            ["--custom-agent-function-path", "agent_tools.agent_wrong_signature"],
            "must be `async def run(base_url, prompt, request_kwargs, metadata, **kw) -> reward`; it cannot be called "
            "with the contract's 4 positional arguments (too many positional",
        ),
        (
            [
                "--custom-agent-function-path",
                "agent_tools.agent_silent",
                "--custom-generate-function-path",
                "agent_tools.generate_bad_mask",
            ],
            "both say how a sample is generated",
        ),
        (
            [
                "--custom-agent-function-path",
                "agent_tools.agent_silent",
                "--generate-execute-tool-function-path",
                "grpolab.examples.calculator.tools.execute_tool",
            ],
            "--custom-agent-function-path runs its own tools",
        ),
        (
            ["--custom-agent-function-path", "agent_tools.agent_silent", "--generate-max-turns", "3"],
            "--generate-max-turns 3 would have no effect",
        ),
        (
            [
                "--custom-agent-function-path",
                "agent_tools.agent_silent",
                "--generate-tool-call-parser",
                "hermes",
            ],
            "--generate-tool-call-parser hermes would have no effect",
        ),
        (
            ["--custom-agent-function-path", "agent_tools.agent_silent", "--no-apply-chat-template"],
            "needs --apply-chat-template",
        ),
    ],
)
def test_episode_function_bad_input_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture, extra: list[str], message: str
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["train", *BASE, *extra, "--run-dir", str(tmp_path / "run")])
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_episodes_that_start_together_open_their_sessions_in_one_request(monkeypatch) -> None:
    """SessionOpener: 5 episodes scheduled together send one POST /sessions {"count": 5}; one started
    after them sends its own; an episode cancelled while it waited gets its session deleted."""
    from grpolab.rollout import agent_episode

    calls: list[tuple[str, str, dict | None]] = []

    def fake_call(url: str, method: str, body: dict | None = None) -> dict:
        calls.append((url, method, body))
        if method == "DELETE":
            return {"success": True}
        assert body is not None
        return {"session_ids": [f"s{len(calls)}-{i}" for i in range(body["count"])]}

    monkeypatch.setattr(agent_episode, "_call", fake_call)

    async def scenario() -> tuple[list[str], str, list[tuple[str, str, dict | None]]]:
        opener = agent_episode.SessionOpener("http://door")
        together = await asyncio.gather(*(opener.open() for _ in range(5)))
        later = await opener.open()
        calls_before = len(calls)
        first, doomed = asyncio.ensure_future(opener.open()), asyncio.ensure_future(opener.open())
        await asyncio.sleep(0)
        doomed.cancel()
        await first
        return list(together), later, calls[calls_before:]

    together, later, last = asyncio.run(scenario())
    assert calls[0] == ("http://door/sessions", "POST", {"count": 5}) and len(set(together)) == 5
    assert calls[1] == ("http://door/sessions", "POST", {"count": 1}) and later == "s2-0"
    assert last[0] == ("http://door/sessions", "POST", {"count": 2})
    assert last[1] == ("http://door/sessions/s3-1", "DELETE", None)  # the cancelled episode's session

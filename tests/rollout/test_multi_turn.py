"""The multi-turn tool loop end to end (rollout/multi_turn.py): a real run of the tool-calling fixture
model with the calculator example, its recordings, replay, the drift auditor (checkers/turns.py,
`grpolab check turns`) and bad input."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from pathlib import Path

import pytest
import torch
from runs import metrics, train_short

from grpolab.checkers.turns import audit_samples
from grpolab.cli import main
from grpolab.core.modeling import load_tokenizer
from grpolab.core.turns.episode import KEY, response_sources
from grpolab.examples.calculator.tools import execute_tool
from grpolab.replay.recording import load_rollout, save_rollout

REPO = Path(__file__).resolve().parents[2]
TOOLS_MODEL = REPO / "fixtures" / "tiny-qwen3-tools"
GSM8K_TRAIN = REPO.parent / "shared" / "data" / "gsm8k" / "train.jsonl"
EOS = 2
TOOL_LOOP = [
    "--hf-checkpoint", str(TOOLS_MODEL), "--apply-chat-template",
    "--generate-execute-tool-function-path", "grpolab.examples.calculator.tools.execute_tool",
    "--generate-tool-specs-path", "grpolab.examples.calculator.tools.TOOL_SPECS",
    "--rollout-batch-size", "4", "--n-samples-per-prompt", "4", "--rollout-max-response-len", "96",
]  # fmt: skip


@pytest.fixture(scope="module")
def tool_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two rollouts of the tool loop under --ci-test (the turns audit runs in-run), recorded."""
    run_dir = tmp_path_factory.mktemp("tools") / "run"
    return train_short(
        run_dir,
        *TOOL_LOOP,
        "--ci-test",
        "--save-debug-rollout-data",
        str(run_dir / "rec" / "{rollout_id}.grz"),
    )


def _samples(run_dir: Path, rollout_id: int = 0) -> list:
    return load_rollout(run_dir / "rec" / f"{rollout_id}.grz").samples


def test_episodes_hold_exact_turns_masks_and_tool_results(tool_run: Path) -> None:
    tok = load_tokenizer(TOOLS_MODEL)
    newline = tok.encode("\n", add_special_tokens=False)
    samples = _samples(tool_run)
    two_turn = 0
    for s in samples:
        episode = s.metadata[KEY]
        sources = response_sources(episode)
        assert len(sources) == len(s.response_ids) == s.loss_mask.numel() == s.rollout_log_probs.numel()
        model = torch.tensor([src == "model" for src, _ in sources])
        assert torch.equal(s.loss_mask.bool(), model)  # only the model's tokens train
        assert torch.all(s.rollout_log_probs[~model] == 0.0) and torch.all(s.rollout_log_probs[model] <= 0.0)
        assert (
            len(episode["finish_reasons"]) == len(episode["reply_lengths"]) == len(episode["weight_versions"])
        )
        for call in episode["tool_calls"]:  # each result keyed by (turn, call), the tool's real answer
            assert call["result"] == asyncio.run(execute_tool(call["name"], json.loads(call["arguments"])))
            tool_msgs = [m for m in s.metadata["messages"] if m.get("tool_call_id") == call["id"]]
            assert [m["content"] for m in tool_msgs] == [call["result"]]
        if len(episode["finish_reasons"]) >= 2:
            two_turn += 1
            first = episode["reply_lengths"][0]
            assert s.response_ids[first - 1] == EOS  # the reply's own <|im_end|> ...
            assert s.response_ids[first : first + len(newline)] == newline  # ... then the template's "\n"
            assert sources[first] == ("boundary", 1)
    assert two_turn >= len(samples) // 2  # the fixture model calls the calculator most of the time
    rollout = metrics(tool_run, "rollout")[0]
    assert rollout["rollout/num_turns"] == pytest.approx(
        sum(len(s.metadata[KEY]["finish_reasons"]) for s in samples) / len(samples)
    )
    assert rollout["rollout/trainable_tokens"] == pytest.approx(
        sum(float(s.loss_mask.sum()) for s in samples) / len(samples)
    )
    assert rollout["rollout/trainable_tokens"] < rollout["rollout/response_lengths"]
    assert rollout["rollout/tool_calls"] > 0.5 and "rollout/tool_parse_errors" in rollout
    # tool and template tokens carry log-prob 0.0 for the engine: counted, the gap would be nats, not 1e-7
    assert all(m["train/train_rollout_logprob_abs_diff"] < 1e-5 for m in metrics(tool_run, "step"))
    checks = [json.loads(line) for line in (tool_run / "events.jsonl").read_text().splitlines()]
    assert [c["ok"] for c in checks if c.get("checker") == "turns"] == [True, True]


def test_episodes_do_not_depend_on_the_run(tool_run: Path, tmp_path: Path) -> None:
    """Rollout 0 again (the same weights): every episode's ids and tool calls are the same."""
    again = train_short(tmp_path / "again", *TOOL_LOOP, "--num-rollout", "1", "--debug-rollout-only",
                        "--save-debug-rollout-data", str(tmp_path / "again" / "{rollout_id}.grz"))  # fmt: skip
    first = _samples(tool_run)
    second = load_rollout(tmp_path / "again" / "0.grz").samples
    assert [s.response_ids for s in second] == [s.response_ids for s in first]

    def same(
        meta: dict,
    ) -> dict:  # the weight version is the run's sync count (none under --debug-rollout-only)
        return {**meta, KEY: {k: v for k, v in meta[KEY].items() if k != "weight_versions"}}

    assert [same(s.metadata) for s in second] == [same(s.metadata) for s in first]
    assert [s.metadata[KEY]["weight_versions"] for s in second] == [
        [0] * len(s.metadata[KEY]["reply_lengths"]) for s in second
    ]
    assert again.is_dir()


def test_replay_trains_the_episode_without_its_tools(tool_run: Path, tmp_path: Path) -> None:
    replay = train_short(
        tmp_path / "replay", *TOOL_LOOP, "--debug-train-only",
        "--load-debug-rollout-data", str(tool_run / "rec" / "{rollout_id}.grz"),
    )  # fmt: skip
    keys = ["train/pg_loss", "train/grad_norm", "train/train_rollout_logprob_abs_diff"]
    assert [[m[k] for k in keys] for m in metrics(replay, "step")] == [
        [m[k] for k in keys] for m in metrics(tool_run, "step")
    ]


def _broken(samples: list, drop_boundary: bool) -> list:
    """The recording a generator that drops the "\\n" after <|im_end|> (or trains a tool token) writes."""
    out = []
    for s in samples:
        episode = s.metadata[KEY]
        if len(episode["finish_reasons"]) < 2:
            out.append(s)
            continue
        first = episode["reply_lengths"][0]
        if drop_boundary:
            keep = [r for r in range(len(s.response_ids)) if r != first]
            spans = [list(x) for x in episode["spans"]]
            spans[1][2] -= 1  # the boundary span after model turn 1
            meta = {**s.metadata, KEY: {**episode, "spans": [x for x in spans if x[2]]}}
            s = dataclasses.replace(
                s, response_ids=[s.response_ids[r] for r in keep], loss_mask=s.loss_mask[keep],
                rollout_log_probs=s.rollout_log_probs[keep], kept_token_ids=None, metadata=meta,
            )  # fmt: skip
        else:
            mask = s.loss_mask.clone()
            mask[first + 2] = 1.0  # a tool message token
            s = dataclasses.replace(s, loss_mask=mask)
        out.append(s)
    return out


@pytest.mark.parametrize("drop_boundary", [True, False], ids=["dropped-boundary", "trainable-tool-token"])
def test_check_turns_finds_a_broken_record(
    tool_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture, drop_boundary: bool
) -> None:
    rec = load_rollout(tool_run / "rec" / "0.grz")
    assert main(["check", "turns", str(tool_run / "rec" / "0.grz"), str(tool_run / "rec" / "1.grz")]) == 0
    assert "every boundary holds the chat template's ids" in capsys.readouterr().out
    broken = _broken(rec.samples, drop_boundary)
    path = tmp_path / "broken.grz"
    save_rollout(path, broken, rollout_id=0, weight_version=rec.weight_version, run_seed=rec.run_seed,
                 sampler=rec.sampler, fingerprints=rec.fingerprints, train_config=rec.train_config,
                 run_dir=rec.run_dir)  # fmt: skip
    assert main(["check", "turns", str(path), "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    bad = sum(len(s.metadata[KEY]["finish_reasons"]) >= 2 for s in broken)
    assert report["ok"] is False and len({e["sample"] for e in report["errors"]}) == bad
    first = report["errors"][0]
    if drop_boundary:
        newline = load_tokenizer(TOOLS_MODEL).encode("\n", add_special_tokens=False)
        assert first["cause"] == "template boundary token" and first["turn"] == 1
        assert first["expected"][: len(newline)] == newline and first["recorded"][:1] != newline[:1]
    else:
        assert first["cause"] == "loss mask" and "is trainable" in first["detail"]
    audits = audit_samples(broken, load_tokenizer(TOOLS_MODEL))  # the same checks, as the run makes them
    assert sum(any(f.severity == "error" for f in a.findings) for a in audits) == bad


def test_check_turns_bad_input(tool_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(["check", "turns", str(tmp_path / "none.grz")]) == 2
    assert "no such file" in capsys.readouterr().err
    text = tmp_path / "text.grz"
    text.write_text("not a recording")
    assert main(["check", "turns", str(text)]) == 2
    assert "grpolab check turns: error:" in capsys.readouterr().err
    rec = load_rollout(tool_run / "rec" / "0.grz")
    single = tmp_path / "single.grz"
    save_rollout(single, [dataclasses.replace(s, metadata={}) for s in rec.samples], rollout_id=0,
                 weight_version=0, run_seed=1, sampler={}, fingerprints={}, train_config={})  # fmt: skip
    assert main(["check", "turns", str(single)]) == 2  # no run dir recorded, no --hf-checkpoint: said so
    assert (
        "its run's run.json is not at (no run dir recorded); pass --hf-checkpoint" in capsys.readouterr().err
    )
    assert main(["check", "turns", str(single), "--hf-checkpoint", str(TOOLS_MODEL)]) == 2
    assert "no multi-turn sample in" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--generate-max-turns", "0"], "--generate-max-turns must be >= 1, got 0"),
        (
            ["--generate-execute-tool-function-path", "agent_tools.not_async"],
            "must be `async def execute_tool",
        ),
        (
            ["--generate-execute-tool-function-path", "no_such_tools.run"],
            "cannot import module 'no_such_tools'",
        ),
        (
            ["--generate-tool-specs-path", "agent_tools.BAD_SCHEMA"],
            "tools[0] (calc) parameters is not a JSON schema",
        ),
        (
            ["--generate-tool-specs-path", "agent_tools.MISSING"],
            "module 'agent_tools' has no attribute 'MISSING'",
        ),
        (["--generate-tool-call-parser", "glm"], "--generate-tool-call-parser must be one of qwen25, hermes"),
    ],
)
def test_tool_loop_bad_input_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture, extra: list[str], message: str
) -> None:
    argv = ["train", *TOOL_LOOP, *extra, "--run-dir", str(tmp_path / "run")]
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


def test_tool_specs_file_and_chat_template_needed(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    specs = tmp_path / "tools.json"
    specs.write_text("[{not json")
    for extra, message in [
        (["--generate-tool-specs-path", str(specs)], f"--generate-tool-specs-path {specs}: not a JSON file"),
        (["--no-apply-chat-template"], "--generate-execute-tool-function-path needs --apply-chat-template"),
    ]:
        with pytest.raises(SystemExit) as exit_info:
            main(["train", *TOOL_LOOP, *extra, "--run-dir", str(tmp_path / "run")])
        assert exit_info.value.code == 2
        assert message in capsys.readouterr().err


@pytest.mark.parametrize(
    ("tool", "message"),
    [
        ("agent_tools.raises", "agent_tools.raises raised KeyError"),
        ("agent_tools.raises_timeout", "agent_tools.raises_timeout raised TimeoutError: the calculator"),
        ("agent_tools.returns_number", "returned int on sample"),
        ("agent_tools.sleeps", "ran past --agent-timeout 0.2 s on sample"),
        ("agent_tools.blocks", "agent_tools.blocks on sample "),
    ],
)
def test_a_failing_tool_fails_the_run_naming_it(tmp_path: Path, tool: str, message: str) -> None:
    argv = [*TOOL_LOOP, "--generate-execute-tool-function-path", tool, "--agent-timeout", "0.2"]
    with pytest.raises(RuntimeError) as error:
        train_short(tmp_path / "run", *argv, "--num-rollout", "1")
    text = str(error.value)
    assert message in text and "turn 1, call 0" in text and "tool 'calc'" in text
    if tool.endswith("raises"):
        assert "agent_tools.py:" in text  # the user's file:line


def test_inject_names_the_turn_of_the_first_difference(tool_run: Path) -> None:
    from grpolab.replay.inject import compare_rollouts

    recorded = _samples(tool_run)
    s = next(x for x in recorded if len(x.metadata[KEY]["finish_reasons"]) >= 2)
    tool_at = response_sources(s.metadata[KEY]).index(("tool", 1))
    changed = dataclasses.replace(
        s, response_ids=[*s.response_ids[:tool_at], 7, *s.response_ids[tool_at + 1 :]]
    )
    fresh = [changed if x is s else x for x in recorded]
    report = compare_rollouts(fresh, recorded, rollout_id=0)
    assert f"first diff at token {tool_at}, turn 1, tool" in report.describe(0.9)


def test_context_and_turn_limits_end_episodes(tmp_path: Path) -> None:
    capped = train_short(tmp_path / "ctx", *TOOL_LOOP, "--num-rollout", "1", "--debug-rollout-only",
                         "--rollout-max-context-len", "100", "--save-debug-rollout-data", str(tmp_path / "ctx{rollout_id}.grz"))  # fmt: skip
    samples = load_rollout(tmp_path / "ctx0.grz").samples
    assert all(len(s.prompt_ids) + s.response_length <= 100 for s in samples)
    ended = {s.metadata[KEY]["ended"] for s in samples}
    assert "context" in ended and all(
        s.finish_reason == "length" for s in samples if s.metadata[KEY]["ended"] == "context"
    )
    one = train_short(tmp_path / "one", *TOOL_LOOP, "--num-rollout", "1", "--debug-rollout-only",
                      "--generate-max-turns", "1", "--save-debug-rollout-data", str(tmp_path / "one{rollout_id}.grz"))  # fmt: skip
    for s in load_rollout(tmp_path / "one0.grz").samples:
        episode = s.metadata[KEY]
        assert (
            len(episode["finish_reasons"]) == 1 and not episode["tool_calls"]
        )  # a call at the last turn is not run
        assert episode["ended"] in ("max_turns", "answer", "length") and s.loss_mask.all()
    assert capped.is_dir() and one.is_dir()


def test_the_model_limit_counts_the_chat_templates_tokens(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """A 410-token GSM8K question before the template is 424 tokens with it: 424 + 102 would pass the raw
    count (410 + 102 = 512) and run past the model's 512 positions, single-turn and in the tool loop."""
    longest = max(GSM8K_TRAIN.read_text().splitlines(), key=len)
    data = tmp_path / "long.jsonl"
    data.write_text(longest + "\n")
    for extra in ([], TOOL_LOOP):
        argv = ["train", *extra, "--hf-checkpoint", str(TOOLS_MODEL), "--apply-chat-template", "--prompt-data",
                str(data), "--rollout-max-response-len", "102", "--run-dir", str(tmp_path / f"long{len(extra)}")]  # fmt: skip
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert (
            f"the longest prompt of --prompt-data ({data} line 1) is " in err
            and "chat template applied" in err
        )
        tokens = int(err.split(" line 1) is ")[1].split()[0])
        assert tokens + 102 > 512 and f"at most {512 - tokens}" in err


def test_context_cap_on_single_turn_samples_and_prompts_that_fill_it(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    rec = str(tmp_path / "single{rollout_id}.grz")
    train_short(tmp_path / "single", "--num-rollout", "1", "--debug-rollout-only", "--rollout-max-context-len", "48",
                "--rollout-max-response-len", "64", "--save-debug-rollout-data", rec)  # fmt: skip
    samples = load_rollout(tmp_path / "single0.grz").samples
    assert all(len(s.prompt_ids) + s.response_length <= 48 for s in samples)
    capped = [s for s in samples if len(s.prompt_ids) + s.response_length == 48]
    assert capped and all(s.finish_reason == "length" for s in capped)
    for extra in ([], TOOL_LOOP):  # a prompt of 37 tokens or more under a cap of 37 can never be answered
        argv = [
            "train",
            *extra,
            "--rollout-max-context-len",
            "37",
            "--run-dir",
            str(tmp_path / f"full{len(extra)}"),
        ]
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert "--rollout-max-context-len 37: --prompt-data" in err and "line 1 is already 37 tokens" in err

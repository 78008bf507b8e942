"""`grpolab check template` (issue 15 item 15): append-only rendering across turns and the answers'
mean −log-prob per token with and without the chat template, on the tiny model with its ChatML
template and with copies whose templates rewrite earlier turns (as Qwen3's templates do)."""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
from pathlib import Path

import pytest
import torch

from grpolab.checkers import template_check as tc
from grpolab.cli import main
from grpolab.core.modeling import load_causal_lm, load_tokenizer
from grpolab.fixtures import SMOLLM2_INSTALL, smollm2_gguf

# Qwen3-style: the reasoning of assistant turns before the last user message is dropped (written
# for this test after the behaviour of Qwen3's templates, not a copy of them)
DROPS_EARLIER_THINKING = (
    "{%- set ns = namespace(last_user=-1) %}"
    "{%- for m in messages %}{%- if m.role == 'user' %}{%- set ns.last_user = loop.index0 %}{%- endif %}{%- endfor %}"
    "{%- for m in messages %}{%- set content = m.content %}"
    "{%- if m.role == 'assistant' and '</think>' in content and loop.index0 < ns.last_user %}"
    "{%- set content = content.split('</think>')[-1].lstrip('\\n') %}{%- endif %}"
    "{{- '<|im_start|>' + m.role + '\\n' + content + '<|im_end|>\\n' }}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
# the generation prompt opens an empty think block that rendered assistant turns do not have
# (what Qwen3's templates do with enable_thinking=False)
EMPTY_THINK_PROMPT = (
    "{%- for m in messages %}{{- '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n<think>\\n\\n</think>\\n\\n' }}{%- endif %}"
)
CONVERSATION = [
    {"role": "user", "content": "What is 2 + 3?"},
    {"role": "assistant", "content": "<think>\n2 + 3 = 5\n</think>\n\n#### 5"},
    {"role": "user", "content": "And 4 + 4?"},
    {"role": "assistant", "content": "<think>\n4 + 4 = 8\n</think>\n\n#### 8"},
]


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path) -> dict[str, Path]:
    """The tiny model, and copies with other templates (or none)."""
    out = {"chatml": tiny_model_dir}
    for name, template in (
        ("qwen3", DROPS_EARLIER_THINKING),
        ("think_prompt", EMPTY_THINK_PROMPT),
        ("none", None),
    ):
        copy = tmp_path_factory.mktemp(name) / "model"
        shutil.copytree(tiny_model_dir, copy)
        if template is None:
            (copy / "chat_template.jinja").unlink()
        else:
            (copy / "chat_template.jinja").write_text(template)
        out[name] = copy
    return out


def test_chatml_is_append_only_qwen3_style_is_not_at_the_next_user_turn(models: dict[str, Path]) -> None:
    assert tc.first_break(load_tokenizer(models["chatml"]), CONVERSATION, 1) is None
    found = tc.first_break(load_tokenizer(models["qwen3"]), CONVERSATION, 1)
    assert found is not None
    assert (found.turn, found.role, found.with_generation_prompt) == (3, "user", False)
    assert "<think>\n2 + 3 = 5\n</think>" in found.shorter and "<think>" not in found.longer
    assert found.longer.endswith("#### 5<|im_end|>\n<|im_start|>user\nAnd 4 + 4?<|im_end|>\n")
    found = tc.first_break(load_tokenizer(models["think_prompt"]), CONVERSATION, 2)
    assert found is not None and (found.conversation, found.turn, found.role) == (2, 2, "assistant")
    assert found.with_generation_prompt and found.shorter.endswith("<think>\n\n</think>\n\n")


def _run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(["check", "template", *argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def _table(out: str) -> list[list[float]]:
    """[with, without] mean −log-prob per row of the report's table (the 'all' row last)."""
    rows = re.findall(r"(\d+\.\d{3}) \((\d+) tokens\)\s+(\d+\.\d{3}) \((\d+) tokens\)", out)
    return [[float(r[0]), float(r[2])] for r in rows]


def test_cli_on_the_tiny_model_exits_0_with_the_table(models: dict[str, Path], capsys) -> None:
    code, out, err = _run(capsys, "--hf-checkpoint", str(models["chatml"]), "--max-new-tokens", "8")
    assert code == 0, err
    assert "(vocabulary 1024: uniform noise is ln(1024) = 6.93 nats per token)" in out
    assert "append-only rendering: yes (1 built-in conversation(s)" in out
    table = _table(out)
    assert len(table) == tc.NUM_BUILTIN_PROMPTS + 1  # one row per built-in prompt, then the mean
    assert all(0 < v < 6.93 for row in table for v in row)


def test_cli_exits_1_naming_the_turn_of_a_qwen3_style_template(
    models: dict[str, Path], capsys, tmp_path
) -> None:
    messages = tmp_path / "conv.jsonl"
    messages.write_text(json.dumps({"messages": CONVERSATION}) + "\n")
    code, out, _ = _run(
        capsys, "--hf-checkpoint", str(models["qwen3"]), "--messages", str(messages), "--max-new-tokens", "4"
    )
    assert code == 1
    assert "append-only rendering: NO (1 of 1 --messages conversation(s))" in out
    assert "conversation 1, turn 3 (user): the rendering of turns 1..2 is not a prefix of turns 1..3" in out
    assert len(_table(out)) == 3  # the two given assistant turns, then the mean


def test_given_assistant_turns_are_scored_exactly(models: dict[str, Path]) -> None:
    tokenizer, model = load_tokenizer(models["chatml"]), load_causal_lm(models["chatml"])
    (first, second) = tc.score_conversations(
        model, tokenizer, [CONVERSATION], mode="greedy", max_new_tokens=4, stop_ids=(2,), seed=0
    )
    answer = list(tokenizer(CONVERSATION[3]["content"], add_special_tokens=False)["input_ids"])
    assert second.with_tokens == second.without_tokens == len(answer)
    for text, nll in (
        (
            tokenizer.apply_chat_template(CONVERSATION[:3], tokenize=False, add_generation_prompt=True),
            second.with_nll,
        ),
        ("What is 2 + 3?\n" + CONVERSATION[1]["content"] + "\nAnd 4 + 4?", second.without_nll),
    ):
        ids = list(tokenizer(text, add_special_tokens=False)["input_ids"])
        with torch.no_grad():
            logp = torch.log_softmax(model(input_ids=torch.tensor([ids + answer])).logits[0].double(), dim=-1)
        expected = -sum(float(logp[len(ids) - 1 + i, tok]) for i, tok in enumerate(answer))
        assert nll == pytest.approx(expected, rel=1e-4)
    assert first.label == "What is 2 + 3?" and second.label == "And 4 + 4?"


def test_bad_input_exits_2_naming_what(models: dict[str, Path], capsys, tmp_path) -> None:
    code, _, err = _run(capsys, "--hf-checkpoint", str(tmp_path / "missing"))
    assert code == 2 and "--hf-checkpoint" in err and "missing" in err
    code, _, err = _run(capsys, "--hf-checkpoint", str(models["none"]))
    assert code == 2 and "the tokenizer has no chat template to check" in err
    bad = tmp_path / "bad.jsonl"
    bad.write_text(
        json.dumps({"messages": CONVERSATION}) + "\n" + json.dumps({"messages": [{"role": "bot"}]}) + "\n"
    )
    code, _, err = _run(capsys, "--hf-checkpoint", str(models["chatml"]), "--messages", str(bad))
    assert code == 2 and f"--messages: {bad} row 2, message 1: expected" in err
    code, _, err = _run(
        capsys, "--hf-checkpoint", str(models["chatml"]), "--messages", str(tmp_path / "no.jsonl")
    )
    assert code == 2 and "--messages" in err and "does not exist" in err
    code, _, err = _run(capsys, "--hf-checkpoint", str(models["chatml"]), "--max-new-tokens", "0")
    assert code == 2 and "--max-new-tokens must be >= 1" in err


@pytest.mark.slow
def test_smollm2_instruct_answers_raw_prompts_with_higher_nll(capsys) -> None:
    """The issue's model: SmolLM2-135M-Instruct's template is append-only, and its own answers to the
    built-in prompts cost more nats per token without the template (minutes on 2 CPU cores)."""
    missing = [m for m in ("gguf", "accelerate") if importlib.util.find_spec(m) is None]
    path = smollm2_gguf()
    if missing or path is None:
        pytest.skip(f"SmolLM2-135M-Instruct GGUF not available ({SMOLLM2_INSTALL})")
    code, out, err = _run(capsys, "--hf-checkpoint", str(path), "--max-new-tokens", "32")
    assert code == 0, err
    assert "(vocabulary 49152: uniform noise is ln(49152) = 10.80 nats per token)" in out
    assert "append-only rendering: yes" in out
    with_template, without_template = _table(out)[-1]
    print(out)
    assert without_template > with_template

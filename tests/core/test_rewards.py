"""Tests for grpolab.core.rewards: GSM8K / boxed graders, custom reward loading, batch scoring."""

from __future__ import annotations

import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from grpolab.core.rewards import (
    REWARD_FNS,
    boxed_math_reward,
    extract_boxed,
    extract_math_answer,
    get_reward_fn,
    load_custom_reward,
    math_reward,
    normalize_answer,
    reward_value,
    score_samples,
)

# ------------------------------------------------------------------------------ math (GSM8K)


def test_answer_after_hashes_wins_over_long_filler() -> None:
    filler = " Let me double check: 3 apples plus 4 pears is 7 fruits, and 12 more." * 8
    response = "Some reasoning with 17 and 19.\n#### 42" + filler
    assert len(filler) >= 500
    assert extract_math_answer(response) == "42"
    assert math_reward(response, "42") == 1.0


def test_last_number_without_hashes() -> None:
    text = "Natalia sold 48 clips in April and 24 in May, so 72 clips, altogether."
    assert extract_math_answer(text) == "72"
    assert math_reward(text, "72") == 1.0


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("#### 1,000,000", "1000000"),
        ("#### -5", "-5"),
        ("The total is $1,234.50.", "1234.50"),
        ("It costs -$3.", "-3"),
        ("5-3 = 2", "2"),
        ("10 - 4", "4"),
        ("no number here", None),
        ("answer: #### none", None),
        ("", None),
    ],
)
def test_extract_math_answer(text: str, expected: str | None) -> None:
    assert extract_math_answer(text) == expected


def test_math_reward_cases() -> None:
    assert math_reward("#### 1,000,000", "1000000") == 1.0
    assert math_reward("#### -5", "5") == 0.0
    assert math_reward("#### -5", "-5") == 1.0
    assert math_reward("The answer is 3.50", "3.5") == 1.0
    assert math_reward("The answer is 72.", "72") == 1.0
    gsm8k_label = (
        "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\nNatalia sold 48+24 = <<48+24=72>>72 clips.\n#### 72"
    )
    assert math_reward("so 72 clips in total", gsm8k_label) == 1.0
    assert math_reward("so 71 clips in total", gsm8k_label) == 0.0
    assert math_reward("", "72") == 0.0
    assert math_reward("72", "") == 0.0
    assert isinstance(math_reward("72", "72"), float)


# ------------------------------------------------------------------------------ boxed


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (r"so \boxed{\frac{1}{3}}.", r"\frac{1}{3}"),
        (r"first \boxed{1} then \boxed{2}", "2"),
        (r"\boxed{\left\{1, \{2\}\right\}}", r"\left\{1, \{2\}\right\}"),
        (r"\boxed{a_{i_{j}}} and \fbox{7}", "7"),
        (r"$\boxed 5$", "5"),
        (r"truncated \boxed{\frac{1}{", None),
        ("no box", None),
    ],
)
def test_extract_boxed(text: str, expected: str | None) -> None:
    assert extract_boxed(text) == expected


def test_normalize_answer() -> None:
    assert normalize_answer(r"\left( 1, 2 \right).") == "(1,2)"
    assert normalize_answer(r"\dfrac{1}{2}\!\text{ cm}") == r"\frac{1}{2}cm"


def test_boxed_math_reward() -> None:
    assert boxed_math_reward(r"thus \boxed{\dfrac{1}{3}}", r"\frac{1}{3}") == 1.0
    assert boxed_math_reward(r"thus \boxed{0.5}", r"\frac{1}{2}") == 1.0
    assert boxed_math_reward(r"thus \boxed{1,000}", "1000") == 1.0
    assert boxed_math_reward(r"thus \boxed{3.50}", r"the answer is \boxed{3.5}") == 1.0
    assert boxed_math_reward(r"thus \boxed{72}", "reasoning\n#### 72") == 1.0
    assert boxed_math_reward(r"thus \boxed{10\text{ apples}}", "10apples") == 1.0
    assert boxed_math_reward(r"thus \boxed{73}", "72") == 0.0
    assert boxed_math_reward("72", "72") == 0.0  # no box
    assert boxed_math_reward("", "72") == 0.0
    assert boxed_math_reward(r"\boxed{}", "") == 0.0


def test_unknown_rm_type_lists_valid_names() -> None:
    assert get_reward_fn("math") is math_reward
    assert REWARD_FNS.names() == ["boxed_math", "math"]
    with pytest.raises(
        ValueError, match=r"unknown reward function 'gsm9k' \(--rm-type\); valid: boxed_math, math"
    ):
        get_reward_fn("gsm9k")
    with pytest.raises(ValueError, match="already registered"):
        REWARD_FNS.register("math")(boxed_math_reward)


def test_reward_value_reduces_dicts_and_numbers() -> None:
    assert reward_value({"acc": 1, "fmt": 0.5}, "fmt", where="r") == 0.5
    assert reward_value(torch.tensor([0.25]), None, where="r") == 0.25
    assert reward_value(True, None, where="r") == 1.0 and reward_value("0.5", None, where="r") == 0.5
    with pytest.raises(ValueError, match=r"^r is a dict \(keys \['1', 'acc'\]\); set --reward-key"):
        reward_value({"acc": 1.0, 1: 2.0}, None, where="r")
    with pytest.raises(ValueError, match=r"^r has no --reward-key 'x'; keys present: \['acc'\]$"):
        reward_value({"acc": 1.0}, "x", where="r")
    for bad in (None, "high", torch.tensor([1.0, 2.0]), [1.0]):
        with pytest.raises(ValueError, match="^r is not a number: "):
            reward_value(bad, None, where="r")


# ------------------------------------------------------------------------------ custom functions


@pytest.fixture
def rm_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    package = tmp_path / "my_rms"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "rm.py").write_text(
        textwrap.dedent(
            """
            import asyncio

            NOT_CALLABLE = 3
            running = 0
            peak = 0

            def sync_rm(sample):
                return 1.0 if sample["response"] == sample["label"] else 0.0

            async def async_rm(sample):
                global running, peak
                running += 1
                peak = max(peak, running)
                await asyncio.sleep(0.01)
                running -= 1
                return {"acc": float(sample["response"] == sample["label"]), "len": len(sample["response"])}

            async def group_rm(samples):
                best = max(len(s["response"]) for s in samples)
                return [float(len(s["response"]) == best) for s in samples]

            def failing_rm(sample):
                if sample["index"] == 2:
                    raise KeyError("boom")
                return 0.0
            """
        )
    )
    (package / "broken.py").write_text("import definitely_not_a_module_xyz\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "my_rms.rm"
    for name in [n for n in sys.modules if n == "my_rms" or n.startswith("my_rms.")]:
        del sys.modules[name]  # each test imports its own fresh copy


def _samples(responses: list[str], label: str = "a") -> list[dict]:
    return [
        {"prompt": "p", "response": r, "label": label, "index": i, "group_index": i // 2, "metadata": {}}
        for i, r in enumerate(responses)
    ]


def test_load_custom_reward_errors(rm_module: str) -> None:
    assert load_custom_reward(f"{rm_module}.sync_rm")(_samples(["a"])[0]) == 1.0
    with pytest.raises(ValueError, match=r"'my_rms\.nope\.fn'.*module 'my_rms\.nope'.*ModuleNotFoundError"):
        load_custom_reward("my_rms.nope.fn")
    with pytest.raises(ValueError, match=r"module 'my_rms\.broken'.*definitely_not_a_module_xyz"):
        load_custom_reward("my_rms.broken.fn")
    with pytest.raises(ValueError, match=r"module 'my_rms\.rm' has no attribute 'missing'"):
        load_custom_reward(f"{rm_module}.missing")
    with pytest.raises(ValueError, match="not callable"):
        load_custom_reward(f"{rm_module}.NOT_CALLABLE")
    with pytest.raises(ValueError, match="package.module.function"):
        load_custom_reward("justaname")


def test_builtin_scoring() -> None:
    samples = _samples(["#### 5", "#### 6", "", "the answer is 5"], label="5")
    assert score_samples(samples, rm_type="math", group_size=2, reward_key=None) == [1.0, 0.0, 0.0, 1.0]
    with pytest.raises(ValueError, match="--rm-type or --custom-rm-path"):
        score_samples(samples, rm_type=None, group_size=2, reward_key=None)


def test_async_custom_fn_runs_concurrently_and_picks_key(rm_module: str) -> None:
    fn = load_custom_reward(f"{rm_module}.async_rm")
    samples = _samples(["a", "bb", "a", "ccc"])
    rewards = score_samples(samples, rm_type="math", custom_fn=fn, group_size=2, reward_key="acc")
    assert rewards == [1.0, 0.0, 1.0, 0.0]
    import my_rms.rm as module

    assert module.peak == 4  # all four calls were in flight together
    lengths = score_samples(samples, rm_type=None, custom_fn=fn, reward_key="len")
    assert lengths == [1.0, 2.0, 1.0, 3.0]


def test_missing_reward_key(rm_module: str) -> None:
    fn = load_custom_reward(f"{rm_module}.async_rm")
    with pytest.raises(
        ValueError, match=r"sample index 0 has no --reward-key 'score'; keys present: \['acc', 'len'\]"
    ):
        score_samples(_samples(["a"]), rm_type=None, custom_fn=fn, group_size=1, reward_key="score")
    with pytest.raises(ValueError, match="set --reward-key"):
        score_samples(_samples(["a"]), rm_type=None, custom_fn=fn, group_size=1, reward_key=None)


def test_group_rm(rm_module: str) -> None:
    fn = load_custom_reward(f"{rm_module}.group_rm")
    samples = _samples(["a", "bbb", "cc", "d"])
    rewards = score_samples(samples, rm_type=None, custom_fn=fn, group_rm=True, group_size=2, reward_key=None)
    assert rewards == [0.0, 1.0, 1.0, 0.0]
    with pytest.raises(ValueError, match="groups of 3"):
        score_samples(samples, rm_type=None, custom_fn=fn, group_rm=True, group_size=3, reward_key=None)


def test_group_rm_wrong_length() -> None:
    async def short(samples: list[dict]) -> list[float]:
        return [1.0]

    with pytest.raises(ValueError, match="list of 2 rewards for sample indices 0..1"):
        score_samples(
            _samples(["a", "b"]), rm_type=None, custom_fn=short, group_rm=True, group_size=2, reward_key=None
        )


def test_raising_reward_names_index_and_response(rm_module: str) -> None:
    fn = load_custom_reward(f"{rm_module}.failing_rm")
    long_response = "the culprit " + "x" * 1000
    samples = _samples(["ok", "ok", long_response, "ok"])
    with pytest.raises(RuntimeError, match="sample index 2") as info:
        score_samples(samples, rm_type=None, custom_fn=fn, group_size=2, reward_key=None)
    message = str(info.value)
    assert "the culprit xxx" in message and "more chars" in message and len(message) < 500
    assert isinstance(info.value.__cause__, KeyError)


def test_raising_group_reward_names_indices() -> None:
    async def bad(samples: list[dict]) -> list[float]:
        if samples[0]["response"] == "c":
            raise ZeroDivisionError("nope")
        return [0.0] * len(samples)

    with pytest.raises(RuntimeError, match=r"sample indices 2\.\.3.*first response: 'c'") as info:
        score_samples(
            _samples(["a", "b", "c", "d"]),
            rm_type=None,
            custom_fn=bad,
            group_rm=True,
            group_size=2,
            reward_key=None,
        )
    assert isinstance(info.value.__cause__, ZeroDivisionError)

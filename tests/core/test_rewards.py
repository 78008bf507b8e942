"""Tests for grpolab.core.rewards: GSM8K / boxed graders, custom reward loading, batch scoring."""

from __future__ import annotations

import importlib
import json
import math
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from grpolab.cli import main
from grpolab.core.config.generation import RewardConfig
from grpolab.core.reward_calls import RewardError, RewardTimeout
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
            import json
            import signal
            import threading

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

            def parse(sample):
                return json.loads("{" + sample["response"])  # raises inside the json package

            def calls_a_library(sample):
                return parse(sample)

            def nan_rm(sample):
                return float("nan") if sample["index"] == 1 else 0.0

            async def inf_rm(sample):
                return float("-inf") if sample["index"] == 3 else 0.0

            def text_rm(sample):
                return {"acc": "high"} if sample["index"] == 2 else {"acc": 1.0}

            RELEASE = threading.Event()  # set by the fixture's teardown: the stuck thread then ends

            def stuck(sample):
                if sample["index"] == 1:
                    RELEASE.wait()
                return 0.0

            async def async_stuck(sample):
                if sample["index"] == 2:
                    await asyncio.sleep(3600)
                return 0.0

            def own_timeout(sample):
                raise TimeoutError("the verifier gave up")

            CALLS = []

            def records_thread(sample):
                CALLS.append((sample["index"], threading.current_thread().name))
                return 0.0

            def uses_signal(sample):
                signal.signal(signal.SIGALRM, signal.SIG_DFL)
                return 0.0
            """
        )
    )
    (package / "broken.py").write_text("import definitely_not_a_module_xyz\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "my_rms.rm"
    if "my_rms.rm" in sys.modules:
        sys.modules["my_rms.rm"].RELEASE.set()
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

    with pytest.raises(
        RewardError, match="test_group_rm_wrong_length.<locals>.short must return a list of 2 rewards"
    ):
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
    assert "the culprit xxx" in message and "more chars" in message and len(message) < 600
    assert isinstance(info.value.__cause__, KeyError)
    assert isinstance(info.value, RewardError)
    line = _line_of(rm_module, 'raise KeyError("boom")')
    assert message.startswith(
        "reward function my_rms.rm.failing_rm failed on sample index 2 (KeyError: 'boom')"
    )
    assert f'rm.py:{line} in failing_rm: raise KeyError("boom")' in message


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


# ------------------------------------------------------------------------------ failures name the user's code


def _line_of(module: str, text: str) -> int:
    """1-based line of `text` in the module's file."""
    path = Path(importlib.import_module(module).__file__)
    return next(i for i, line in enumerate(path.read_text().splitlines(), 1) if text in line)


@pytest.mark.parametrize("timeout", [None, 5.0])  # inline on the loop, and on the worker thread
def test_error_names_the_innermost_line_of_the_users_file(rm_module: str, timeout: float | None) -> None:
    fn = load_custom_reward(f"{rm_module}.calls_a_library", timeout)
    with pytest.raises(RewardError) as info:
        score_samples(_samples(["a", "b"]), rm_type=None, custom_fn=fn)
    message = str(info.value)
    assert message.startswith(
        "reward function my_rms.rm.calls_a_library failed on sample index 0 (JSONDecodeError"
    )
    line = _line_of(rm_module, 'return json.loads("{"')
    assert f"rm.py:{line} in parse: return json.loads(" in message  # the innermost frame in the user's file
    assert "; raised in " in message and "json" in message.split("; raised in ")[1]  # and where it raised


def test_non_finite_and_non_number_rewards_name_function_and_sample(rm_module: str) -> None:
    cases = [
        (
            "nan_rm",
            None,
            "reward function my_rms.rm.nan_rm returned nan for sample index 1; a reward must be",
        ),
        ("inf_rm", None, "reward function my_rms.rm.inf_rm returned -inf for sample index 3"),
        (
            "text_rm",
            "acc",
            "reward function my_rms.rm.text_rm returned a non-number for sample index 2: 'high' (str)",
        ),
    ]
    for name, key, expected in cases:
        with pytest.raises(RewardError) as info:
            score_samples(
                _samples(["a"] * 4),
                rm_type=None,
                custom_fn=load_custom_reward(f"{rm_module}.{name}"),
                reward_key=key,
            )
        assert str(info.value).startswith(expected), str(info.value)
    with pytest.raises(
        ValueError, match="reward of my_rms.rm.text_rm for sample index 0 has no --reward-key 'x'"
    ):
        score_samples(
            _samples(["a"]),
            rm_type=None,
            custom_fn=load_custom_reward(f"{rm_module}.text_rm"),
            reward_key="x",
        )


def test_sample_index_is_the_samples_own_index() -> None:
    """On rank 1 of a run the list holds rollout samples 10..13: messages name the rollout index."""

    def bad(sample: dict) -> float:
        if sample["response"] == "x":
            raise ValueError("no")
        return 0.0

    samples = _samples(["a", "a", "x", "a"])
    for i, sample in enumerate(samples):
        sample["index"] = 10 + i
    with pytest.raises(
        RewardError,
        match=r"test_sample_index_is_the_samples_own_index.<locals>.bad failed on sample index 12 ",
    ):
        score_samples(samples, rm_type=None, custom_fn=bad)


# ------------------------------------------------------------------------------ --reward-timeout


@pytest.mark.parametrize(("name", "index", "abandoned"), [("stuck", 1, True), ("async_stuck", 2, False)])
def test_a_stuck_reward_times_out(rm_module: str, name: str, index: int, abandoned: bool) -> None:
    fn = load_custom_reward(f"{rm_module}.{name}", timeout=0.3)
    start = time.monotonic()
    with pytest.raises(RewardTimeout) as info:
        score_samples(_samples(["a"] * 4), rm_type=None, custom_fn=fn)
    assert time.monotonic() - start < 5.0
    message = str(info.value)
    assert message.startswith(
        f"reward function my_rms.rm.{name} did not return within --reward-timeout 0.3 s on sample index {index}"
    )
    assert ("worker thread is abandoned" in message) is abandoned and "the run ends" in message
    assert isinstance(info.value, RewardError) and isinstance(info.value, RuntimeError)  # exit 1


def test_the_timeout_counts_from_each_calls_start(rm_module: str, tmp_path: Path) -> None:
    """Sync calls run one after another; each gets the whole timeout (4 x 0.15 s under a 0.4 s timeout)."""
    (tmp_path / "my_rms" / "slow.py").write_text(
        "import time\ndef rm(sample):\n    time.sleep(0.15)\n    return 1.0\n"
    )
    fn = load_custom_reward("my_rms.slow.rm", timeout=0.4)
    assert score_samples(_samples(["a"] * 4), rm_type=None, custom_fn=fn) == [1.0] * 4


def test_sync_rewards_run_in_order_on_one_worker_thread_only_under_a_timeout(rm_module: str) -> None:
    import my_rms.rm as module

    score_samples(
        _samples(["a"] * 5), rm_type=None, custom_fn=load_custom_reward(f"{rm_module}.records_thread", 9.0)
    )
    assert [index for index, _ in module.CALLS] == [0, 1, 2, 3, 4]
    assert {thread for _, thread in module.CALLS} == {"grpolab-reward"}
    module.CALLS.clear()
    score_samples(
        _samples(["a"] * 2), rm_type=None, custom_fn=load_custom_reward(f"{rm_module}.records_thread")
    )
    assert {thread for _, thread in module.CALLS} == {threading.main_thread().name}


def test_the_users_own_timeout_error_is_not_ours(rm_module: str) -> None:
    with pytest.raises(RewardError) as info:
        score_samples(
            _samples(["a"]), rm_type=None, custom_fn=load_custom_reward(f"{rm_module}.own_timeout", 5.0)
        )
    assert not isinstance(info.value, RewardTimeout)
    assert "failed on sample index 0 (TimeoutError: the verifier gave up)" in str(info.value)


def test_main_thread_only_code_gets_a_hint(rm_module: str) -> None:
    with pytest.raises(RewardError, match="--reward-timeout; 0 runs them on the main thread"):
        score_samples(
            _samples(["a"]), rm_type=None, custom_fn=load_custom_reward(f"{rm_module}.uses_signal", 5.0)
        )
    assert score_samples(
        _samples(["a"]), rm_type=None, custom_fn=load_custom_reward(f"{rm_module}.uses_signal")
    ) == [0.0]


def test_reward_timeout_flag() -> None:
    assert RewardConfig().reward_timeout == 300.0 and RewardConfig().call_timeout == 300.0
    assert RewardConfig(reward_timeout=0).call_timeout is None
    for bad in (-1.0, math.inf, math.nan):
        with pytest.raises(ValueError, match="--reward-timeout must be a finite number of seconds >= 0"):
            RewardConfig(reward_timeout=bad)


# ------------------------------------------------------------------------------ end to end: grpolab train


_E2E = ["--num-rollout", "1", "--rollout-batch-size", "2", "--n-samples-per-prompt", "2"]
_E2E += ["--rollout-max-response-len", "8", "--no-progress"]


@pytest.mark.parametrize(
    ("name", "extra", "needle"),
    [
        (
            "failing_rm",
            [],
            "reward function my_rms.rm.failing_rm failed on sample index 2 (KeyError: 'boom') at ",
        ),
        ("nan_rm", [], "reward function my_rms.rm.nan_rm returned nan for sample index 1"),
        (
            "stuck",
            ["--reward-timeout", "1"],
            "my_rms.rm.stuck did not return within --reward-timeout 1 s on sample index 1",
        ),
        (
            "async_stuck",
            ["--reward-timeout", "1"],
            "async_stuck did not return within --reward-timeout 1 s on sample index 2",
        ),
    ],
)
def test_train_fails_with_exit_1_naming_the_reward(
    rm_module: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    name: str,
    extra: list[str],
    needle: str,
) -> None:
    run_dir = tmp_path / "run"
    code = main(
        ["train", *_E2E, "--custom-rm-path", f"{rm_module}.{name}", *extra, "--run-dir", str(run_dir)]
    )
    err = capsys.readouterr().err
    assert code == 1 and needle in err, err
    last = json.loads((run_dir / "events.jsonl").read_text().splitlines()[-1])
    assert last["event"] == "status" and last["status"] == "failed" and needle in last["error"]

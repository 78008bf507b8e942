"""Rule-based rewards (`--rm-type`), custom reward functions (`--custom-rm-path`) and batch scoring.

What is really computed:
1. `math` (GSM8K): the number after the last `####` in the response, else the last number in it,
   compared numerically (exact Decimal) with the label's number. 1.0 or 0.0. Deviation from Miles,
   whose `math` grades the last `\\boxed{}`: that grader is `boxed_math` here.
2. `boxed_math`: the last `\\boxed{...}` / `\\fbox{...}` (balanced braces) compared with the label
   by normalized string, or numerically (exact fractions) when both sides parse as numbers.
3. Custom functions, imported once at startup from `pkg.mod.fn`: sync or async,
   `fn(sample) -> float | dict` or, with `--group-rm`, `fn(samples) -> list[float | dict]`.
   Async calls run concurrently; dict rewards are reduced with `--reward-key`. Each call runs under
   `--reward-timeout` (reward_calls.py), and a call that raises, times out or returns NaN/inf or a
   non-number fails the run with a `RewardError` naming the function, the sample and the user's line.

Sample dicts carry `prompt`, `response`, `label`, `index`, `group_index`, `metadata`.
"""

from __future__ import annotations

import asyncio
import math
import re
from collections.abc import Callable
from decimal import Decimal, InvalidOperation
from fractions import Fraction
from typing import Any

from grpolab.core.dotted_path import import_callable
from grpolab.core.registry import Registry
from grpolab.core.reward_calls import CustomReward, RewardCaller, RewardError, function_name

RewardFn = Callable[[str, str], float]
"""A built-in reward: `(response, label) -> float`."""

REWARD_FNS: Registry[RewardFn] = Registry("reward function", "--rm-type")
"""The built-in rewards by `--rm-type` name; an unknown name lists the valid ones."""

# ---------------------------------------------------------------------------------------------
# Numbers

# A minus is a sign only when it does not follow a word character or ')' ("5-3" is not "-3").
_NUMBER_RE = re.compile(
    r"(?P<sign>(?<![\w)])-)?\$?"
    r"(?P<num>\d{1,3}(?:,\d{3})+(?!\d)(?:\.\d+)?|\d+(?:\.\d+)?|\.\d+)"
)


def _number_text(match: re.Match[str]) -> str:
    return (match.group("sign") or "") + match.group("num").replace(",", "")


def extract_math_answer(text: str) -> str | None:
    """GSM8K-style final answer: the first number after the LAST `####`, else the last number.

    Numbers may carry thousands commas (`1,000,000`), a minus sign, a decimal part, a `$` prefix;
    a trailing `.` is not part of the number. Returns the number with commas and `$` removed
    (`"1000000"`, `"-5"`, `"3.50"`), or None when there is none (also when the last `####` is not
    followed by a number).
    """
    if "####" in text:
        match = _NUMBER_RE.search(text.rsplit("####", 1)[1])
        return _number_text(match) if match else None
    matches = list(_NUMBER_RE.finditer(text))
    return _number_text(matches[-1]) if matches else None


def _as_decimal(text: str | None) -> Decimal | None:
    if text is None:
        return None
    try:
        value = Decimal(text)
    except InvalidOperation:
        return None
    return value if value.is_finite() else None


@REWARD_FNS.register("math")
def math_reward(response: str, label: str) -> float:
    """`--rm-type math`: 1.0 if the response's GSM8K answer equals the label's number, else 0.0.

    The label's number is taken after its `####` when present (raw GSM8K answers), else from the
    label itself. Comparison is exact on Decimals, so `3.50` == `3.5` and `1,000` == `1000`.
    """
    if not response:
        return 0.0
    predicted = _as_decimal(extract_math_answer(response))
    expected = _as_decimal(extract_math_answer(str(label)))
    if predicted is None or expected is None:
        return 0.0
    return 1.0 if predicted == expected else 0.0


# ---------------------------------------------------------------------------------------------
# Boxed answers

_BOX_COMMANDS = ("\\boxed", "\\fbox")


def extract_boxed(text: str) -> str | None:
    """Contents of the last `\\boxed{...}` or `\\fbox{...}` (nested braces balanced), or None.

    Also accepts the brace-less form `\\boxed 5` (up to the next `$`). A last box whose braces
    never close (a truncated response) gives None.
    """
    start = max(text.rfind(command) for command in _BOX_COMMANDS)
    if start < 0:
        return None
    command = next(c for c in _BOX_COMMANDS if text.startswith(c, start))
    rest = text[start + len(command) :]
    if rest.startswith(" "):
        return rest.lstrip().split("$", 1)[0].strip() or None
    if not rest.startswith("{"):
        return None
    depth = 0
    for i, char in enumerate(rest):
        if char == "{":
            depth += 1
        elif char == "}":
            depth -= 1
            if depth == 0:
                return rest[1:i]
    return None


_TEXT_RE = re.compile(r"\\(?:text|textbf|mathrm)\{([^{}]*)\}")
_FRAC_RE = re.compile(r"^(-?)\\frac\{([^{}]+)\}\{([^{}]+)\}$")


def normalize_answer(text: str) -> str:
    """Normalize a boxed answer for string comparison.

    Unwraps `\\text{}` (and `\\textbf{}`, `\\mathrm{}`), drops `\\left`, `\\right`, `\\!`, `\\,`,
    `$` and all whitespace, maps `\\dfrac`/`\\tfrac` to `\\frac`, strips a trailing `.`.
    """
    text = _TEXT_RE.sub(r"\1", text)
    for old, new in (("\\left", ""), ("\\right", ""), ("\\!", ""), ("\\,", ""), ("$", "")):
        text = text.replace(old, new)
    text = text.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    text = "".join(text.split())
    return text.rstrip(".")


def _parse_number(text: str) -> Fraction | None:
    """An exact number from a normalized answer: `1,000`, `-3.5`, `\\frac{1}{3}`, `2/3`; else None."""
    match = _FRAC_RE.match(text)
    if match:
        sign, numerator, denominator = match.groups()
        text = f"{sign}{numerator}/{denominator}"
    parts = text.split("/")
    if len(parts) > 2:
        return None
    values = []
    for part in parts:
        if not re.fullmatch(r"-?(?:\d{1,3}(?:,\d{3})+|\d+)?(?:\.\d+)?", part) or not re.search(r"\d", part):
            return None
        values.append(Fraction(Decimal(part.replace(",", ""))))
    if len(values) == 2:
        return values[0] / values[1] if values[1] != 0 else None
    return values[0]


@REWARD_FNS.register("boxed_math")
def boxed_math_reward(response: str, label: str) -> float:
    """`--rm-type boxed_math`: 1.0 if the last box in the response matches the label, else 0.0.

    The label is box-extracted when it has a box, else taken after its last `####`, else used as
    is. Match = equal `normalize_answer` strings, or equal exact values when both parse as numbers.
    No box in the response -> 0.0.
    """
    predicted = extract_boxed(response) if response else None
    if predicted is None:
        return 0.0
    label = str(label)
    if any(command in label for command in _BOX_COMMANDS):
        expected = extract_boxed(label)
    elif "####" in label:
        expected = label.rsplit("####", 1)[1]
    else:
        expected = label
    if expected is None:
        return 0.0
    predicted, expected = normalize_answer(predicted), normalize_answer(expected)
    if not expected:
        return 0.0
    if predicted == expected:
        return 1.0
    predicted_value, expected_value = _parse_number(predicted), _parse_number(expected)
    if predicted_value is not None and expected_value is not None and predicted_value == expected_value:
        return 1.0
    return 0.0


# ---------------------------------------------------------------------------------------------
# Built-in lookup and custom functions


def get_reward_fn(rm_type: str) -> RewardFn:
    """The built-in `(response, label) -> float` registered as `rm_type` (`--rm-type`).

    Raises:
        ValueError: unknown name; the message names `--rm-type` and lists the valid names.
    """
    return REWARD_FNS.get(rm_type)


def load_custom_reward(path: str, timeout: float | None = None) -> CustomReward:
    """Import `pkg.mod.fn` (`--custom-rm-path`); return it with the timeout its calls run under.

    Args:
        path: `pkg.mod.fn`, importable from sys.path (PYTHONPATH).
        timeout: `--reward-timeout` in seconds, or None to wait forever.

    Raises:
        ValueError: naming the path, the module and the underlying error, when the path has no
            module part, the module does not import, the attribute is missing or not callable.
    """
    fn = import_callable(path, "--custom-rm-path")
    return CustomReward(fn, timeout)


# ---------------------------------------------------------------------------------------------
# Batch scoring


def _shorten(text: Any, limit: int = 200) -> str:
    text = str(text)
    return text if len(text) <= limit else text[:limit] + f"... [{len(text) - limit} more chars]"


def reward_value(value: Any, reward_key: str | None, *, where: str) -> float:
    """One reward as a float; a dict reward is reduced to its `reward_key` entry (Miles `--reward-key`).

    The one place a dict reward is picked apart: live scoring and the Miles dump import use it.
    Anything `float()` accepts is a number (int, float, bool, a one-element tensor, a numeric string).

    Args:
        value: what a reward function returned (or a dump stored).
        reward_key: `--reward-key`, or None when rewards are plain numbers.
        where: names the reward in messages, e.g. "reward for sample index 3".

    Raises:
        ValueError: `{where} is a dict (keys [...]); set --reward-key ...` without a key,
            `{where} has no --reward-key 'k'; keys present: [...]`, or `{where} is not a number: ...`.
    """
    picked = _pick_key(value, reward_key, where=where)
    number = _as_float(picked)
    if number is None:
        raise ValueError(f"{where} is not a number: {_shorten(repr(picked))}")
    return number


def _pick_key(value: Any, reward_key: str | None, *, where: str) -> Any:
    """A dict reward's `reward_key` entry; any other value as is. ValueError: see `reward_value`."""
    if not isinstance(value, dict):
        return value
    keys = sorted(map(str, value))
    if reward_key is None:
        raise ValueError(f"{where} is a dict (keys {keys}); set --reward-key to pick one")
    if reward_key not in value:
        raise ValueError(f"{where} has no --reward-key {reward_key!r}; keys present: {keys}")
    return value[reward_key]


def _as_float(value: Any) -> float | None:
    try:
        return float(value)
    except (TypeError, ValueError, RuntimeError):  # RuntimeError: a multi-element tensor
        return None


def _index(sample: dict, position: int) -> int:
    index = sample.get("index")
    return index if isinstance(index, int) else position


async def _score_one(caller: RewardCaller, sample: dict, position: int) -> Any:
    index = _index(sample, position)
    return await caller.call(
        sample, what=f"sample index {index}", context=f"response: {_shorten(sample.get('response'))!r}"
    )


async def _score_group(caller: RewardCaller, group: list[dict], start: int) -> list[Any]:
    span = f"sample indices {_index(group[0], start)}..{_index(group[-1], start + len(group) - 1)}"
    context = f"first response: {_shorten(group[0].get('response'))!r}"
    rewards = await caller.call(group, what=span, context=context)
    if not isinstance(rewards, (list, tuple)) or len(rewards) != len(group):
        raise RewardError(
            f"group reward function {caller.name} must return a list of {len(group)} rewards for {span}, "
            f"got {_shorten(repr(rewards))}"
        )
    return list(rewards)


def _checked_reward(value: Any, reward_key: str | None, *, name: str, index: int) -> float:
    """A user's raw reward as a finite float (dict reduced by `reward_key`).

    Raises:
        ValueError: a dict reward and `--reward-key` do not fit (`reward_value`; a flag to set).
        RewardError: the function returned a non-number, NaN or ±inf.
    """
    picked = _pick_key(value, reward_key, where=f"reward of {name} for sample index {index}")
    number = _as_float(picked)
    if number is None:
        raise RewardError(
            f"reward function {name} returned a non-number for sample index {index}: "
            f"{_shorten(repr(picked))} ({type(picked).__name__})"
        )
    if not math.isfinite(number):
        raise RewardError(
            f"reward function {name} returned {number} for sample index {index}; "
            "a reward must be a finite number"
        )
    return number


def _builtin_sample_fn(rm_type: str) -> Callable[[dict], float]:
    reward_fn = get_reward_fn(rm_type)

    def score(sample: dict) -> float:
        return reward_fn(sample["response"], "" if sample.get("label") is None else sample["label"])

    score.__qualname__ = reward_fn.__qualname__
    score.__module__ = reward_fn.__module__
    return score


def score_samples(
    samples: list[dict],
    *,
    rm_type: str | None,
    custom_fn: Callable[..., Any] | None = None,
    group_rm: bool = False,
    group_size: int = 1,
    reward_key: str | None = None,
) -> list[float]:
    """Score every sample; async reward functions run concurrently (asyncio.gather under asyncio.run).

    `custom_fn` (from `load_custom_reward`, a `CustomReward` with its `--reward-timeout`; a plain
    callable has no timeout) takes precedence over `rm_type`. With `group_rm`, samples are split into
    contiguous groups of `group_size` and `custom_fn(group)` returns one reward per sample (a built-in
    rm_type still scores per sample). Dict rewards are reduced with `reward_key`. How calls run (event
    loop, worker thread) is `reward_calls.RewardCaller`. "Sample index" in messages is the sample's
    `index` field (its position in the rollout), else its position in `samples`. Call it from
    synchronous code: it starts its own event loop, so it cannot run inside a running one.

    Returns:
        one float reward per sample, in order.

    Raises:
        ValueError: neither rm_type nor custom_fn, len(samples) not a multiple of group_size with
            group_rm, a dict reward that `reward_key` does not fit (names --reward-key, the function
            and the keys present): the flags are wrong.
        RewardError (a RuntimeError): the user's function failed: it raised (the message names the
            function as pkg.mod.fn, the sample index, the innermost line of the function's own file and
            the response, truncated to 200 chars; the exception chained), timed out (`RewardTimeout`),
            returned NaN/inf or a non-number, or (group) not one reward per sample.
    """
    if custom_fn is None and rm_type is None:
        raise ValueError("no reward function: set --rm-type or --custom-rm-path")
    fn = custom_fn if custom_fn is not None else _builtin_sample_fn(rm_type)
    grouped = group_rm and custom_fn is not None
    if grouped and (group_size < 1 or len(samples) % group_size):
        raise ValueError(f"--group-rm: {len(samples)} samples do not split into groups of {group_size}")
    raw = asyncio.run(_score_all(fn, samples, group_size if grouped else None))
    name = function_name(fn)
    return [
        _checked_reward(value, reward_key, name=name, index=_index(sample, i))
        for i, (sample, value) in enumerate(zip(samples, raw))
    ]


async def _score_all(fn: Callable[..., Any], samples: list[dict], group_size: int | None) -> list[Any]:
    """Every sample's raw reward, in order: one call per sample, or per group of `group_size`."""
    caller = RewardCaller(fn)
    try:
        if group_size is None:
            return await asyncio.gather(*(_score_one(caller, sample, i) for i, sample in enumerate(samples)))
        starts = range(0, len(samples), group_size)
        groups = await asyncio.gather(*(_score_group(caller, samples[s : s + group_size], s) for s in starts))
    finally:
        caller.close()
    return [reward for group in groups for reward in group]

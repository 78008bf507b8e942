"""GRPO numeric guard on hand-computed rewards and advantages; CheckFailure shape."""

from __future__ import annotations

import math
import pickle

import pytest
import torch

from grpolab.checkers.errors import CheckFailure
from grpolab.checkers.numeric_guard import format_findings, guard_rewards, raise_on_findings
from grpolab.core.algorithms import grpo_advantages


def _guard(rewards: torch.Tensor, groups: list[int], **kw: float) -> list:
    group_ids = torch.tensor(groups)
    return guard_rewards(rewards, group_ids, grpo_advantages(rewards, group_ids), **kw)


def test_tiny_std_and_float32_residue() -> None:
    rewards = torch.tensor([0.1, 0.1 + 1e-9, 1.0, 0.0], dtype=torch.float64)
    # std of [0.1, 0.1 + 1e-9] = 1e-9 / sqrt(2) = 7.071e-10; grpolab (no epsilon) gives ±1/sqrt(2)
    assert grpo_advantages(rewards, torch.tensor([4, 4, 9, 9]))[:2].tolist() == pytest.approx(
        [-math.sqrt(0.5), math.sqrt(0.5)], rel=1e-6
    )
    findings = _guard(rewards, [4, 4, 9, 9])
    assert [(f.code, f.group, f.samples, f.severity) for f in findings] == [
        ("tiny_group_std", 4, (0, 1), "warn"),
        ("float32_residue", 4, (0, 1), "warn"),
    ]
    assert "group 4: reward std 7.071e-10 is below 1e-06 but not 0" in findings[0].message
    assert "rewards [0.1, 0.100000001]" in findings[0].message
    # float32(0.1) == float32(0.1 + 1e-9) == 0.10000000149011612
    assert "are all 0.10000000149011612 in float32" in findings[1].message
    assert "advantages up to 0.707" in findings[1].message


def test_same_rewards_already_float32_are_fine() -> None:
    rewards = torch.tensor([0.1, 0.1 + 1e-9], dtype=torch.float32)  # rounds to one value: std 0
    assert _guard(rewards, [0, 0]) == []


def test_bf16_exact_fraction_is_fine() -> None:
    rewards = torch.tensor([1.0, 1.0, 1.0, 1.0078125], dtype=torch.bfloat16)  # 1 + 2**-7, exact
    assert grpo_advantages(rewards, torch.zeros(4, dtype=torch.long)).tolist() == [-0.5, -0.5, -0.5, 1.5]
    assert _guard(rewards, [0, 0, 0, 0]) == []


def test_std_thresholds() -> None:
    # exactly constant: std 0, advantages 0 → nothing; std 2e-6/sqrt(2) = 1.41e-6 ≥ 1e-6 → nothing
    assert _guard(torch.tensor([0.3, 0.3, 0.3], dtype=torch.float64), [1, 1, 1]) == []
    assert _guard(torch.tensor([0.0, 2e-6], dtype=torch.float64), [1, 1]) == []
    findings = _guard(torch.tensor([0.0, 1e-6], dtype=torch.float64), [1, 1])  # std 7.07e-7
    assert [f.code for f in findings] == ["tiny_group_std"]  # 1e-6 is float32-distinct from 0: no residue


def test_advantage_above_limit_names_the_sample() -> None:
    rewards = torch.tensor([0.0, 1.0, 0.5, 0.5])
    advantages = torch.tensor([-12.0, 12.0, 10.0, -10.0])  # |10| is not above the limit
    findings = guard_rewards(rewards, torch.tensor([0, 0, 1, 1]), advantages)
    assert [(f.code, f.group, f.samples) for f in findings] == [("advantage_too_large", 0, (0, 1))]
    assert findings[0].message.startswith(
        "|advantage| above --ci-max-abs-advantage 10 at sample 0 (-12), sample 1 (12) in group 0 of 2"
    )
    assert guard_rewards(rewards, torch.tensor([0, 0, 1, 1]), advantages, max_abs_advantage=12.0) == []


def test_lone_outlier_in_a_big_group_exceeds_ten() -> None:
    # n = 150, one reward 1, the rest 0: the outlier's advantage is (n - 1) / sqrt(n) = 12.166
    rewards = torch.zeros(150)
    rewards[37] = 1.0
    findings = _guard(rewards, [3] * 150)
    assert [(f.code, f.samples) for f in findings] == [("advantage_too_large", (37,))]
    assert "sample 37 (12.17)" in findings[0].message
    assert "a lone outlier in a group of 150 gets 12.2" in findings[0].message


def test_non_finite_advantage() -> None:
    findings = guard_rewards([1.0, 0.0], [0, 0], [float("nan"), float("-inf")])
    assert [(f.code, f.samples) for f in findings] == [("non_finite_advantage", (0, 1))]
    assert "sample 0 (nan), sample 1 (-inf)" in findings[0].message


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="equal length"):
        guard_rewards([1.0, 0.0], [0], [0.0, 0.0])
    with pytest.raises(ValueError, match="--ci-max-abs-advantage must be > 0"):
        guard_rewards([1.0], [0], [0.0], max_abs_advantage=0)


def test_raise_on_findings_and_check_failure() -> None:
    raise_on_findings([], rollout_id=3)
    findings = guard_rewards([0.0, 1.0], [0, 0], [-12.0, 12.0])
    with pytest.raises(CheckFailure) as e:
        raise_on_findings(findings, rollout_id=3)
    assert isinstance(e.value, AssertionError) and e.value.checker == "numeric_guard"
    assert str(e.value).startswith("numeric_guard check failed: rollout 3: 1 numeric finding(s)")
    assert str(e.value).endswith(format_findings(findings))
    assert format_findings(findings).startswith("[warn numeric_guard/advantage_too_large] |advantage|")
    copy = pickle.loads(pickle.dumps(e.value))
    assert (copy.checker, copy.message, str(copy)) == (e.value.checker, e.value.message, str(e.value))

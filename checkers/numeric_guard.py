"""GRPO numeric guard: warn (fail under `--ci-test`) on rewards and advantages that are numerically fragile.

What it checks, per rollout, on the rewards and the advantages computed from them (new in grpolab;
no Miles counterpart — the thresholds come from Miles' GRPO normalization, notes section 5.1):

1. `tiny_group_std`: a group's reward std (unbiased, float64) is below 1e-6 but not 0. Miles divides
   by `std + 1e-6`, so 1e-6 is where the epsilon stops dominating; grpolab divides by the std alone
   (`core/algorithms.py::grpo_advantages`), so such a group turns reward noise of 1e-9 into full-size
   advantages (±0.71 for two samples).
2. `float32_residue`: a group whose rewards are all equal once rounded to float32 (Miles computes the
   normalization in float32, where this group is constant and gets advantage 0) but not in the dtype
   given, and whose advantages are not all 0. The rewards are not float32-representable fractions
   (e.g. 0.1 + 1e-9 next to 0.1), and the leftover is pure rounding noise that the update follows.
3. `advantage_too_large`: |advantage| above `--ci-max-abs-advantage` (default 10). With std
   normalization one outlier in a group of n gets (n − 1)/√n (3.75 for n = 16, 11.2 for n = 128).
4. `non_finite_advantage`: NaN or ±inf advantages.

Pure: no I/O, no config. Shape legend: B samples, G groups.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

from grpolab.checkers.errors import CheckFailure

TINY_STD = 1e-6  # Miles' GRPO epsilon: adv = (r − mean) / (std + 1e-6)
DEFAULT_MAX_ABS_ADVANTAGE = 10.0
_SHOW = 5  # samples/rewards shown per finding


@dataclass(frozen=True, kw_only=True)
class GuardFinding:
    """One numeric problem found in a rollout's rewards or advantages."""

    severity: Literal["warn"] = "warn"
    code: str
    """`tiny_group_std` | `float32_residue` | `advantage_too_large` | `non_finite_advantage`."""
    message: str
    group: int | None = None
    """The group id (as given in group_ids_B) the finding is about."""
    samples: tuple[int, ...] = ()
    """Sample indices (positions in the batch) the finding is about."""


def _as_1d(x: Tensor | Sequence[float], name: str) -> Tensor:
    t = torch.as_tensor(x).detach().cpu()
    if t.dim() != 1:
        raise ValueError(f"{name} must be 1-D, got shape {tuple(t.shape)}")
    return t


def _fmt(values: Sequence[float]) -> str:
    shown = ", ".join(repr(v) for v in values[:_SHOW])
    return f"[{shown}{', …' if len(values) > _SHOW else ''}]"


def guard_rewards(
    rewards_B: Tensor | Sequence[float],
    group_ids_B: Tensor | Sequence[int],
    advantages_B: Tensor | Sequence[float],
    *,
    max_abs_advantage: float = DEFAULT_MAX_ABS_ADVANTAGE,
) -> list[GuardFinding]:
    """Findings for one rollout, in group order of first appearance, then per-sample findings.

    Args:
        rewards_B: [B] rewards in the dtype the reward function produced (float64 keeps the
            distinction float32 loses).
        group_ids_B: [B] integer group id per sample.
        advantages_B: [B] the advantages computed from these rewards.
        max_abs_advantage: `--ci-max-abs-advantage`.

    Raises:
        ValueError: shapes differ or are not 1-D, or `max_abs_advantage` <= 0 (names the flag).
    """
    if not max_abs_advantage > 0:
        raise ValueError(f"--ci-max-abs-advantage must be > 0, got {max_abs_advantage}")
    r_B = _as_1d(rewards_B, "rewards_B")
    g_B = _as_1d(group_ids_B, "group_ids_B")
    a_B = _as_1d(advantages_B, "advantages_B")
    if not r_B.shape == g_B.shape == a_B.shape:
        raise ValueError(
            f"rewards_B, group_ids_B and advantages_B must have equal length, got "
            f"{tuple(r_B.shape)}, {tuple(g_B.shape)}, {tuple(a_B.shape)}"
        )
    rewards = r_B.to(torch.float64).tolist()
    rewards32 = r_B.to(torch.float32).tolist()
    advantages = a_B.to(torch.float64).tolist()
    groups: dict[int, list[int]] = {}
    for i, g in enumerate(g_B.tolist()):
        groups.setdefault(int(g), []).append(i)

    findings: list[GuardFinding] = []
    for group, members in groups.items():
        findings.extend(_group_findings(group, members, rewards, rewards32, advantages))
    findings.extend(_advantage_findings(groups, rewards, advantages, max_abs_advantage))
    return findings


def _group_findings(
    group: int, members: list[int], rewards: list[float], rewards32: list[float], advantages: list[float]
) -> list[GuardFinding]:
    values = [rewards[i] for i in members]
    out: list[GuardFinding] = []
    if len(values) > 1:
        mean = math.fsum(values) / len(values)
        std = math.sqrt(math.fsum((v - mean) ** 2 for v in values) / (len(values) - 1))
        if 0 < std < TINY_STD:
            out.append(
                GuardFinding(
                    code="tiny_group_std",
                    group=group,
                    samples=tuple(members),
                    message=(
                        f"group {group}: reward std {std:.3e} is below {TINY_STD:g} but not 0 "
                        f"(rewards {_fmt(values)}). GRPO divides by this std, so differences this small "
                        "(usually rounding noise in the reward function) become full-size advantages; "
                        "Miles' + 1e-6 in the denominator would shrink them to ~0 instead."
                    ),
                )
            )
    values32 = [rewards32[i] for i in members]
    residue = [advantages[i] for i in members if advantages[i] != 0.0]
    if len(set(values32)) == 1 and len(set(values)) > 1 and residue:
        worst = max(residue, key=abs)
        out.append(
            GuardFinding(
                code="float32_residue",
                group=group,
                samples=tuple(members),
                message=(
                    f"group {group}: rewards {_fmt(values)} are all {values32[0]!r} in float32 but differ "
                    f"in float64: they are not float32-representable, and the difference leaves advantages "
                    f"up to {abs(worst):.3g} in a group "
                    "that float32 (Miles' precision) would treat as constant (advantage 0). Round rewards "
                    "in the reward function (e.g. to float32, or to the fractions it means: 0, 0.5, 1)."
                ),
            )
        )
    return out


def _advantage_findings(
    groups: dict[int, list[int]], rewards: list[float], advantages: list[float], limit: float
) -> list[GuardFinding]:
    out: list[GuardFinding] = []
    for group, members in groups.items():
        bad = [i for i in members if not math.isfinite(advantages[i])]
        if bad:
            out.append(
                GuardFinding(
                    code="non_finite_advantage",
                    group=group,
                    samples=tuple(bad),
                    message=(
                        f"group {group}: non-finite advantage at "
                        + ", ".join(f"sample {i} ({advantages[i]!r})" for i in bad[:_SHOW])
                        + f"; group rewards {_fmt([rewards[i] for i in members])}"
                    ),
                )
            )
        big = [i for i in members if math.isfinite(advantages[i]) and abs(advantages[i]) > limit]
        if big:
            n = len(members)
            hint = (
                f"; with std normalization a lone outlier in a group of {n} gets {(n - 1) / math.sqrt(n):.3g}"
                if n > 1
                else ""
            )
            shown = ", ".join(f"sample {i} ({advantages[i]:.4g})" for i in big[:_SHOW])
            out.append(
                GuardFinding(
                    code="advantage_too_large",
                    group=group,
                    samples=tuple(big),
                    message=(
                        f"|advantage| above --ci-max-abs-advantage {limit:g} at {shown} in group {group} "
                        f"of {n} (rewards {_fmt([rewards[i] for i in members])}){hint}"
                    ),
                )
            )
    return out


def format_findings(findings: Sequence[GuardFinding]) -> str:
    """One line per finding: `[warn numeric_guard/<code>] <message>`."""
    return "\n".join(f"[{f.severity} numeric_guard/{f.code}] {f.message}" for f in findings)


def raise_on_findings(findings: Sequence[GuardFinding], *, rollout_id: int) -> None:
    """Under `--ci-test`: raise `CheckFailure("numeric_guard", ...)` listing every finding, if any."""
    if findings:
        raise CheckFailure(
            "numeric_guard",
            f"rollout {rollout_id}: {len(findings)} numeric finding(s) (--ci-test turns these warnings "
            "into failures; --ci-max-abs-advantage sets the advantage limit)\n" + format_findings(findings),
        )

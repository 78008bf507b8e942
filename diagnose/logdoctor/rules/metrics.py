"""Log-doctor rules on the metrics a run prints (`step N: {…}`, `rollout N: {…}`, Miles and grpolab)
and on its dashboard setup: the step-0 log-prob gap, a non-zero KL at step 0, a non-finite gradient
norm with finite rewards, non-finite rewards, and the wandb `--wandb-group` TypeError.

Metric values are read from the dict repr on the line without parsing it (`metric_value`); only the
first step-0 line is parsed whole (`core.foreign_logs.parse_line`).
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from typing import TYPE_CHECKING

from grpolab.diagnose.logdoctor.model import (
    KERNEL_PITFALLS,
    MANUAL_TROUBLE,
    MAX_EVIDENCE,
    METRIC_NEEDLE,
    Finding,
    Line,
    Mention,
    Rule,
    is_rollout_line,
    keep_line,
    register,
)

if TYPE_CHECKING:
    from grpolab.diagnose.logdoctor.ruleset import LogRules

_STEP_INDEX = re.compile(r"(?:^|[\s\]\)])step (\d+): \{")
_NUMBER = re.compile(
    r"^(?:[\w.]+\()?\s*([-+]?(?:nan|inf|infinity|\d[\d.]*(?:e[-+]?\d+)?|\.\d+(?:e[-+]?\d+)?))\s*\)?$"
)

WANDB = Mention("wandb frame", ("wandb",))
"""A wandb frame (the --wandb-group TypeError)."""


def metric_value(token: str) -> float | None:
    """A metric value as printed in a dict repr (`0.25`, `nan`, `-inf`, `np.float64(nan)`,
    `tensor(0.3)`), or None when it is not a number."""
    m = _NUMBER.match(token.strip().lower())
    if m is None:
        return None
    try:
        return float(m.group(1))
    except ValueError:
        return None


def _value_after(text: str, key: str) -> str:
    """The printed value after `key` in a dict repr (up to the next comma or closing brace), or ""."""
    at = text.find(key)
    if at < 0:
        return ""
    start = at + len(key)
    ends = [i for i in (text.find(",", start), text.find("}", start)) if i >= 0]
    return text[start : min(ends) if ends else len(text)]


@register
class Step0Gap(Rule):
    """`train/train_rollout_logprob_abs_diff` at step 0 above `RuleOptions.max_step0_gap`: the engine
    and the trainer do not read the same weights."""

    id = "step0_gap"
    severity = "error"
    needles = (METRIC_NEEDLE,)
    cause = (
        "At step 0 the engine and the trainer should score the same answers with the same "
        "weights; a large train/train_rollout_logprob_abs_diff means they do not start from "
        "the same weights, or read them in different formats. The manual's healthy "
        "Qwen3-0.6B runs had 0.0148-0.0157."
    )
    fix = (
        "Stop the run before it trains on wrong numbers. Check the checkpoint paths of both "
        "sides (--hf-checkpoint and the trainer's load path) and compare with your healthy "
        "runs (`grpolab gate`)."
    )
    source = f"{MANUAL_TROUBLE} (The gap at step 0 is far above your range)"

    def __init__(self, log: LogRules) -> None:
        super().__init__(log)
        self.step0: tuple[Line, dict[str, float]] | None = None
        """The first `step 0` line and its metrics (Miles prints each step line twice)."""

    def observe(self, line: Line) -> None:
        if self.step0 is None and "step 0: {" in line.text:
            from grpolab.rundir.foreign_logs import parse_line  # imported on use: `ast` costs start-up time

            record = parse_line(line.text, line.line)
            if record is not None and record.kind == "step" and record.step == 0:
                self.step0 = (line, record.metrics)

    def findings(self, earlier: Sequence[Finding]) -> list[Finding]:
        if self.step0 is None:
            return []
        line, metrics = self.step0
        gap = metrics.get("train/train_rollout_logprob_abs_diff")
        limit = self.log.options.max_step0_gap
        if gap is None or (math.isfinite(gap) and gap <= limit):
            return []
        return [
            self.finding(
                f"step-0 log-prob gap {gap:.4g} is far above range (limit {limit:g})",
                (self.ev(line, focus="'train/train_rollout_logprob_abs_diff'"),),
                {"gap": gap, "limit": limit},
            )
        ]


@register
class KlNonzeroStep0(Rule):
    """`train/ppo_kl` not exactly 0 at step 0 (read from `Step0Gap`'s step-0 line)."""

    id = "kl_nonzero_step0"
    severity = "warning"
    cause = (
        "Step 0 is computed before the first optimizer update, when the policy is the old "
        "policy, so its train/ppo_kl should be exactly 0. A non-zero value means two forwards of "
        "the same weights on the same tokens disagree: non-deterministic fused attention (or "
        "dropout left on)."
    )
    fix = "Force a deterministic attention kernel (Miles: --attention-backend flash) and turn dropout off."
    source = KERNEL_PITFALLS

    def findings(self, earlier: Sequence[Finding]) -> list[Finding]:
        step0 = self.log.rule(Step0Gap).step0
        if step0 is None:
            return []
        line, metrics = step0
        kl = metrics.get("train/ppo_kl")
        if kl is None or kl == 0.0:
            return []
        return [
            self.finding(
                f"train/ppo_kl is {kl:.3g} at step 0 (expected exactly 0)",
                (self.ev(line, focus="'train/ppo_kl'"),),
                {"ppo_kl": kl},
            )
        ]


@register
class GradNormNan(Rule):
    """A non-finite `train/grad_norm` while the rewards before it are finite (with non-finite rewards
    before it, `RewardNonfinite` explains it)."""

    id = "grad_norm_nan"
    severity = "error"
    needles = (METRIC_NEEDLE,)
    fix = (
        "Check the chat template on a few prompts, run the step in bf16/fp32 instead of FP8, and "
        "replay the step (`grpolab replay`) to find the first non-finite tensor."
    )
    source = KERNEL_PITFALLS

    def __init__(self, log: LogRules) -> None:
        super().__init__(log)
        self.nonfinite: dict[int, tuple[Line, float]] = {}
        """Step → its first line with a non-finite grad norm, and the value."""

    def observe(self, line: Line) -> None:
        if "'train/grad_norm'" not in line.text:
            return
        token = _value_after(line.text, "'train/grad_norm': ")
        if "n" not in token.lower():  # finite numbers have no n; nan and inf do (fast path)
            return
        step = _STEP_INDEX.search(line.text)
        number = metric_value(token)
        if step is None or number is None or math.isfinite(number):
            return
        self.nonfinite.setdefault(int(step.group(1)), (line, number))

    def findings(self, earlier: Sequence[Finding]) -> list[Finding]:
        if not self.nonfinite:
            return []
        first_step = min(self.nonfinite)
        line, value = self.nonfinite[first_step]
        if any(ln.line <= line.line for ln, _ in self.log.rule(RewardNonfinite).lines):
            return []  # the reward finding explains it
        steps = sorted(self.nonfinite)
        seen_rewards = self.log.first_rollout is not None
        return [
            self.finding(
                f"train/grad_norm is {value} at step {first_step}"
                + (f" ({len(steps)} steps)" if len(steps) > 1 else "")
                + (" while the rewards are finite" if seen_rewards else ""),
                (self.ev(self.nonfinite[s][0], focus="'train/grad_norm'") for s in steps[:MAX_EVIDENCE]),
                {"steps": steps, "first_step": first_step},
                cause=(
                    "The gradient overflowed although "
                    + (
                        "every rollout/raw_reward before it is finite"
                        if seen_rewards
                        else "no non-finite reward is in the log"
                    )
                    + ": usually a bad chat template (garbage tokens with extreme log-probs) or activation "
                    "overflow in low precision (FP8)."
                ),
            )
        ]


@register
class RewardNonfinite(Rule):
    """A non-finite `rollout/raw_reward` on a rollout line."""

    id = "reward_nonfinite"
    severity = "error"
    needles = (METRIC_NEEDLE,)
    cause = "The reward function returned NaN or Inf for some answers; every later number inherits it."
    fix = "Make the reward function return finite floats (catch parse failures and score them 0)."
    source = "grpolab"

    def __init__(self, log: LogRules) -> None:
        super().__init__(log)
        self.lines: list[tuple[Line, float]] = []
        """Rollout lines with a non-finite reward, and the value."""

    def observe(self, line: Line) -> None:
        if "'rollout/raw_reward'" not in line.text or not is_rollout_line(line.text):
            return
        token = _value_after(line.text, "'rollout/raw_reward': ")
        number = metric_value(token) if "n" in token.lower() else None
        if number is not None and not math.isfinite(number):
            self.lines.append((line, number))

    def findings(self, earlier: Sequence[Finding]) -> list[Finding]:
        if not self.lines:
            return []
        return [
            self.finding(
                f"rollout/raw_reward is {self.lines[0][1]}",
                (self.ev(ln, focus="'rollout/raw_reward'") for ln, _ in self.lines[:MAX_EVIDENCE]),
                {"lines": len(self.lines)},
            )
        ]


@register
class WandbGroup(Rule):
    """`TypeError: unsupported operand … 'NoneType' and 'str'` with a wandb frame nearby: the run
    stopped at start because --wandb-group is missing."""

    id = "wandb_group"
    severity = "error"
    needles = (b"'NoneType' and 'str'",)
    mentions = (WANDB,)
    cause = (
        "The wandb setup joins the run group with a string; without --wandb-group the group is "
        "None and the run stops at start."
    )
    fix = "Pass --wandb-group (any name) with --use-wandb."
    source = "Miles 101 manual (Send the signals to a dashboard: Keep --wandb-group)"

    def __init__(self, log: LogRules) -> None:
        super().__init__(log)
        self.lines: list[Line] = []

    def observe(self, line: Line) -> None:
        if "unsupported operand" in line.text and keep_line(self.lines, line):
            self.log.ask_context(self.id, line)

    def findings(self, earlier: Sequence[Finding]) -> list[Finding]:
        lines = [ln for ln in self.lines if self.log.near(WANDB, ln.line)]
        if not lines:
            return []
        frame = self.log.near(WANDB, lines[0].line)
        evidence = [self.ev(ln) for ln in lines[:MAX_EVIDENCE]] + self.log.mention_evidence(
            frame, "wandb frame"
        )
        return [
            self.finding(
                "the run stopped at start in the wandb setup: TypeError NoneType + str",
                sorted(evidence, key=lambda e: e.line),
                {"lines": len(lines), "wandb_line": frame},
            )
        ]

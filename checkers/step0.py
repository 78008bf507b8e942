"""The step-0 rule and the gap-range rule, once: used by the in-run KL checker (`checkers/kl.py`),
`grpolab gate` (`checkers/gate.py`, its command in `checkers/gate_command.py`) and the UI's Health
page (`ui/health.py`).

"Step 0" means the first optimizer step of the run: the first `step` record of its metrics in file
order (for a run resumed with --load into a new run directory, its first step after the resume;
for a Miles/slime log, its first `step N:` line). Pure functions over numbers and records.

Step-0 rule (Miles' `ci_utils.check_kl`, notes-miles-slime-areal.md 3.1; Miles 101 manual 5.2,
"Check two values at step 0"): before the first update the trainer's old and new probabilities come
from the same weights, so |train/ppo_kl| < 1e-9 and |train/pg_clipfrac| < 1e-10; the policy also
equals the reference, so |train/kl_loss| < 1e-9 when the run logs it (--use-kl-loss). The same
on-policy pair holds at the first optimizer step of every rollout (the in-run checker tests it there).

Gap-range rule (manual 5.2 "Compare the gap with your range", 8.3 "measure the gap at step 0 and
keep it inside the range of your healthy runs"; its Qwen3-0.6B seeds gave 0.0148-0.0157): the
step-0 train/train_rollout_logprob_abs_diff must lie in [lo, hi]. A range derived from baseline runs
is [min, max] of their step-0 gaps widened by a relative margin m: [min*(1-m), max*(1+m)] (grpolab's
default m = 0.1). Above `FAR_FACTOR` × hi the value is "far" ("several times your range" means the
two sides compute different models; the factor 3 is grpolab's).

Jump rule (the log-prob checker's stale-weights diagnosis, `checkers/logprobs.py`): a later gap
above `FAR_FACTOR` × the run's first gap has "jumped": the first gap is measured with trainer and
engine on the same weights, so a gap several times larger after weight syncs means the two sides no
longer hold the same weights.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from grpolab.rundir.foreign_logs import MetricRecord

PPO_KL_KEY = "train/ppo_kl"
CLIPFRAC_KEY = "train/pg_clipfrac"
KL_LOSS_KEY = "train/kl_loss"
GAP_KEY = "train/train_rollout_logprob_abs_diff"
PPO_KL_TOL = 1e-9
"""Miles `check_kl` / manual 5.2: |ppo_kl| below 1e-9 at step 0."""
PG_CLIPFRAC_TOL = 1e-10
"""Miles `check_kl` / manual 5.2: |pg_clipfrac| below 1e-10 at step 0."""
KL_LOSS_TOL = 1e-9
"""Miles `check_kl`: |kl_loss| below 1e-9 at the run's first step."""
DEFAULT_GAP_MARGIN = 0.1
"""Relative widening of a baseline-derived gap range (grpolab; `grpolab gate --gap-margin`)."""
FAR_FACTOR = 3.0
"""A step-0 gap above this many times the range's top is "far" (manual: "several times"; 3: grpolab)."""

GapPlace = Literal["inside", "outside", "far"]


@dataclass(frozen=True)
class Step0Check:
    """One key of the step-0 rule.

    Attributes:
        key: the metric; value: its step-0 value (None: not logged); limit: |value| must be below it.
    """

    key: str
    value: float | None
    limit: float

    @property
    def logged(self) -> bool:
        return self.value is not None

    @property
    def passed(self) -> bool:
        """|value| < limit (False when not logged or NaN)."""
        return self.value is not None and abs(self.value) < self.limit


def first_step(records: Iterable[MetricRecord]) -> MetricRecord | None:
    """Step 0 of a run: its first `step` record in file order, or None when it logged no step."""
    return next((r for r in records if r.kind == "step"), None)


def step0_checks(
    metrics: Mapping[str, float], *, first_of_run: bool = True, ppo_kl_tol: float = PPO_KL_TOL
) -> list[Step0Check]:
    """The step-0 rule over one step's metrics: ppo_kl and pg_clipfrac, then kl_loss when
    `first_of_run` and the step logged it (the rule's on-policy pair alone for a later rollout's
    first step). `ppo_kl_tol` is `grpolab gate --step0-kl` (Miles: 1e-9)."""
    checks = [
        Step0Check(PPO_KL_KEY, metrics.get(PPO_KL_KEY), ppo_kl_tol),
        Step0Check(CLIPFRAC_KEY, metrics.get(CLIPFRAC_KEY), PG_CLIPFRAC_TOL),
    ]
    if first_of_run and KL_LOSS_KEY in metrics:
        checks.append(Step0Check(KL_LOSS_KEY, metrics[KL_LOSS_KEY], KL_LOSS_TOL))
    return checks


def gap_range_from(values: Sequence[float], margin: float = DEFAULT_GAP_MARGIN) -> tuple[float, float]:
    """[min*(1-m), max*(1+m)] of baseline runs' step-0 gaps (see the module docstring).

    Raises:
        ValueError: no values, a value that is not finite, or a margin that is not a finite m >= 0.
    """
    if not values:
        raise ValueError("a gap range needs at least one baseline value")
    if not all(math.isfinite(v) for v in values):
        raise ValueError(f"baseline gaps must be finite numbers, got {list(values)}")
    if not (math.isfinite(margin) and margin >= 0):
        raise ValueError(f"gap margin {margin!r}: expected a relative margin >= 0 (e.g. 0.1)")
    return min(values) * (1 - margin), max(values) * (1 + margin)


def gap_place(value: float, lo: float, hi: float) -> GapPlace:
    """Where a step-0 gap lies: "inside" [lo, hi] (passes), else "far" above FAR_FACTOR × hi, else
    "outside" (NaN counts as outside). Only "inside" passes the gap-range rule."""
    if lo <= value <= hi:
        return "inside"
    return "far" if value > FAR_FACTOR * hi else "outside"


def gap_jumped(first: float, later: float) -> bool:
    """The jump rule (module docstring): `later` > FAR_FACTOR × `first` (both mean per-token |gaps|,
    nats, >= 0; NaN never jumps)."""
    return later > FAR_FACTOR * first

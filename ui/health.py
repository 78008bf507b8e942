"""Run health: the eight signals of the Miles monitoring page / manual section 5.1, and the
step-0 checks of manual section 5.2, each classified ok / watch / red / n/a with the numbers
that decided it. Pure functions over one run's (kind, step) frame (see `RunStore.frame`) and, for
the step-0 checks, its first step record (`checkers/step0.py`: the rule `grpolab gate` and the
in-run KL checker apply; step 0 is the run's first optimizer step, whatever its number).

Thresholds and where they come from (THRESHOLDS below repeats them for the page):
- the monitoring page's "What to watch" table gives the healthy pattern and the red flag of each
  signal; its only numbers are `pg_clipfrac` < 0.2 healthy / > 0.5 red, the gap "≪ 1.0" and
  `grad_norm` < clip_grad (1.0 by default);
- the manual (1.3, 5.1) says to read trends as means over five or more steps (rewards moved by up
  to 0.21 step to step), that 10 of 32 zero-std groups happened on a healthy first step, and
  (5.2) that step 0 must show `train/ppo_kl` < 1e-9 and `train/pg_clipfrac` < 1e-10 (Miles'
  own asserts), with a step-0 gap inside the range of healthy runs ("several times your range"
  means the two sides compute different models);
- every other cut-off (collapse span, jump and ratio factors) is ours, named "grpolab" below.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import pandas as pd

from grpolab.checkers import step0
from grpolab.rundir.foreign_logs import MetricRecord

WINDOW = 5
"""Steps averaged to read a trend (manual 1.3 / 5.1: 'read the mean over five or more steps')."""

THRESHOLDS: dict[str, tuple[str, str]] = {
    "reward": ("red: last 5 rewards span ≤ 0.01 (saturated); watch: mean(last 5) < mean(first 5)",
               "monitoring: 'trending up, with healthy variance' / 'saturates near a single value'; "
               "manual 5.1: read means over ≥ 5 steps; 0.01 span: grpolab"),
    "kl_loss": ("red: a step > 10× the median of the earlier steps (and > 1e-3); watch: > 3×",
                "monitoring: 'bounded, drifts up' / 'sudden jump'; factors: grpolab"),
    "gap": ("red: any step ≥ 1.0, or mean(last 5) > 3× mean(first 5); watch: ≥ 0.1 or > 1.5×",
            "monitoring: 'stable and small (≪ 1.0)' / 'climbing without bound'; factors: grpolab"),
    "entropy": ("red: mean(last 5) < 0.1× mean(first 5); watch: < 0.5×",
                "monitoring: 'slowly decreasing' / 'falls to ~0 too fast'; factors: grpolab"),
    "grad_norm": ("red: ≥ clip on 3 steps in a row or on half the steps (or NaN); watch: any step ≥ clip",
                  "monitoring: '< clip_grad (1.0 by default)' / 'repeatedly hitting clip threshold'"),
    "time": ("red: median rollout/train time ratio ≥ 10 either way; watch: ≥ 3",
             "monitoring: 'roughly balanced' / 'one ≫ other'; factors: grpolab"),
    "pg_clipfrac": ("red: any step > 0.5; watch: any step > 0.2",
                    "monitoring: '< 0.2' / '> 0.5 means policy is moving fast → drop LR'"),
    "zero_std": ("red: every group zero-std in each of the last 5 rollouts; watch: mean share > 0.5",
                 "manual 1.3: GRPO learns nothing from zero-std groups (10 of 32 on a healthy first "
                 "step); cut-offs: grpolab"),
}  # fmt: skip


@dataclass(frozen=True)
class Signal:
    """One health verdict.

    Attributes:
        name: what is judged; key: the metric(s) read; status: ok | watch | red | n/a;
        evidence: the numbers that decided it; rule: the thresholds; source: where they come from.
    """

    name: str
    key: str
    status: str
    evidence: str
    rule: str
    source: str


def series(frame: pd.DataFrame, key: str) -> pd.Series:
    """A key's logged values by step (NaN = not logged, dropped)."""
    if key not in frame.columns:
        return pd.Series(dtype=float)
    return frame[key].dropna().groupby(level="step").last().sort_index()


def _sig(name: str, key: str, rule_key: str, status: str, evidence: str) -> Signal:
    rule, source = THRESHOLDS[rule_key]
    return Signal(name, key, status, evidence, rule, source)


def _na(name: str, key: str, rule_key: str, why: str) -> Signal:
    return _sig(name, key, rule_key, "n/a", why)


def _ends(s: pd.Series) -> tuple[float, float]:
    return float(s.iloc[:WINDOW].mean()), float(s.iloc[-WINDOW:].mean())


def reward_signal(frame: pd.DataFrame) -> Signal:
    key, name = "rollout/raw_reward", "reward trend and collapse"
    s = series(frame, key)
    if len(s) < WINDOW:
        return _na(name, key, "reward", f"{len(s)} rollouts logged; a trend needs ≥ {WINDOW}")
    first, last = _ends(s)
    span = float(s.iloc[-WINDOW:].max() - s.iloc[-WINDOW:].min())
    evidence = f"mean first {WINDOW} {first:.4g} → last {WINDOW} {last:.4g}; last-{WINDOW} span {span:.4g}"
    status = "red" if span <= 0.01 else "watch" if last < first else "ok"
    return _sig(name, key, "reward", status, evidence)


def kl_signal(frame: pd.DataFrame) -> Signal:
    key, name = "train/kl_loss", "kl_loss jumps"
    s = series(frame, key)
    if len(s) < 4:
        why = "not logged (only with --use-kl-loss)" if s.empty else f"{len(s)} steps; needs ≥ 4"
        return _na(name, key, "kl_loss", why)
    worst, at = 0.0, int(s.index[0])
    values = s.to_numpy(float)
    for i in range(3, len(values)):
        base = max(float(np.median(values[:i])), 1e-12)
        ratio = values[i] / base if values[i] > 1e-3 else 0.0
        if ratio > worst:
            worst, at = ratio, int(s.index[i])
    status = "red" if worst > 10 else "watch" if worst > 3 else "ok"
    return _sig(name, key, "kl_loss", status, f"largest jump {worst:.3g}× the earlier median (step {at})")


def gap_signal(frame: pd.DataFrame) -> Signal:
    key, name = "train/train_rollout_logprob_abs_diff", "log-prob gap climbing"
    s = series(frame, key)
    if s.empty:
        return _na(name, key, "gap", "not logged (needs engine log-probs)")
    peak = float(s.max())
    evidence = f"max {peak:.4g} (step {int(s.idxmax())})"
    ratio = math.nan
    if len(s) >= WINDOW:
        first, last = _ends(s)
        ratio = last / first if first > 0 else (math.inf if last > 0 else 1.0)
        evidence += f"; mean last {WINDOW} / first {WINDOW} = {ratio:.3g}"
    red = peak >= 1.0 or ratio > 3
    watch = peak >= 0.1 or ratio > 1.5
    return _sig(name, key, "gap", "red" if red else "watch" if watch else "ok", evidence)


def entropy_signal(frame: pd.DataFrame) -> Signal:
    name = "entropy collapse"
    key = "train/entropy_loss" if "train/entropy_loss" in frame.columns else "rollout/entropy"
    s = series(frame, key)
    if s.empty:
        return _na(name, key, "entropy", "not logged")
    if (s == 0).all():
        return _na(
            name, key, "entropy", "logged 0 at every step: this setup does not compute entropy (manual 5.1)"
        )
    if len(s) < WINDOW:
        return _na(name, key, "entropy", f"{len(s)} steps logged; a trend needs ≥ {WINDOW}")
    first, last = _ends(s)
    ratio = last / first if first > 0 else 1.0
    status = "red" if ratio < 0.1 else "watch" if ratio < 0.5 else "ok"
    evidence = f"mean first {WINDOW} {first:.4g} → last {WINDOW} {last:.4g} (× {ratio:.3g})"
    return _sig(name, key, "entropy", status, evidence)


def grad_norm_signal(frame: pd.DataFrame, clip_grad: float | None) -> Signal:
    key, name = "train/grad_norm", "grad_norm hitting the clip"
    clip = 1.0 if clip_grad is None else clip_grad
    nan_steps = 0
    if key in frame.columns and "train/loss" in frame.columns:
        steps = frame[frame["train/loss"].notna()]
        nan_steps = int(steps[key].isna().sum()) if not steps.empty else 0
    s = series(frame, key)
    if s.empty and not nan_steps:
        return _na(name, key, "grad_norm", "not logged")
    if clip <= 0:
        return _na(name, key, "grad_norm", "--clip-grad 0: clipping is off")
    hits = (s >= clip).to_numpy()
    run = best = 0
    for h in hits:
        run = run + 1 if h else 0
        best = max(best, run)
    src = "" if clip_grad is not None else " (default)"
    evidence = (
        f"{int(hits.sum())} of {len(s)} steps ≥ clip {clip:g}{src}; longest run {best}; max {s.max():.4g}"
    )
    if nan_steps:
        evidence += f"; {nan_steps} step(s) with NaN grad_norm"
    red = nan_steps > 0 or best >= 3 or (len(s) > 1 and hits.mean() >= 0.5)
    status = "red" if red else "watch" if hits.any() else "ok"
    return _sig(name, key, "grad_norm", status, evidence)


def time_signal(frame: pd.DataFrame) -> Signal:
    key, name = "perf/rollout_time vs perf/train_time", "rollout/train time imbalance"
    r, t = series(frame, "perf/rollout_time"), series(frame, "perf/train_time")
    if r.empty or t.empty:
        return _na(name, key, "time", "needs both perf/rollout_time and perf/train_time")
    mr, mt = float(r.median()), float(t.median())
    if mr <= 0 or mt <= 0:
        return _na(name, key, "time", f"median rollout {mr:.3g} s, train {mt:.3g} s")
    ratio = mr / mt
    worst = max(ratio, 1 / ratio)
    status = "red" if worst >= 10 else "watch" if worst >= 3 else "ok"
    evidence = f"median rollout {mr:.3g} s / train {mt:.3g} s = {ratio:.3g}"
    return _sig(name, key, "time", status, evidence)


def clipfrac_signal(frame: pd.DataFrame) -> Signal:
    key, name = "train/pg_clipfrac", "pg_clipfrac"
    s = series(frame, key)
    if s.empty:
        return _na(name, key, "pg_clipfrac", "not logged")
    peak = float(s.max())
    status = "red" if peak > 0.5 else "watch" if peak > 0.2 else "ok"
    return _sig(
        name, key, "pg_clipfrac", status, f"max {peak:.4g} (step {int(s.idxmax())}), mean {s.mean():.4g}"
    )


def zero_std_signal(frame: pd.DataFrame, groups_per_rollout: int | None) -> Signal:
    name = "zero-std group share"
    count_keys = [c for c in frame.columns if c.startswith("rollout/zero_std/count_")]
    if groups_per_rollout and count_keys:
        key = "rollout/zero_std/count_* / groups"
        counts = frame[count_keys].dropna(how="all")
        share = counts.fillna(0).sum(axis=1).groupby(level="step").last() / groups_per_rollout
        how = f"of {groups_per_rollout} groups"
    elif {"rollout/zero_std/all_zero_percentage", "rollout/zero_std/all_one_percentage"} <= set(
        frame.columns
    ):
        key = "rollout/zero_std/all_{zero,one}_percentage"
        share = series(frame, "rollout/zero_std/all_zero_percentage").add(
            series(frame, "rollout/zero_std/all_one_percentage"), fill_value=0
        )
        how = "from the logged percentages"
    else:
        return _na(
            name, "rollout/zero_std/*", "zero_std", "no zero_std counts, or the group count is unknown"
        )
    share = share.sort_index()
    if share.empty:
        return _na(name, key, "zero_std", "no rollout logged the counts")
    tail = share.iloc[-WINDOW:]
    mean = float(tail.mean())
    status = "red" if bool((tail >= 1.0).all()) else "watch" if mean > 0.5 else "ok"
    evidence = (
        f"mean share of the last {len(tail)} rollouts {mean:.3g} ({how}); first rollout {share.iloc[0]:.3g}"
    )
    return _sig(name, key, "zero_std", status, evidence)


def health_signals(
    frame: pd.DataFrame, *, clip_grad: float | None = None, groups_per_rollout: int | None = None
) -> list[Signal]:
    """The eight signals, in the monitoring page's order (clip_grad None → Miles' default 1.0)."""
    return [
        reward_signal(frame),
        kl_signal(frame),
        gap_signal(frame),
        entropy_signal(frame),
        grad_norm_signal(frame, clip_grad),
        time_signal(frame),
        clipfrac_signal(frame),
        zero_std_signal(frame, groups_per_rollout),
    ]


STEP0_SOURCE = "manual 5.2 (Miles' --ci-test asserts ppo_kl < 1e-9, pg_clipfrac < 1e-10); checkers/step0.py"
GAP_SOURCE = "manual 5.2: compare the step-0 gap with the range of your healthy runs; checkers/step0.py"
GAP_RULE = (
    f"ok: inside the range; watch: outside; red: > {step0.FAR_FACTOR:g}× its top ('several times your "
    "range') or missing; a baseline range is their step-0 min..max widened by the margin "
    "(as `grpolab gate --gap-range auto`)"
)
_GAP_STATUS = {"inside": "ok", "outside": "watch", "far": "red"}


def _absent(key: str, first: MetricRecord, non_numeric: Mapping[str, str]) -> str:
    """Why the first step record holds no number for `key` (`grpolab gate`: "key not found")."""
    where = f"the first step record (step {first.step}, line {first.line_no})"
    if key in non_numeric:
        return f"not a number: {non_numeric[key]} in {where}"
    return f"missing from {where}"


def step0_checks(
    first: MetricRecord | None,
    *,
    gap_range: tuple[float, float] | None = None,
    non_numeric: Mapping[str, str] | None = None,
) -> list[Signal]:
    """The step-0 rule (`checkers/step0.py`, the gate's and the in-run checker's) on a run's first
    step record `first` (None: no step logged): ppo_kl, pg_clipfrac, kl_loss when logged, and the
    step-0 gap against `gap_range` (lo, hi). Each row is the gate's verdict: ok / red (a key missing
    from the record, or not a number there, is red: `grpolab gate` fails it), the gap ok / watch / red
    (outside the range fails the gate either way; red when "far" or absent); n/a when no step was
    logged (the gate cannot judge: exit 2) or the gap has no range chosen.

    `non_numeric`: key → the value as JSON of the record's metric values that are not numbers
    (`reader.MetricsFile.non_numeric` of its line), so that the evidence can say so.
    """
    at = "no step logged" if first is None else f"step {first.step}"
    odd = non_numeric or {}
    out = []
    for check in step0.step0_checks({} if first is None else first.metrics):
        rule = f"ok: |value| < {check.limit:g} at the first step; red otherwise (also when missing)"
        name = f"step 0 {check.key}"
        if first is None:
            out.append(Signal(name, check.key, "n/a", f"not logged ({at})", rule, STEP0_SOURCE))
        elif check.value is None:
            out.append(Signal(name, check.key, "red", _absent(check.key, first, odd), rule, STEP0_SOURCE))
        else:
            status = "ok" if check.passed else "red"
            out.append(Signal(name, check.key, status, f"{check.value:.6g} ({at})", rule, STEP0_SOURCE))
    out.append(_gap_check(first, at, gap_range, odd))
    return out


def _gap_check(
    first: MetricRecord | None, at: str, gap_range: tuple[float, float] | None, odd: Mapping[str, str]
) -> Signal:
    key, name = step0.GAP_KEY, "step 0 gap vs baseline"
    v = None if first is None else first.metrics.get(key)
    if first is None or (gap_range is None and v is None):
        return Signal(name, key, "n/a", f"not logged ({at})", GAP_RULE, GAP_SOURCE)
    if gap_range is None:
        return Signal(name, key, "n/a", f"{v:.6g} ({at}); no baseline range chosen", GAP_RULE, GAP_SOURCE)
    lo, hi = gap_range
    if v is None:
        return Signal(name, key, "red", _absent(key, first, odd), GAP_RULE, GAP_SOURCE)
    status = _GAP_STATUS[step0.gap_place(v, lo, hi)]
    return Signal(name, key, status, f"{v:.6g} ({at}) vs [{lo:.6g}, {hi:.6g}]", GAP_RULE, GAP_SOURCE)


def baseline_gap_range(
    firsts: list[MetricRecord | None], margin: float = step0.DEFAULT_GAP_MARGIN
) -> tuple[float, float] | None:
    """The gap range of baseline runs from their first step records (`step0.gap_range_from`: min..max
    widened by `margin`); None when no baseline logged a finite step-0 gap."""
    values = [r.metrics.get(step0.GAP_KEY) for r in firsts if r is not None]
    present = [v for v in values if v is not None and math.isfinite(v)]
    return step0.gap_range_from(present, margin) if present else None

"""Health classification on synthetic runs: each signal's ok / watch / red / n/a boundary."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from grpolab.rundir.foreign_logs import MetricRecord
from grpolab.rundir.reader import metric_record
from grpolab.ui import health, readers


def records_to_frame(rows):
    """The frame of metrics-file shaped dicts (as the reader would read them)."""
    return readers.records_to_frame(metric_record(r) for r in rows)


def _frame(**columns: list[float]) -> pd.DataFrame:
    """A run whose rollout i logged columns[k][i] (kind chosen from the key's namespace)."""
    recs = []
    n = max(len(v) for v in columns.values())
    for i in range(n):
        by_kind: dict[str, dict[str, float]] = {}
        for key, values in columns.items():
            if i < len(values):
                kind = {"rollout": "rollout", "train": "step", "perf": "perf"}[key.split("/")[0]]
                by_kind.setdefault(kind, {})[key] = values[i]
        for kind, metrics in by_kind.items():
            recs.append(
                {"kind": kind, "rollout_id": i, "step": i if kind == "step" else None, "metrics": metrics}
            )
    return records_to_frame(recs)


def _status(signal: health.Signal) -> str:
    return signal.status


@pytest.mark.parametrize(
    ("rewards", "status"),
    [
        ([0.5, 0.55, 0.6, 0.62, 0.7, 0.72, 0.75, 0.8], "ok"),
        ([0.8, 0.75, 0.7, 0.72, 0.6, 0.55, 0.58, 0.5], "watch"),
        ([0.5, 0.6, 0.7, 0.9, 0.9, 0.9, 0.9, 0.905], "red"),
        ([0.5, 0.6, 0.7], "n/a"),
    ],
)
def test_reward(rewards: list[float], status: str) -> None:
    assert health.reward_signal(_frame(**{"rollout/raw_reward": rewards})).status == status


def test_kl_loss_jump() -> None:
    steady = [0.01, 0.011, 0.012, 0.013, 0.014, 0.015]
    assert health.kl_signal(_frame(**{"train/kl_loss": steady})).status == "ok"
    assert health.kl_signal(_frame(**{"train/kl_loss": [*steady, 0.05]})).status == "watch"
    red = health.kl_signal(_frame(**{"train/kl_loss": [*steady, 0.5]}))
    assert red.status == "red" and "step 6" in red.evidence
    assert health.kl_signal(_frame(**{"train/loss": [1.0] * 6})).status == "n/a"


def test_gap() -> None:
    flat = [0.0153, 0.0161, 0.0143, 0.015, 0.0148, 0.0152, 0.0149, 0.0151, 0.015, 0.0155]
    assert health.gap_signal(_frame(**{"train/train_rollout_logprob_abs_diff": flat})).status == "ok"
    climbing = [0.01, 0.012, 0.015, 0.02, 0.03, 0.04, 0.05, 0.06, 0.07, 0.08]
    sig = health.gap_signal(_frame(**{"train/train_rollout_logprob_abs_diff": climbing}))
    assert sig.status == "red" and "= 3.45" in sig.evidence  # mean last 5 / first 5 = 0.06 / 0.0174
    assert health.gap_signal(_frame(**{"train/train_rollout_logprob_abs_diff": [0.2]})).status == "watch"
    assert health.gap_signal(_frame(**{"train/train_rollout_logprob_abs_diff": [1.2]})).status == "red"


def test_entropy() -> None:
    key = "train/entropy_loss"
    assert health.entropy_signal(_frame(**{key: [0.0] * 10})).status == "n/a"
    assert (
        health.entropy_signal(
            _frame(**{key: [1.0, 0.98, 0.97, 0.95, 0.94, 0.9, 0.88, 0.87, 0.85, 0.84]})
        ).status
        == "ok"
    )
    assert health.entropy_signal(_frame(**{key: [1.0] * 5 + [0.3] * 5})).status == "watch"
    assert health.entropy_signal(_frame(**{key: [1.0] * 5 + [0.01] * 5})).status == "red"
    assert (
        health.entropy_signal(_frame(**{"rollout/entropy": [1.0] * 5 + [0.01] * 5})).key == "rollout/entropy"
    )


def test_grad_norm() -> None:
    key = "train/grad_norm"
    assert health.grad_norm_signal(_frame(**{key: [0.3, 0.5, 0.4, 0.2]}), 1.0).status == "ok"
    assert health.grad_norm_signal(_frame(**{key: [0.3, 1.0, 0.4, 0.2]}), 1.0).status == "watch"
    sig = health.grad_norm_signal(_frame(**{key: [0.3, 1.2, 1.5, 1.1, 0.2, 0.2, 0.2]}), 1.0)
    assert sig.status == "red" and "3 of 7 steps ≥ clip 1; longest run 3" in sig.evidence
    assert health.grad_norm_signal(_frame(**{key: [1.2, 1.5]}), 2.0).status == "ok"
    assert health.grad_norm_signal(_frame(**{key: [0.3]}), 0.0).status == "n/a"
    assert "(default)" in health.grad_norm_signal(_frame(**{key: [0.3]}), None).evidence
    nan = health.grad_norm_signal(_frame(**{key: [0.3, math.nan], "train/loss": [0.1, 0.2]}), 1.0)
    assert nan.status == "red" and "1 step(s) with NaN grad_norm" in nan.evidence


def test_time_imbalance() -> None:
    assert (
        health.time_signal(_frame(**{"perf/rollout_time": [57.0] * 3, "perf/train_time": [105.0] * 3})).status
        == "ok"
    )
    assert (
        health.time_signal(_frame(**{"perf/rollout_time": [5.0] * 3, "perf/train_time": [20.0] * 3})).status
        == "watch"
    )
    sig = health.time_signal(_frame(**{"perf/rollout_time": [100.0] * 3, "perf/train_time": [5.0] * 3}))
    assert sig.status == "red" and "= 20" in sig.evidence
    assert health.time_signal(_frame(**{"perf/rollout_time": [1.0]})).status == "n/a"


@pytest.mark.parametrize(("peak", "status"), [(0.0, "ok"), (0.2, "ok"), (0.3, "watch"), (0.51, "red")])
def test_clipfrac(peak: float, status: str) -> None:
    assert health.clipfrac_signal(_frame(**{"train/pg_clipfrac": [0.0, peak, 0.1]})).status == status


def test_zero_std_share() -> None:
    frame = _frame(
        **{"rollout/zero_std/count_0": [3, 2, 2, 3, 2], "rollout/zero_std/count_1": [7, 6, 8, 5, 6]}
    )
    sig = health.zero_std_signal(frame, 32)
    assert sig.status == "ok" and "first rollout 0.312" in sig.evidence
    assert health.zero_std_signal(frame, 16).status == "watch"  # 8-10 of 16 groups
    all_same = _frame(**{"rollout/zero_std/count_0": [2, 2, 2]})
    assert health.zero_std_signal(all_same, 2).status == "red"
    pct = _frame(
        **{
            "rollout/zero_std/all_zero_percentage": [0.5, 0.5],
            "rollout/zero_std/all_one_percentage": [0.0, 0.5],
        }
    )
    assert health.zero_std_signal(pct, None).status == "watch"  # mean of 0.5 and 1.0
    assert health.zero_std_signal(_frame(**{"rollout/raw_reward": [0.5]}), 32).status == "n/a"


def _step(step: int, **metrics: float) -> MetricRecord:
    return MetricRecord("step", step, step, {k.replace("__", "/"): v for k, v in metrics.items()})


def test_step0_checks() -> None:
    ok = _step(0, train__ppo_kl=0.0, train__pg_clipfrac=0.0, train__train_rollout_logprob_abs_diff=0.0153)
    checks = {c.name: c for c in health.step0_checks(ok, gap_range=(0.0148, 0.0157))}
    assert list(checks) == ["step 0 train/ppo_kl", "step 0 train/pg_clipfrac", "step 0 gap vs baseline"]
    assert [c.status for c in checks.values()] == ["ok", "ok", "ok"]
    assert checks["step 0 gap vs baseline"].evidence == "0.0153 (step 0) vs [0.0148, 0.0157]"
    # step 0 is the first step record, whatever its number (a resumed run's first step)
    bad = _step(7, train__ppo_kl=2e-9, train__pg_clipfrac=1e-9, train__kl_loss=1e-6)
    bad.metrics["train/train_rollout_logprob_abs_diff"] = 0.05
    checks = {c.name: c for c in health.step0_checks(bad, gap_range=(0.0148, 0.0157))}
    assert [c.status for c in checks.values()] == ["red"] * 4  # 0.05 > 3 × 0.0157; kl_loss logged: checked
    assert checks["step 0 train/ppo_kl"].evidence == "2e-09 (step 7)"
    # a key missing from the first step record fails the gate ("key not found"): red here too
    mid = _step(0, train__train_rollout_logprob_abs_diff=0.02)
    assert [c.status for c in health.step0_checks(mid, gap_range=(0.0148, 0.0157))] == ["red", "red", "watch"]
    assert health.step0_checks(mid)[0].evidence == "missing from the first step record (step 0, line 0)"
    assert health.step0_checks(mid)[2].status == "n/a"
    no_gap = health.step0_checks(_step(3, train__ppo_kl=0.0), gap_range=(0.0148, 0.0157))
    assert (no_gap[2].status, no_gap[2].evidence) == (
        "red",
        "missing from the first step record (step 3, line 0)",
    )
    # not a number in the file (the reader leaves it out of the record): red, and said so
    odd = health.step0_checks(_step(0, train__pg_clipfrac=0.0), non_numeric={"train/ppo_kl": "null"})
    assert [c.status for c in odd] == ["red", "ok", "n/a"]
    assert odd[0].evidence == "not a number: null in the first step record (step 0, line 0)"
    assert [c.status for c in health.step0_checks(None)] == ["n/a"] * 3
    baseline = [_step(0, train__train_rollout_logprob_abs_diff=v) for v in (0.0148, 0.0157, 0.0150)]
    assert health.baseline_gap_range([*baseline, None], margin=0) == (0.0148, 0.0157)
    lo, hi = health.baseline_gap_range(baseline)  # the gate's default --gap-margin 0.1
    assert (lo, hi) == pytest.approx((0.0148 * 0.9, 0.0157 * 1.1))
    assert health.baseline_gap_range([_step(0, train__ppo_kl=0.0)]) is None


def test_eight_signals_in_order() -> None:
    names = [s.name for s in health.health_signals(_frame(**{"rollout/raw_reward": [0.5]}))]
    assert len(names) == 8 and names[0] == "reward trend and collapse" and names[-1] == "zero-std group share"
    assert all(s.source for s in health.health_signals(_frame(**{"rollout/raw_reward": [0.5]})))

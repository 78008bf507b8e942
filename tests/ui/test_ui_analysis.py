"""Pure comparison logic: same steps, seed band, first divergence, config diff, clean steps."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from grpolab.rundir.reader import metric_record
from grpolab.ui import analysis, readers


def records_to_frame(rows):
    """The frame of metrics-file shaped dicts (as the reader would read them)."""
    return readers.records_to_frame(metric_record(r) for r in rows)


def _scalars(
    runs: dict[str, dict[int, float]], key: str = "rollout/raw_reward", kind: str = "rollout"
) -> pd.DataFrame:
    frames = {
        run: records_to_frame(
            {"kind": kind, "rollout_id": s, "step": s if kind == "step" else None, "metrics": {key: v}}
            for s, v in values.items()
        )
        for run, values in runs.items()
    }
    return pd.concat(frames.values(), keys=list(frames), names=["run", "kind", "step"])


def test_metric_series_and_same_steps() -> None:
    scalars = _scalars({"a": {0: 1.0, 1: 2.0, 2: 3.0}, "b": {1: 5.0, 2: 6.0, 3: 7.0}})
    series = analysis.metric_series(scalars, "rollout/raw_reward")
    assert list(series.columns) == ["a", "b"] and list(series.index) == [0, 1, 2, 3]
    assert math.isnan(series.loc[3, "a"]) and series.loc[3, "b"] == 7.0
    same = analysis.same_steps(series)
    assert list(same.index) == [1, 2]
    assert analysis.metric_series(scalars, "missing").empty
    assert analysis.key_kind(scalars, "rollout/raw_reward") == "rollout"
    assert analysis.axis_label("step") == "train step" and analysis.axis_label("perf") == "rollout id"


def test_no_common_steps_gives_an_empty_frame() -> None:
    scalars = _scalars({"a": {0: 1.0, 1: 2.0}, "b": {10: 1.0, 11: 2.0}})
    assert analysis.same_steps(analysis.metric_series(scalars, "rollout/raw_reward")).empty


def test_seed_band_and_verdicts() -> None:
    scalars = _scalars(
        {
            "s1": {0: 0.50, 1: 0.60, 2: 0.70},
            "s2": {0: 0.52, 1: 0.58, 2: 0.74},
            "s3": {0: 0.49, 1: 0.61, 2: 0.72},
            "change": {0: 0.60, 1: 0.70, 2: 0.80},
            "noise": {0: 0.50, 1: 0.60, 2: 0.71},
        }
    )
    series = analysis.metric_series(scalars, "rollout/raw_reward")
    band = analysis.seed_band(series, ["s1", "s2", "s3"])
    assert band["min"].tolist() == [0.49, 0.58, 0.70] and band["max"].tolist() == [0.52, 0.61, 0.74]
    assert set(band["n"]) == {3}
    assert analysis.seed_band(series, ["s1"]).empty  # one seed is no spread
    verdicts = {
        v.run: v for v in analysis.band_verdicts(series, ["s1", "s2", "s3"], list(series.columns), last_n=2)
    }
    assert set(verdicts) == {"change", "noise"}
    assert verdicts["change"].outside and not verdicts["noise"].outside
    assert verdicts["noise"].low == pytest.approx(0.65) and verdicts["noise"].high == pytest.approx(0.665)


def test_first_divergence_bitwise_and_tolerance() -> None:
    a = pd.Series([1.0, 2.0, 3.0, 4.0, math.nan], index=[0, 1, 2, 3, 4])
    b = pd.Series([1.0, 2.0, 3.0 + 1e-12, 4.5, math.nan], index=[0, 1, 2, 3, 4])
    assert analysis.first_divergence(a, b, 0.0) == 2
    assert analysis.first_divergence(a, b, 1e-9) == 3
    assert analysis.first_divergence(a, b, 1.0) is None
    assert analysis.first_divergence(a, a.copy(), 0.0) is None  # NaN equals NaN when bitwise
    assert analysis.first_divergence(a, pd.Series([1.0], index=[9]), 0.0) is None


def test_divergence_report_over_keys() -> None:
    frames = []
    for bump in (0.0, 0.5):
        recs = []
        for s in range(5):
            recs.append(
                {
                    "kind": "rollout",
                    "rollout_id": s,
                    "step": None,
                    "metrics": {"rollout/raw_reward": s + (bump if s >= 3 else 0)},
                }
            )
            recs.append(
                {
                    "kind": "step",
                    "rollout_id": s,
                    "step": s,
                    "metrics": {"train/loss": 1.0, "train/grad_norm": 0.1 * s + (bump if s >= 4 else 0)},
                }
            )
        frames.append(records_to_frame(recs))
    scalars = pd.concat(frames, keys=["a", "b"], names=["run", "kind", "step"])
    keys = ["rollout/raw_reward", "train/loss", "train/grad_norm", "not/logged"]
    report = analysis.divergence_report(scalars, "a", "b", keys, 0.0)
    assert (
        report.first_step == 3 and report.first_keys == ("rollout/raw_reward",) and report.common_steps == 5
    )
    assert report.table["diverged"].tolist() == [False, False, False, True, True]
    assert report.table.loc[4, "|Δ| train/grad_norm"] == pytest.approx(0.5)
    assert report.table.loc[3, "max |Δ|"] == pytest.approx(0.5)
    assert analysis.divergence_report(scalars, "a", "b", keys, 1.0).first_step is None
    empty = analysis.divergence_report(scalars, "a", "zzz", keys, 0.0)
    assert empty.common_steps == 0 and empty.first_step is None


def test_config_diff_keeps_only_differences() -> None:
    diff = analysis.config_diff(
        {
            "a": {"optimizer": {"lr": 2e-4, "clip_grad": 1.0}, "seed": 1, "model": {"hf_checkpoint": "m"}},
            "b": {"optimizer": {"lr": 1e-4, "clip_grad": 1.0}, "seed": 2, "model": {"hf_checkpoint": "m"}},
            "c": {"optimizer": {"lr": 2e-4, "clip_grad": 1.0}, "seed": 1},
        }
    )
    assert list(diff.index) == ["model.hf_checkpoint", "optimizer.lr", "seed"]
    assert diff.loc["optimizer.lr"].tolist() == ["0.0002", "0.0001", "0.0002"]
    assert diff.loc["model.hf_checkpoint", "c"] == "—"
    assert analysis.config_diff({"a": {"x": 1}, "b": {"x": 1}}).empty
    assert analysis.flatten({"a": {"b": {"c": 1}}, "d": [1]}) == {"a.b.c": 1, "d": [1]}


def test_clean_steps_from_throttle_marks() -> None:
    recs = [
        {
            "kind": "perf",
            "rollout_id": i,
            "step": None,
            "time": 100.0 * (i + 1),
            "metrics": {"perf/step_time": 90.0},
        }
        for i in range(4)
    ]  # step i runs over [100(i+1) - 90, 100(i+1)]
    frame = records_to_frame(recs)
    gpu = pd.DataFrame(
        {
            "time": [15.0, 105.0, 250.0, 330.0],
            "throttle_reasons": [["hw_slowdown"], [], ["sw_thermal"], None],
            "throttle": [None, None, None, True],
        }
    )
    marks = analysis.throttle_times(gpu)
    assert marks.tolist() == [15.0, 250.0, 330.0]
    clean = analysis.clean_steps(frame, marks)
    assert clean.tolist() == [False, True, False, False]  # 15 in step 0, 250 in step 2, 330 in step 3
    assert analysis.clean_steps(frame, np.array([])).all()
    assert analysis.throttle_times(pd.DataFrame({"time": []})).size == 0
    # gpu_idle and clock settings are not throttles (the step waited, it was not slowed); an explicit
    # `throttle` field wins over the names, and a null one falls back to them
    idle = pd.DataFrame(
        {
            "time": [15.0, 150.0, 250.0, 330.0, 340.0],
            "throttle_reasons": [
                ["gpu_idle"],
                ["hw_slowdown"],  # at 150, inside step 1, but its `throttle` field says no
                ["applications_clocks_setting"],
                ["gpu_idle"],
                ["sw_power_cap"],
            ],
            "throttle": [None, False, None, None, np.nan],
        }
    )
    assert analysis.throttle_times(idle).tolist() == [340.0]
    assert analysis.clean_steps(frame, analysis.throttle_times(idle)).tolist() == [True, True, True, False]


def test_keys_in_namespace() -> None:
    keys = [
        "rollout/raw_reward",
        "train/loss",
        "perf/step_time",
        "eval/gsm8k",
        "multi_turn/x",
        "train/grad_norm",
    ]
    assert analysis.keys_in_namespace(keys, "train/") == ["train/grad_norm", "train/loss"]
    assert analysis.keys_in_namespace(keys, "other") == ["multi_turn/x"]

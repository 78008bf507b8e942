"""`diff_runs`: compare two runs on the same step numbers, as deep as their files allow (issue 13).

Layers: 1. set-up (resolved flags, environment fingerprint, data identity; reported, they do not
decide the verdict: two runs may differ in --run-dir and still train identically); 2. per metric,
the first step where the values differ beyond the tolerance (a number against NaN differs, NaN equals
NaN; a step where a run did not log the key at all is not compared), or where run B leaves the band of the
`--baseline` runs (min–max of run A and the baselines at that step, widened by the tolerance);
3. the first differing sample/token of the rollouts both recorded (diff/samples.py); 4. the first
parameter whose per-step hash differs (diff/layers.py).

Fail closed: when nothing differs but something could not be compared (no metrics, steps that do not
overlap, steps or metrics on one side only, recordings or hashes on one side only) the verdict is
"cannot_judge" with each reason in `notes`, never "identical". Timing metrics (`perf/*`, `*_time`,
throughputs) are not compared: they differ between any two runs.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from grpolab.core.nested import differing
from grpolab.diff.frames import TIME_COLUMN
from grpolab.diff.layers import layer_divergence
from grpolab.diff.report import MetricDivergence, RunDiff, SetupDifference
from grpolab.diff.samples import compare_recordings
from grpolab.diff.series import seed_band, values_equal
from grpolab.diff.sources import RunSource, read_source

TIMING_KEY = re.compile(r"^perf/|_time$|per_sec|tflops|throughput")
"""Keys that measure wall time or speed: never equal between two runs, so never compared."""
A, B = "A", "B"


def check_tol(tol: float) -> float:
    """`--tol` as a float; raises ValueError (naming the flag) unless finite and >= 0."""
    if not isinstance(tol, (int, float)) or not math.isfinite(tol) or tol < 0:
        raise ValueError(f"--tol must be a finite number >= 0, got {tol}")
    return float(tol)


def diff_runs(
    run_a: str | Path, run_b: str | Path, *, tol: float = 0.0, baselines: Sequence[str | Path] = ()
) -> RunDiff:
    """Compare run A with run B (run directories or Miles/slime logs).

    Args:
        tol: absolute tolerance for metrics and engine log-probs (0 = bitwise; token ids are exact).
        baselines: more runs (other seeds of A's set-up): with them a metric of B counts as differing
            only outside the min–max band of A and the baselines at that step.

    Raises:
        ValueError: `tol` negative or not finite; `sources.DiffInputError` (a ValueError): a path
            that is not a run, named; `replay.format.RecordingError`: a recording that does not read.
    """
    tol = check_tol(tol)
    a, b = read_source(run_a), read_source(run_b)
    base = [read_source(p) for p in baselines]
    out = RunDiff(run_a=str(run_a), run_b=str(run_b), verdict="identical", tol=tol)
    out.setup = setup_differences(a, b)
    out.notes += [f"run {side}: {note}" for side, src in ((A, a), (B, b)) for note in src.notes]
    out.runs = [f"run {side}: {src.status}" for side, src in ((A, a), (B, b)) if src.status]
    metric_divergences(out, a, b, base)
    out.sample, notes = compare_recordings(
        a.recordings, b.recordings, tol=tol, tokenizer_dir=a.tokenizer_dir or b.tokenizer_dir
    )
    out.notes += notes
    out.layer, notes = layer_divergence(a.step_hashes, b.step_hashes)
    out.notes += notes
    if out.metrics or out.sample is not None or out.layer is not None:
        out.verdict = "differs"
    elif out.notes:
        out.verdict = "cannot_judge"
    return out


# ------------------------------------------------------------------------------- layer 1
def _section(section: str, a: dict[str, Any], b: dict[str, Any]) -> list[SetupDifference]:
    return [SetupDifference(section, key, va, vb, {"a": A, "b": B}.get(only, ""))
            for key, va, vb, only in differing(a, b)]  # fmt: skip


def setup_differences(a: RunSource, b: RunSource) -> list[SetupDifference]:
    """Flags, environment and data-identity values that differ (data: the file's path is left out
    when its SHA-256 matches, as `core.data_identity` compares by content)."""
    data_a, data_b = dict(a.data), dict(b.data)
    if data_a.get("sha256") and data_a.get("sha256") == data_b.get("sha256"):
        data_a.pop("prompt_data", None)
        data_b.pop("prompt_data", None)
    return [
        *_section("flags", a.config, b.config),
        *_section("env", a.environment, b.environment),
        *_section("data", data_a, data_b),
    ]


# ------------------------------------------------------------------------------- layer 2
def compared_keys(src: RunSource) -> set[str]:
    """The metric keys a run logged (a NaN counts) that are not timings (`TIMING_KEY`)."""
    cols = src.logged.columns[src.logged.any(axis=0).to_numpy()]
    return {str(k) for k in cols if k != TIME_COLUMN and not TIMING_KEY.search(str(k))}


def key_series(src: RunSource, key: str) -> pd.Series:
    """step → value of `key` at the steps the run logged it (a logged NaN kept), float64, sorted.
    A step logged under two kinds keeps the later kind's value (the frame's (kind, step) order)."""
    if key not in src.frame.columns or key not in src.logged.columns:
        return pd.Series([], dtype="float64")
    values = src.frame[key][src.logged[key].to_numpy()]
    steps = values.index.get_level_values("step").astype(int)
    out = pd.Series(values.to_numpy(float), index=steps)
    return out[~out.index.duplicated(keep="last")].sort_index()


def _span(steps: Sequence[int]) -> str:
    return "none" if len(steps) == 0 else f"{min(steps)}..{max(steps)}" if len(steps) > 1 else str(steps[0])


def metric_divergences(out: RunDiff, a: RunSource, b: RunSource, base: list[RunSource]) -> None:
    """Fill `out.metrics`, `first_step`, `common_steps` and the notes of layer 2."""
    keys_a, keys_b = compared_keys(a), compared_keys(b)
    for side, keys in ((A, keys_a), (B, keys_b)):
        if not keys:
            out.notes.append(f"run {side} logged no metrics: nothing to compare")
    if not keys_a or not keys_b:
        return
    for side, only in ((A, keys_a - keys_b), (B, keys_b - keys_a)):
        if only:
            out.notes.append(f"metrics only run {side} logged (not compared): {', '.join(sorted(only))}")
    names = [f"baseline{i}" for i in range(len(base))]
    common: set[int] = set()
    logged: dict[str, set[int]] = {A: set(), B: set()}  # steps with any compared key
    for key in sorted(keys_a & keys_b):
        sides = {A: key_series(a, key), B: key_series(b, key)}
        series = pd.concat({**sides, **{n: key_series(s, key) for n, s in zip(names, base)}}, axis=1)
        has_a, has_b = series.index.isin(sides[A].index), series.index.isin(sides[B].index)
        steps = series.index[has_a & has_b]
        logged[A].update(int(s) for s in series.index[has_a])
        logged[B].update(int(s) for s in series.index[has_b])
        common.update(int(s) for s in steps)
        found = _first_divergence(key, series.loc[steps], names, out.tol)
        if found is not None:
            out.metrics.append(found)
    _step_notes(out, common, logged)
    out.metrics.sort(key=lambda m: (m.step, m.key))
    out.first_step = out.metrics[0].step if out.metrics else None


def _step_notes(out: RunDiff, common: set[int], logged: dict[str, set[int]]) -> None:
    """`common_steps`, and notes for steps that do not overlap or that one run alone logged (a key
    missing at one step of one run, such as a zero count Miles leaves out, is no such step)."""
    out.common_steps = len(common)
    if not common:
        span_a, span_b = _span(sorted(logged[A])), _span(sorted(logged[B]))
        out.notes.append(f"no common steps: run A logged steps {span_a}, run B {span_b}")
        return
    for side, other in ((A, B), (B, A)):
        alone = sorted(logged[side] - logged[other])
        if alone:
            out.notes.append(f"steps only run {side} logged (not compared): {_span(alone)}")


def _first_divergence(
    key: str, pair: pd.DataFrame, baselines: list[str], tol: float
) -> MetricDivergence | None:
    """The first step of `pair` (columns A, B and the baselines) where B differs from A, or from the
    band of A and the baselines at the steps where that band exists."""
    if pair.empty:
        return None
    va, vb = pair[A].to_numpy(float), pair[B].to_numpy(float)
    bad = ~values_equal(va, vb, tol)
    band = seed_band(pair, [A, *baselines]) if baselines else pd.DataFrame()
    lows = band["min"].reindex(pair.index).to_numpy(float) if not band.empty else np.full(len(pair), np.nan)
    highs = band["max"].reindex(pair.index).to_numpy(float) if not band.empty else np.full(len(pair), np.nan)
    banded = ~np.isnan(lows)
    with np.errstate(invalid="ignore"):
        outside = ~((vb >= lows - tol) & (vb <= highs + tol))
    bad = np.where(banded, outside, bad)
    hits = np.flatnonzero(bad)
    if len(hits) == 0:
        return None
    i = int(hits[0])
    return MetricDivergence(
        key,
        int(pair.index[i]),
        float(va[i]),
        float(vb[i]),
        (float(lows[i]), float(highs[i])) if banded[i] else None,
    )

"""Pure comparison math over metric frames, shared by `grpolab diff` and the UI's Compare page.

Inputs are frames indexed by (run, kind, step) with one float column per metric key (plus `time`),
the shape `ui.runstore.RunStore.read_scalars` returns. The
x axis of a key is its `step` level: the train step for `train/*` keys and the rollout id for every
other kind (the same numbers when a rollout makes one optimizer step). A NaN cell counts as "not
logged". No I/O here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from grpolab.core.nested import flatten


def metric_series(scalars: pd.DataFrame, key: str) -> pd.DataFrame:
    """One key across runs: index step, one column per run (NaN where a run did not log it)."""
    if key not in scalars.columns:
        return pd.DataFrame()
    values = scalars[key].dropna()
    if values.empty:
        return pd.DataFrame()
    by_step = values.groupby(level=["run", "step"]).last()
    out = by_step.unstack("run")
    runs = [r for r in dict.fromkeys(scalars.index.get_level_values("run")) if r in out.columns]
    return out[runs].sort_index()


def seed_band(series: pd.DataFrame, baseline: Sequence[str]) -> pd.DataFrame:
    """Min–max band of the baseline runs per step, on steps every baseline run logged.

    Returns:
        frame indexed by step with columns `min`, `max`, `n` (baseline runs); empty when fewer
        than 2 baseline runs are present (a band needs at least two seeds).
    """
    cols = [b for b in baseline if b in series.columns]
    if len(cols) < 2:
        return pd.DataFrame(columns=["min", "max", "n"])
    base = series[cols].dropna(how="any")
    return pd.DataFrame({"min": base.min(axis=1), "max": base.max(axis=1), "n": len(cols)})


@dataclass(frozen=True)
class BandVerdict:
    """Manual 5.3: a change counts only outside the baseline seeds' spread.

    Attributes:
        run: the compared run; last_n: how many final steps are averaged.
        value: the run's mean over its last `last_n` steps (of the steps the baseline also has).
        low / high: min and max of the baseline runs' means over the same steps.
        outside: value < low or value > high.
    """

    run: str
    last_n: int
    value: float
    low: float
    high: float

    @property
    def outside(self) -> bool:
        return self.value < self.low or self.value > self.high


def band_verdicts(
    series: pd.DataFrame, baseline: Sequence[str], candidates: Sequence[str], *, last_n: int = 8
) -> list[BandVerdict]:
    """Each candidate's mean over the last `last_n` common steps against the baseline spread."""
    cols = [b for b in baseline if b in series.columns]
    out: list[BandVerdict] = []
    for run in candidates:
        if run in cols or run not in series.columns or len(cols) < 2:
            continue
        common = series[[*cols, run]].dropna(how="any")
        if common.empty:
            continue
        tail = common.iloc[-last_n:]
        means = tail[cols].mean()
        out.append(
            BandVerdict(run, len(tail), float(tail[run].mean()), float(means.min()), float(means.max()))
        )
    return out


def values_equal(a: np.ndarray, b: np.ndarray, tol: float) -> np.ndarray:
    """Elementwise "same value": tol == 0 → bitwise equal (NaN equals NaN); else |a − b| ≤ tol."""
    if tol == 0:
        return (a == b) | (np.isnan(a) & np.isnan(b))
    return (np.abs(a - b) <= tol) | (np.isnan(a) & np.isnan(b))


def first_divergence(a: pd.Series, b: pd.Series, tol: float = 0.0) -> int | None:
    """First step (of the steps both series logged) where they differ beyond `tol`; None if never."""
    both = pd.concat([a, b], axis=1, join="inner").dropna(how="all")
    if both.empty:
        return None
    same = values_equal(both.iloc[:, 0].to_numpy(float), both.iloc[:, 1].to_numpy(float), tol)
    bad = np.flatnonzero(~same)
    return None if len(bad) == 0 else int(both.index[bad[0]])


@dataclass(frozen=True)
class DivergenceReport:
    """Per-step differences of two runs over some keys.

    Attributes:
        table: index step; one `|Δ| <key>` column per key, `max |Δ|`, and `diverged` (bool).
        first_step: the first step where any key differs beyond the tolerance (None: never).
        first_keys: the keys that differ at that step.
        common_steps: how many step numbers both runs logged for at least one key.
    """

    table: pd.DataFrame
    first_step: int | None
    first_keys: tuple[str, ...]
    common_steps: int


def divergence_report(
    scalars: pd.DataFrame, run_a: str, run_b: str, keys: Sequence[str], tol: float = 0.0
) -> DivergenceReport:
    """Compare two runs key by key on the steps both logged; `tol == 0` means bitwise."""
    cols: dict[str, pd.Series] = {}
    flags: dict[str, pd.Series] = {}
    for key in keys:
        series = metric_series(scalars, key)
        if run_a not in series.columns or run_b not in series.columns:
            continue
        pair = series[[run_a, run_b]].dropna(how="any")
        if pair.empty:
            continue
        a, b = pair[run_a].to_numpy(float), pair[run_b].to_numpy(float)
        cols[f"|Δ| {key}"] = pd.Series(np.abs(a - b), index=pair.index)
        flags[key] = pd.Series(~values_equal(a, b, tol), index=pair.index)
    if not cols:
        return DivergenceReport(pd.DataFrame(), None, (), 0)
    table = pd.DataFrame(cols).sort_index()
    diverged = pd.DataFrame(flags).reindex(table.index).fillna(False).astype(bool)
    table["max |Δ|"] = table.max(axis=1)
    table["diverged"] = diverged.any(axis=1)
    hits = table.index[table["diverged"].to_numpy()]
    if len(hits) == 0:
        return DivergenceReport(table, None, (), len(table))
    first = int(hits[0])
    first_keys = tuple(k for k in flags if bool(diverged.loc[first, k]))
    return DivergenceReport(table, first, first_keys, len(table))


def config_diff(configs: dict[str, dict[str, Any]]) -> pd.DataFrame:
    """Only the keys whose values differ between runs: index key, one column per run.

    A key a run lacks shows as "—". Returns an empty frame when all configs agree.
    """
    flat = {run: flatten(cfg) for run, cfg in configs.items()}
    keys = sorted(set().union(*(f.keys() for f in flat.values()))) if flat else []
    missing = object()
    rows = {}
    for key in keys:
        values = [flat[r].get(key, missing) for r in flat]
        if any(repr(v) != repr(values[0]) for v in values[1:]):
            rows[key] = ["—" if v is missing else repr(v) if not isinstance(v, str) else v for v in values]
    return pd.DataFrame.from_dict(rows, orient="index", columns=list(flat)) if rows else pd.DataFrame()
